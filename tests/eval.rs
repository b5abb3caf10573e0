//! The built-in evaluations: link prediction end to end (split, train, score), bad evaluation
//! inputs, and the node-classification cross-check against scikit-learn where it is installed.

mod common;

use common::*;
use std::path::Path;

/// Train DeepWalk on 2 in-process ranks; `extra` flags replace the defaults of the same name.
fn train(g: &Path, out: &Path, extra: &[&str]) {
    let mut args = vec!["--graph", s(g), "-o", s(out), "--ranks", "2"];
    for (flag, default) in [
        ("--dim", "32"),
        ("--walks-per-node", "8"),
        ("--walk-length", "30"),
    ] {
        if !extra.contains(&flag) {
            args.extend_from_slice(&[flag, default]);
        }
    }
    args.extend_from_slice(extra);
    let o = run(120, &args);
    assert_eq!(o.code, 0, "{}", o.all());
}

fn json(o: &Out) -> serde_json::Value {
    assert_eq!(o.code, 0, "{}", o.all());
    serde_json::from_str(&o.stdout).expect("json on stdout")
}

#[test]
fn split_train_and_link_prediction() {
    let d = tmp();
    let (g, _) = sbm(d.path(), 1500, 10);
    let (tr, te) = (p(d.path(), "train.h5"), p(d.path(), "test.h5"));
    let o = run(
        60,
        &[
            "split",
            "--graph",
            s(&g),
            "--test-fraction",
            "0.1",
            "-o",
            s(&tr),
            "--test",
            s(&te),
        ],
    );
    assert_eq!(o.code, 0, "{}", o.all());
    let emb = p(d.path(), "emb.h5");
    train(&tr, &emb, &[]);
    let base = [
        "eval",
        "linkpred",
        "--embeddings",
        s(&emb),
        "--test",
        s(&te),
        "--json",
    ];
    let dot = json(&run(60, &base));
    for k in ["auc", "mrr", "hits@1", "hits@3", "hits@10"] {
        let v = dot[k].as_f64().unwrap_or(-1.0);
        assert!((0.0..=1.0).contains(&v), "{k} = {v}: {dot}");
    }
    // Held-out edges of a planted partition fall inside blocks: far better than chance.
    assert!(dot["auc"].as_f64().expect("auc") > 0.85, "{dot}");
    assert!(dot["hits@10"].as_f64().expect("hits") > 0.3, "{dot}");
    // Distributed over ranks (each reads a stripe of the rows and fetches the rest one-sidedly):
    // exactly the same metrics, under mpirun and in-process.
    let o = mpirun(3, 90, &base);
    assert_eq!(json(&o), dot, "mpirun -n 3");
    let mut in_process = base.to_vec();
    in_process.extend_from_slice(&["--ranks", "2"]);
    assert_eq!(json(&run(60, &in_process)), dot, "--ranks 2");
    let mut had = base.to_vec();
    had.extend_from_slice(&["--score", "hadamard"]);
    let had_out = json(&run(60, &had));
    assert!(had_out["auc"].as_f64().expect("auc") > 0.8, "{had_out}");
    // Hadamard runs on one process: under mpirun rank 0 alone evaluates and prints (once).
    assert_eq!(
        json(&mpirun(2, 90, &had)),
        had_out,
        "hadamard under mpirun -n 2"
    );
    // Embeddings of another graph size are refused.
    let (small, _) = {
        let d2 = p(d.path(), "small");
        std::fs::create_dir_all(&d2).expect("mkdir");
        sbm(&d2, 300, 3)
    };
    let other = p(d.path(), "other.h5");
    train(&small, &other, &[]);
    let o = run(
        60,
        &[
            "eval",
            "linkpred",
            "--embeddings",
            s(&other),
            "--test",
            s(&te),
        ],
    );
    assert_eq!(o.code, 1, "{}", o.all());
    assert!(
        o.stderr.contains("1500 nodes") && o.stderr.contains("300 rows"),
        "{}",
        o.stderr
    );
}

#[test]
fn bad_evaluation_inputs_are_named() {
    let d = tmp();
    let (g, labels) = sbm(d.path(), 300, 3);
    let emb = p(d.path(), "emb.h5");
    train(&g, &emb, &[]);
    let nodeclf = |labels: &Path, extra: &[&str]| {
        let mut a = vec![
            "eval",
            "nodeclf",
            "--embeddings",
            s(&emb),
            "--labels",
            s(labels),
        ];
        a.extend_from_slice(extra);
        run(60, &a)
    };
    // A label for a node that does not exist: file and line named.
    let bad = p(d.path(), "bad.tsv");
    std::fs::write(&bad, "0 a\n1 b\n999 a\n").expect("write");
    let o = nodeclf(&bad, &[]);
    assert_eq!(o.code, 1, "{}", o.all());
    assert!(
        o.stderr.contains("bad.tsv:3") && o.stderr.contains("999"),
        "{}",
        o.stderr
    );
    // An empty label file.
    let empty = p(d.path(), "empty.tsv");
    std::fs::write(&empty, "# nothing\n").expect("write");
    let o = nodeclf(&empty, &[]);
    assert_eq!(o.code, 1, "{}", o.all());
    assert!(o.stderr.contains("no labels"), "{}", o.stderr);
    // A fraction outside (0, 1).
    let o = nodeclf(&labels, &["--train-fractions", "0.5,1.5"]);
    assert_ne!(o.code, 0, "{}", o.all());
    assert!(
        o.stderr.contains("1.5") && o.stderr.contains("(0, 1)"),
        "{}",
        o.stderr
    );
    // NaN in the embeddings.
    let nan = p(d.path(), "nan.h5");
    {
        let f = hdf5::File::create(&nan).expect("create");
        let mut v = vec![0.5f32; 300 * 4];
        v[4 * 17 + 2] = f32::NAN;
        let a = ndarray::Array2::from_shape_vec((300, 4), v).expect("shape");
        f.new_dataset_builder()
            .with_data(&a)
            .create("embeddings")
            .expect("write");
    }
    let o = run(
        60,
        &[
            "eval",
            "nodeclf",
            "--embeddings",
            s(&nan),
            "--labels",
            s(&labels),
        ],
    );
    assert_eq!(o.code, 1, "{}", o.all());
    assert!(
        o.stderr.contains("non-finite") && o.stderr.contains("row 17"),
        "{}",
        o.stderr
    );
    // Distributed link prediction reads the rows in slabs and sends them to their ranks: the
    // same error, naming the row, before the test edges are read.
    let linkpred = [
        "eval",
        "linkpred",
        "--embeddings",
        s(&nan),
        "--test",
        s(&g),
        "--ranks",
        "3",
    ];
    let o = run(60, &linkpred);
    assert_eq!(o.code, 1, "{}", o.all());
    assert!(
        o.stderr.contains("non-finite") && o.stderr.contains("row 17"),
        "{}",
        o.stderr
    );
    // Splits that are not permutations of the labeled nodes.
    let sp = p(d.path(), "splits.json");
    std::fs::write(&sp, r#"{"perms": [[0, 1, 2]]}"#).expect("write");
    let o = nodeclf(&labels, &["--splits", s(&sp)]);
    assert_eq!(o.code, 1, "{}", o.all());
    assert!(o.stderr.contains("not a permutation"), "{}", o.stderr);
}

/// A Python with numpy, scikit-learn and h5py, if this machine has one.
fn python_with_sklearn() -> Option<String> {
    let candidates = [
        std::env::var("PYTHON").unwrap_or_default(),
        "/tmp/anchors/bin/python".into(),
        "python3".into(),
    ];
    candidates.into_iter().filter(|c| !c.is_empty()).find(|py| {
        std::process::Command::new(py)
            .args(["-c", "import sklearn, h5py, scipy"])
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

#[test]
fn node_classification_agrees_with_scikit_learn_on_the_same_splits() {
    let anchors = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/anchors/eval_nodeclf.py");
    let Some(py) = python_with_sklearn() else {
        eprintln!("SKIPPED: no Python with scikit-learn, scipy and h5py (set PYTHON=...)");
        return;
    };
    if !anchors.exists() {
        eprintln!(
            "SKIPPED: the reference protocol {} is not here",
            anchors.display()
        );
        return;
    }
    let d = tmp();
    let (g, labels) = sbm(d.path(), 1000, 8);
    let emb = p(d.path(), "emb.h5");
    // A short run: embeddings of middling quality, where solver differences would show.
    train(
        &g,
        &emb,
        &[
            "--walks-per-node",
            "1",
            "--walk-length",
            "10",
            "--dim",
            "16",
        ],
    );
    // Multi-label: every fifth node also carries a second label.
    let multi = p(d.path(), "multi.tsv");
    let mut text = std::fs::read_to_string(&labels).expect("labels");
    for v in (0..1000).step_by(5) {
        text.push_str(&format!("{v} extra{}\n", v % 3));
    }
    std::fs::write(&multi, text).expect("write");
    for l in [&labels, &multi] {
        let o = std::process::Command::new(&py)
            .args([
                concat!(env!("CARGO_MANIFEST_DIR"), "/bench/crosscheck_nodeclf.py"),
                "--bin",
                BIN,
                "--emb",
                s(&emb),
                "--labels",
                s(l),
                "--shuffles",
                "3",
            ])
            .output()
            .expect("run the cross-check");
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "{}: more than 0.5 F1 points from scikit-learn:\n{out}\n{}",
            l.display(),
            String::from_utf8_lossy(&o.stderr)
        );
    }
}
