//! The source's layering and size rules (docs/architecture.md): samplers and models do no
//! communication, evaluation does not import the solver, the transport imports nothing above
//! it, and no file grows past its ceiling. Reads `src/` as text; no MPI.

use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read src") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// A file's code before its test module, with its path relative to the crate.
fn code() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    sources(&root.join("src"), &mut files);
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("read source");
            let code = match text.find("#[cfg(test)]\nmod tests") {
                Some(at) => &text[..at],
                None => &text[..],
            };
            let code = code.to_string();
            let rel = p.strip_prefix(root).expect("under the crate");
            (rel.to_string_lossy().replace('\\', "/"), code)
        })
        .collect()
}

#[test]
fn layers_import_only_below_them() {
    // (files whose path starts with this, what they must not import, why)
    let rules = [
        (
            "src/sample/",
            "crate::comm",
            "samplers return what leaves; the driver moves it",
        ),
        ("src/model/", "crate::comm", "a model is math"),
        ("src/model/", "crate::train", "a model is math"),
        (
            "src/model/",
            "crate::kgeval",
            "evaluation calls models, not the reverse",
        ),
        (
            "src/eval.rs",
            "crate::train",
            "evaluation reads embeddings through src/embeddings.rs",
        ),
        (
            "src/linkpred.rs",
            "crate::train",
            "evaluation reads embeddings through src/embeddings.rs",
        ),
        (
            "src/kgeval.rs",
            "crate::train",
            "evaluation reads embeddings through src/embeddings.rs",
        ),
        (
            "src/plan.rs",
            "crate::train",
            "plan shares the memory model through src/estimate.rs",
        ),
        (
            "src/comm/",
            "crate::train",
            "the transport imports nothing above it",
        ),
        (
            "src/comm/",
            "crate::spmd",
            "the transport imports nothing above it",
        ),
        (
            "src/comm/",
            "crate::model",
            "the transport imports nothing above it",
        ),
        (
            "src/comm/",
            "crate::graph",
            "the transport imports nothing above it",
        ),
        (
            "src/comm/",
            "crate::config",
            "the transport imports nothing above it",
        ),
    ];
    let mut broken = Vec::new();
    for (path, code) in code() {
        // Comments may name other layers.
        let code: Vec<&str> = code
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect();
        for (prefix, banned, why) in rules {
            if path.starts_with(prefix) && code.iter().any(|l| l.contains(banned)) {
                broken.push(format!("{path} uses {banned}: {why}"));
            }
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn no_file_grows_past_its_ceiling() {
    // Lines before the test module: 1,000 at most; the files still above it may not grow
    // (issue 33 splits them).
    let above = [("src/config.rs", 1312), ("src/model/kge.rs", 1060)];
    let mut broken = Vec::new();
    for (path, code) in code() {
        let lines = code.lines().count();
        let ceiling = above
            .iter()
            .find(|(p, _)| *p == path)
            .map_or(1000, |&(_, c)| c);
        if lines > ceiling {
            broken.push(format!(
                "{path}: {lines} lines before its tests (at most {ceiling})"
            ));
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}
