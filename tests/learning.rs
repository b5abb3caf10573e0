//! Learning from few samples per node (the billion-node budget): the defaults learn a planted
//! partition at 1 walk x 20 per node where word2vec's rate learns nothing, 16-bit rows learn as
//! 32-bit ones do, a run that does not learn says so (and `--on-stall abort` ends it), and
//! row-wise Adagrad trains in place on one rank and across ranks.

mod common;

use common::*;
use std::path::Path;

/// A planted partition of 16,384 nodes in 16 blocks (avg degree 30, 30% of edges leave their
/// block), as `graphscale generate sbm` writes it.
fn partition(dir: &Path) -> (String, String) {
    let (g, l) = (p(dir, "sbm.h5"), p(dir, "labels.tsv"));
    let o = run(
        60,
        &[
            "generate",
            "sbm",
            "--nodes",
            "16384",
            "--blocks",
            "16",
            "--avg-degree",
            "30",
            "--mix",
            "0.3",
            "--seed",
            "5",
            "-o",
            s(&g),
            "--labels",
            s(&l),
        ],
    );
    assert_eq!(o.code, 0, "{}", o.all());
    (s(&g).to_string(), s(&l).to_string())
}

/// DeepWalk at the billion-node budget: 1 walk x 20 per node, window 5, d 16, 2 threads.
fn small_budget<'a>(graph: &'a str, emb: &'a str, metrics: &'a str) -> Vec<&'a str> {
    budget(graph, emb, metrics, "1", "2")
}

/// DeepWalk with `walks` walks x 20 per node, window 5, d 16, `threads` threads per rank.
fn budget<'a>(
    graph: &'a str,
    emb: &'a str,
    metrics: &'a str,
    walks: &'a str,
    threads: &'a str,
) -> Vec<&'a str> {
    vec![
        "--graph",
        graph,
        "--walks-per-node",
        walks,
        "--walk-length",
        "20",
        "--window",
        "5",
        "--dim",
        "16",
        "--threads",
        threads,
        "-o",
        emb,
        "--metrics",
        metrics,
    ]
}

#[test]
fn the_defaults_learn_from_a_small_budget_where_word2vecs_rate_stalls() {
    let d = tmp();
    let (g, l) = partition(d.path());
    let (emb, m) = (p(d.path(), "e.h5"), p(d.path(), "m.jsonl"));
    let args = small_budget(&g, s(&emb), s(&m));
    let o = run(120, &args);
    assert_eq!(o.code, 0, "{}", o.all());
    assert!(
        o.stderr
            .contains("--lr 0.7 (default for 120 training pairs per node)"),
        "{}",
        o.stderr
    );
    assert!(!o.stderr.contains("not learning"), "{}", o.stderr);
    let f1 = micro_f1(&emb, Path::new(&l));
    assert!(f1 > 0.9, "Micro-F1 {f1} with the defaults");
    let ms = metrics(&m);
    assert_eq!(ms[0]["stalled"], false);
    assert!(
        ms[0]["stall_score_rms"].as_f64().unwrap() > 0.5,
        "{}",
        ms[0]
    );

    // word2vec's rate on the same budget: the loss stays at ln 2, the run says so, and the
    // embeddings are at chance (1 in 16).
    let mut w2v = args.clone();
    w2v.extend(["--lr", "0.025"]);
    let o = run(120, &w2v);
    assert_eq!(o.code, 0, "{}", o.all());
    assert!(
        o.stderr.contains("WARNING: at 1")
            && o.stderr.contains("the rows are not learning")
            && o.stderr.contains("--lr 0.025"),
        "{}",
        o.stderr
    );
    assert_eq!(o.stderr.matches("not learning").count(), 1, "warned once");
    assert_eq!(metrics(&m)[0]["stalled"], true);
    let chance = micro_f1(&emb, Path::new(&l));
    assert!(chance < 0.2, "Micro-F1 {chance} at 0.025");
}

#[test]
fn on_stall_abort_ends_a_run_that_does_not_learn() {
    let d = tmp();
    let (g, _) = partition(d.path());
    let (emb, m) = (p(d.path(), "e.h5"), p(d.path(), "m.jsonl"));
    let mut args = small_budget(&g, s(&emb), s(&m));
    args.extend(["--lr", "0.0001", "--on-stall", "abort"]);
    let o = run(120, &args);
    assert_ne!(o.code, 0, "{}", o.all());
    assert!(
        o.stderr.contains("the rows are not learning") && o.stderr.contains("aborting the job"),
        "{}",
        o.stderr
    );
    assert!(!emb.exists(), "an aborted run writes no embeddings");
    // Under mpirun every rank reaches the same verdict (one all-reduce) and the job ends.
    let o = mpirun(2, 120, &args);
    assert_ne!(o.code, 0, "{}", o.all());
    assert_ne!(o.code, 124, "the job hung: {}", o.all());
    assert!(o.all().contains("the rows are not learning"), "{}", o.all());
}

#[test]
fn sixteen_bit_rows_learn_as_thirty_two_bit_rows_do() {
    let d = tmp();
    let (g, l) = partition(d.path());
    let mut f1 = Vec::new();
    for dtype in ["f32", "f16", "bf16"] {
        let (emb, m) = (p(d.path(), "e.h5"), p(d.path(), "m.jsonl"));
        let mut args = small_budget(&g, s(&emb), s(&m));
        args.extend(["--dtype", dtype]);
        let o = run(120, &args);
        assert_eq!(o.code, 0, "{dtype}: {}", o.all());
        f1.push(micro_f1(&emb, Path::new(&l)));
    }
    for (dtype, f) in ["f16", "bf16"].iter().zip(&f1[1..]) {
        assert!(
            (f - f1[0]).abs() < 0.03,
            "{dtype} rows: Micro-F1 {f}, f32 rows {}",
            f1[0]
        );
    }
}

#[test]
fn adagrad_trains_in_place_on_one_rank_and_across_ranks() {
    let d = tmp();
    let (g, l) = partition(d.path());
    // Adagrad's steps need more passes than sgd's at this budget (docs/tuning.md): 4 walks.
    let (emb, m) = (p(d.path(), "e.h5"), p(d.path(), "m.jsonl"));
    let mut args = budget(&g, s(&emb), s(&m), "4", "1");
    args.extend(["--optimizer", "adagrad"]);
    let one = run(120, &args);
    assert_eq!(one.code, 0, "{}", one.all());
    assert!(
        one.stderr.contains("\"optimizer\":\"adagrad\"")
            && one.stderr.contains("\"update\":\"hogwild\""),
        "{}",
        one.stderr
    );
    let f_one = micro_f1(&emb, Path::new(&l));
    assert!(f_one > 0.5, "one rank: Micro-F1 {f_one}");
    // Two ranks sharing their rows (and accumulators), and two simulated nodes (copies of the
    // other node's rows in the cache, each with its own accumulator).
    for extra in [&[][..], &["--ranks-per-node", "1"][..]] {
        let mut a = args.clone();
        a.extend_from_slice(extra);
        let o = mpirun(2, 180, &a);
        assert_eq!(o.code, 0, "{extra:?}: {}", o.all());
        let f = micro_f1(&emb, Path::new(&l));
        assert!(f > f_one - 0.1, "{extra:?}: Micro-F1 {f}, one rank {f_one}");
    }
}
