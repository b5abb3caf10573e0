//! Embeddings out: `embeddings` (num_nodes x dim, f32, row i = node i) in HDF5, with the effective
//! config and provenance as attributes. Rank 0 creates the file; then each rank in turn writes
//! its own rows as one (strided, for the striped partition) hyperslab, in bounded chunks. No rank
//! ever gathers the matrix.

use std::path::Path;

use hdf5::types::VarLenUnicode;
use ndarray::{s, Array2};

use crate::comm::Comm;
use crate::config::TrainConfig;
use crate::error::{Error, Result};
use crate::graph::partition::Scheme;
use crate::graph::LocalGraph;
use crate::spmd::agree;
use crate::store::{decode_row, Shard};

/// Bytes of f32 rows written per hyperslab: bounds the conversion buffer (and HDF5's copy of a
/// chunk, as large), 16 MiB together.
pub const WRITE_BYTES: usize = 8 << 20;

/// Rows per hyperslab (and per chunk of the dataset) at `dim`.
fn write_rows_at(dim: usize) -> usize {
    (WRITE_BYTES / (4 * dim.max(1))).max(1)
}

pub fn write_embeddings(
    comm: &Comm,
    path: &Path,
    g: &LocalGraph,
    shard: &Shard,
    cfg: &TrainConfig,
) -> Result<()> {
    let n = g.num_nodes() as usize;
    let dim = shard.dim;
    let created = if comm.rank() == 0 {
        create(path, n, dim, cfg, comm.size())
    } else {
        Ok(())
    };
    agree(comm, created)?;
    // A graph relabelled by `graphscale reorder`: rows go back to their original ids.
    let ids = agree(comm, original_ids(&cfg.graph, g))?;
    let rows = ids.map(|ids| to_original_order(comm, &cfg.graph, g, shard, &ids));
    let rows = match rows {
        Some(r) => Some(agree(comm, r)?),
        None => None,
    };
    for r in 0..comm.size() {
        let res = if r == comm.rank() {
            match &rows {
                Some((first, a)) => write_block(path, *first, a),
                None => write_rows(path, g, shard),
            }
        } else {
            Ok(())
        };
        agree(comm, res)?;
    }
    Ok(())
}

/// The original id of each of this rank's rows, when the graph file has `original_ids`.
fn original_ids(graph: &Path, g: &LocalGraph) -> Result<Option<Vec<u64>>> {
    let f = crate::graph::h5::open_h5(graph)?;
    let Ok(ds) = f.dataset("original_ids") else {
        return Ok(None);
    };
    let n = g.num_nodes();
    if ds.shape() != [n as usize] {
        return Err(Error::bad_input(
            graph,
            format!(
                "'original_ids' has shape {:?}; it must hold one id per node ({n})",
                ds.shape()
            ),
        ));
    }
    let rows = g.num_local();
    if rows == 0 {
        return Ok(Some(Vec::new()));
    }
    let first = g.part.global(g.rank, 0) as usize;
    let last = g.part.global(g.rank, rows - 1) as usize;
    let step = if g.part.scheme() == Scheme::Striped {
        g.part.ranks()
    } else {
        1
    };
    let ids: Vec<u64> = ds
        .read_slice_1d::<u64, _>(s![first..last + 1;step])
        .map_err(|e| Error::hdf5(graph, "read original_ids", e))?
        .to_vec();
    if let Some(bad) = ids.iter().find(|&&o| o >= n) {
        return Err(Error::bad_input(
            graph,
            format!("'original_ids' holds {bad}, beyond num_nodes {n}"),
        ));
    }
    Ok(Some(ids))
}

/// Collective: send every row to the rank that writes its original id's range (ranks write
/// equal contiguous ranges); returns this rank's first original id and its rows in order.
fn to_original_order(
    comm: &Comm,
    graph: &Path,
    g: &LocalGraph,
    shard: &Shard,
    ids: &[u64],
) -> Result<(usize, Array2<f32>)> {
    let (n, ranks, dim) = (g.num_nodes() as usize, comm.size(), shard.dim);
    let span = n.div_ceil(ranks).max(1);
    let rb = shard.row_bytes();
    let mut send = vec![Vec::new(); ranks];
    let mut row = vec![0f32; dim];
    shard.window.with_local(|bytes| {
        for (r, &o) in ids.iter().enumerate() {
            decode_row(shard.dtype, &bytes[r * rb..(r + 1) * rb], &mut row);
            let b = &mut send[o as usize / span];
            b.extend_from_slice(&o.to_le_bytes());
            for x in &row {
                b.extend_from_slice(&x.to_le_bytes());
            }
        }
    });
    let first = (comm.rank() * span).min(n);
    let len = ((comm.rank() + 1) * span).min(n) - first;
    let mut a = Array2::<f32>::zeros((len, dim));
    let mut filled = vec![false; len];
    for b in comm.all_to_all_v(send) {
        for rec in b.chunks_exact(8 + 4 * dim) {
            let o = u64::from_le_bytes(rec[..8].try_into().expect("8 bytes")) as usize;
            let i = o - first;
            if filled[i] {
                return Err(Error::bad_input(
                    graph,
                    format!("'original_ids' holds {o} twice: it must be a permutation"),
                ));
            }
            filled[i] = true;
            for (x, c) in a.row_mut(i).iter_mut().zip(rec[8..].chunks_exact(4)) {
                *x = f32::from_le_bytes(c.try_into().expect("4 bytes"));
            }
        }
    }
    if let Some(i) = filled.iter().position(|f| !f) {
        return Err(Error::bad_input(
            graph,
            format!(
                "'original_ids' lacks {}: it must be a permutation",
                first + i
            ),
        ));
    }
    Ok((first, a))
}

fn write_block(path: &Path, first: usize, a: &Array2<f32>) -> Result<()> {
    if a.nrows() == 0 {
        return Ok(());
    }
    let f = hdf5::File::open_rw(path).map_err(|e| Error::hdf5(path, "open output", e))?;
    let ds = f
        .dataset("embeddings")
        .map_err(|e| Error::hdf5(path, "open embeddings", e))?;
    ds.write_slice(a, s![first..first + a.nrows(), ..])
        .map_err(|e| Error::hdf5(path, "write embeddings", e))
}

fn create(path: &Path, n: usize, dim: usize, cfg: &TrainConfig, ranks: usize) -> Result<()> {
    let f = hdf5::File::create(path).map_err(|e| Error::hdf5(path, "create output", e))?;
    let err = |what: &'static str| move |e| Error::hdf5(path, what, e);
    f.new_dataset::<f32>()
        .chunk((write_rows_at(dim).min(n).max(1), dim))
        .shape((n, dim))
        .create("embeddings")
        .map_err(err("create dataset embeddings"))?;
    let text = |name: &str, v: &str| -> hdf5::Result<()> {
        let v: VarLenUnicode = v.parse().expect("no NUL in attribute text");
        f.new_attr::<VarLenUnicode>().create(name)?.write_scalar(&v)
    };
    text("config", &cfg.to_json()).map_err(err("attribute config"))?;
    text("model", &format!("{:?}", cfg.model).to_lowercase()).map_err(err("attribute model"))?;
    text("graph", &cfg.graph.display().to_string()).map_err(err("attribute graph"))?;
    text("graphscale_version", env!("CARGO_PKG_VERSION")).map_err(err("attribute version"))?;
    f.new_attr::<u64>()
        .create("ranks")
        .and_then(|a| a.write_scalar(&(ranks as u64)))
        .map_err(err("attribute ranks"))?;
    Ok(())
}

fn write_rows(path: &Path, g: &LocalGraph, shard: &Shard) -> Result<()> {
    let f = hdf5::File::open_rw(path).map_err(|e| Error::hdf5(path, "open output", e))?;
    let ds = f
        .dataset("embeddings")
        .map_err(|e| Error::hdf5(path, "open embeddings", e))?;
    let (dim, rb, rows) = (shard.dim, shard.row_bytes(), shard.rows);
    let (rank, ranks) = (g.rank, g.part.ranks());
    shard.window.with_local(|bytes| -> Result<()> {
        let mut start = 0;
        while start < rows {
            let end = (start + write_rows_at(dim)).min(rows);
            let mut a = Array2::<f32>::zeros((end - start, dim));
            for (i, mut row) in a.rows_mut().into_iter().enumerate() {
                let r = start + i;
                decode_row(
                    shard.dtype,
                    &bytes[r * rb..(r + 1) * rb],
                    row.as_slice_mut().expect("standard layout"),
                );
            }
            let first = g.part.global(rank, start) as usize;
            let res = match g.part.scheme() {
                Scheme::Striped => {
                    let last = g.part.global(rank, end - 1) as usize;
                    ds.write_slice(&a, s![first..last + 1;ranks, ..])
                }
                Scheme::Block => ds.write_slice(&a, s![first..first + (end - start), ..]),
            };
            res.map_err(|e| Error::hdf5(path, "write embeddings", e))?;
            start = end;
        }
        Ok(())
    })
}

/// Read `embeddings` back (evaluation, export, tests): returns (rows, dim, row-major data).
pub fn read_embeddings(path: &Path) -> Result<(usize, usize, Vec<f32>)> {
    read_embeddings_stripe(path, 0, 1)
}

/// Rows `rank, rank + ranks, ...` of an embeddings file (one rank's stripe): returns (total
/// rows, dim, row-major stripe). Non-finite values are refused, naming row and column.
pub fn read_embeddings_stripe(
    path: &Path,
    rank: usize,
    ranks: usize,
) -> Result<(usize, usize, Vec<f32>)> {
    let f = crate::graph::h5::open_h5(path)?;
    let ds = f
        .dataset("embeddings")
        .map_err(|_| Error::bad_input(path, "missing dataset 'embeddings' (num_nodes x dim)"))?;
    let shape = ds.shape();
    if shape.len() != 2 {
        return Err(Error::bad_input(
            path,
            format!("'embeddings' must be 2-D, found shape {shape:?}"),
        ));
    }
    let (rows, dim) = (shape[0], shape[1]);
    let data: Vec<f32> = if ranks == 1 {
        ds.read_raw::<f32>()
            .map_err(|e| Error::hdf5(path, "read embeddings", e))?
    } else if rank < rows {
        let a: Array2<f32> = ds
            .read_slice(s![rank..rows;ranks, ..])
            .map_err(|e| Error::hdf5(path, "read embeddings", e))?;
        a.into_raw_vec_and_offset().0
    } else {
        Vec::new()
    };
    if let Some(i) = data.iter().position(|x| !x.is_finite()) {
        return Err(Error::bad_input(
            path,
            format!(
                "embeddings contain a non-finite value at row {}, column {}",
                rank + (i / dim) * ranks,
                i % dim
            ),
        ));
    }
    Ok((rows, dim, data))
}
