//! Real multi-rank behaviour under `mpirun --oversubscribe` at 2-4 ranks: loads agree with one
//! rank, one-sided fetches return the owners' rows, training classifies planted blocks, and a
//! failing rank ends the whole job quickly.

mod common;
use common::*;

use std::time::Instant;

fn info_json(o: &Out) -> serde_json::Value {
    assert_eq!(o.code, 0, "{}", o.all());
    serde_json::from_str(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", o.stdout))
}

#[test]
fn multi_rank_loads_agree_with_one_rank() {
    let d = tmp();
    let g = rmat(d.path(), 10, 8);
    let one = info_json(&run(60, &["info", "--graph", s(&g), "--json"]));
    for (ranks, scheme) in [(2, "striped"), (3, "block"), (4, "striped")] {
        let many = info_json(&mpirun(
            ranks,
            90,
            &[
                "info",
                "--graph",
                s(&g),
                "--json",
                "--partition",
                scheme,
                "--comm-timeout",
                "30",
            ],
        ));
        for key in [
            "num_nodes",
            "file_edges",
            "adjacency_entries",
            "min_degree",
            "max_degree",
            "isolated_nodes",
        ] {
            assert_eq!(one[key], many[key], "{key} at {ranks} ranks");
        }
        assert_eq!(many["ranks"], ranks);
        // in-process ranks hold the same graph as MPI ranks
        let local = info_json(&run(
            60,
            &[
                "info",
                "--graph",
                s(&g),
                "--json",
                "--partition",
                scheme,
                "--ranks",
                &ranks.to_string(),
            ],
        ));
        assert_eq!(local["max_rank_entries"], many["max_rank_entries"]);
    }
}

#[test]
fn fetched_rows_equal_the_owners_rows() {
    for ranks in [2, 3, 4] {
        let o = mpirun(
            ranks,
            90,
            &[
                "selftest",
                "rma",
                "--rows",
                "3000",
                "--rounds",
                "30",
                "--comm-timeout",
                "30",
            ],
        );
        assert_eq!(o.code, 0, "{}", o.all());
        assert!(o.stdout.contains("fetched rows verified"), "{}", o.stdout);
    }
    // Ranks grouped two by two into "nodes": rows of the node are copied from the shared
    // window, rows of the other node read with MPI_Get (rank 2 is alone on its node).
    for ranks in [3, 4] {
        let o = mpirun_env(
            ranks,
            90,
            &["GRAPHSCALE_RANKS_PER_NODE=2"],
            &["selftest", "rma", "--rows", "3000", "--rounds", "30"],
        );
        assert_eq!(o.code, 0, "{ranks} ranks, 2 per node: {}", o.all());
        assert!(o.stdout.contains("fetched rows verified"), "{}", o.stdout);
    }
}

/// Open MPI configurations whose windows fail: with `osc ucx` alone no shared windows (the run
/// goes on with every rank its own node, after a warning naming the fix), with `osc rdma` over
/// TCP no windows at all (a clear error on every rank, exit 1). Before the start-up probes both
/// aborted in MPI's error handler (`MPI_ERR_INTERN`, `MPI_ERR_WIN`).
#[test]
fn windows_this_mpi_cannot_make_are_a_warning_or_a_clear_error() {
    if common::mpich() {
        return;
    }
    let rma = ["selftest", "rma", "--rows", "2000", "--rounds", "10"];
    let o = mpirun_env(3, 90, &["OMPI_MCA_osc=ucx"], &rma);
    assert_eq!(o.code, 0, "{}", o.all());
    assert!(o.stdout.contains("fetched rows verified"), "{}", o.all());
    assert!(o.stderr.contains("--mca osc ucx,sm"), "{}", o.all());
    let tcp = [
        "OMPI_MCA_osc=rdma",
        "OMPI_MCA_pml=ob1",
        "OMPI_MCA_btl=tcp,self",
    ];
    let o = mpirun_env(2, 90, &tcp, &rma);
    assert_eq!(o.code, 1, "{}", o.all());
    assert!(
        o.stderr.contains("MPI_Win_allocate fails on this MPI") && !o.stderr.contains("MPI_ERR"),
        "{}",
        o.all()
    );
}

#[test]
fn exchanges_split_into_rounds_deliver_everything() {
    // 64-byte rounds force every all-to-all to take many rounds; the load must be unchanged.
    let d = tmp();
    let g = p(d.path(), "ring.h5");
    assert_eq!(
        run(
            30,
            &["generate", "shape", "ring", "--nodes", "500", "-o", s(&g)]
        )
        .code,
        0
    );
    let out = mpirun_env(
        3,
        90,
        &["GRAPHSCALE_A2A_ROUND_BYTES=64"],
        &["info", "--graph", s(&g), "--json"],
    );
    assert_eq!(out.code, 0, "{}", out.all());
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["adjacency_entries"], 1000);
    assert_eq!(v["min_degree"], 2);
    assert_eq!(v["max_degree"], 2);
}

#[test]
fn a_rank_that_stops_or_panics_ends_the_job() {
    for mode in ["hang", "panic"] {
        let t = Instant::now();
        let o = mpirun(
            3,
            60,
            &["selftest", mode, "--fail-rank", "1", "--comm-timeout", "3"],
        );
        let secs = t.elapsed().as_secs_f64();
        assert_ne!(o.code, 0, "{mode}: {}", o.all());
        assert_ne!(o.code, 124, "{mode}: the job hung");
        assert!(secs < 30.0, "{mode}: took {secs:.1} s");
        let want = if mode == "hang" {
            "did not complete within --comm-timeout"
        } else {
            "rank 1 panicked"
        };
        assert!(o.all().contains(want), "{mode}: {}", o.all());
    }
}

/// A trained run: its Micro-F1, the remote rows its ranks read, and its output.
struct Trained {
    f1: f64,
    remote_rows: u64,
    out: Out,
}

/// DeepWalk (or `extra`'s model) on `ranks` (under `mpirun` with `env` when more than one),
/// scored on the labels.
fn train_and_score(
    ranks: usize,
    g: &std::path::Path,
    l: &std::path::Path,
    dir: &std::path::Path,
    env: &[&str],
    extra: &[&str],
) -> Trained {
    let emb = p(dir, "emb.h5");
    let metrics = p(dir, "metrics.jsonl");
    let args = with_model(walk_args(s(g), s(&emb), s(&metrics)), extra);
    let o = if ranks == 1 {
        run(240, &args)
    } else {
        mpirun_env(ranks, 240, env, &args)
    };
    assert_eq!(o.code, 0, "{}", o.all());
    assert!(
        o.stderr.contains("pairs/s"),
        "prints the metrics summary: {}",
        o.stderr
    );
    let remote_rows = std::fs::read_to_string(&metrics)
        .expect("metrics")
        .lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).expect("json line");
            v["remote_rows"].as_u64().expect("remote_rows")
        })
        .sum();
    Trained {
        f1: micro_f1(&emb, l),
        remote_rows,
        out: o,
    }
}

#[test]
fn deepwalk_classifies_planted_blocks_at_1_2_and_4_ranks() {
    let d = tmp();
    let (g, l) = sbm(d.path(), 1500, 5);
    for ranks in [1, 2, 4] {
        let f1 = train_and_score(ranks, &g, &l, d.path(), &[], &[]).f1;
        assert!(f1 >= 0.9, "Micro-F1 {f1} at {ranks} ranks");
    }
}

#[test]
fn node2vec_line_and_reduced_precision_train_under_mpi() {
    let d = tmp();
    let (g, l) = sbm(d.path(), 1200, 4);
    let cases: [&[&str]; 5] = [
        &["--model", "node2vec", "--p", "0.5", "--q", "2"],
        &[
            "--model",
            "line",
            "--order",
            "2",
            "--line-samples",
            "100",
            "--batch-size",
            "1024",
            "--lr",
            "0.05",
        ],
        &["--dtype", "f16", "--optimizer", "adagrad", "--lr", "0.05"],
        &["--dtype", "bf16", "--partition", "block"],
        &["--shared-negatives", "32", "--max-staleness", "1"],
    ];
    for extra in cases {
        let f1 = train_and_score(3, &g, &l, d.path(), &[], extra).f1;
        assert!(f1 >= 0.9, "{extra:?}: Micro-F1 {f1}");
    }
}

/// Hogwild with node-shared rows: on one node nothing is fetched or pushed; across "nodes"
/// (ranks grouped two by two) only the other node's rows are; either way training works.
#[test]
fn node_shared_rows_are_updated_in_place_and_other_nodes_fetched() {
    let d = tmp();
    let (g, l) = sbm(d.path(), 1200, 4);
    // 3 ranks two per node: rank 2 is alone on its node and must take part all the same.
    // Too little room in /dev/shm (the test hook says 1,000 bytes): private memory, a warning.
    let cases: [(usize, &[&str], &[&str], bool); 5] = [
        (2, &[], &[], false),
        (2, &[], &["--node-memory", "private"], true),
        (4, &["GRAPHSCALE_RANKS_PER_NODE=2"], &[], true),
        (3, &["GRAPHSCALE_RANKS_PER_NODE=2"], &[], true),
        (2, &["GRAPHSCALE_SHM_BYTES=1000"], &[], true),
    ];
    for (i, &(ranks, env, extra, fetches)) in cases.iter().enumerate() {
        let t = train_and_score(ranks, &g, &l, d.path(), env, extra);
        let warned = t.out.stderr.contains("using --node-memory private");
        assert_eq!(
            warned,
            env.iter().any(|e| e.starts_with("GRAPHSCALE_SHM")),
            "case {i}: {}",
            t.out.stderr
        );
        let remote = t.remote_rows;
        assert_eq!(remote > 0, fetches, "case {i}: {remote} remote rows");
        assert!(t.f1 >= 0.9, "case {i}: Micro-F1 {}", t.f1);
    }
}
