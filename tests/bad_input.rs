//! Bad input gets a clear error naming the file and the problem, and a non-zero exit; under
//! mpirun every rank exits non-zero and nothing hangs.

mod common;
use common::*;

use graphscale::graph::{h5, Edge};

fn write_h5(path: &std::path::Path, f: impl FnOnce(&hdf5::File)) {
    let file = hdf5::File::create(path).unwrap();
    f(&file);
}

fn attr(file: &hdf5::File, name: &str, v: u64) {
    file.new_attr::<u64>()
        .create(name)
        .unwrap()
        .write_scalar(&v)
        .unwrap();
}

/// Each case: a file maker and the words the message must contain.
fn cases(dir: &std::path::Path) -> Vec<(std::path::PathBuf, &'static str)> {
    let mut v = Vec::new();
    let missing = p(dir, "nope.h5");
    v.push((missing, "No such file"));

    let not_h5 = p(dir, "text.h5");
    std::fs::write(&not_h5, "0 1\n1 2\n").unwrap();
    v.push((not_h5, "not a readable HDF5 file"));

    let no_dst = p(dir, "no_dst.h5");
    write_h5(&no_dst, |f| {
        f.new_dataset_builder()
            .with_data(&[0u64, 1])
            .create("src")
            .unwrap();
        attr(f, "num_nodes", 2);
    });
    v.push((no_dst, "missing dataset 'dst'"));

    let float_ids = p(dir, "float.h5");
    write_h5(&float_ids, |f| {
        f.new_dataset_builder()
            .with_data(&[0.0f64, 1.0])
            .create("src")
            .unwrap();
        f.new_dataset_builder()
            .with_data(&[1u64, 0])
            .create("dst")
            .unwrap();
        attr(f, "num_nodes", 2);
    });
    v.push((float_ids, "must be unsigned integers"));

    let lengths = p(dir, "lengths.h5");
    write_h5(&lengths, |f| {
        f.new_dataset_builder()
            .with_data(&[0u64, 1, 2])
            .create("src")
            .unwrap();
        f.new_dataset_builder()
            .with_data(&[1u64, 0])
            .create("dst")
            .unwrap();
        attr(f, "num_nodes", 3);
    });
    v.push((lengths, "'src' has 3 entries but 'dst' has 2"));

    let range = p(dir, "range.h5");
    let edges = [(0, 1), (1, 2), (2, 7)].map(|(a, b)| Edge {
        src: a,
        dst: b,
        weight: 1.0,
    });
    h5::write_edges(&range, &edges, 3, false, false).unwrap();
    v.push((range, "dst[2] = 7 is out of range: num_nodes is 3"));

    for (name, w, msg) in [
        ("nan.h5", f32::NAN, "weight[1] = NaN"),
        ("inf.h5", f32::INFINITY, "weight[1] = inf"),
        ("neg.h5", -1.0, "weight[1] = -1"),
    ] {
        let path = p(dir, name);
        let edges = [
            Edge {
                src: 0,
                dst: 1,
                weight: 1.0,
            },
            Edge {
                src: 1,
                dst: 2,
                weight: w,
            },
        ];
        h5::write_edges(&path, &edges, 3, false, true).unwrap();
        v.push((path, msg));
    }

    let empty = p(dir, "empty.h5");
    write_h5(&empty, |f| {
        f.new_dataset::<u64>().shape(0).create("src").unwrap();
        f.new_dataset::<u64>().shape(0).create("dst").unwrap();
        attr(f, "num_nodes", 0);
    });
    v.push((empty, "empty graph"));

    let no_attr = p(dir, "no_attr.h5");
    write_h5(&no_attr, |f| {
        f.new_dataset_builder()
            .with_data(&[0u64])
            .create("src")
            .unwrap();
        f.new_dataset_builder()
            .with_data(&[1u64])
            .create("dst")
            .unwrap();
    });
    v.push((no_attr, "missing root attribute 'num_nodes'"));
    v
}

#[test]
fn bad_graph_files_are_named_and_explained() {
    let d = tmp();
    for (path, want) in cases(d.path()) {
        let o = run(60, &["info", "--graph", s(&path), "--comm-timeout", "20"]);
        assert_eq!(o.code, 1, "{}: {}", path.display(), o.all());
        assert!(
            o.stderr.contains(want),
            "{}: expected '{want}' in: {}",
            path.display(),
            o.stderr
        );
        assert!(
            o.stderr
                .contains(path.file_name().unwrap().to_str().unwrap()),
            "names the file: {}",
            o.stderr
        );
    }
}

#[test]
fn bad_graph_files_end_every_rank_under_mpirun() {
    let d = tmp();
    for (path, want) in cases(d.path()).into_iter().step_by(2) {
        let o = mpirun(
            3,
            90,
            &["info", "--graph", s(&path), "--comm-timeout", "20"],
        );
        assert_ne!(o.code, 0, "{}: {}", path.display(), o.all());
        assert_ne!(o.code, 124, "the job hung: {}", o.all());
        assert!(
            o.stderr.contains(want),
            "{}: expected '{want}' in: {}",
            path.display(),
            o.stderr
        );
        // rank 0 reports once for all ranks
        assert_eq!(
            o.stderr.matches("graphscale: error:").count(),
            1,
            "{}",
            o.stderr
        );
    }
}

#[test]
fn malformed_text_lines_report_file_and_line() {
    let d = tmp();
    let cases = [
        (
            "0 1\n1 2 0.5\n",
            "bad.txt:2:",
            "every line needs the same columns",
        ),
        ("# c\n0 1\nfoo bar\n", "bad.txt:3:", "--string-ids"),
        ("0 1\n2\n", "bad.txt:2:", "one field"),
        ("0 1 x\n", "bad.txt:1:", "not a number"),
        ("# only comments\n", "bad.txt", "no edges found"),
    ];
    for (text, at, want) in cases {
        let f = p(d.path(), "bad.txt");
        std::fs::write(&f, text).unwrap();
        let o = run(30, &["convert", s(&f), "-o", s(&p(d.path(), "o.h5"))]);
        assert_eq!(o.code, 1, "{}", o.all());
        assert!(
            o.stderr.contains(at) && o.stderr.contains(want),
            "{text:?}: {}",
            o.stderr
        );
    }
}

#[test]
fn string_ids_convert_and_keep_names() {
    let d = tmp();
    let f = p(d.path(), "kg.tsv");
    std::fs::write(&f, "alice\tbob\nbob,carol\n% comment\ncarol dave\n").unwrap();
    let out = p(d.path(), "kg.h5");
    let o = run(30, &["convert", s(&f), "-o", s(&out), "--string-ids"]);
    assert_eq!(o.code, 0, "{}", o.all());
    let file = hdf5::File::open(&out).unwrap();
    let names: Vec<hdf5::types::VarLenUnicode> =
        file.dataset("node_names").unwrap().read_raw().unwrap();
    let names: Vec<String> = names.iter().map(|n| n.as_str().to_string()).collect();
    assert_eq!(names, ["alice", "bob", "carol", "dave"]);
    let src: Vec<u64> = file.dataset("src").unwrap().read_raw().unwrap();
    assert_eq!(src, [0, 1, 2]);
    assert_eq!(
        file.attr("num_nodes")
            .unwrap()
            .read_scalar::<u64>()
            .unwrap(),
        4
    );
}

#[test]
fn flags_are_checked() {
    let o = run(30, &["--graph", "g.h5", "--no-such-flag"]);
    assert_eq!(o.code, 2, "{}", o.all());
    assert!(o.stderr.contains("--no-such-flag"), "{}", o.stderr);
    let o = run(
        30,
        &["--graph", "g.h5", "--model", "deepwalk", "--p", "0.5"],
    );
    assert_eq!(o.code, 1, "{}", o.all());
    assert!(
        o.stderr.contains("only apply to --model node2vec"),
        "{}",
        o.stderr
    );
    let o = run(30, &["--graph", "g.h5", "--dim", "0", "--window", "0"]);
    assert_eq!(o.code, 1);
    assert!(
        o.stderr.contains("--dim") && o.stderr.contains("--window"),
        "{}",
        o.stderr
    );
    // Memory-mapped rows need a directory, and private node memory.
    let o = run(30, &["--graph", "g.h5", "--mmap-rows", "/no/such/dir"]);
    assert_eq!(o.code, 1, "{}", o.all());
    assert!(
        o.stderr
            .contains("--mmap-rows /no/such/dir: not a directory"),
        "{}",
        o.stderr
    );
    let o = run(
        30,
        &[
            "--graph",
            "g.h5",
            "--mmap-rows",
            "/tmp",
            "--node-memory",
            "shared",
        ],
    );
    assert_eq!(o.code, 1, "{}", o.all());
    assert!(o.stderr.contains("--node-memory private"), "{}", o.stderr);
    // A batch script that forgot its flags fails, with the usage.
    let o = run(30, &[]);
    assert_eq!(o.code, 2, "{}", o.all());
    assert!(
        o.stderr.contains("Usage: graphscale") && o.stderr.contains("--graph"),
        "{}",
        o.stderr
    );
}

/// Without -o the embeddings go next to the graph (said at start); an output nobody can write
/// is refused before the graph is loaded, on every rank.
#[test]
fn a_finished_run_is_never_discarded() {
    let d = tmp();
    let (g, l) = sbm(d.path(), 300, 3);
    let m = p(d.path(), "m.jsonl");
    let mut a = walk_args(s(&g), "", s(&m));
    let o_at = a.iter().position(|x| *x == "-o").unwrap();
    a.drain(o_at..o_at + 2);
    let o = mpirun(2, 120, &a);
    assert_eq!(o.code, 0, "{}", o.all());
    let default = p(d.path(), "sbm.emb.h5");
    assert!(
        o.stderr
            .contains(&format!("written to {}", default.display())),
        "{}",
        o.stderr
    );
    assert!(micro_f1(&default, &l) > 0.5);
    let missing = p(d.path(), "no/such/dir/emb.h5");
    let mut a = walk_args(s(&g), s(&missing), s(&m));
    a.push("--max-memory=1K"); // would fail after the load: the output check comes first
    let o = mpirun(2, 120, &a);
    assert_eq!(o.code, 1, "{}", o.all());
    assert!(
        o.stderr.contains("-o ")
            && o.stderr.contains("cannot create a file in")
            && o.stderr.contains("no/such/dir"),
        "{}",
        o.stderr
    );
    assert!(!o.stderr.contains("--max-memory"), "{}", o.stderr);
}

#[test]
fn bad_configs_are_refused_on_every_rank_before_training() {
    let d = tmp();
    let (g, _) = sbm(d.path(), 200, 2);
    let o = mpirun(
        3,
        90,
        &["--graph", s(&g), "--lr=-1", "--comm-timeout", "20"],
    );
    assert_eq!(o.code, 1, "{}", o.all());
    assert!(
        o.stderr.contains("--lr must be a positive number"),
        "{}",
        o.stderr
    );
    let o = mpirun(
        2,
        90,
        &[
            "--graph",
            s(&g),
            "--max-memory",
            "1K",
            "--comm-timeout",
            "20",
        ],
    );
    assert_eq!(o.code, 1, "{}", o.all());
    assert!(o.stderr.contains("exceeds --max-memory"), "{}", o.stderr);
    let rm = rmat(d.path(), 10, 32);
    // Refused on both ranks before training, with each of `needles` in the message.
    let refused = |limit: &str, needles: &[&str]| {
        let o = mpirun(
            2,
            90,
            &[
                "--graph",
                s(&rm),
                "--dim",
                "8",
                "--max-memory",
                limit,
                "--comm-timeout",
                "20",
            ],
        );
        assert_eq!(o.code, 1, "{}", o.all());
        assert!(needles.iter().all(|n| o.stderr.contains(n)), "{}", o.stderr);
        assert!(!o.stderr.contains("pairs/s"), "{}", o.stderr);
    };
    // Rows that fit, an adjacency that does not: refused once the load has counted the
    // degrees, before it reads the entries, with the adjacency's size named.
    refused(
        "100K",
        &[
            "rmat.h5: the adjacency takes",
            "exceeds --max-memory 100.0 KiB",
        ],
    );
    // Rows and adjacency that fit (a few hundred KiB), a whole estimate that does not (the
    // process alone holds more than 4 MiB): refused after the load, before training.
    refused(
        "4M",
        &["the memory estimate", "exceeds --max-memory 4.0 MiB"],
    );
    let cfg = p(d.path(), "run.toml");
    std::fs::write(&cfg, "[training]\nlearning_rat = 0.1\n").unwrap();
    let o = run(30, &["--config", s(&cfg), "--graph", s(&g)]);
    assert_eq!(o.code, 1, "{}", o.all());
    assert!(
        o.stderr.contains("run.toml") && o.stderr.contains("learning_rat"),
        "{}",
        o.stderr
    );
}

#[test]
fn a_diverging_run_aborts_naming_the_step_and_a_node() {
    let d = tmp();
    let (g, _) = sbm(d.path(), 300, 3);
    // Batched updates: in place, rates above word2vec's take implicit steps, which stay
    // finite even at 1e30.
    let args = [
        "--graph",
        s(&g),
        "--lr",
        "1e30",
        "--update",
        "batched",
        "--walks-per-node",
        "2",
        "--walk-length",
        "10",
        "--dim",
        "8",
    ];
    let o = run(60, &args);
    assert_ne!(o.code, 0, "{}", o.all());
    assert!(
        o.stderr.contains("non-finite loss") && o.stderr.contains("at step"),
        "{}",
        o.stderr
    );
    let mut mpi_args = args.to_vec();
    mpi_args.extend_from_slice(&["--comm-timeout", "20"]);
    let o = mpirun(2, 90, &mpi_args);
    assert_ne!(o.code, 0, "{}", o.all());
    assert_ne!(o.code, 124, "the job hung: {}", o.all());
    assert!(o.stderr.contains("non-finite loss"), "{}", o.stderr);
}
