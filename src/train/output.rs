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

/// Rows written per hyperslab (bounds the conversion buffer).
const WRITE_ROWS: usize = 1 << 18;

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
    for r in 0..comm.size() {
        let res = if r == comm.rank() {
            write_rows(path, g, shard)
        } else {
            Ok(())
        };
        agree(comm, res)?;
    }
    Ok(())
}

fn create(path: &Path, n: usize, dim: usize, cfg: &TrainConfig, ranks: usize) -> Result<()> {
    let f = hdf5::File::create(path).map_err(|e| Error::hdf5(path, "create output", e))?;
    let err = |what: &'static str| move |e| Error::hdf5(path, what, e);
    f.new_dataset::<f32>()
        .chunk((WRITE_ROWS.min(n).max(1), dim))
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
            let end = (start + WRITE_ROWS).min(rows);
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
