//! Helpers shared by the integration tests: run the binary (alone or under mpirun) with a hard
//! timeout, and make small graphs.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

pub const BIN: &str = env!("CARGO_BIN_EXE_graphscale");

pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    pub fn all(&self) -> String {
        format!("{}\n{}", self.stdout, self.stderr)
    }
}

fn finish(mut c: Command) -> Out {
    let o = c.output().expect("run command");
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// Run the binary without MPI, killed after `secs`.
pub fn run(secs: u32, args: &[&str]) -> Out {
    let mut c = Command::new("timeout");
    c.args(["-k", "5", &secs.to_string(), BIN]).args(args);
    for k in ["OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"] {
        c.env_remove(k);
    }
    finish(c)
}

/// Which MPI the suites run under: Open MPI (`mpirun`) unless `GRAPHSCALE_TEST_MPI=mpich`, which
/// `make test-mpich` sets for a build linked against MPICH (its launcher is `mpiexec.mpich`).
pub fn mpich() -> bool {
    std::env::var("GRAPHSCALE_TEST_MPI").is_ok_and(|v| v == "mpich")
}

/// The launcher's command line for `ranks` ranks of the binary with `VAR=value` settings exported
/// to every rank (`mpirun --oversubscribe -n N -x VAR=value`, or `mpiexec.mpich -n N -genv VAR
/// value`), ending with the binary.
pub fn launch_args(ranks: usize, env: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = if mpich() {
        vec!["mpiexec.mpich".into(), "-n".into(), ranks.to_string()]
    } else {
        vec![
            "mpirun".into(),
            "--oversubscribe".into(),
            "-n".into(),
            ranks.to_string(),
        ]
    };
    for e in env {
        let (k, v) = e.split_once('=').expect("VAR=value");
        if mpich() {
            a.extend(["-genv".into(), k.into(), v.into()]);
        } else {
            a.extend(["-x".into(), e.to_string()]);
        }
    }
    a.push(BIN.into());
    a
}

/// The launcher as a command (see [`launch_args`]), with the settings Open MPI needs as root on a
/// small machine (MPICH ignores them).
pub fn launcher(ranks: usize, env: &[&str]) -> Command {
    let a = launch_args(ranks, env);
    let mut c = Command::new(&a[0]);
    c.args(&a[1..]);
    mpi_env(&mut c);
    c
}

fn mpi_env(c: &mut Command) {
    c.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_mpi_yield_when_idle", "1");
}

/// Run the binary under the launcher with `ranks` ranks, killed after `secs`.
/// `timeout` exits 124 when it had to kill the job: tests assert on the code, so a hang fails.
pub fn mpirun(ranks: usize, secs: u32, args: &[&str]) -> Out {
    mpirun_env(ranks, secs, &[], args)
}

/// As [`mpirun`], with `VAR=value` settings exported to every rank (`mpirun -x`).
pub fn mpirun_env(ranks: usize, secs: u32, env: &[&str], args: &[&str]) -> Out {
    let mut c = Command::new("timeout");
    c.args(["-k", "5", &secs.to_string()])
        .args(launch_args(ranks, env))
        .args(args);
    mpi_env(&mut c);
    finish(c)
}

pub fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

pub fn p(dir: &Path, name: &str) -> PathBuf {
    dir.join(name)
}

pub fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// A planted-partition graph and its labels in `dir`.
/// `graphscale generate rmat` of 2^`scale` nodes into `dir/rmat.h5`.
pub fn rmat(dir: &Path, scale: u32, edge_factor: u32) -> PathBuf {
    let g = p(dir, "rmat.h5");
    let (scale, ef) = (scale.to_string(), edge_factor.to_string());
    let o = run(
        60,
        &[
            "generate",
            "rmat",
            "--scale",
            &scale,
            "--edge-factor",
            &ef,
            "-o",
            s(&g),
        ],
    );
    assert_eq!(o.code, 0, "{}", o.all());
    g
}

pub fn sbm(dir: &Path, nodes: u64, blocks: u64) -> (PathBuf, PathBuf) {
    let g = p(dir, "sbm.h5");
    let l = p(dir, "labels.tsv");
    let o = run(
        60,
        &[
            "generate",
            "sbm",
            "--nodes",
            &nodes.to_string(),
            "--blocks",
            &blocks.to_string(),
            "--avg-degree",
            "10",
            "--mix",
            "0.1",
            "--seed",
            "3",
            "-o",
            s(&g),
            "--labels",
            s(&l),
        ],
    );
    assert_eq!(o.code, 0, "{}", o.all());
    (g, l)
}

/// Micro-F1 at a 50% training fraction (2 repeats) of `emb` against `labels`, by `eval nodeclf`.
pub fn micro_f1(emb: &Path, labels: &Path) -> f64 {
    let o = run(
        120,
        &[
            "eval",
            "nodeclf",
            "--embeddings",
            s(emb),
            "--labels",
            s(labels),
            "--train-fractions",
            "0.5",
            "--repeats",
            "2",
            "--json",
        ],
    );
    assert_eq!(o.code, 0, "{}", o.all());
    let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("json");
    v["results"]["0.5"]["micro_f1"].as_f64().expect("micro_f1")
}

/// A short DeepWalk run on `graph` (5 walks of 20, window 10, d 32, 1 thread per rank) writing
/// `emb` and `metrics`.
pub fn walk_args<'a>(graph: &'a str, emb: &'a str, metrics: &'a str) -> Vec<&'a str> {
    vec![
        "--graph",
        graph,
        "--walks-per-node",
        "5",
        "--walk-length",
        "20",
        "--window",
        "10",
        "--dim",
        "32",
        "--threads",
        "1",
        "-o",
        emb,
        "--metrics",
        metrics,
        "--comm-timeout",
        "60",
    ]
}

/// `walk_args` plus `extra`, without the walk flags when `extra` picks another model (they are
/// refused for models that do not walk).
pub fn with_model<'a>(mut args: Vec<&'a str>, extra: &[&'a str]) -> Vec<&'a str> {
    if extra
        .windows(2)
        .any(|w| w[0] == "--model" && !matches!(w[1], "deepwalk" | "node2vec"))
    {
        for flag in ["--walks-per-node", "--walk-length", "--window"] {
            if let Some(i) = args.iter().position(|a| *a == flag) {
                args.drain(i..i + 2);
            }
        }
    }
    args.extend_from_slice(extra);
    args
}

/// The JSON records of a `--metrics` file, one per rank.
pub fn metrics(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .expect("metrics")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect()
}

/// A counter summed over ranks (0 where absent).
pub fn sum(ms: &[serde_json::Value], key: &str) -> u64 {
    ms.iter().map(|m| m[key].as_u64().unwrap_or(0)).sum()
}
