//! The source's layering and size rules (docs/architecture.md): samplers and models do no
//! communication, evaluation does not import the solver, the transport imports nothing above
//! it, and no file or function grows past its length (1,000 lines before the tests, 120 per
//! function). Reads `src/` as text; no MPI.

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
            "crate::eval",
            "evaluation calls models, not the reverse",
        ),
        (
            "src/eval/",
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
fn no_file_is_longer_than_1000_lines() {
    let broken: Vec<String> = code()
        .into_iter()
        .filter(|(_, code)| code.lines().count() > 1000)
        .map(|(path, code)| format!("{path}: {} lines before its tests", code.lines().count()))
        .collect();
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

/// The functions of `code` and their lengths in lines, from the `fn` line to the line that
/// closes its body (braces counted; the sources' strings balance theirs).
fn functions(code: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let t = l.trim_start();
        let t = t
            .strip_prefix("pub(crate) ")
            .or_else(|| t.strip_prefix("pub(super) "))
            .or_else(|| t.strip_prefix("pub "))
            .unwrap_or(t);
        let t = t.strip_prefix("const ").unwrap_or(t);
        let t = t.strip_prefix("unsafe ").unwrap_or(t);
        let Some(rest) = t.strip_prefix("fn ") else {
            continue;
        };
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        // A declaration without a body (a trait's) ends with `;` before any `{` (outside the
        // brackets of its signature: `[f32; N]`).
        let (mut depth, mut opened, mut brackets) = (0i64, false, 0i64);
        for (j, l) in lines[i..].iter().enumerate() {
            for c in l.chars() {
                match c {
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => depth -= 1,
                    '(' | '[' if !opened => brackets += 1,
                    ')' | ']' if !opened => brackets -= 1,
                    ';' if !opened && brackets == 0 => depth = -1,
                    _ => {}
                }
                if depth < 0 {
                    break;
                }
            }
            if depth < 0 {
                break;
            }
            if opened && depth == 0 {
                out.push((name.clone(), j + 1));
                break;
            }
        }
    }
    out
}

#[test]
fn no_function_is_longer_than_120_lines() {
    let mut broken = Vec::new();
    for (path, code) in code() {
        for (name, len) in functions(&code) {
            if len > 120 {
                broken.push(format!("{path}: fn {name} is {len} lines"));
            }
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn function_lengths_are_counted() {
    let code = "fn a() {\n    let s = \"{}\";\n}\ntrait T {\n    fn b(&self, x: [u8; 2]);\n}\nfn d(x: [u8; 2]) {}\npub(super) fn c(\n    x: u8,\n) -> u8 {\n    if x > 0 {\n        1\n    } else {\n        0\n    }\n}\n";
    assert_eq!(
        functions(code),
        vec![
            ("a".to_string(), 3),
            ("d".to_string(), 1),
            ("c".to_string(), 9)
        ]
    );
}
