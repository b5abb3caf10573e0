//! GraphSAGE's checkpoints (`--checkpoint-dir`, `--checkpoint-every`, `--resume`), in the
//! layout and commit protocol of the other models' (`crate::checkpoint`): a version directory
//! with one HDF5 shard per rank and a manifest of their sizes and CRC-32s, published by renaming
//! `LATEST`. A checkpoint is taken at the end of an epoch (once `--checkpoint-every` steps or
//! seconds have passed since the last, or on SIGTERM / SIGUSR1, after which the job stops with
//! exit code 4). Rank 0's shard holds the weights, Adam's state, the best validation epoch's
//! weights and score and the cursor; every rank's shard holds its learnable input rows (ids,
//! values, sparse Adam state, the best epoch's copy). A resume at any rank count reads rank 0's
//! shard on every rank and every shard's rows on every rank, keeping those it owns.

use std::path::Path;

use hdf5::types::VarLenUnicode;

use crate::checkpoint::{self, Cursor, FileSum};
use crate::comm::Comm;
use crate::config::TrainConfig;
use crate::error::{Error, Result};
use crate::model::sage::{Adam, Sage};
use crate::spmd::agree;

use super::Learned;

/// Layout version of GraphSAGE's shard files.
const SAGE_FORMAT: u64 = 1;

/// What must match between a GraphSAGE checkpoint and the run resuming it (`--epochs` may
/// grow: a resume can train on).
pub(super) fn identity(cfg: &TrainConfig, dims: &[usize], nodes: u64) -> serde_json::Value {
    let s = cfg.sage.as_ref().expect("sage settings");
    serde_json::json!({
        "model": "sage",
        "graph_nodes": nodes,
        "dims": dims,
        "aggregator": s.aggregator,
        "input": s.input,
        "fanout": s.fanout,
        "feature_norm": s.feature_norm,
        "lr": cfg.lr,
        "weight_decay": s.weight_decay,
        "dropout": s.dropout,
        "batch_size": cfg.batch_size,
        "seed": cfg.seed,
    })
}

/// The training state a checkpoint holds besides the learnable rows.
pub(super) struct State {
    pub cursor: Cursor,
    pub params: Vec<f32>,
    pub best_params: Vec<f32>,
    pub adam: (Vec<f32>, Vec<f32>, i32),
}

/// Collective: write checkpoint version `next_version(dir)` of `sage`, `adam`, the best epoch
/// (`best_params`, score and cursor in `cursor`) and the `learned` rows, and commit it.
/// Returns the version.
pub(super) fn save(
    comm: &Comm,
    dir: &Path,
    ident: &serde_json::Value,
    (sage, adam, best_params): (&Sage, &Adam, &[f32]),
    cursor: &Cursor,
    learned: Option<&Learned>,
) -> Result<u64> {
    let v = checkpoint::next_version(comm, dir)?;
    let vdir = checkpoint::version_dir(dir, v);
    let made = if comm.rank() == 0 {
        std::fs::create_dir_all(&vdir).map_err(|e| Error::io(&vdir, e))
    } else {
        Ok(())
    };
    agree(comm, made)?;
    let path = checkpoint::shard_path(dir, v, comm.rank());
    let written = write(
        &path,
        ident,
        cursor,
        comm.rank() == 0,
        (sage, adam, best_params),
        learned,
    )
    .and_then(|()| checkpoint::file_sum(&path));
    checkpoint::commit_written(comm, dir, (v, cursor), written)?;
    Ok(v)
}

/// One rank's shard: the identity and cursor, rank 0's dense state, the rank's rows; fsynced.
fn write(
    path: &Path,
    ident: &serde_json::Value,
    cursor: &Cursor,
    dense: bool,
    (sage, adam, best_params): (&Sage, &Adam, &[f32]),
    learned: Option<&Learned>,
) -> Result<()> {
    let err = |what: &'static str| move |e| Error::hdf5(path, what, e);
    {
        let f = hdf5::File::create(path).map_err(err("create checkpoint shard"))?;
        let put = |name: &str, x: &[f32]| {
            f.new_dataset_builder()
                .with_data(x)
                .create(name)
                .map(|_| ())
        };
        if dense {
            let (m, v, t) = adam.state();
            put("weights", &sage.params)
                .and_then(|()| put("best_weights", best_params))
                .and_then(|()| put("adam_m", m))
                .and_then(|()| put("adam_v", v))
                .and_then(|()| {
                    f.new_attr::<i64>()
                        .create("adam_t")?
                        .write_scalar(&i64::from(t))
                })
                .map_err(err("write the weights and Adam's state"))?;
        }
        if let Some(l) = learned {
            let (ids, rows, state, kept) = l.parts();
            f.new_dataset_builder()
                .with_data(&ids)
                .create("learned_ids")
                .map(|_| ())
                .and_then(|()| put("learned_rows", &rows))
                .and_then(|()| put("learned_state", state))
                .and_then(|()| put("learned_kept", &kept))
                .map_err(err("write the learnable rows"))?;
        }
        let text = |name: &str, v: &str| -> hdf5::Result<()> {
            let v: VarLenUnicode = v.parse().expect("no NUL in attribute text");
            f.new_attr::<VarLenUnicode>().create(name)?.write_scalar(&v)
        };
        text("identity", &ident.to_string())
            .and_then(|()| text("cursor", &serde_json::to_string(cursor).expect("json")))
            .and_then(|()| {
                f.new_attr::<u64>()
                    .create("sage_format")?
                    .write_scalar(&SAGE_FORMAT)
            })
            // The other models' reader then names the model that differs.
            .and_then(|()| {
                f.new_attr::<u64>()
                    .create("format_version")?
                    .write_scalar(&checkpoint::FORMAT_VERSION)
            })
            .map_err(err("write attributes"))?;
        crate::graph::h5::flush(&f, path)?;
    }
    checkpoint::fsync(path)
}

/// An open, checked shard of version `v`.
fn open_shard(
    dir: &Path,
    v: u64,
    rank: usize,
    sum: FileSum,
    ident: &serde_json::Value,
) -> Result<hdf5::File> {
    let path = checkpoint::shard_path(dir, v, rank);
    let found = checkpoint::file_sum(&path)?;
    if found != sum {
        return Err(Error::bad_input(
            &path,
            format!(
                "damaged checkpoint shard: {} bytes, CRC-32 {:08x}; the manifest says {} bytes, {:08x}; resume from another directory or remove this one to start over",
                found.bytes, found.crc32, sum.bytes, sum.crc32
            ),
        ));
    }
    let f = hdf5::File::open(&path).map_err(|e| Error::hdf5(&path, "open checkpoint shard", e))?;
    let text = |name: &str| -> Option<String> {
        f.attr(name)
            .and_then(|a| a.read_scalar::<VarLenUnicode>())
            .ok()
            .map(|v| v.as_str().to_string())
    };
    let saved: serde_json::Value = text("identity")
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(serde_json::Value::Null);
    if saved.get("model").and_then(|m| m.as_str()) != Some("sage") {
        return Err(Error::Mismatch(format!(
            "{}: not a GraphSAGE checkpoint; resume it with the model that wrote it",
            path.display()
        )));
    }
    let diff = checkpoint::differences(&saved, ident);
    if !diff.is_empty() {
        return Err(Error::Mismatch(format!(
            "refusing to resume: the checkpoint in {} is another run's ({}); resume with its settings",
            dir.display(),
            diff.join("; ")
        )));
    }
    Ok(f)
}

/// Collective: the newest committed checkpoint of `dir` into `adam` and `learned`; its state,
/// or `None` when `dir` holds none (the run starts from the beginning).
pub(super) fn load(
    comm: &Comm,
    dir: &Path,
    ident: &serde_json::Value,
    adam: &mut Adam,
    learned: Option<&mut Learned>,
) -> Result<Option<State>> {
    let listed = if comm.rank() == 0 {
        checkpoint::candidates(dir)
    } else {
        Ok(Vec::new())
    };
    let listed = agree(comm, listed)?;
    let bytes = comm.all_gather_bytes(&serde_json::to_vec(&listed.first()).expect("json"));
    let newest: Option<(u64, Vec<FileSum>)> = serde_json::from_slice(&bytes[0]).expect("json");
    let Some((v, sums)) = newest else {
        if comm.rank() == 0 {
            eprintln!(
                "graphscale: no committed checkpoint in {}; starting from the beginning",
                dir.display()
            );
        }
        return Ok(None);
    };
    let state = agree(comm, read_dense(dir, v, sums[0], ident))?;
    if !adam.restore(state.adam.0.clone(), state.adam.1.clone(), state.adam.2) {
        return Err(Error::Mismatch(
            "the checkpoint's Adam state does not fit the model".into(),
        ));
    }
    if let Some(l) = learned {
        let mut installed = 0u64;
        for (rank, &sum) in sums.iter().enumerate() {
            let read = open_shard(dir, v, rank, sum, ident).and_then(|f| {
                let err = |e| Error::hdf5(dir, "read learnable rows of a checkpoint", e);
                let ids: Vec<u64> = f
                    .dataset("learned_ids")
                    .and_then(|d| d.read_raw())
                    .map_err(err)?;
                let get = |name: &str| {
                    f.dataset(name)
                        .and_then(|d| d.read_raw::<f32>())
                        .map_err(err)
                };
                let (rows, st, kept) = (
                    get("learned_rows")?,
                    get("learned_state")?,
                    get("learned_kept")?,
                );
                Ok(l.install(&ids, &rows, &st, &kept) as u64)
            });
            installed += agree(comm, read)?;
        }
        if comm.sum_u64(installed) != l.nodes() {
            return Err(Error::bad_input(
                dir,
                "the checkpoint's learnable rows do not cover every node: damaged or another graph's",
            ));
        }
    }
    comm.barrier();
    if comm.rank() == 0 {
        eprintln!(
            "graphscale: resuming from checkpoint version {v} ({} ranks then, {} now; {} epochs done)",
            sums.len(),
            comm.size(),
            state.cursor.epoch
        );
    }
    Ok(Some(state))
}

/// Collective: with `--resume`, the checkpoint's weights into `sage` and the rest as [`load`]
/// puts it.
pub(super) fn resume(
    comm: &Comm,
    cfg: &TrainConfig,
    ident: &serde_json::Value,
    (sage, adam): (&mut Sage, &mut Adam),
    learned: Option<&mut Learned>,
) -> Result<Option<State>> {
    let Some(dir) = &cfg.resume else {
        return Ok(None);
    };
    let st = load(comm, dir, ident, adam, learned)?;
    if let Some(st) = &st {
        sage.params.clone_from(&st.params);
    }
    Ok(st)
}

/// Rank 0's shard of version `v`: the weights, Adam's state and the cursor.
fn read_dense(dir: &Path, v: u64, sum: FileSum, ident: &serde_json::Value) -> Result<State> {
    let f = open_shard(dir, v, 0, sum, ident)?;
    let err = |e| Error::hdf5(dir, "read a checkpoint's weights", e);
    let get = |name: &str| {
        f.dataset(name)
            .and_then(|d| d.read_raw::<f32>())
            .map_err(err)
    };
    let t: i64 = f
        .attr("adam_t")
        .and_then(|a| a.read_scalar())
        .map_err(err)?;
    let cursor: Cursor = f
        .attr("cursor")
        .and_then(|a| a.read_scalar::<VarLenUnicode>())
        .ok()
        .and_then(|c| serde_json::from_str(c.as_str()).ok())
        .ok_or_else(|| Error::bad_input(dir, "a checkpoint without its cursor"))?;
    Ok(State {
        cursor,
        params: get("weights")?,
        best_params: get("best_weights")?,
        adam: (get("adam_m")?, get("adam_v")?, t as i32),
    })
}
