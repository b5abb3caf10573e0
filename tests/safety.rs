//! Never lose what a user gave, keep node names end to end, and say the truth: outputs never
//! overwrite inputs, failed writes leave earlier files intact, `--resume` never silently starts
//! over, names travel from `convert --string-ids` to the embeddings, the word2vec export and
//! `eval nodeclf`, and flags that cannot apply are refused.

mod common;
use common::*;

fn edges(dir: &std::path::Path, name: &str, text: &str) -> std::path::PathBuf {
    let f = p(dir, name);
    std::fs::write(&f, text).unwrap();
    f
}

fn convert(input: &std::path::Path, out: &std::path::Path, extra: &[&str]) -> Out {
    let mut a = vec!["convert", s(input), "-o", s(out)];
    a.extend_from_slice(extra);
    run(60, &a)
}

fn small_walks<'a>(g: &'a str, o: &'a str) -> Vec<&'a str> {
    vec![
        "--graph",
        g,
        "-o",
        o,
        "--dim",
        "8",
        "--walks-per-node",
        "2",
        "--walk-length",
        "10",
        "--window",
        "3",
        "--threads",
        "1",
    ]
}

#[test]
fn no_output_overwrites_an_input() {
    let d = tmp();
    let tsv = edges(d.path(), "e.tsv", "0 1\n1 2\n2 0\n");
    // convert onto its own input: refused before the input is opened for writing.
    let o = convert(&tsv, &tsv, &[]);
    assert_eq!(o.code, 1, "{}", o.all());
    assert!(o.stderr.contains("would destroy the input"), "{}", o.all());
    assert_eq!(std::fs::read_to_string(&tsv).unwrap(), "0 1\n1 2\n2 0\n");
    let g = p(d.path(), "g.h5");
    assert_eq!(convert(&tsv, &g, &[]).code, 0);
    let before = std::fs::read(&g).unwrap();
    // train -o the graph, directly and through a symlink.
    let link = p(d.path(), "link.h5");
    std::os::unix::fs::symlink(&g, &link).unwrap();
    for out in [&g, &link] {
        let o = run(60, &small_walks(s(&g), s(out)));
        assert_eq!(o.code, 1, "{}", o.all());
        assert!(
            o.stderr.contains("is the same file as --graph"),
            "{}",
            o.all()
        );
    }
    // --metrics onto the graph, too.
    let emb = p(d.path(), "emb.h5");
    let mut a = small_walks(s(&g), s(&emb));
    a.extend_from_slice(&["--metrics", s(&g)]);
    let o = run(60, &a);
    assert_eq!(o.code, 1, "{}", o.all());
    assert!(o.stderr.contains("--metrics"), "{}", o.all());
    assert_eq!(std::fs::read(&g).unwrap(), before, "the graph was changed");
    // export onto its embeddings.
    assert_eq!(run(60, &small_walks(s(&g), s(&emb))).code, 0);
    let o = run(
        60,
        &[
            "export",
            "--embeddings",
            s(&emb),
            "--format",
            "npy",
            "-o",
            s(&emb),
        ],
    );
    assert_eq!(o.code, 1, "{}", o.all());
    assert!(o.stderr.contains("would destroy the input"), "{}", o.all());
    // A directory as -o.
    let o = convert(&tsv, d.path(), &[]);
    assert_eq!(o.code, 1, "{}", o.all());
    assert!(o.stderr.contains("is a directory"), "{}", o.all());
}

#[test]
fn a_failed_run_leaves_the_earlier_output_intact() {
    let d = tmp();
    let good = edges(d.path(), "good.tsv", "0 1\n1 2\n2 0\n");
    let bad = edges(d.path(), "bad.tsv", "0 1\nnot an edge line\n");
    let g = p(d.path(), "g.h5");
    assert_eq!(convert(&good, &g, &[]).code, 0);
    let before = std::fs::read(&g).unwrap();
    let o = convert(&bad, &g, &[]);
    assert_eq!(o.code, 1, "{}", o.all());
    assert!(o.stderr.contains("bad.tsv:2"), "{}", o.all());
    assert!(o.stderr.contains("unchanged"), "{}", o.all());
    assert_eq!(
        std::fs::read(&g).unwrap(),
        before,
        "a failed convert replaced the file"
    );
    let leftovers: Vec<_> = std::fs::read_dir(d.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains("partial"))
        .collect();
    assert!(leftovers.is_empty(), "partial files left: {leftovers:?}");
    // An unwritable --metrics directory is found before training, and no embeddings appear.
    let emb = p(d.path(), "emb.h5");
    let mut a = small_walks(s(&g), s(&emb));
    a.extend_from_slice(&["--metrics", "/nonexistent-dir/m.jsonl"]);
    let o = run(60, &a);
    assert_eq!(o.code, 1, "{}", o.all());
    assert!(o.stderr.contains("no such directory"), "{}", o.all());
    assert!(!o.stderr.contains("pairs/s"), "trained first: {}", o.all());
    assert!(!emb.exists());
}

#[test]
fn resume_never_starts_over_silently_and_never_rotates_another_runs_checkpoints() {
    let d = tmp();
    let (g, _) = sbm(d.path(), 200, 2);
    let emb = p(d.path(), "emb.h5");
    let ck = p(d.path(), "ck");
    // A mistyped --resume: an error before anything is loaded.
    let mut a = small_walks(s(&g), s(&emb));
    a.extend_from_slice(&["--resume", s(&ck)]);
    let o = run(60, &a);
    assert_eq!(o.code, 1, "{}", o.all());
    assert!(o.stderr.contains("no such directory"), "{}", o.all());
    assert!(o.stderr.contains("--resume-if-present"), "{}", o.all());
    // --resume-if-present starts fresh and checkpoints.
    let mut a = small_walks(s(&g), s(&emb));
    a.extend_from_slice(&[
        "--checkpoint-dir",
        s(&ck),
        "--checkpoint-every",
        "5",
        "--resume-if-present",
        s(&ck),
    ]);
    let o = run(60, &a);
    assert_eq!(o.code, 0, "{}", o.all());
    assert!(o.stderr.contains("no committed checkpoint"), "{}", o.all());
    let latest = std::fs::read_to_string(ck.join("LATEST")).unwrap();
    // An empty directory given to --resume: an error too.
    let empty = p(d.path(), "empty");
    std::fs::create_dir(&empty).unwrap();
    let mut b = small_walks(s(&g), s(&emb));
    b.extend_from_slice(&["--resume", s(&empty)]);
    let o = run(60, &b);
    assert_eq!(o.code, 1, "{}", o.all());
    assert!(
        o.stderr.contains("holds no committed checkpoint"),
        "{}",
        o.all()
    );
    // A new run pointed at the old run's directory without resuming it: refused, untouched.
    let mut c = small_walks(s(&g), s(&emb));
    c.extend_from_slice(&["--checkpoint-dir", s(&ck), "--checkpoint-every", "5"]);
    let o = run(60, &c);
    assert_eq!(o.code, 1, "{}", o.all());
    assert!(
        o.stderr.contains("another run's checkpoints"),
        "{}",
        o.all()
    );
    assert_eq!(std::fs::read_to_string(ck.join("LATEST")).unwrap(), latest);
    // Resuming it is fine.
    let o = run(60, &a);
    assert_eq!(o.code, 0, "{}", o.all());
    assert!(o.stderr.contains("resuming from checkpoint"), "{}", o.all());
}

/// Named nodes from `convert --string-ids` are in the embeddings (`node_names`), the word2vec
/// export's keys and the labels `eval nodeclf` reads.
#[test]
fn node_names_travel_from_convert_to_embeddings_export_and_eval() {
    let d = tmp();
    // Two cliques of named nodes, joined by one edge.
    let a: Vec<String> = (0..8).map(|i| format!("alice{i}")).collect();
    let b: Vec<String> = (0..8).map(|i| format!("bob{i}")).collect();
    let mut text = String::new();
    for grp in [&a, &b] {
        for i in 0..grp.len() {
            for j in i + 1..grp.len() {
                text += &format!("{}\t{}\n", grp[i], grp[j]);
            }
        }
    }
    text += "alice0\tbob0\n";
    let tsv = edges(d.path(), "named.tsv", &text);
    let g = p(d.path(), "g.h5");
    assert_eq!(convert(&tsv, &g, &["--string-ids"]).code, 0);
    let emb = p(d.path(), "emb.h5");
    let o = run(60, &small_walks(s(&g), s(&emb)));
    assert_eq!(o.code, 0, "{}", o.all());
    let f = hdf5::File::open(&emb).unwrap();
    let names: Vec<hdf5::types::VarLenUnicode> =
        f.dataset("node_names").unwrap().read_raw().unwrap();
    let names: Vec<String> = names.iter().map(|n| n.as_str().to_string()).collect();
    assert_eq!(names.len(), 16);
    assert_eq!(names[0], "alice0", "row 0 is the first name seen");
    // word2vec keys are the names.
    let w2v = p(d.path(), "emb.txt");
    let o = run(
        60,
        &[
            "export",
            "--embeddings",
            s(&emb),
            "--format",
            "word2vec",
            "-o",
            s(&w2v),
        ],
    );
    assert_eq!(o.code, 0, "{}", o.all());
    let text = std::fs::read_to_string(&w2v).unwrap();
    let keys: Vec<&str> = text
        .lines()
        .skip(1)
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    assert_eq!(keys, names.iter().map(String::as_str).collect::<Vec<_>>());
    // Labels by name.
    let mut labels = String::new();
    for n in &a {
        labels += &format!("{n}\tA\n");
    }
    for n in &b {
        labels += &format!("{n}\tB\n");
    }
    let lab = edges(d.path(), "labels.tsv", &labels);
    let args = [
        "eval",
        "nodeclf",
        "--embeddings",
        s(&emb),
        "--labels",
        s(&lab),
        "--train-fractions",
        "0.5",
        "--repeats",
        "2",
        "--json",
    ];
    let o = run(60, &args);
    assert_eq!(o.code, 0, "{}", o.all());
    // An unknown name is an error naming it.
    let lab2 = edges(d.path(), "labels2.tsv", "carol\tA\n");
    let mut args2 = args;
    args2[5] = s(&lab2);
    let o = run(60, &args2);
    assert_eq!(o.code, 1, "{}", o.all());
    assert!(
        o.stderr.contains("labels2.tsv:1") && o.stderr.contains("'carol'"),
        "{}",
        o.all()
    );
}

#[test]
fn sparse_integer_ids_are_refused_with_the_count_or_kept_on_request() {
    let d = tmp();
    let tsv = edges(d.path(), "sparse.tsv", "1 1000000\n2 3\n");
    let g = p(d.path(), "g.h5");
    let o = convert(&tsv, &g, &[]);
    assert_eq!(o.code, 1, "{}", o.all());
    assert!(
        o.stderr.contains("999997 of the 1000001 rows"),
        "{}",
        o.all()
    );
    assert!(o.stderr.contains("--string-ids"), "{}", o.all());
    assert!(!g.exists());
    let o = convert(&tsv, &g, &["--keep-isolated"]);
    assert_eq!(o.code, 0, "{}", o.all());
    assert!(
        o.stdout.contains("999997 of the 1000001 rows have no edge"),
        "{}",
        o.all()
    );
    // --string-ids: four dense rows, the ids kept as names.
    let o = convert(&tsv, &g, &["--string-ids"]);
    assert_eq!(o.code, 0, "{}", o.all());
    assert!(o.stdout.contains(": 4 nodes"), "{}", o.all());
}

#[test]
fn flags_that_cannot_apply_and_negative_numbers_are_refused_clearly() {
    let d = tmp();
    let (g, _) = sbm(d.path(), 100, 2);
    let emb = p(d.path(), "emb.h5");
    for (extra, want) in [
        (vec!["--lr", "-1"], "--lr must be a positive number"),
        (vec!["--negatives", "0"], "--negatives must be at least 1"),
        (
            vec!["--model", "line", "--walk-length", "5"],
            "--walk-length does not apply to --model line",
        ),
        (
            vec!["--order", "1"],
            "--order does not apply to --model deepwalk",
        ),
    ] {
        let mut a = vec!["--graph", s(&g), "-o", s(&emb)];
        a.extend_from_slice(&extra);
        let o = run(60, &a);
        assert_eq!(o.code, 1, "{extra:?}: {}", o.all());
        assert!(o.stderr.contains(want), "{extra:?}: {}", o.all());
    }
    // plan refuses the models it does not model instead of printing a DeepWalk plan.
    let o = run(
        30,
        &[
            "plan", "--nodes", "1e6", "--edges", "1e7", "--model", "complex",
        ],
    );
    assert_eq!(o.code, 1, "{}", o.all());
    assert!(o.stderr.contains("not --model complex"), "{}", o.all());
    // `train` without --graph is a usage error (exit 2), as documented.
    let o = run(30, &["train"]);
    assert_eq!(o.code, 2, "{}", o.all());
    // --version names the commit, the MPI library and HDF5.
    let o = run(30, &["--version"]);
    assert_eq!(o.code, 0, "{}", o.all());
    for w in ["commit", "MPI:", "HDF5:"] {
        assert!(o.stdout.contains(w), "{w}: {}", o.all());
    }
    // Help gives the defaults of the training flags.
    let o = run(30, &["train", "--help"]);
    for w in ["default 128", "default 80", "default 10", "default 5"] {
        assert!(o.stdout.contains(w), "{w}: {}", o.stdout);
    }
    // The MPI flags belong to the commands that run as a job; serial ones neither list nor
    // take them.
    for c in [
        "convert", "generate", "export", "split", "reorder", "report",
    ] {
        let o = run(30, &[c, "--help"]);
        assert_eq!(o.code, 0, "{c}: {}", o.all());
        assert!(!o.stdout.contains("--comm-timeout"), "{c}: {}", o.stdout);
        assert!(!o.stdout.contains("--ranks"), "{c}: {}", o.stdout);
    }
    let o = run(30, &["eval", "nodeclf", "--help"]);
    assert!(!o.stdout.contains("--comm-timeout"), "{}", o.stdout);
    let o = run(30, &["convert", s(&g), "-o", s(&emb), "--ranks", "2"]);
    assert_eq!(o.code, 2, "{}", o.all());
    for c in [&["train"][..], &["info"], &["eval", "kg"]] {
        let o = run(30, &[c, &["--help"]].concat());
        assert!(o.stdout.contains("--comm-timeout"), "{c:?}: {}", o.stdout);
    }
}

/// A usage error under mpirun prints its message every time (rank 0 prints; the others wait
/// for it before they exit), and the job exits 2.
#[test]
fn usage_errors_print_once_under_mpirun_every_time() {
    for _ in 0..3 {
        let o = mpirun(3, 60, &["--dimm", "8"]);
        assert_eq!(o.code, 2, "{}", o.all());
        assert_eq!(
            o.stderr.matches("unexpected argument '--dimm'").count(),
            1,
            "{}",
            o.all()
        );
    }
}

/// LINE on a graph too sparse for its samples per edge says so (Cora's defaults train 195
/// samples per node and score Micro-F1 38 against DeepWalk's 80), and is quiet when they suffice.
#[test]
fn line_warns_when_its_samples_cannot_train_the_graph() {
    let d = tmp();
    let (g, _) = sbm(d.path(), 100, 2);
    let emb = p(d.path(), "emb.h5");
    for (samples, warned) in [("1", true), ("2000", false)] {
        let a = [
            "--graph",
            s(&g),
            "-o",
            s(&emb),
            "--model",
            "line",
            "--dim",
            "8",
            "--threads",
            "1",
            "--line-samples",
            samples,
        ];
        let o = run(120, &a);
        assert_eq!(o.code, 0, "{}", o.all());
        assert_eq!(
            o.stderr.contains("too few to train a graph this sparse"),
            warned,
            "--line-samples {samples}: {}",
            o.stderr
        );
    }
}

/// Slurm's warning signal: SIGUSR1 to mpirun (forwarded to every rank) makes the job commit a
/// checkpoint at its next step and stop with exit code 4, writing no embeddings.
#[test]
fn a_signal_checkpoints_and_stops_the_job() {
    let d = tmp();
    let (g, _) = sbm(d.path(), 2000, 4);
    let (emb, ck) = (p(d.path(), "emb.h5"), p(d.path(), "ck"));
    let mut child = launcher(2, &[])
        .args(["--graph", s(&g), "-o", s(&emb)])
        .args(["--dim", "16", "--walks-per-node", "400", "--threads", "1"])
        .args(["--checkpoint-dir", s(&ck), "--checkpoint-every", "100000"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("mpirun");
    let t0 = std::time::Instant::now();
    // The ranks catch the signal once the checkpoint directory exists (made just after).
    while !ck.exists() && t0.elapsed().as_secs() < 60 && child.try_wait().unwrap().is_none() {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let pid = child.id().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-USR1", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed().as_secs() > 120 {
            let _ = child.kill();
            panic!("the job did not stop after SIGUSR1");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    // Every rank exits 4. Hydra before MPICH 4.2 may report 0 for a job it forwarded a
    // signal to: it keeps the status of a rank it reaped before the last rank's output
    // closed and sets the others to 0 (docs/running.md, "MPI libraries and launchers").
    let codes: &[i32] = if mpich() { &[4, 0] } else { &[4] };
    assert!(
        status.code().is_some_and(|c| codes.contains(&c)),
        "{status:?}: {err}"
    );
    assert!(err.contains("stopped by a signal"), "{err}");
    assert!(ck.join("LATEST").exists(), "{err}");
    assert!(!emb.exists(), "embeddings of a stopped run were written");
}

/// A disk that fills (here a file-size limit, `ulimit -f`, which fails writes as a full disk
/// does) fails the command naming the file, removes the partial output and leaves the earlier
/// file; a training run whose embeddings cannot be written exits non-zero with none left.
#[test]
fn a_full_disk_fails_the_write_and_keeps_the_earlier_file() {
    let d = tmp();
    let mut text = String::new();
    for i in 0..60_000u64 {
        text.push_str(&format!("{} {}\n", i % 20_000, (i * 7919 + 13) % 20_000));
    }
    let big = edges(d.path(), "big.tsv", &text);
    let small = edges(d.path(), "small.tsv", "0 1\n1 2\n2 0\n");
    let g = p(d.path(), "g.h5");
    assert_eq!(convert(&small, &g, &[]).code, 0);
    let before = std::fs::read(&g).unwrap();
    // 64 KiB of file at most; SIGXFSZ ignored so that the write fails with an error.
    let limited = |args: &[&str]| -> Out {
        let mut c = std::process::Command::new("timeout");
        c.args(["-k", "5", "120", "bash", "-c"])
            .arg(format!("trap '' XFSZ; ulimit -f 64; exec {BIN} \"$@\""))
            .arg("graphscale")
            .args(args);
        let o = c.output().unwrap();
        Out {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    };
    let o = limited(&["convert", s(&big), "-o", s(&g)]);
    assert_eq!(o.code, 1, "{}", o.all());
    assert!(o.stderr.contains("g.h5"), "{}", o.all());
    assert!(o.stderr.contains("unchanged"), "{}", o.all());
    assert_eq!(
        std::fs::read(&g).unwrap(),
        before,
        "the earlier graph changed"
    );
    let partial = |dir: &std::path::Path| {
        std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .any(|e| e.file_name().to_string_lossy().contains("partial"))
    };
    assert!(!partial(d.path()), "a partial file was left");
    // Embeddings of 20,000 rows x 8 f32 (640 KB) do not fit in 64 KiB.
    let g2 = p(d.path(), "g2.h5");
    assert_eq!(convert(&big, &g2, &[]).code, 0);
    let emb = p(d.path(), "emb.h5");
    let o = limited(&small_walks(s(&g2), s(&emb)));
    assert_ne!(o.code, 0, "{}", o.all());
    assert!(o.stderr.contains("emb.h5"), "{}", o.all());
    assert!(!emb.exists(), "embeddings appeared");
    assert!(!partial(d.path()), "a partial file was left");
}
