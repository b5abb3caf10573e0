//! Checkpoints and resume (DESIGN sections 7-8). A checkpoint is a version directory
//! `DIR/v00000007/` holding one HDF5 shard per rank (`shard-00003.h5`: the rank's node ids, rows
//! and optimizer state per matrix, its in-flight walkers, the training cursor, the run's identity
//! and a CRC-32 of all of it) plus a `manifest.json`. A version exists only once rank 0 has
//! renamed `DIR/LATEST.tmp` to `DIR/LATEST` naming it, after every rank has written and fsynced
//! its shard: a crash at any moment leaves the previous committed version intact. Older versions
//! are removed only after a commit, keeping the last [`KEEP`].
//!
//! Training pauses only to copy its rows into a snapshot; a background thread writes and fsyncs
//! the shard, and the commit happens at the first step at which every rank's writer is done.
//!
//! Resume re-shards: each old shard is read by exactly one new rank (`old % new_ranks`), checked
//! (format, identity, shapes, node ids, checksum), and its rows are routed to their new owners in
//! one all-to-all, so the number of ranks may change. A version that fails its checks is skipped
//! for the previous committed one, loudly; a checkpoint of another run (graph, model, dims, ...)
//! is refused with the list of what differs.

use std::io::Write;
use std::path::{Path, PathBuf};

use hdf5::types::VarLenUnicode;
use serde::{Deserialize, Serialize};

use crate::comm::{Comm, ReduceOp};
use crate::config::TrainConfig;
use crate::error::{Error, Result};
use crate::graph::LocalGraph;
use crate::spmd::agree;
use crate::store::Shard;

/// Layout version of the shard files.
pub const FORMAT_VERSION: u64 = 2;
/// Committed versions kept on disk.
pub const KEEP: usize = 2;
const LATEST: &str = "LATEST";
const MANIFEST: &str = "manifest.json";

/// Where training stands: enough to continue the schedule where it stopped.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Cursor {
    /// Optimizer steps done (walk supersteps or LINE steps).
    pub step: u64,
    /// Epoch in progress (walks).
    pub epoch: u32,
    /// Walk tokens processed by all ranks (drives the learning-rate schedule).
    pub done: f64,
    /// Fraction of this epoch's walks started, over all ranks.
    pub started: f64,
    /// This rank's start cursor (used when the number of ranks is unchanged).
    pub next_start: u64,
    /// `--patience` (knowledge graphs): the best validation MRR so far, if any.
    #[serde(default)]
    pub valid_best: Option<f64>,
    /// `--patience`: validations since the MRR last rose.
    #[serde(default)]
    pub valid_flat: u32,
}

/// What must match between a checkpoint and the run resuming it.
pub fn identity(cfg: &TrainConfig, g: &LocalGraph, digest: u64) -> serde_json::Value {
    let mut id = serde_json::json!({
        "graph_nodes": g.num_nodes(),
        "graph_edges": g.file_edges,
        "graph_directed": g.directed,
        "graph_digest": format!("{digest:016x}"),
        "model": cfg.model,
        "order": cfg.order,
        "dim": cfg.dim,
        "dtype": cfg.dtype,
        "optimizer": cfg.optimizer,
        "lr": cfg.lr,
        "epochs": cfg.epochs,
        "walks_per_node": cfg.walks_per_node,
        "walk_length": cfg.walk_length,
        "window": cfg.window,
        "negatives": cfg.negatives,
        "p": cfg.p,
        "q": cfg.q,
        "line_samples": cfg.line_samples,
    });
    if cfg.model.is_kg() {
        // What shapes a knowledge-graph model's parameters and loss (walk and edge models keep
        // the identity their checkpoints were written with).
        let kg = serde_json::json!({
            "kg_loss": cfg.kg.kg_loss,
            "gamma": cfg.kg.gamma,
        });
        if let (Some(o), Some(k)) = (id.as_object_mut(), kg.as_object()) {
            o.extend(k.clone());
        }
    }
    id
}

/// Names and values that differ between two identities, as `name: checkpoint X, this run Y`.
pub(crate) fn differences(saved: &serde_json::Value, now: &serde_json::Value) -> Vec<String> {
    let (Some(a), Some(b)) = (saved.as_object(), now.as_object()) else {
        return vec!["the identity attribute is not a JSON object".into()];
    };
    b.iter()
        .filter(|(k, v)| a.get(*k) != Some(v))
        .map(|(k, v)| {
            let old = a.get(k).map_or("(absent)".to_string(), |x| x.to_string());
            format!("{k}: checkpoint {old}, this run {v}")
        })
        .collect()
}

/// One rank's copy of its state, taken between steps.
pub struct Snapshot {
    pub rank: usize,
    pub ranks: usize,
    pub nodes: Vec<u64>,
    /// Per matrix: rows in the storage dtype and f32 optimizer state.
    pub matrices: Vec<(Vec<u8>, Vec<f32>)>,
    pub row_bytes: usize,
    pub state_per_row: usize,
    pub walkers: Vec<u8>,
    pub cursor: Cursor,
    pub identity: String,
    pub config: String,
    pub fingerprint: u64,
}

impl Snapshot {
    pub fn take(g: &LocalGraph, shards: &[Shard], walkers: Vec<u8>, cursor: Cursor) -> Snapshot {
        Snapshot {
            rank: g.rank,
            ranks: g.part.ranks(),
            nodes: (0..g.num_local())
                .map(|i| g.part.global(g.rank, i))
                .collect(),
            matrices: shards
                .iter()
                .map(|s| (s.window.with_local(<[u8]>::to_vec), s.state.clone()))
                .collect(),
            row_bytes: shards[0].row_bytes(),
            state_per_row: shards[0].state_per_row,
            walkers,
            cursor,
            identity: String::new(),
            config: String::new(),
            fingerprint: g.part.fingerprint(),
        }
    }

    pub fn bytes(&self) -> u64 {
        let m: usize = self
            .matrices
            .iter()
            .map(|(r, s)| r.len() + 4 * s.len())
            .sum();
        (8 * self.nodes.len() + m + self.walkers.len()) as u64
    }

    fn crc(&self) -> u32 {
        data_crc(&self.nodes, &self.matrices, &self.walkers)
    }
}

/// CRC-32 of a shard's data, in file order: node ids, then rows and state per matrix, then walkers.
fn data_crc(nodes: &[u64], matrices: &[(Vec<u8>, Vec<f32>)], walkers: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    for n in nodes {
        h.update(&n.to_le_bytes());
    }
    for (rows, state) in matrices {
        h.update(rows);
        for x in state {
            h.update(&x.to_le_bytes());
        }
    }
    h.update(walkers);
    h.finalize()
}

pub fn version_dir(dir: &Path, v: u64) -> PathBuf {
    dir.join(format!("v{v:08}"))
}

pub fn shard_path(dir: &Path, v: u64, rank: usize) -> PathBuf {
    version_dir(dir, v).join(format!("shard-{rank:05}.h5"))
}

/// Write one shard file and fsync it. Runs on a background thread.
pub fn write_shard(path: &Path, s: &Snapshot) -> Result<()> {
    let err = |what: &'static str| move |e| Error::hdf5(path, what, e);
    {
        let f = hdf5::File::create(path).map_err(err("create checkpoint shard"))?;
        let rows = s.nodes.len();
        if rows > 0 {
            f.new_dataset_builder()
                .with_data(&s.nodes)
                .create("nodes")
                .map_err(err("write nodes"))?;
            for (m, (data, state)) in s.matrices.iter().enumerate() {
                let a = ndarray::ArrayView2::from_shape((rows, s.row_bytes), data)
                    .expect("rows x row_bytes");
                f.new_dataset_builder()
                    .with_data(&a)
                    .create(format!("rows{m}").as_str())
                    .map_err(err("write rows"))?;
                if s.state_per_row > 0 {
                    let a = ndarray::ArrayView2::from_shape((rows, s.state_per_row), state)
                        .expect("rows x state");
                    f.new_dataset_builder()
                        .with_data(&a)
                        .create(format!("state{m}").as_str())
                        .map_err(err("write state"))?;
                }
            }
        }
        if !s.walkers.is_empty() {
            f.new_dataset_builder()
                .with_data(&s.walkers)
                .create("walkers")
                .map_err(err("write walkers"))?;
        }
        let u = |name: &str, v: u64| -> hdf5::Result<()> {
            f.new_attr::<u64>().create(name)?.write_scalar(&v)
        };
        let t = |name: &str, v: &str| -> hdf5::Result<()> {
            let v: VarLenUnicode = v.parse().expect("no NUL in attribute text");
            f.new_attr::<VarLenUnicode>().create(name)?.write_scalar(&v)
        };
        (|| -> hdf5::Result<()> {
            u("format_version", FORMAT_VERSION)?;
            u("rank", s.rank as u64)?;
            u("ranks", s.ranks as u64)?;
            u("rows", rows as u64)?;
            u("matrices", s.matrices.len() as u64)?;
            u("walker_bytes", s.walkers.len() as u64)?;
            u("partition_fingerprint", s.fingerprint)?;
            u("crc32", u64::from(s.crc()))?;
            t("identity", &s.identity)?;
            t(
                "cursor",
                &serde_json::to_string(&s.cursor).expect("cursor json"),
            )?;
            t("config", &s.config)
        })()
        .map_err(err("write attributes"))?;
        crate::graph::h5::flush(&f, path)?;
    }
    fsync(path)
}

pub(crate) fn fsync(path: &Path) -> Result<()> {
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| Error::io(path, e))
}

/// Version numbers of the `v*` directories in `dir`, ascending.
fn versions_on_disk(dir: &Path) -> Vec<u64> {
    let mut v: Vec<u64> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.strip_prefix('v')?.parse().ok()
        })
        .collect();
    v.sort_unstable();
    v
}

/// The committed version named by `DIR/LATEST`, if any.
pub fn latest(dir: &Path) -> Result<Option<u64>> {
    let p = dir.join(LATEST);
    match std::fs::read_to_string(&p) {
        Ok(s) => s.trim().parse().map(Some).map_err(|_| {
            Error::bad_input(
                &p,
                format!(
                    "'{}' is not a version number; remove the file to start over or write the number of a complete v* directory",
                    s.trim()
                ),
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(p, e)),
    }
}

/// Before a run (rank 0): `--resume DIR` must name a directory holding a committed checkpoint
/// (a mistyped path or an empty directory is an error; `--resume-if-present` may start fresh),
/// and a `--checkpoint-dir` that holds committed checkpoints must be the one resumed from: its
/// versions would otherwise be rotated away by a run they do not belong to.
pub fn check_dirs(resume: Option<&Path>, required: bool, ckpt: Option<&Path>) -> Result<()> {
    if let (Some(r), true) = (resume, required) {
        if !r.is_dir() {
            return Err(Error::config(format!(
                "--resume {}: no such directory; check the path (--resume-if-present {} starts from the beginning when there is no checkpoint yet)",
                r.display(),
                r.display()
            )));
        }
        if latest(r)?.is_none() {
            return Err(Error::config(format!(
                "--resume {}: the directory holds no committed checkpoint (no {LATEST} file); check the path, or use --resume-if-present to start from the beginning when there is none yet",
                r.display()
            )));
        }
    }
    let Some(dir) = ckpt else {
        return Ok(());
    };
    let Some(v) = latest(dir)? else {
        return Ok(());
    };
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    };
    if resume.is_some_and(|r| same(r, dir)) {
        return Ok(());
    }
    Err(Error::config(format!(
        "--checkpoint-dir {}: holds another run's checkpoints (committed version {v}) that this run would rotate away; continue that run with --resume {}, or give an empty or new --checkpoint-dir",
        dir.display(),
        dir.display()
    )))
}

/// Collective: the number the next version gets (above every directory already present).
pub fn next_version(comm: &Comm, dir: &Path) -> Result<u64> {
    let mine = if comm.rank() == 0 {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(dir, e))
            .map(|_| versions_on_disk(dir).last().map_or(1, |v| v + 1))
    } else {
        Ok(0)
    };
    let v = agree(comm, mine)?;
    Ok(comm.max_u64(v))
}

/// Rank 0, after every rank's shard of `v` is on disk: publish `v` and prune old versions.
pub fn commit(dir: &Path, v: u64, files: &[FileSum], cursor: &Cursor) -> Result<()> {
    let vdir = version_dir(dir, v);
    let manifest = serde_json::json!({
        "version": v,
        "ranks": files.len(),
        "files": files,
        "format_version": FORMAT_VERSION,
        "step": cursor.step,
        "epoch": cursor.epoch,
    });
    write_atomically(&vdir.join(MANIFEST), manifest.to_string().as_bytes())?;
    fsync(&vdir)?;
    write_atomically(&dir.join(LATEST), format!("{v}\n").as_bytes())?;
    fsync(dir)?;
    // Keep the newest KEEP committed versions; drop everything older.
    let old: Vec<u64> = versions_on_disk(dir)
        .into_iter()
        .filter(|&x| x <= v)
        .collect();
    for &x in old.iter().rev().skip(KEEP) {
        let p = version_dir(dir, x);
        if let Err(e) = std::fs::remove_dir_all(&p) {
            log::warn!("could not remove old checkpoint {}: {e}", p.display());
        }
    }
    Ok(())
}

fn write_atomically(path: &Path, data: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
    f.write_all(data)
        .and_then(|_| f.sync_all())
        .map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
}

/// Size and CRC-32 of a whole shard file, recorded in the manifest at commit and checked before
/// the file is handed to the HDF5 library: libhdf5 is not hardened against damaged files (it
/// can crash on them), so a damaged shard must never reach it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileSum {
    pub bytes: u64,
    pub crc32: u32,
}

pub fn file_sum(path: &Path) -> Result<FileSum> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut h = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut bytes = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(|e| Error::io(path, e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        bytes += n as u64;
    }
    Ok(FileSum {
        bytes,
        crc32: h.finalize(),
    })
}

/// Why a shard could not be used.
enum Unusable {
    /// Another run's checkpoint: never fall back, refuse.
    Mismatch(String),
    /// Damaged or incomplete: try the previous version.
    Corrupt(String),
}

/// A shard as read and checked.
struct ShardData {
    nodes: Vec<u64>,
    matrices: Vec<(Vec<u8>, Vec<f32>)>,
    walkers: Vec<u8>,
    cursor: Cursor,
}

/// An open shard file, read with its name in every error.
struct ShardFile {
    f: hdf5::File,
    shown: String,
}

impl ShardFile {
    fn corrupt(&self, m: String) -> Unusable {
        Unusable::Corrupt(format!("{}: {m}", self.shown))
    }

    fn u64(&self, name: &str) -> std::result::Result<u64, Unusable> {
        self.f
            .attr(name)
            .and_then(|a| a.read_scalar::<u64>())
            .map_err(|_| self.corrupt(format!("attribute '{name}' missing or not a u64")))
    }

    fn text(&self, name: &str) -> std::result::Result<String, Unusable> {
        self.f
            .attr(name)
            .and_then(|a| a.read_scalar::<VarLenUnicode>())
            .map(|s| s.as_str().to_string())
            .map_err(|_| self.corrupt(format!("attribute '{name}' missing or not text")))
    }

    /// Dataset `name`, which must hold `want` values (`cols == 0`) or `want` rows of `cols`.
    fn read<T: hdf5::H5Type>(
        &self,
        name: &str,
        want: usize,
        cols: usize,
    ) -> std::result::Result<Vec<T>, Unusable> {
        let d = self
            .f
            .dataset(name)
            .map_err(|_| self.corrupt(format!("dataset '{name}' missing")))?;
        let shape = d.shape();
        let ok = if cols == 0 {
            shape == [want]
        } else {
            shape == [want, cols]
        };
        if !ok {
            return Err(self.corrupt(format!("dataset '{name}' has shape {shape:?}")));
        }
        d.read_raw::<T>()
            .map_err(|e| self.corrupt(format!("reading '{name}': {e}")))
    }

    /// The format and the run that wrote it (another run's shard is a mismatch, never a
    /// fallback), then its cursor.
    fn header(&self, ident: &serde_json::Value) -> std::result::Result<Cursor, Unusable> {
        let fv = self.u64("format_version")?;
        if fv != FORMAT_VERSION {
            return Err(Unusable::Mismatch(format!(
                "{}: checkpoint format {fv}, this graphscale reads format {FORMAT_VERSION}",
                self.shown
            )));
        }
        let saved: serde_json::Value = serde_json::from_str(&self.text("identity")?)
            .map_err(|e| self.corrupt(format!("attribute 'identity': {e}")))?;
        let diff = differences(&saved, ident);
        if !diff.is_empty() {
            return Err(Unusable::Mismatch(format!(
                "{} was written by a different run: {}",
                self.shown,
                diff.join("; ")
            )));
        }
        serde_json::from_str(&self.text("cursor")?)
            .map_err(|e| self.corrupt(format!("attribute 'cursor': {e}")))
    }
}

fn read_shard(
    path: &Path,
    sum: FileSum,
    ident: &serde_json::Value,
    matrices: usize,
    row_bytes: usize,
    spr: usize,
    num_nodes: u64,
) -> std::result::Result<ShardData, Unusable> {
    let shown = path.display().to_string();
    let corrupt = |m: String| Unusable::Corrupt(format!("{shown}: {m}"));
    match file_sum(path) {
        Ok(s) if s == sum => {}
        Ok(s) => {
            return Err(corrupt(format!(
                "{} bytes with CRC-32 {:08x}, the manifest recorded {} bytes with {:08x}: damaged or truncated",
                s.bytes, s.crc32, sum.bytes, sum.crc32
            )))
        }
        Err(e) => return Err(corrupt(e.to_string())),
    }
    let f = hdf5::File::open(path).map_err(|e| corrupt(format!("cannot open: {e}")))?;
    let f = ShardFile { f, shown };
    let cursor = f.header(ident)?;
    let rows = f.u64("rows")?;
    if rows > num_nodes {
        return Err(f.corrupt(format!("{rows} rows for a graph of {num_nodes} nodes")));
    }
    if f.u64("matrices")? != matrices as u64 {
        return Err(f.corrupt("wrong number of matrices".into()));
    }
    let rows = rows as usize;
    let mut data = ShardData {
        nodes: Vec::new(),
        matrices: Vec::new(),
        walkers: Vec::new(),
        cursor,
    };
    if rows > 0 {
        data.nodes = f.read::<u64>("nodes", rows, 0)?;
        for m in 0..matrices {
            let r = f.read::<u8>(&format!("rows{m}"), rows, row_bytes)?;
            let s = if spr > 0 {
                f.read::<f32>(&format!("state{m}"), rows, spr)?
            } else {
                Vec::new()
            };
            data.matrices.push((r, s));
        }
    } else {
        data.matrices = vec![(Vec::new(), Vec::new()); matrices];
    }
    let wb = f.u64("walker_bytes")? as usize;
    if wb > 0 {
        data.walkers = f.read::<u8>("walkers", wb, 0)?;
    }
    if u64::from(data_crc(&data.nodes, &data.matrices, &data.walkers)) != f.u64("crc32")? {
        return Err(
            f.corrupt("checksum mismatch: the shard was damaged after it was written".into())
        );
    }
    if let Some(bad) = data.nodes.iter().find(|&&n| n >= num_nodes) {
        return Err(f.corrupt(format!("node id {bad} is outside the graph")));
    }
    Ok(data)
}

/// A resumed state: the version, the global cursor (rank 0's shard) and this rank's walkers.
pub struct Restored {
    pub version: u64,
    pub cursor: Cursor,
    /// The old run had as many ranks as this one: `cursor.next_start` is this rank's own.
    pub same_ranks: bool,
    /// Encoded walkers whose current node this rank owns.
    pub walkers: Vec<u8>,
}

/// Collective: load the newest usable committed version of `dir` into `shards`. `Ok(None)` when
/// the directory holds no committed version. `route_walkers` splits encoded walkers by owner.
pub fn restore(
    comm: &Comm,
    dir: &Path,
    g: &LocalGraph,
    ident: &serde_json::Value,
    shards: &mut [Shard],
    route_walkers: impl Fn(&[u8], usize) -> std::result::Result<Vec<Vec<u8>>, String>,
) -> Result<Option<Restored>> {
    // Rank 0 lists the candidates: committed versions, newest first, with their rank counts.
    let listed = if comm.rank() == 0 {
        candidates(dir)
    } else {
        Ok(Vec::new())
    };
    let listed = agree(comm, listed)?;
    let bytes = comm.all_gather_bytes(&serde_json::to_vec(&listed).expect("json"));
    let list: Vec<(u64, Vec<FileSum>)> = serde_json::from_slice(&bytes[0]).expect("json");
    if list.is_empty() {
        if comm.rank() == 0 {
            eprintln!(
                "graphscale: no committed checkpoint in {}; starting from the beginning",
                dir.display()
            );
        }
        return Ok(None);
    }
    let (matrices, rb, spr) = (shards.len(), shards[0].row_bytes(), shards[0].state_per_row);
    let mut skipped = Vec::new();
    for (v, sums) in &list {
        let (v, old_ranks) = (*v, sums.len());
        let mut local: std::result::Result<Vec<ShardData>, Unusable> = Ok(Vec::new());
        for s in (comm.rank()..old_ranks).step_by(comm.size()) {
            let r = read_shard(
                &shard_path(dir, v, s),
                sums[s],
                ident,
                matrices,
                rb,
                spr,
                g.num_nodes(),
            );
            match (r, &mut local) {
                (Ok(d), Ok(all)) => all.push(d),
                (Err(e), Ok(_)) => local = Err(e),
                _ => {}
            }
        }
        let code = match &local {
            Ok(_) => 0,
            Err(Unusable::Corrupt(_)) => 1,
            Err(Unusable::Mismatch(_)) => 2,
        };
        let worst = comm.max_u64(code);
        if worst == 2 {
            let mine = match local {
                Err(Unusable::Mismatch(m)) => Err(Error::Mismatch(format!(
                    "refusing to resume: {m}. Resume with the original settings, or point --resume at this run's own checkpoint directory."
                ))),
                _ => Ok(()),
            };
            agree(comm, mine)?;
            unreachable!("agree fails when a rank failed");
        }
        let outcome = match local {
            Err(Unusable::Corrupt(m)) => Err(m),
            Err(Unusable::Mismatch(_)) => unreachable!("handled above"),
            Ok(data) if worst == 0 => install(comm, g, shards, data, &route_walkers),
            Ok(_) => Err(String::new()),
        };
        let failed = comm.max_u64(u64::from(outcome.is_err()));
        if failed == 0 {
            let (cursor, walkers) = outcome.expect("checked");
            // Rank 0 read old shard 0: its cursor is the global one.
            let c = comm.all_gather_bytes(&serde_json::to_vec(&cursor).expect("json"));
            let global: Cursor = serde_json::from_slice(&c[0]).expect("json");
            if comm.rank() == 0 {
                eprintln!(
                    "graphscale: resuming from checkpoint version {v} ({} ranks then, {} now; step {})",
                    old_ranks,
                    comm.size(),
                    global.step
                );
            }
            return Ok(Some(Restored {
                version: v,
                cursor: Cursor {
                    next_start: cursor.next_start,
                    ..global
                },
                same_ranks: old_ranks == comm.size(),
                walkers,
            }));
        }
        let msg = outcome.err().unwrap_or_default();
        let all = comm.all_gather_bytes(msg.as_bytes());
        let why: Vec<String> = all
            .iter()
            .enumerate()
            .filter(|(_, m)| !m.is_empty())
            .map(|(r, m)| format!("rank {r}: {}", String::from_utf8_lossy(m)))
            .collect();
        if comm.rank() == 0 {
            eprintln!(
                "graphscale: WARNING: checkpoint version {v} in {} is unusable ({}); trying the previous one",
                dir.display(),
                why.join("; ")
            );
        }
        skipped.push(format!("v{v}: {}", why.join("; ")));
    }
    Err(Error::bad_input(
        dir,
        format!(
            "no usable checkpoint (tried {}); remove the directory to start over",
            skipped.join(" | ")
        ),
    ))
}

/// Committed versions (at most the one `LATEST` names, with a manifest), newest first.
pub(crate) fn candidates(dir: &Path) -> Result<Vec<(u64, Vec<FileSum>)>> {
    let Some(latest) = latest(dir)? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for v in versions_on_disk(dir)
        .into_iter()
        .rev()
        .filter(|&v| v <= latest)
    {
        let p = version_dir(dir, v).join(MANIFEST);
        let files = std::fs::read(&p)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|m| serde_json::from_value::<Vec<FileSum>>(m.get("files")?.clone()).ok());
        match files {
            Some(f) if !f.is_empty() && f.len() < 1 << 24 => out.push((v, f)),
            _ => eprintln!(
                "graphscale: WARNING: {} is missing or unreadable; skipping checkpoint version {v}",
                p.display()
            ),
        }
    }
    if !out.iter().any(|(v, _)| *v == latest) {
        eprintln!(
            "graphscale: WARNING: {}/LATEST names version {latest}, which is incomplete",
            dir.display()
        );
    }
    Ok(out)
}

/// Route the read rows to their owners in this run and write them into the shards. Returns the
/// cursor of the first shard read (if any) and this rank's walkers.
fn install(
    comm: &Comm,
    g: &LocalGraph,
    shards: &mut [Shard],
    data: Vec<ShardData>,
    route_walkers: &impl Fn(&[u8], usize) -> std::result::Result<Vec<Vec<u8>>, String>,
) -> std::result::Result<(Cursor, Vec<u8>), String> {
    let (rb, spr) = (shards[0].row_bytes(), shards[0].state_per_row);
    let rec = 8 + shards.len() * (rb + 4 * spr);
    let mut send = vec![Vec::new(); comm.size()];
    let mut walker_send = vec![Vec::new(); comm.size()];
    let mut cursor = Cursor::default();
    let mut err = None;
    for (k, d) in data.iter().enumerate() {
        if k == 0 {
            cursor = d.cursor.clone();
        }
        for (i, &node) in d.nodes.iter().enumerate() {
            let b = &mut send[g.part.owner(node)];
            b.extend_from_slice(&node.to_le_bytes());
            for (rows, state) in &d.matrices {
                b.extend_from_slice(&rows[i * rb..(i + 1) * rb]);
                for x in &state[i * spr..(i + 1) * spr] {
                    b.extend_from_slice(&x.to_le_bytes());
                }
            }
        }
        match route_walkers(&d.walkers, comm.size()) {
            Ok(parts) => {
                for (o, p) in parts.into_iter().enumerate() {
                    walker_send[o].extend(p);
                }
            }
            Err(e) => err = Some(e),
        }
    }
    let recv = comm.all_to_all_v(send);
    let walkers: Vec<u8> = comm.all_to_all_v(walker_send).concat();
    let n = g.num_local();
    let mut seen = vec![false; n];
    for b in &recv {
        for r in b.chunks_exact(rec) {
            let node = u64::from_le_bytes(r[..8].try_into().expect("8 bytes"));
            let (owner, row) = g.part.locate(node);
            if owner != comm.rank() || seen[row] {
                err.get_or_insert(format!("node {node} arrived twice or at the wrong rank"));
                continue;
            }
            seen[row] = true;
            let mut o = 8;
            for s in shards.iter_mut() {
                let bytes = &r[o..o + rb];
                s.window
                    .with_local_mut(|w| w[row * rb..(row + 1) * rb].copy_from_slice(bytes));
                o += rb;
                for (j, c) in r[o..o + 4 * spr].chunks_exact(4).enumerate() {
                    s.state[row * spr + j] = f32::from_le_bytes(c.try_into().expect("4 bytes"));
                }
                o += 4 * spr;
            }
        }
    }
    let have = seen.iter().filter(|&&x| x).count();
    if have != n && err.is_none() {
        err = Some(format!("holds {have} of this rank's {n} rows"));
    }
    match err {
        Some(e) => Err(e),
        None => Ok((cursor, walkers)),
    }
}

/// A background shard write: the thread, and the version it belongs to.
pub struct Writing {
    pub version: u64,
    pub cursor: Cursor,
    pub handle: std::thread::JoinHandle<Result<FileSum>>,
}

/// Has `comm.rank()`'s writer finished? (for the collective decision to commit)
pub fn writer_done(w: &Option<Writing>) -> bool {
    w.as_ref().is_none_or(|w| w.handle.is_finished())
}

/// Collective: wait for every rank's writer, agree on the outcome, commit on rank 0.
pub fn finish_writing(comm: &Comm, dir: &Path, w: Writing) -> Result<()> {
    let r = w
        .handle
        .join()
        .unwrap_or_else(|_| Err(Error::config("the checkpoint writer panicked")));
    commit_written(comm, dir, (w.version, &w.cursor), r)
}

/// Collective: every rank's shard of version `v` written (its size and CRC-32, or the error):
/// agree on the outcome, and rank 0 commits the version with every rank's sum.
pub fn commit_written(
    comm: &Comm,
    dir: &Path,
    (v, cursor): (u64, &Cursor),
    written: Result<FileSum>,
) -> Result<()> {
    let sum = agree(comm, written)?;
    let all = comm.all_gather_bytes(&serde_json::to_vec(&sum).expect("json"));
    let files: Vec<FileSum> = all
        .iter()
        .map(|b| serde_json::from_slice(b).expect("json"))
        .collect();
    let c = if comm.rank() == 0 {
        commit(dir, v, &files, cursor)
    } else {
        Ok(())
    };
    agree(comm, c)
}

/// Sum-reduce helper kept here so the trainer's per-step check is one call.
pub fn poll(comm: &Comm, due: bool, done: bool) -> (bool, bool) {
    let v = comm.all_reduce_u64(&[u64::from(due), u64::from(done)], ReduceOp::Sum);
    (v[0] > 0, v[1] == comm.size() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn snapshot(rows: usize) -> Snapshot {
        Snapshot {
            rank: 0,
            ranks: 1,
            nodes: (0..rows as u64).collect(),
            matrices: vec![((0..rows * 8).map(|i| i as u8).collect(), vec![0.5; rows])],
            row_bytes: 8,
            state_per_row: 1,
            walkers: vec![1, 2, 3],
            cursor: Cursor::default(),
            identity: r#"{"dim": 2}"#.into(),
            config: "{}".into(),
            fingerprint: 7,
        }
    }

    fn read(path: &Path, sum: FileSum) -> std::result::Result<ShardData, Unusable> {
        read_shard(path, sum, &serde_json::json!({"dim": 2}), 1, 8, 1, 100)
    }

    #[test]
    fn a_written_shard_reads_back_and_a_flipped_bit_is_caught() {
        let t = tempfile::tempdir().expect("tempdir");
        let p = t.path().join("s.h5");
        write_shard(&p, &snapshot(20)).expect("write");
        let sum = file_sum(&p).expect("sum");
        let d = read(&p, sum).ok().expect("clean shard reads");
        assert_eq!(d.nodes.len(), 20);
        assert_eq!(d.matrices[0].0[9], 9);
        assert_eq!(d.walkers, vec![1, 2, 3]);
        // Find a data byte (the row bytes are 0, 1, 2, ...) and flip one bit of it.
        let mut bytes = std::fs::read(&p).expect("read");
        let pat: Vec<u8> = (40..56).collect();
        let at = bytes
            .windows(16)
            .position(|w| w == pat.as_slice())
            .expect("rows in the file");
        bytes[at + 3] ^= 1;
        std::fs::write(&p, bytes).expect("write");
        // Caught by the file checksum before libhdf5 sees the file...
        match read(&p, sum) {
            Err(Unusable::Corrupt(m)) => assert!(m.contains("damaged or truncated"), "{m}"),
            _ => panic!("a flipped bit went unnoticed"),
        }
        // ...and by the data checksum inside the file even when the outer one is bypassed.
        match read(&p, file_sum(&p).expect("sum")) {
            Err(Unusable::Corrupt(m)) => assert!(m.contains("checksum mismatch"), "{m}"),
            _ => panic!("a flipped bit went unnoticed"),
        }
    }

    proptest! {
        /// Damaged shard files (random bytes overwritten anywhere) are refused before libhdf5
        /// parses them (it crashed on such files when it did); undamaged ones read back.
        #[test]
        fn damaged_shards_never_panic(edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..16)) {
            let t = tempfile::tempdir().expect("tempdir");
            let p = t.path().join("s.h5");
            write_shard(&p, &snapshot(20)).expect("write");
            let sum = file_sum(&p).expect("sum");
            let mut bytes = std::fs::read(&p).expect("read");
            let original = bytes.clone();
            for (i, b) in &edits {
                let k = i.index(bytes.len());
                bytes[k] = *b;
            }
            std::fs::write(&p, &bytes).expect("write");
            match read(&p, sum) {
                Ok(d) => {
                    prop_assert_eq!(&bytes, &original, "damage passed the checks");
                    prop_assert_eq!(d.nodes, (0..20u64).collect::<Vec<_>>());
                }
                Err(Unusable::Corrupt(_)) => prop_assert_ne!(&bytes, &original),
                Err(Unusable::Mismatch(m)) => prop_assert!(false, "damage read as a mismatch: {}", m),
            }
        }

        /// LATEST holds anything: a number or a clean error.
        #[test]
        fn latest_never_panics(text in "\\PC{0,30}") {
            let t = tempfile::tempdir().expect("tempdir");
            std::fs::write(t.path().join(LATEST), &text).expect("write");
            let _ = latest(t.path());
        }

        /// Identities of any JSON shape compare without panicking.
        #[test]
        fn identity_comparison_never_panics(a in "\\PC{0,40}", k in "[a-z]{1,5}", v in any::<i64>()) {
            let saved: serde_json::Value = serde_json::from_str(&a).unwrap_or(serde_json::Value::Null);
            let now = serde_json::json!({ k.clone(): v });
            let d = differences(&saved, &now);
            prop_assert!(!d.is_empty() || saved.get(&k) == now.get(&k));
        }
    }

    #[test]
    fn identity_differences_name_each_setting() {
        let a = serde_json::json!({"dim": 64, "model": "deepwalk", "graph_nodes": 10});
        let b = serde_json::json!({"dim": 128, "model": "deepwalk", "graph_nodes": 10});
        let d = differences(&a, &b);
        assert_eq!(d, vec!["dim: checkpoint 64, this run 128".to_string()]);
        assert!(differences(&b, &b).is_empty());
    }

    #[test]
    fn latest_is_read_and_garbage_is_refused() {
        let t = tempfile::tempdir().expect("tempdir");
        assert!(latest(t.path()).expect("no file is fine").is_none());
        write_atomically(&t.path().join(LATEST), b"12\n").expect("write");
        assert_eq!(latest(t.path()).expect("readable"), Some(12));
        std::fs::write(t.path().join(LATEST), "x").expect("write");
        let e = latest(t.path()).expect_err("garbage").to_string();
        assert!(
            e.contains("LATEST") && e.contains("not a version number"),
            "{e}"
        );
    }

    #[test]
    fn commit_publishes_and_keeps_the_last_versions() {
        let t = tempfile::tempdir().expect("tempdir");
        for v in 1..=4 {
            std::fs::create_dir_all(version_dir(t.path(), v)).expect("mkdir");
        }
        let files = [FileSum { bytes: 1, crc32: 2 }; 3];
        commit(t.path(), 4, &files, &Cursor::default()).expect("commit");
        assert_eq!(latest(t.path()).expect("latest"), Some(4));
        assert_eq!(versions_on_disk(t.path()), vec![3, 4]);
        assert_eq!(
            candidates(t.path()).expect("list"),
            vec![(4, files.to_vec())]
        );
        // An uncommitted newer directory is never a candidate.
        std::fs::create_dir_all(version_dir(t.path(), 5)).expect("mkdir");
        assert_eq!(
            candidates(t.path()).expect("list"),
            vec![(4, files.to_vec())]
        );
    }
}
