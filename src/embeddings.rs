//! Embeddings out: `embeddings` (num_nodes x dim, f32, row i = node i) in HDF5, with the effective
//! config and provenance as attributes. Rank 0 creates the file; then each rank in turn writes
//! contiguous rows in bounded blocks: its own rows under the block partition (or alone), and
//! under the striped partition (or a relabelled graph) a contiguous range of ids whose rows the
//! ranks exchange window by window. No rank ever gathers the matrix.

use std::path::Path;

use hdf5::types::VarLenUnicode;
use ndarray::{s, Array2};

use crate::comm::Comm;
use crate::config::{Dtype, TrainConfig};
use crate::error::{Error, Result};
use crate::graph::nodedata::read_owned_rows;
use crate::graph::partition::{Partitioner, Scheme};
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
    if let Some(ids) = agree(comm, original_ids(&cfg.graph, g))? {
        let window = write_rows_at(dim);
        let at = (path, "embeddings");
        return write_original_order(comm, at, &cfg.graph, n, shard, &ids, window);
    }
    // Striped rows across ranks: each rank's rows are every p-th of every chunk, so strided
    // writes would rewrite every chunk p times (R-MAT 2^20, d 64: 6.4 s at 2 ranks, 8.3 s at 4,
    // against 0.9 s at 1). The ranks exchange rows instead and each writes contiguous windows.
    if comm.size() > 1 && g.part.scheme() == Scheme::Striped {
        let ids: Vec<u64> = (0..g.num_local())
            .map(|i| g.part.global(g.rank, i))
            .collect();
        let at = (path, "embeddings");
        return write_original_order(comm, at, &cfg.graph, n, shard, &ids, write_rows_at(dim));
    }
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

/// Copy the graph's `node_names` (if it has them) beside the rows, row i's name at i: in the
/// original order for a graph relabelled by `reorder` (its rows are written in that order).
/// Knowledge-graph models write their own (entities and relations).
pub fn write_names(path: &Path, graph: &Path, kg: bool) -> Result<()> {
    if kg {
        return Ok(());
    }
    let gf = crate::graph::h5::open_h5(graph)?;
    let Some(names) = crate::graph::h5::read_names(&gf, graph, "node_names")? else {
        return Ok(());
    };
    let names = match gf.dataset("original_ids") {
        Ok(ds) => {
            let ids: Vec<u64> = ds
                .read_raw()
                .map_err(|e| Error::hdf5(graph, "read original_ids", e))?;
            let mut out = vec![String::new(); names.len()];
            for (new, &old) in ids.iter().enumerate() {
                if let (Some(slot), Some(name)) = (out.get_mut(old as usize), names.get(new)) {
                    slot.clone_from(name);
                }
            }
            out
        }
        Err(_) => names,
    };
    let f = hdf5::File::open_rw(path).map_err(|e| Error::hdf5(path, "open output", e))?;
    crate::graph::h5::write_names(&f, path, "node_names", &names)?;
    crate::graph::h5::flush(&f, path)
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

/// A reader of a rank's row `r` into an f32 buffer.
pub type ReadRow<'a> = &'a dyn Fn(usize, &mut [f32]);

/// Rows a rank writes, as f32: `with_rows` hands `f` a reader of the rank's rows.
pub trait RowSource {
    fn dim(&self) -> usize;
    fn with_rows(&self, f: &mut dyn FnMut(ReadRow));
}

impl RowSource for Shard {
    fn dim(&self) -> usize {
        self.dim
    }

    fn with_rows(&self, f: &mut dyn FnMut(ReadRow)) {
        let rb = self.row_bytes();
        self.window.with_local(|bytes| {
            f(&|r, out| decode_row(self.dtype, &bytes[r * rb..(r + 1) * rb], out));
        });
    }
}

/// Rows held as one row-major f32 array of width `.1`.
pub struct DenseRows<'a>(pub &'a [f32], pub usize);

impl RowSource for DenseRows<'_> {
    fn dim(&self) -> usize {
        self.1
    }

    fn with_rows(&self, f: &mut dyn FnMut(ReadRow)) {
        let (x, d) = (self.0, self.1);
        f(&|r, out| out.copy_from_slice(&x[r * d..(r + 1) * d]));
    }
}

/// Collective: rows given by global id (`ids[i]` is this rank's row i of `src`) into the
/// dataset `at.1` (`n` x `src.dim()`, f32) of the file rank 0 created at `at.0`, each row at its
/// id, window by window: no rank holds more than a window of other ranks' rows.
pub fn write_by_id<S: RowSource + ?Sized>(
    comm: &Comm,
    at: (&Path, &str),
    graph: &Path,
    n: usize,
    src: &S,
    ids: &[u64],
) -> Result<()> {
    write_original_order(comm, at, graph, n, src, ids, write_rows_at(src.dim()))
}

/// A dataset `name` of `n` x `dim` f32 rows in the file at `path`, chunked as the writes of
/// [`write_by_id`] are.
pub(crate) fn create_rows(path: &Path, name: &str, n: usize, dim: usize) -> Result<()> {
    let f = hdf5::File::open_rw(path).map_err(|e| Error::hdf5(path, "open output", e))?;
    f.new_dataset::<f32>()
        .chunk((write_rows_at(dim).min(n).max(1), dim.max(1)))
        .shape((n, dim))
        .create(name)
        .map_err(|e| Error::hdf5(path, format!("create dataset {name}"), e))?;
    crate::graph::h5::flush(&f, path)
}

/// Collective: write every row at its original id. Rank r writes original ids
/// `r span..(r + 1) span` (`span` = nodes / ranks, rounded up) in windows of `window` rows
/// (`write_rows_at(dim)`): in round k every rank sends the rows whose original ids fall in window k of each
/// rank's range (its rows sorted by original id, so each is the next run of that list), and each
/// rank writes its window once the ranks before it have written theirs. Memory stays at a
/// window's rows per round, not a second copy of the shard.
fn write_original_order<S: RowSource + ?Sized>(
    comm: &Comm,
    (path, dataset): (&Path, &str),
    graph: &Path,
    n: usize,
    src: &S,
    ids: &[u64],
    window: usize,
) -> Result<()> {
    let (ranks, dim) = (comm.size(), src.dim());
    let span = n.div_ceil(ranks).max(1);
    // This rank's rows by original id, and per destination rank a cursor into that order.
    let mut order: Vec<u32> = (0..ids.len() as u32).collect();
    order.sort_unstable_by_key(|&r| ids[r as usize]);
    let mut cursor: Vec<usize> = (0..ranks)
        .map(|d| order.partition_point(|&r| (ids[r as usize] as usize) < d * span))
        .collect();
    let first = (comm.rank() * span).min(n);
    let len = ((comm.rank() + 1) * span).min(n) - first;
    let mut row = vec![0f32; dim];
    let rec = 8 + 4 * dim;
    for k in 0..span.div_ceil(window) {
        let mut send = vec![Vec::new(); ranks];
        src.with_rows(&mut |read| {
            for (d, b) in send.iter_mut().enumerate() {
                let end = (d * span + (k + 1) * window).min((d + 1) * span);
                while let Some(&r) = order.get(cursor[d]) {
                    let o = ids[r as usize];
                    if o as usize >= end {
                        break;
                    }
                    let r = r as usize;
                    read(r, &mut row);
                    b.extend_from_slice(&o.to_le_bytes());
                    for x in &row {
                        b.extend_from_slice(&x.to_le_bytes());
                    }
                    cursor[d] += 1;
                }
            }
        });
        // This rank's window k: original ids `lo..lo + rows`.
        let lo = first + (k * window).min(len);
        let rows = (first + ((k + 1) * window).min(len)) - lo;
        let mut a = Array2::<f32>::zeros((rows, dim));
        let mut filled = vec![false; rows];
        let mut res = Ok(());
        for b in comm.all_to_all_v(send) {
            for x in b.chunks_exact(rec) {
                let o = u64::from_le_bytes(x[..8].try_into().expect("8 bytes")) as usize;
                let i = o - lo;
                if filled[i] {
                    res = Err(Error::bad_input(
                        graph,
                        format!("'original_ids' holds {o} twice: it must be a permutation"),
                    ));
                    continue;
                }
                filled[i] = true;
                for (y, c) in a.row_mut(i).iter_mut().zip(x[8..].chunks_exact(4)) {
                    *y = f32::from_le_bytes(c.try_into().expect("4 bytes"));
                }
            }
        }
        if let (Ok(()), Some(i)) = (&res, filled.iter().position(|f| !f)) {
            res = Err(Error::bad_input(
                graph,
                format!("'original_ids' lacks {}: it must be a permutation", lo + i),
            ));
        }
        for r in 0..ranks {
            let done = if r == comm.rank() {
                std::mem::replace(&mut res, Ok(())).and_then(|()| {
                    if rows > 0 {
                        write_block((path, dataset), lo, &a)
                    } else {
                        Ok(())
                    }
                })
            } else {
                Ok(())
            };
            agree(comm, done)?;
        }
    }
    Ok(())
}

fn write_block((path, name): (&Path, &str), first: usize, a: &Array2<f32>) -> Result<()> {
    if a.nrows() == 0 {
        return Ok(());
    }
    let f = hdf5::File::open_rw(path).map_err(|e| Error::hdf5(path, "open output", e))?;
    let ds = f
        .dataset(name)
        .map_err(|e| Error::hdf5(path, format!("open {name}"), e))?;
    ds.write_slice(a, s![first..first + a.nrows(), ..])
        .map_err(|e| Error::hdf5(path, format!("write {name}"), e))?;
    crate::graph::h5::flush(&f, path)
}

pub(crate) fn create(
    path: &Path,
    n: usize,
    dim: usize,
    cfg: &TrainConfig,
    ranks: usize,
) -> Result<()> {
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
    crate::graph::h5::flush(&f, path)
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
        crate::graph::h5::flush(&f, path)
    })
}

/// The `node_names` of an embeddings file (row i's name at i), if it has them.
pub fn read_node_names(path: &Path) -> Result<Option<Vec<String>>> {
    let f = crate::graph::h5::open_h5(path)?;
    crate::graph::h5::read_names(&f, path, "node_names")
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
    let (rows, dim) = embeddings_shape(path)?;
    let f = crate::graph::h5::open_h5(path)?;
    let ds = f
        .dataset("embeddings")
        .map_err(|e| Error::hdf5(path, "open embeddings", e))?;
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
        return Err(non_finite(path, rank + (i / dim) * ranks, i % dim));
    }
    Ok((rows, dim, data))
}

/// Collective: rows `rank, rank + ranks, ...` of an embeddings file, as
/// [`read_embeddings_stripe`] returns them, read in slabs of consecutive rows that the ranks
/// send to their rows' holders (`graph::nodedata::read_owned_rows`): a strided selection is
/// read row by row, about 10x slower per row.
pub fn read_embeddings_striped(comm: &Comm, path: &Path) -> Result<(usize, usize, Vec<f32>)> {
    if comm.size() == 1 {
        return read_embeddings(path);
    }
    let (rows, dim) = agree(comm, embeddings_shape(path))?;
    let part = Partitioner::new(Scheme::Striped, rows as u64, comm.size());
    let rank = comm.rank();
    let mut data = vec![0f32; part.num_local(rank) * dim];
    let mut bad = None;
    read_owned_rows(
        comm,
        (path, "embeddings"),
        &part,
        (dim, Dtype::F32),
        |r, row| {
            if let (None, Some(c)) = (bad, row.iter().position(|x| !x.is_finite())) {
                bad = Some((part.global(rank, r), c));
            }
            data[r * dim..(r + 1) * dim].copy_from_slice(row);
        },
    )?;
    let checked = bad.map_or(Ok(()), |(i, c)| Err(non_finite(path, i as usize, c)));
    agree(comm, checked)?;
    Ok((rows, dim, data))
}

/// The shape (rows, dim) of an embeddings file's `embeddings`, which must be 2-D.
fn embeddings_shape(path: &Path) -> Result<(usize, usize)> {
    let f = crate::graph::h5::open_h5(path)?;
    let ds = f
        .dataset("embeddings")
        .map_err(|_| Error::bad_input(path, "missing dataset 'embeddings' (num_nodes x dim)"))?;
    match ds.shape()[..] {
        [rows, dim] => Ok((rows, dim)),
        ref shape => Err(Error::bad_input(
            path,
            format!("'embeddings' must be 2-D, found shape {shape:?}"),
        )),
    }
}

fn non_finite(path: &Path, row: usize, col: usize) -> Error {
    Error::bad_input(
        path,
        format!("embeddings contain a non-finite value at row {row}, column {col}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::local;
    use crate::config::{Dtype, Optimizer};
    use crate::graph::partition::{Partitioner, Scheme};

    /// Three ranks, windows of 5 rows (7 rounds): every row lands at its original id.
    #[test]
    fn rows_go_back_to_their_original_ids_in_rounds() {
        // New id v was original id (7 v + 3) mod n (a permutation: 7 and 101 are coprime).
        rows_land_at(|v| (7 * v + 3) % 101);
    }

    /// The striped partition's rows written as contiguous windows (what `write_embeddings`
    /// does across ranks): row i is node i.
    #[test]
    fn striped_rows_are_written_in_contiguous_windows() {
        rows_land_at(|v| v);
    }

    fn rows_land_at(original: impl Fn(u64) -> u64 + Sync) {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("e.h5");
        let (n, dim) = (101u64, 3);
        hdf5::File::create(&path)
            .unwrap()
            .new_dataset::<f32>()
            .shape((n as usize, dim))
            .create("embeddings")
            .unwrap();
        local::run(3, std::time::Duration::from_secs(30), |c| {
            let part = Partitioner::new(Scheme::Striped, n, c.size());
            let g = LocalGraph::from_entries(c.rank(), part.clone(), &[], 0, false, false);
            let rows = part.num_local(c.rank());
            let mut shard = Shard::new(&c, rows, dim, Dtype::F32, Optimizer::Sgd, false);
            let global = |r: usize| part.global(c.rank(), r);
            shard.init(|r, out| {
                for (j, x) in out.iter_mut().enumerate() {
                    *x = (global(r) * 10 + j as u64) as f32;
                }
            });
            let ids: Vec<u64> = (0..rows).map(|r| original(global(r))).collect();
            let at = (path.as_path(), "embeddings");
            write_original_order(&c, at, &path, g.num_nodes() as usize, &shard, &ids, 5).unwrap();
        });
        let (rows, got_dim, data) = read_embeddings(&path).unwrap();
        assert_eq!((rows, got_dim), (n as usize, dim));
        for v in 0..n {
            let o = original(v) as usize;
            let want: Vec<f32> = (0..dim).map(|j| (v * 10 + j as u64) as f32).collect();
            assert_eq!(&data[o * dim..(o + 1) * dim], &want[..], "node {v} at {o}");
        }
    }
}
