//! The path between nodes, on one machine: `--ranks-per-node 1` makes every rank its own node, so
//! rows of other ranks are cached, synchronised and pushed as between machines. Every setting of
//! the remote path trains to the same quality and accounts for its bytes exactly; settings that
//! cannot work are refused on every rank before training.

mod common;

use common::*;

/// [`walk_args`] with every rank its own node.
fn args<'a>(g: &'a str, emb: &'a str, m: &'a str) -> Vec<&'a str> {
    let mut a = walk_args(g, emb, m);
    a.extend_from_slice(&["--ranks-per-node", "1"]);
    a
}

#[test]
fn every_remote_path_setting_trains_and_counts_its_bytes() {
    let d = tmp();
    let (g, l) = sbm(d.path(), 1200, 4);
    let (emb, m) = (p(d.path(), "emb.h5"), p(d.path(), "m.jsonl"));
    // (flags, bytes per fetched row of 32 values, one-sided reads). The default wire is int8:
    // a byte per value and a 4-byte scale per row.
    let cases: [(&[&str], u64, bool); 10] = [
        (&[], 36, false),
        (
            &[
                "--model",
                "line",
                "--line-samples",
                "100",
                "--batch-size",
                "1024",
                "--lr",
                "0.05",
            ],
            36,
            false,
        ),
        (&["--wire-dtype", "f32"], 128, false),
        (&["--wire-dtype", "f16"], 64, false),
        (&["--wire-dtype", "bf16", "--cache-refresh", "2"], 64, false),
        // One-sided reads move rows in the storage dtype (f32).
        (&["--fetch", "rma"], 128, true),
        // A cache too small for a batch: evictions, and it grows with a warning.
        (&["--cache-rows", "40"], 36, false),
        // No cache: every batch fetches its rows and pushes their deltas (the earlier path).
        (&["--cache-rows", "0"], 128, true),
        // Rows stored in 16 bits, updated in place by the hogwild kernels: read one-sidedly
        // in their storage dtype, and with the cache (deltas added to f16 cells by owners).
        (&["--dtype", "f16", "--cache-rows", "0"], 64, true),
        (&["--dtype", "bf16"], 36, false),
    ];
    for (i, (extra, row_bytes, one_sided)) in cases.iter().enumerate() {
        let a = with_model(args(s(&g), s(&emb), s(&m)), extra);
        let o = mpirun(3, 240, &a);
        assert_eq!(o.code, 0, "case {i} {extra:?}: {}", o.all());
        let f1 = micro_f1(&emb, &l);
        assert!(f1 >= 0.9, "case {i} {extra:?}: Micro-F1 {f1}");
        let ms = metrics(&m);
        let (rows, fetched) = (sum(&ms, "remote_rows"), sum(&ms, "fetch_bytes"));
        assert!(rows > 0, "case {i}: nothing fetched");
        assert_eq!(fetched, rows * row_bytes, "case {i}: fetch bytes");
        let read = sum(&ms, "one_sided_bytes");
        assert_eq!(read > 0, *one_sided, "case {i}: one-sided bytes {read}");
        let hits = sum(&ms, "cache_hits");
        let no_cache = extra.windows(2).any(|w| w == ["--cache-rows", "0"]);
        if !no_cache {
            // The batches' distinct remote rows (the cache's uses) against those of a random
            // half of their references: at least half of them (a row referenced c times is
            // missed with probability 2^-c), and fewer than all.
            let uses = hits + sum(&ms, "cache_misses") + sum(&ms, "cache_refreshes");
            let half = sum(&ms, "remote_uses_half");
            assert!(
                half < uses && 20 * half >= 9 * uses,
                "case {i}: {half} of {uses} uses"
            );
        }
        match extra.first() {
            _ if no_cache => assert_eq!(hits, 0, "case {i}"),
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

/// With one thread per rank the main thread computes the batches itself (no pool thread runs
/// beside it), so a run across nodes is reproducible: the same command writes the same
/// embeddings bit for bit at 3 ranks as simulated nodes (rows cached and re-read, deltas
/// combined by their owners), for DeepWalk and LINE, over shared memory and over TCP; another
/// seed writes others.
#[test]
fn one_thread_per_rank_runs_are_reproducible_across_nodes() {
    let d = tmp();
    let (g, l) = sbm(d.path(), 1200, 4);
    let m = p(d.path(), "m.jsonl");
    let read = |e: &std::path::Path| -> Vec<u32> {
        let (_, _, v) = graphscale::embeddings::read_embeddings(e).expect("embeddings");
        v.iter().map(|x| x.to_bits()).collect()
    };
    let line: &[&str] = &["--model", "line", "--line-samples", "100", "--lr", "0.05"];
    for (name, extra) in [("deepwalk", &[][..]), ("line", line)] {
        let embs: Vec<_> = (0..3)
            .map(|i| p(d.path(), &format!("{name}{i}.h5")))
            .collect();
        for (e, seed) in embs.iter().zip(["0", "0", "1"]) {
            let mut a = with_model(args(s(&g), s(e), s(&m)), extra);
            a.extend_from_slice(&["--seed", seed]);
            let o = mpirun(3, 240, &a);
            assert_eq!(o.code, 0, "{name}, seed {seed}: {}", o.all());
            let ms = metrics(&m);
            assert!(sum(&ms, "cache_hits") > 0, "{name}: the cache did not run");
        }
        assert!(micro_f1(&embs[0], &l) >= 0.9, "{name}");
        let (a, b, c) = (read(&embs[0]), read(&embs[1]), read(&embs[2]));
        let differ = a.iter().zip(&b).filter(|(x, y)| x != y).count();
        assert_eq!(differ, 0, "{name}: {differ} of {} values differ", a.len());
        assert_ne!(a, c, "{name}: seeds 0 and 1 wrote the same embeddings");
        if name == "deepwalk" && !mpich() {
            // Over TCP (as between machines) the same bits as over shared memory.
            let tcp = [
                "OMPI_MCA_pml=ob1",
                "OMPI_MCA_btl=tcp,self",
                "OMPI_MCA_osc=ucx",
                "UCX_TLS=tcp,self",
            ];
            let mut over = with_model(args(s(&g), s(&embs[2]), s(&m)), extra);
            over.extend_from_slice(&["--seed", "0"]);
            let o = mpirun_env(3, 240, &tcp, &over);
            assert_eq!(o.code, 0, "over TCP: {}", o.all());
            assert!(
                read(&embs[2]) == a,
                "over TCP: other embeddings than over shared memory"
            );
        }
    }
}

#[test]
fn remote_path_settings_that_cannot_work_are_refused_on_every_rank() {
    let d = tmp();
    let (g, _) = sbm(d.path(), 300, 3);
    let (emb, m) = (p(d.path(), "emb.h5"), p(d.path(), "m.jsonl"));
    let cases: [(&[&str], &str); 3] = [
        (
            // Momentum updates through the owner (batched): f32 gradients, not f16.
            &["--wire-dtype", "f16", "--optimizer", "momentum"],
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

/// `graphscale reorder` relabels a graph for `--partition block`: fewer walker crossings and
/// remote rows, the same quality, and embeddings written back in the original ids' order (the
/// labels refer to those).
#[test]
fn a_reordered_graph_trains_with_fewer_crossings_and_original_rows() {
    let d = tmp();
    let (g, l) = sbm(d.path(), 1200, 4);
    let r = p(d.path(), "r.h5");
    let o = run(
        60,
        &[
            "reorder",
            "--graph",
            s(&g),
            "-o",
            s(&r),
            "--parts",
            "2",
            "--json",
        ],
    );
    assert_eq!(o.code, 0, "{}", o.all());
    let rep: serde_json::Value = serde_json::from_str(o.stdout.trim()).expect("json");
    let after = rep["cut_block_after"].as_f64().unwrap();
    assert!(
        after < 0.5 * rep["cut_striped_before"].as_f64().unwrap(),
        "{rep}"
    );
    assert!(
        rep["volume_balance"].as_f64().unwrap() <= 1.05 + 1e-9,
        "{rep}"
    );
    let (emb, m) = (p(d.path(), "emb.h5"), p(d.path(), "m.jsonl"));
    let crossings = |graph: &str, extra: &[&str]| -> (f64, f64) {
        let mut a = args(graph, s(&emb), s(&m));
        a.extend_from_slice(extra);
        let o = mpirun(2, 240, &a);
        assert_eq!(o.code, 0, "{}", o.all());
        let f1 = micro_f1(&emb, &l);
        let ms = metrics(&m);
        (
            sum(&ms, "walker_crossings") as f64 / sum(&ms, "tokens") as f64,
            f1,
        )
    };
    let (before, f1_before) = crossings(s(&g), &[]);
    let (reordered, f1_after) = crossings(s(&r), &["--partition", "block"]);
    assert!(
        f1_before >= 0.9 && f1_after >= 0.9,
        "{f1_before} {f1_after}"
    );
    assert!(
        reordered < 0.6 * before,
        "crossings per token {before} -> {reordered}"
    );
    // A relabelling that is not a permutation is refused, naming the dataset.
    let bad = p(d.path(), "bad.h5");
    std::fs::copy(&r, &bad).unwrap();
    {
        let f = hdf5::File::open_rw(&bad).unwrap();
        f.unlink("original_ids").unwrap();
        f.new_dataset_builder()
            .with_data(&vec![0u64; 1200])
            .create("original_ids")
            .unwrap();
    }
    let mut a = args(s(&bad), s(&emb), s(&m));
    a.extend_from_slice(&["--partition", "block"]);
    let o = mpirun(2, 120, &a);
    assert_ne!(o.code, 0, "{}", o.all());
    assert_ne!(o.code, 124, "hung: {}", o.all());
    assert!(o.stderr.contains("original_ids"), "{}", o.stderr);
}
