//! Failure behaviour and checkpoints: injected faults end the whole job in bounded time, a killed
//! run resumes from its last committed checkpoint to the quality of an uninterrupted run,
//! checkpoints re-shard across rank counts exactly, and damaged or foreign checkpoints are
//! skipped or refused with a message.

mod common;

use common::*;
use std::path::Path;
use std::time::Instant;

fn train_args<'a>(g: &'a str, out: &'a str) -> Vec<&'a str> {
    vec![
        "--graph",
        g,
        "--dim",
        "32",
        "--walks-per-node",
        "6",
        "--walk-length",
        "20",
        "--window",
        "5",
        "-o",
        out,
        "--comm-timeout",
        "10",
    ]
}

/// [`train_args`] with every rank its own node (rows cached across ranks) and small steps.
fn simulated_nodes_args<'a>(g: &'a str, out: &'a str) -> Vec<&'a str> {
    let mut args = train_args(g, out);
    args.extend_from_slice(&["--ranks-per-node", "1", "--batch-size", "2048"]);
    args
}

fn rows(path: &Path) -> Vec<f32> {
    let f = hdf5::File::open(path).expect("open embeddings");
    f.dataset("embeddings")
        .and_then(|d| d.read_raw::<f32>())
        .expect("read embeddings")
}

#[test]
fn every_injected_fault_ends_the_job_within_the_timeout() {
    let d = tmp();
    let (g, _) = sbm(d.path(), 600, 4);
    let out = p(d.path(), "emb.h5");
    for kind in ["panic", "exit", "hang", "kill"] {
        let fault = format!("rank=1,step=5,kind={kind}");
        let mut args = train_args(s(&g), s(&out));
        args.extend_from_slice(&["--inject-fault", &fault]);
        let t = Instant::now();
        let o = mpirun(3, 90, &args);
        let secs = t.elapsed().as_secs_f64();
        assert_ne!(o.code, 0, "{kind}: {}", o.all());
        assert_ne!(o.code, 124, "{kind}: the job hung: {}", o.all());
        // --comm-timeout (10 s) plus launch, load and teardown.
        assert!(
            secs < 10.0 + 20.0,
            "{kind}: the job took {secs:.1} s to end"
        );
        let all = o.all();
        let named = match kind {
            "panic" => all.contains("rank 1") && all.contains("injected fault at step 5"),
            // mpirun reports the dead process; our ranks report the stalled collective.
            "kill" => all.contains("rank 1") && all.contains("signal 9"),
            "hang" => all.contains("did not complete within --comm-timeout"),
            _ => all.contains("rank 1"),
        };
        assert!(named, "{kind}: the failure is not explained: {all}");
    }
}

#[test]
fn a_killed_run_resumes_from_its_last_checkpoint_to_full_quality() {
    let d = tmp();
    let (g, labels) = sbm(d.path(), 2000, 10);
    // An uninterrupted run for reference.
    let full = p(d.path(), "full.h5");
    let o = mpirun(4, 120, &train_args(s(&g), s(&full)));
    assert_eq!(o.code, 0, "{}", o.all());
    let reference = micro_f1(&full, &labels);
    assert!(reference >= 0.9, "uninterrupted Micro-F1 {reference}");

    for seed in 0..10u64 {
        let ck = p(d.path(), &format!("ck{seed}"));
        let out = p(d.path(), &format!("emb{seed}.h5"));
        // A random rank dies at a random step (SIGKILL: no chance to clean up).
        let rank = seed % 4;
        let step = 12 + (seed * 7919) % 90;
        let fault = format!("rank={rank},step={step},kind=kill");
        let seed_s = seed.to_string();
        let mut args = train_args(s(&g), s(&out));
        // Small steps: each rank of the node walks whole walks (node-shared rows), so the
        // default batch would end the run before the later fault steps.
        args.extend_from_slice(&[
            "--batch-size",
            "2048",
            "--seed",
            &seed_s,
            "--checkpoint-dir",
            s(&ck),
            "--checkpoint-every",
            "4",
        ]);
        let mut killed = args.clone();
        killed.extend_from_slice(&["--inject-fault", &fault]);
        let t = Instant::now();
        let o = mpirun(4, 120, &killed);
        assert_ne!(
            o.code,
            0,
            "seed {seed}: a killed run must fail: {}",
            o.all()
        );
        assert_ne!(o.code, 124, "seed {seed}: the job hung: {}", o.all());
        assert!(t.elapsed().as_secs() < 40, "seed {seed}: slow to end");
        assert!(!out.exists(), "seed {seed}: a killed run wrote output");
        assert!(
            ck.join("LATEST").exists(),
            "seed {seed}: nothing committed before step {step}"
        );

        let mut resumed = args.clone();
        resumed.extend_from_slice(&["--resume", s(&ck)]);
        let o = mpirun(4, 120, &resumed);
        assert_eq!(o.code, 0, "seed {seed}: {}", o.all());
        assert!(
            o.stderr.contains("resuming from checkpoint version"),
            "{}",
            o.stderr
        );
        let f1 = micro_f1(&out, &labels);
        assert!(
            f1 >= reference - 0.03,
            "seed {seed}: resumed Micro-F1 {f1} vs uninterrupted {reference}"
        );
    }
}

#[test]
fn checkpoints_reshard_exactly_across_rank_counts() {
    let d = tmp();
    let (g, _) = sbm(d.path(), 500, 5);
    let ck = p(d.path(), "ck");
    let first = p(d.path(), "first.h5");
    let mut args = train_args(s(&g), s(&first));
    args.extend_from_slice(&[
        "--checkpoint-dir",
        s(&ck),
        "--checkpoint-every",
        "10",
        "--optimizer",
        "adagrad",
    ]);
    let o = mpirun(4, 120, &args);
    assert_eq!(o.code, 0, "{}", o.all());
    // The final state is committed: resuming it trains nothing more and writes the same rows,
    // whatever the number of ranks (4 -> 2 -> 3, via the in-process transport too).
    let saved = rows(&first);
    for (how, n) in [("mpi", 2), ("mpi", 3), ("local", 3)] {
        let out = p(d.path(), &format!("{how}{n}.h5"));
        let mut a = train_args(s(&g), s(&out));
        a.extend_from_slice(&["--optimizer", "adagrad", "--resume", s(&ck)]);
        let o = if how == "mpi" {
            mpirun(n, 120, &a)
        } else {
            let ranks = n.to_string();
            a.extend_from_slice(&["--ranks", &ranks]);
            run(120, &a)
        };
        assert_eq!(o.code, 0, "{how} {n}: {}", o.all());
        assert_eq!(rows(&out), saved, "{how} {n}: re-sharded rows differ");
    }
    // And from 2 ranks to 3.
    let ck2 = p(d.path(), "ck2");
    let second = p(d.path(), "second.h5");
    let mut args = train_args(s(&g), s(&second));
    args.extend_from_slice(&["--checkpoint-dir", s(&ck2), "--checkpoint-every", "10"]);
    let o = mpirun(2, 120, &args);
    assert_eq!(o.code, 0, "{}", o.all());
    let out = p(d.path(), "from2.h5");
    let mut a = train_args(s(&g), s(&out));
    a.extend_from_slice(&["--resume", s(&ck2)]);
    let o = mpirun(3, 120, &a);
    assert_eq!(o.code, 0, "2 -> 3: {}", o.all());
    assert_eq!(rows(&out), rows(&second), "2 -> 3: re-sharded rows differ");
}

/// Batched updates are reproducible at any thread count (node-shared rows are read in place
/// then); hogwild ones (like word2vec's) only with one thread per rank, private rows and no
/// remote-row cache, since threads, with node-shared rows the node's ranks, and with the cache
/// the exchange that overlaps the pool's batch, race on rows.
#[test]
fn a_seed_reproduces_a_run_at_a_fixed_rank_count() {
    let d = tmp();
    let (g, _) = sbm(d.path(), 400, 4);
    for (update, threads, memory, cache) in [
        ("batched", "2", "shared", "0"),
        ("hogwild", "1", "private", "0"),
    ] {
        let outs: Vec<_> = ["a", "b", "c", "d"]
            .iter()
            .map(|n| p(d.path(), &format!("{update}-{n}.h5")))
            .collect();
        // The fourth run keeps its rows in memory-mapped files (--mmap-rows).
        let maps = p(d.path(), "maps");
        std::fs::create_dir(&maps).unwrap();
        for (i, (out, seed)) in outs.iter().zip(["7", "7", "8", "7"]).enumerate() {
            let mut a = train_args(s(&g), s(out));
            a.extend_from_slice(&["--seed", seed, "--threads", threads, "--update", update]);
            let memory = if i == 3 { "private" } else { memory };
            a.extend_from_slice(&["--node-memory", memory, "--cache-rows", cache]);
            if i == 3 {
                a.extend_from_slice(&["--mmap-rows", s(&maps)]);
            }
            let o = mpirun(2, 120, &a);
            assert_eq!(o.code, 0, "{}", o.all());
            if i == 3 {
                assert!(o.stderr.contains("--mmap-rows"), "{}", o.stderr);
            }
        }
        assert_eq!(
            rows(&outs[0]),
            rows(&outs[1]),
            "{update}: the same seed gave different rows"
        );
        if memory == "private" {
            // Rows in files train exactly as rows in memory.
            assert_eq!(
                rows(&outs[0]),
                rows(&outs[3]),
                "{update}: memory-mapped rows trained differently"
            );
        }
        // One rank alone maps its rows too (no window over them: nobody reads them).
        if memory == "private" {
            let out = p(d.path(), "one.h5");
            let mut a = train_args(s(&g), s(&out));
            a.extend_from_slice(&["--threads", threads, "--mmap-rows", s(&maps)]);
            let o = mpirun(1, 120, &a);
            assert_eq!(o.code, 0, "{}", o.all());
        }
        // The files were unlinked once mapped.
        assert_eq!(std::fs::read_dir(&maps).unwrap().count(), 0);
        std::fs::remove_dir(&maps).unwrap();
        assert_ne!(
            rows(&outs[0]),
            rows(&outs[2]),
            "{update}: another seed gave the same rows"
        );
    }
}

#[test]
fn clipping_keeps_a_too_large_learning_rate_finite() {
    let d = tmp();
    let (g, _) = sbm(d.path(), 400, 4);
    let out = p(d.path(), "emb.h5");
    let mut a = train_args(s(&g), s(&out));
    // Batched, as clipping is: in place, rates above word2vec's take implicit steps, which
    // stay finite (tests/learning.rs).
    a.extend_from_slice(&["--lr", "50", "--update", "batched"]);
    let o = run(60, &a);
    assert_ne!(
        o.code,
        0,
        "lr 50 was expected to diverge without clipping: {}",
        o.all()
    );
    a.extend_from_slice(&["--clip-grad", "0.01"]);
    let o = run(60, &a);
    assert_eq!(o.code, 0, "{}", o.all());
    assert!(rows(&out).iter().all(|x| x.is_finite()));
}

#[test]
fn damaged_uncommitted_and_foreign_checkpoints() {
    let d = tmp();
    let (g, _) = sbm(d.path(), 400, 4);
    let ck = p(d.path(), "ck");
    let out = p(d.path(), "emb.h5");
    let mut args = train_args(s(&g), s(&out));
    args.extend_from_slice(&[
        "--checkpoint-dir",
        s(&ck),
        "--checkpoint-every",
        "5",
        "--ranks",
        "2",
    ]);
    let o = run(120, &args);
    assert_eq!(o.code, 0, "{}", o.all());
    let latest: u64 = std::fs::read_to_string(ck.join("LATEST"))
        .expect("LATEST")
        .trim()
        .parse()
        .expect("number");
    let vdir = |v: u64| ck.join(format!("v{v:08}"));
    assert!(vdir(latest).exists() && vdir(latest - 1).exists());
    assert!(!vdir(latest - 2).exists(), "old versions are pruned");

    // A crash between the shard writes and the commit leaves a newer, uncommitted directory.
    std::fs::create_dir_all(vdir(latest + 1)).expect("mkdir");
    std::fs::copy(
        vdir(latest).join("shard-00000.h5"),
        vdir(latest + 1).join("shard-00000.h5"),
    )
    .expect("copy");
    let mut resume = train_args(s(&g), s(&out));
    resume.extend_from_slice(&["--resume", s(&ck), "--ranks", "2"]);
    let o = run(120, &resume);
    assert_eq!(o.code, 0, "{}", o.all());
    assert!(
        o.stderr
            .contains(&format!("resuming from checkpoint version {latest} ")),
        "{}",
        o.stderr
    );

    // A damaged shard in the newest version: the previous version is used, loudly.
    let shard = vdir(latest).join("shard-00001.h5");
    let mut bytes = std::fs::read(&shard).expect("read shard");
    let n = bytes.len();
    for b in &mut bytes[n / 2..n / 2 + 64] {
        *b ^= 0x5a;
    }
    std::fs::write(&shard, bytes).expect("write shard");
    let o = run(120, &resume);
    assert_eq!(o.code, 0, "{}", o.all());
    assert!(o.stderr.contains("unusable"), "{}", o.stderr);
    assert!(
        o.stderr
            .contains(&format!("resuming from checkpoint version {} ", latest - 1)),
        "{}",
        o.stderr
    );

    // Another run's settings: refused, naming what differs.
    let mut foreign = resume.clone();
    let at = foreign.iter().position(|a| *a == "--dim").expect("--dim") + 1;
    foreign[at] = "16";
    let o = run(120, &foreign);
    assert_eq!(o.code, 1, "{}", o.all());
    assert!(
        o.stderr.contains("dim: checkpoint 32, this run 16"),
        "{}",
        o.stderr
    );
}

#[test]
fn on_nan_skip_drops_batches_and_finishes() {
    let d = tmp();
    let (g, _) = sbm(d.path(), 300, 3);
    let out = p(d.path(), "emb.h5");
    let m = p(d.path(), "m.jsonl");
    let o = run(
        60,
        &[
            "--graph",
            s(&g),
            "--lr",
            "1e30",
            "--walks-per-node",
            "2",
            "--walk-length",
            "10",
            "--dim",
            "8",
            "--on-nan",
            "skip",
            "--update",
            "batched",
            "-o",
            s(&out),
            "--metrics",
            s(&m),
        ],
    );
    assert_eq!(o.code, 0, "{}", o.all());
    let text = std::fs::read_to_string(&m).expect("metrics");
    let skipped: u64 = text
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("json");
            v["skipped_batches"].as_u64().expect("field")
        })
        .sum();
    assert!(skipped > 0, "no batch was skipped: {text}");
}

/// Across simulated nodes (every rank its own node) deltas of cached rows are in flight when a
/// rank dies: the job still ends within the timeout, and a resume from the last checkpoint
/// (which holds only owned rows, every cached delta pushed before it) trains to full quality.
#[test]
fn a_rank_killed_with_cached_deltas_in_flight_ends_the_job_and_resumes() {
    let d = tmp();
    let (g, labels) = sbm(d.path(), 1200, 4);
    let ck = p(d.path(), "ck");
    let out = p(d.path(), "emb.h5");
    let mut args = simulated_nodes_args(s(&g), s(&out));
    args.extend_from_slice(&["--checkpoint-dir", s(&ck), "--checkpoint-every", "4"]);
    for kind in ["kill", "hang"] {
        let fault = format!("rank=2,step=11,kind={kind}");
        let mut killed = args.clone();
        killed.extend_from_slice(&["--inject-fault", &fault]);
        let t = Instant::now();
        let o = mpirun(3, 90, &killed);
        assert_ne!(o.code, 0, "{kind}: {}", o.all());
        assert_ne!(o.code, 124, "{kind}: the job hung: {}", o.all());
        assert!(t.elapsed().as_secs() < 40, "{kind}: slow to end");
        assert!(!out.exists(), "{kind}: a failed run wrote output");
    }
    assert!(
        ck.join("LATEST").exists(),
        "nothing committed before step 11"
    );
    let mut resumed = args.clone();
    resumed.extend_from_slice(&["--resume", s(&ck)]);
    let o = mpirun(3, 120, &resumed);
    assert_eq!(o.code, 0, "{}", o.all());
    assert!(
        o.stderr.contains("resuming from checkpoint version"),
        "{}",
        o.stderr
    );
    let f1 = micro_f1(&out, &labels);
    assert!(f1 >= 0.9, "resumed Micro-F1 {f1}");
}

/// Checkpoints every few steps across simulated nodes leave the walks as they were: the same
/// steps and pairs as the run without them. A checkpoint once handed the walkers in transit to
/// the engine a step early; every rank then started more walkers to fill its share in flight,
/// and each checkpoint added more: 3 simulated nodes took 156 steps instead of 459, and 8 nodes
/// trained to Micro-F1 0.79 instead of 0.98.
#[test]
fn frequent_checkpoints_across_nodes_keep_the_walks_steps() {
    let d = tmp();
    let (g, labels) = sbm(d.path(), 1200, 4);
    let mut runs = Vec::new();
    for every in [None, Some("4")] {
        let out = p(d.path(), "emb.h5");
        let m = p(d.path(), "metrics.jsonl");
        let ck = p(d.path(), "ck");
        let mut args = simulated_nodes_args(s(&g), s(&out));
        args.extend_from_slice(&["--metrics", s(&m)]);
        if let Some(e) = every {
            args.extend_from_slice(&["--checkpoint-dir", s(&ck), "--checkpoint-every", e]);
        }
        let o = mpirun(3, 120, &args);
        assert_eq!(o.code, 0, "{every:?}: {}", o.all());
        let ms = metrics(&m);
        let steps = ms[0]["steps"].as_u64().expect("steps");
        runs.push((steps, sum(&ms, "pairs"), sum(&ms, "checkpoints")));
        let f1 = micro_f1(&out, &labels);
        assert!(f1 >= 0.9, "{every:?}: Micro-F1 {f1}");
    }
    let ((steps, pairs, _), (ck_steps, ck_pairs, written)) = (runs[0], runs[1]);
    assert!(written >= 3 * 20, "checkpoints written: {written}");
    assert_eq!(ck_steps, steps, "steps with checkpoints every 4 steps");
    assert_eq!(ck_pairs, pairs, "pairs with checkpoints every 4 steps");
}
