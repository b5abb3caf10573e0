//! The path between nodes, on one machine: `--ranks-per-node 1` makes every rank its own node, so
//! rows of other ranks are cached, synchronised and pushed as between machines. Every setting of
//! the remote path trains to the same quality and accounts for its bytes exactly; settings that
//! cannot work are refused on every rank before training.

mod common;

use common::*;
use serde_json::Value;

fn metrics(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .expect("metrics")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect()
}

fn sum(ms: &[Value], key: &str) -> u64 {
    ms.iter().map(|m| m[key].as_u64().unwrap_or(0)).sum()
}

fn args<'a>(g: &'a str, emb: &'a str, m: &'a str) -> Vec<&'a str> {
    vec![
        "--graph",
        g,
        "--walks-per-node",
        "5",
        "--walk-length",
        "20",
        "--window",
        "10",
        "--dim",
        "32",
        "--threads",
        "1",
        "-o",
        emb,
        "--metrics",
        m,
        "--comm-timeout",
        "60",
        "--ranks-per-node",
        "1",
    ]
}

#[test]
fn every_remote_path_setting_trains_and_counts_its_bytes() {
    let d = tmp();
    let (g, l) = sbm(d.path(), 1200, 4);
    let (emb, m) = (p(d.path(), "emb.h5"), p(d.path(), "m.jsonl"));
    // (flags, wire bytes per value of fetched rows, one-sided reads)
    let cases: [(&[&str], u64, bool); 6] = [
        (&[], 2, false),
        (&["--wire-dtype", "f32"], 4, false),
        (&["--wire-dtype", "bf16", "--cache-refresh", "2"], 2, false),
        // One-sided reads move rows in the storage dtype (f32).
        (&["--fetch", "rma"], 4, true),
        // A cache too small for a batch: evictions, and it grows with a warning.
        (&["--cache-rows", "40"], 2, false),
        // No cache: every batch fetches its rows and pushes their deltas (the earlier path).
        (&["--cache-rows", "0"], 4, true),
    ];
    for (i, (extra, value_bytes, one_sided)) in cases.iter().enumerate() {
        let mut a = args(s(&g), s(&emb), s(&m));
        a.extend_from_slice(extra);
        let o = mpirun(3, 240, &a);
        assert_eq!(o.code, 0, "case {i} {extra:?}: {}", o.all());
        let f1 = micro_f1(&emb, &l);
        assert!(f1 >= 0.9, "case {i} {extra:?}: Micro-F1 {f1}");
        let ms = metrics(&m);
        let (rows, fetched) = (sum(&ms, "remote_rows"), sum(&ms, "fetch_bytes"));
        assert!(rows > 0, "case {i}: nothing fetched");
        assert_eq!(fetched, rows * 32 * value_bytes, "case {i}: fetch bytes");
        let read = sum(&ms, "one_sided_bytes");
        assert_eq!(read > 0, *one_sided, "case {i}: one-sided bytes {read}");
        let hits = sum(&ms, "cache_hits");
        match extra.first() {
            Some(&"--cache-rows") if extra[1] == "0" => assert_eq!(hits, 0, "case {i}"),
            Some(&"--cache-rows") => {
                assert!(sum(&ms, "cache_evictions") > 0, "case {i}: no evictions");
                assert!(o.stderr.contains("growing it"), "case {i}: {}", o.stderr);
            }
            // A short clock: rows are read again often.
            Some(&"--wire-dtype") if extra.len() > 2 => {
                assert!(sum(&ms, "cache_refreshes") * 2 > rows, "case {i}")
            }
            // Rows are reused far more often than they are read.
            _ => assert!(hits > 3 * rows, "case {i}: {hits} hits, {rows} rows read"),
        }
    }
}

/// Two simulated nodes of two ranks: node rows in place, other nodes' rows cached; the flag and
/// the environment variable group ranks alike; the in-process transport runs the same path.
#[test]
fn simulated_nodes_by_flag_by_env_and_in_process() {
    let d = tmp();
    let (g, l) = sbm(d.path(), 1200, 4);
    let (emb, m) = (p(d.path(), "emb.h5"), p(d.path(), "m.jsonl"));
    let base = args(s(&g), s(&emb), s(&m));
    let two = |a: &mut Vec<&str>| {
        let i = a.iter().position(|x| *x == "--ranks-per-node").unwrap();
        a[i + 1] = "2";
    };
    let mut flag = base.clone();
    two(&mut flag);
    let by_flag = mpirun(4, 240, &flag);
    assert_eq!(by_flag.code, 0, "{}", by_flag.all());
    let flag_rows = sum(&metrics(&m), "cache_misses");
    assert!(micro_f1(&emb, &l) >= 0.9);
    let env: Vec<&str> = base[..base.len() - 2].to_vec();
    let by_env = mpirun_env(4, 240, &["GRAPHSCALE_RANKS_PER_NODE=2"], &env);
    assert_eq!(by_env.code, 0, "{}", by_env.all());
    let env_rows = sum(&metrics(&m), "cache_misses");
    assert!(flag_rows > 0 && env_rows > 0, "{flag_rows} {env_rows}");
    let mut local = base.clone();
    local.extend_from_slice(&["--ranks", "2"]);
    let o = run(240, &local);
    assert_eq!(o.code, 0, "{}", o.all());
    assert!(sum(&metrics(&m), "cache_hits") > 0, "in-process: no cache");
    assert!(micro_f1(&emb, &l) >= 0.9);
}

#[test]
fn remote_path_settings_that_cannot_work_are_refused_on_every_rank() {
    let d = tmp();
    let (g, _) = sbm(d.path(), 300, 3);
    let (emb, m) = (p(d.path(), "emb.h5"), p(d.path(), "m.jsonl"));
    let cases: [(&[&str], &str); 3] = [
        (
            &["--wire-dtype", "f16", "--optimizer", "adagrad"],
            "--wire-dtype f16",
        ),
        (
            &["--cache-rows", "100000000", "--max-memory", "64M"],
            "--cache-rows 100000000",
        ),
        (&["--cache-refresh", "0"], "--cache-refresh"),
    ];
    for (extra, named) in cases {
        let mut a = args(s(&g), s(&emb), s(&m));
        a.extend_from_slice(extra);
        let o = mpirun(2, 60, &a);
        assert_ne!(o.code, 0, "{extra:?} was accepted: {}", o.all());
        assert_ne!(o.code, 124, "{extra:?}: the job hung: {}", o.all());
        assert!(o.stderr.contains(named), "{extra:?}: {}", o.stderr);
        assert!(!emb.exists(), "{extra:?}: trained anyway");
    }
}
