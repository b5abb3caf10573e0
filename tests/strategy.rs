//! `--strategy replicated`, the data-parallel baseline (DDP) in the same binary: it trains to the
//! sharded strategy's quality with the same sampler and kernel, moves the bytes its sync says
//! (the dense all-reduce exactly), keeps its replicas equal, and refuses what does not apply.

mod common;

use common::*;

#[test]
fn replicated_matches_sharded_quality_and_moves_more_bytes() {
    let d = tmp();
    let (nodes, ranks) = (1200u64, 3u64);
    let (g, l) = sbm(d.path(), nodes, 4);
    let (emb, m) = (p(d.path(), "emb.h5"), p(d.path(), "m.jsonl"));
    let mut moved = Vec::new();
    for strategy in [
        &[][..],
        &["--strategy", "replicated"],
        &["--strategy", "replicated", "--sync", "dense"],
    ] {
        let mut a = walk_args(s(&g), s(&emb), s(&m));
        a.extend_from_slice(&["--ranks-per-node", "1"]);
        a.extend_from_slice(strategy);
        let o = mpirun(ranks as usize, 240, &a);
        assert_eq!(o.code, 0, "{strategy:?}: {}", o.all());
        let f1 = micro_f1(&emb, &l);
        assert!(f1 >= 0.9, "{strategy:?}: Micro-F1 {f1}");
        let ms = metrics(&m);
        assert!(sum(&ms, "pairs") > 0);
        moved.push(sum(&ms, "comm_bytes_sent"));
        if strategy.len() == 4 {
            // The dense sync all-reduces two matrices of nodes x 32 f32 every step: a ring
            // moves 2 (p - 1) / p of them per rank.
            for r in &ms {
                let steps = r["steps"].as_u64().unwrap();
                let per_step = 2 * (2 * (ranks - 1) * nodes * 32 * 4 / ranks);
                assert_eq!(
                    r["push_bytes_sent"].as_u64().unwrap(),
                    steps * per_step,
                    "{r}"
                );
            }
            assert!(
                o.stderr.contains("every rank holds all 1200 rows"),
                "{}",
                o.stderr
            );
        }
    }
    // Every rank ships its batch's rows to every other rank (sparse), or whole matrices
    // (dense); the sharded strategy only its remote rows' deltas and reads.
    assert!(moved[1] > 2 * moved[0], "{moved:?}");
    assert!(moved[2] > moved[1], "{moved:?}");
}

/// LINE on the in-process transport: the same strategy without MPI.
#[test]
fn replicated_line_in_process() {
    let d = tmp();
    let (g, l) = sbm(d.path(), 800, 4);
    let (emb, m) = (p(d.path(), "emb.h5"), p(d.path(), "m.jsonl"));
    let o = run(
        240,
        &[
            "--graph",
            s(&g),
            "--model",
            "line",
            "--line-samples",
            "100",
            "--batch-size",
            "1024",
            "--lr",
            "0.05",
            "--dim",
            "32",
            "--threads",
            "1",
            "--ranks",
            "2",
            "--strategy",
            "replicated",
            "-o",
            s(&emb),
            "--metrics",
            s(&m),
        ],
    );
    assert_eq!(o.code, 0, "{}", o.all());
    assert!(micro_f1(&emb, &l) >= 0.9);
    let ms = metrics(&m);
    assert!(sum(&ms, "push_bytes_sent") > 0 && sum(&ms, "remote_rows") == 0);
}

#[test]
fn replicated_settings_that_do_not_apply_are_refused_on_every_rank() {
    let d = tmp();
    let (g, _) = sbm(d.path(), 300, 3);
    let (emb, m) = (p(d.path(), "emb.h5"), p(d.path(), "m.jsonl"));
    let cases: [(&[&str], &str); 5] = [
        (
            &["--sync", "dense"],
            "--sync applies to --strategy replicated",
        ),
        (
            &["--strategy", "replicated", "--optimizer", "adagrad"],
            "needs --optimizer sgd",
        ),
        (
            &["--strategy", "replicated", "--cache-rows", "10"],
            "--cache-rows applies to --strategy sharded",
        ),
        (
            &["--strategy", "replicated", "--checkpoint-dir", "ck"],
            "does not checkpoint",
        ),
        // 300 rows x 32 dims x 2 matrices x 4 B x 2 (dense) = 150 KiB per rank.
        (
            &[
                "--strategy",
                "replicated",
                "--sync",
                "dense",
                "--max-memory",
                "100K",
            ],
            "copy of every row",
        ),
    ];
    for (extra, named) in cases {
        let mut a = walk_args(s(&g), s(&emb), s(&m));
        a.extend_from_slice(extra);
        let o = mpirun(2, 120, &a);
        assert_eq!(o.code, 1, "{extra:?}: {}", o.all());
        assert!(o.stderr.contains(named), "{extra:?}: {}", o.stderr);
        assert!(
            !o.stderr.contains("pairs/s"),
            "{extra:?} trained: {}",
            o.stderr
        );
    }
}
