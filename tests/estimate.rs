//! The memory estimate printed at start (and written as `memory_estimate_bytes`) holds against
//! the peak RSS the run then measures (issue 18): within 15% at three sizes, for the walk and
//! edge models. One rank, so that no page of another rank's node-shared window is counted.

mod common;

use common::*;

#[test]
fn the_printed_estimate_is_within_15_percent_of_peak_rss_at_three_sizes() {
    let d = tmp();
    let cases: [(u32, &[&str]); 3] = [
        (14, &["--dim", "64"]),
        (
            16,
            &[
                "--dim",
                "128",
                "--dtype",
                "f16",
                "--model",
                "line",
                "--order",
                "1",
                "--line-samples",
                "1",
            ],
        ),
        (18, &["--dim", "64"]),
    ];
    for (scale, extra) in cases {
        let g = rmat(d.path(), scale, 16);
        let (emb, m) = (p(d.path(), "emb.h5"), p(d.path(), "m.jsonl"));
        let _ = std::fs::remove_file(&m);
        let mut a = vec![
            "--graph",
            s(&g),
            "-o",
            s(&emb),
            "--metrics",
            s(&m),
            "--walks-per-node",
            "1",
            "--walk-length",
            "10",
            "--window",
            "5",
            "--threads",
            "1",
        ];
        a.extend_from_slice(extra);
        let o = mpirun(1, 240, &a);
        assert_eq!(o.code, 0, "scale {scale}: {}", o.all());
        assert!(
            o.stderr.contains("samplers and step buffers"),
            "scale {scale}: {}",
            o.stderr
        );
        let last = metrics(&m)
            .into_iter()
            .rev()
            .find(|v| v["memory_estimate_bytes"].as_u64().is_some_and(|e| e > 0))
            .expect("a record with the estimate");
        let est = last["memory_estimate_bytes"].as_u64().unwrap() as f64;
        let peak = last["peak_rss_bytes"].as_u64().expect("peak_rss_bytes") as f64;
        let ratio = est / peak;
        assert!(
            (0.85..=1.15).contains(&ratio),
            "scale {scale} {extra:?}: estimate {est} against peak RSS {peak}: {ratio:.3}"
        );
        eprintln!("scale {scale}: estimate / peak RSS {ratio:.3}");
    }
}
