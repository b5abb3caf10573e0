//! GraphSAGE's learnable input rows (`--input learned|both`): a row of `--dim` values per node,
//! stored as the walk models' rows are. Sharded (the default strategy), a rank holds its own
//! nodes' rows in an RMA window with their sparse Adam state; a step reads the rows of its input
//! nodes (its own from the window, the others' one-sidedly from their owners) and pushes their
//! gradients to the owners in one exchange. An owner sums the gradients every rank sent for a
//! row and takes one Adam step on it: the step is that of one process training the global batch,
//! whatever the rank count, and no row is read stale (a step's reads follow its first sampling
//! exchange, which every rank enters only after applying the step before). Replicated
//! (`--strategy replicated`, the baseline), every rank holds every row and every rank's
//! gradients go to every rank, which all apply the same sums.

use rustc_hash::FxHashMap;

use crate::comm::{Comm, Window};
use crate::config::{Dtype, Optimizer};
use crate::graph::partition::Partitioner;
use crate::stats::RankMetrics;

use super::sharded::{NodeRows, Rows};
use crate::graph::nodedata::read_owned_rows;
use crate::store::{apply_update, decode_row, encode_row, OptParams};

/// A step's gradient record: the node's id, then its row's gradient.
fn record_bytes(dim: usize) -> usize {
    8 + 4 * dim
}

/// A value of node `v`'s first row, column `j`: uniform in `[-a, a)`, `a = sqrt(3 / dim)` (unit
/// expected squared norm per row), from a hash of the seed, the node and the column, so that the
/// rows do not depend on the rank count.
fn initial(seed: u64, v: u64, j: usize, dim: usize) -> f32 {
    let mut z = seed
        ^ v.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ (j as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    // splitmix64's finaliser.
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    let u = (z >> 40) as f32 / (1u64 << 24) as f32;
    (2.0 * u - 1.0) * (3.0 / dim as f32).sqrt()
}

/// Where node `v`'s row is under `part` (every row on this rank `me` without one): its owner
/// and its place there.
fn locate(part: Option<&Partitioner>, me: usize, v: u64) -> (usize, usize) {
    match part {
        Some(p) => p.locate(v),
        None => (me, v as usize),
    }
}

/// The learnable rows this rank holds and the way to the others'.
pub(super) struct Learned<'a> {
    comm: &'a Comm,
    pub(super) dim: usize,
    /// Nodes of the graph: rows over all ranks.
    nodes: u64,
    /// Sharded: whose row a node's is. Replicated (`None`): every rank holds every row.
    part: Option<Partitioner>,
    /// The rows this rank holds (f32), readable by the other ranks.
    window: Window,
    /// Sparse Adam's state per held row: its first and second moments and its step count.
    state: Vec<f32>,
    opt: OptParams,
    lr: f32,
    /// A push's gradients summed per row: the row's place in `sums`, in order of arrival.
    slot: FxHashMap<u64, u32>,
    rows: Vec<u64>,
    sums: Vec<f32>,
    /// The rows as they were at the best validation epoch ([`Learned::keep`]).
    kept: Vec<u8>,
}

impl<'a> Learned<'a> {
    /// Collective: the rows of `nodes` nodes, `part`'s (sharded) or all of them (replicated),
    /// initialised from `seed`; Adam with `lr` updates them.
    pub(super) fn new(
        comm: &'a Comm,
        part: Option<Partitioner>,
        nodes: u64,
        dim: usize,
        (seed, lr): (u64, f32),
    ) -> Learned<'a> {
        let me = comm.rank();
        let held = part.as_ref().map_or(nodes as usize, |p| p.num_local(me));
        let mut window = comm.window(held * dim * 4);
        let global = |r: usize| part.as_ref().map_or(r as u64, |p| p.global(me, r));
        window.with_local_mut(|bytes| {
            let mut row = vec![0f32; dim];
            for (r, b) in bytes.chunks_exact_mut(4 * dim).enumerate() {
                let v = global(r);
                row.iter_mut()
                    .enumerate()
                    .for_each(|(j, x)| *x = initial(seed, v, j, dim));
                encode_row(Dtype::F32, &row, b);
            }
        });
        comm.barrier();
        let opt = OptParams::new(Optimizer::Adam, 0.9);
        Learned {
            comm,
            dim,
            nodes,
            part,
            window,
            state: vec![0.0; held * Optimizer::Adam.state_per_row(dim)],
            opt,
            lr,
            slot: FxHashMap::default(),
            rows: Vec::new(),
            sums: Vec::new(),
            kept: Vec::new(),
        }
    }

    /// Keep a copy of the held rows (the best validation epoch's, which the output holds with
    /// that epoch's weights).
    pub(super) fn keep(&mut self) {
        let kept = &mut self.kept;
        self.window.with_local(|bytes| {
            kept.clear();
            kept.extend_from_slice(bytes);
        });
    }

    /// The held rows' global ids, their values, their Adam state and the best epoch's copy (a
    /// checkpoint's; the copy empty when none was kept).
    pub(super) fn parts(&self) -> (Vec<u64>, Vec<f32>, &[f32], Vec<f32>) {
        let ids = (0..self.held()).map(|r| self.global(r)).collect();
        let as_f32 = |b: &[u8]| -> Vec<f32> {
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
                .collect()
        };
        let rows = self.window.with_local(as_f32);
        (ids, rows, &self.state, as_f32(&self.kept))
    }

    /// Install saved rows of `ids` that this rank holds (others are skipped): values, Adam
    /// state and the best epoch's copy (`kept` empty when the checkpoint had none). Returns the
    /// rows installed.
    pub(super) fn install(
        &mut self,
        ids: &[u64],
        rows: &[f32],
        state: &[f32],
        kept: &[f32],
    ) -> usize {
        let (me, dim) = (self.comm.rank(), self.dim);
        let per = Optimizer::Adam.state_per_row(dim);
        if !kept.is_empty() && self.kept.is_empty() {
            self.window.with_local(|b| self.kept = b.to_vec());
        }
        let part = self.part.clone();
        let (st, kp) = (&mut self.state, &mut self.kept);
        let mut n = 0;
        self.window.with_local_mut(|bytes| {
            for (i, &v) in ids.iter().enumerate() {
                let (o, r) = locate(part.as_ref(), me, v);
                if o != me {
                    continue;
                }
                let row = &rows[i * dim..(i + 1) * dim];
                encode_row(Dtype::F32, row, &mut bytes[r * 4 * dim..(r + 1) * 4 * dim]);
                st[r * per..(r + 1) * per].copy_from_slice(&state[i * per..(i + 1) * per]);
                if !kept.is_empty() {
                    encode_row(
                        Dtype::F32,
                        &kept[i * dim..(i + 1) * dim],
                        &mut kp[r * 4 * dim..(r + 1) * 4 * dim],
                    );
                }
                n += 1;
            }
        });
        n
    }

    /// Collective: back to the rows kept last, if any.
    pub(super) fn restore(&mut self) {
        if !self.kept.is_empty() {
            let kept = &self.kept;
            self.window
                .with_local_mut(|bytes| bytes.copy_from_slice(kept));
        }
        self.comm.barrier();
    }

    /// Rows over all ranks (the graph's nodes).
    pub(super) fn nodes(&self) -> u64 {
        self.nodes
    }

    /// The rows this rank holds.
    pub(super) fn held(&self) -> usize {
        self.state.len() / Optimizer::Adam.state_per_row(self.dim)
    }

    /// Bytes this rank holds: the rows, the best epoch's copy of them and their Adam state.
    pub(super) fn bytes(&self) -> u64 {
        (2 * self.held() * 4 * self.dim + 4 * self.state.len()) as u64
    }

    /// The rows this rank writes to the output (its own; replicated, every `ranks`-th) and
    /// their global ids.
    pub(super) fn share(&self) -> (Share<'_>, Vec<u64>) {
        let (me, ranks) = (self.comm.rank(), self.comm.size());
        let (first, step) = if self.part.is_some() {
            (0, 1)
        } else {
            (me, ranks)
        };
        let ids = (first..self.held())
            .step_by(step)
            .map(|r| self.global(r))
            .collect();
        (
            Share {
                l: self,
                first,
                step,
            },
            ids,
        )
    }

    /// The global id of held row `r`.
    fn global(&self, r: usize) -> u64 {
        self.part
            .as_ref()
            .map_or(r as u64, |p| p.global(self.comm.rank(), r))
    }

    /// Collective: the rows as `train --model sage --input learned|both` wrote them to the
    /// dataset `input_rows` of `path` (every node's row at its id).
    pub(super) fn load(&mut self, path: &std::path::Path) -> crate::error::Result<()> {
        let (held, dim) = (self.held(), self.dim);
        let comm = self.comm;
        let part = self.part.as_ref();
        let mut read = Ok(());
        self.window.with_local_mut(|bytes| {
            let mut put = |r: usize, row: &[f32]| {
                encode_row(Dtype::F32, row, &mut bytes[r * 4 * dim..(r + 1) * 4 * dim]);
            };
            read = match part {
                Some(part) => {
                    read_owned_rows(comm, (path, "input_rows"), part, (dim, Dtype::F32), put)
                }
                None => crate::graph::nodedata::read_rows(
                    path,
                    "input_rows",
                    (0, held, 1),
                    1 << 14,
                    |at, x| {
                        for (i, row) in x.chunks_exact(dim).enumerate() {
                            put(at + i, row);
                        }
                    },
                ),
            };
        });
        crate::spmd::agree(self.comm, read)?;
        self.comm.barrier();
        Ok(())
    }

    /// The rows of `input` (in order, `dim` each) into `out`: this rank's from its window, the
    /// others' read one-sidedly from their owners (their bytes counted in `m`; the rows too when
    /// they are the whole input rows, `alone`).
    fn read(&self, input: &[u64], alone: bool, m: &mut RankMetrics, out: &mut Vec<f32>) {
        let dim = self.dim;
        let Some(part) = &self.part else {
            // Replicated: every row is here.
            out.clear();
            out.resize(input.len() * dim, 0.0);
            self.window.with_local(|bytes| {
                for (&v, o) in input.iter().zip(out.chunks_exact_mut(dim)) {
                    let r = v as usize;
                    decode_row(Dtype::F32, &bytes[r * 4 * dim..(r + 1) * 4 * dim], o);
                }
            });
            m.local_rows += if alone { input.len() as u64 } else { 0 };
            return;
        };
        let mut c = RankMetrics::default();
        let rows = Rows {
            comm: self.comm,
            part,
            window: &self.window,
            // Learnable rows change under their owners' Adam: read one-sidedly, never in place.
            node: &NodeRows::default(),
            dtype: Dtype::F32,
            width: dim,
        };
        rows.read(input, None, &mut c, out);
        if alone {
            (m.local_rows, m.cache_misses) =
                (m.local_rows + c.local_rows, m.cache_misses + c.cache_misses);
        }
        m.fetch_bytes += c.fetch_bytes;
        m.one_sided_bytes += c.one_sided_bytes;
    }

    /// `x`'s rows of `input` (`cols` feature values each, or none) with the learnable rows of
    /// the same nodes after them: rows of `cols + dim`. `scratch` holds the learnable rows.
    pub(super) fn join(
        &self,
        input: &[u64],
        cols: usize,
        x: &mut Vec<f32>,
        scratch: &mut Vec<f32>,
        m: &mut RankMetrics,
    ) {
        self.read(input, cols == 0, m, scratch);
        if cols == 0 {
            std::mem::swap(x, scratch);
            return;
        }
        let (dim, width) = (self.dim, cols + self.dim);
        debug_assert_eq!(x.len(), input.len() * cols);
        x.resize(input.len() * width, 0.0);
        // Back to front: row i moves from `i cols` to `i width`, never over a row not yet moved.
        for i in (0..input.len()).rev() {
            x.copy_within(i * cols..(i + 1) * cols, i * width);
            x[i * width + cols..(i + 1) * width].copy_from_slice(&scratch[i * dim..(i + 1) * dim]);
        }
    }

    /// Collective: the gradients `gx` of `input`'s rows (rows of `cols + dim`: the learnable
    /// part after the `cols` feature values), scaled by `scale`, to the rows' owners (every
    /// rank, replicated), which sum them per row and take one Adam step on each.
    pub(super) fn push(
        &mut self,
        input: &[u64],
        gx: &[f32],
        cols: usize,
        scale: f32,
        m: &mut RankMetrics,
    ) {
        let (dim, ranks, me) = (self.dim, self.comm.size(), self.comm.rank());
        let width = cols + dim;
        let mut send = vec![Vec::new(); ranks];
        let mut all = Vec::new();
        for (i, &v) in input.iter().enumerate() {
            let b = match &self.part {
                Some(p) => &mut send[p.owner(v)],
                None => &mut all,
            };
            b.extend_from_slice(&v.to_le_bytes());
            for &g in &gx[i * width + cols..(i + 1) * width] {
                b.extend_from_slice(&(g * scale).to_le_bytes());
            }
        }
        if self.part.is_none() {
            send = vec![all; ranks];
        }
        // Bytes to and from the other ranks (not this rank's own).
        let others = |bufs: &[Vec<u8>]| -> u64 {
            let all: u64 = bufs.iter().map(|b| b.len() as u64).sum();
            all - bufs[me].len() as u64
        };
        m.push_bytes_sent += others(&send);
        let recv = self.comm.all_to_all_v(send);
        m.push_bytes_received += others(&recv);
        // Summed per row in order of arrival (rank order: the same on every rank).
        self.slot.clear();
        self.rows.clear();
        self.sums.clear();
        let (slot, rows, sums) = (&mut self.slot, &mut self.rows, &mut self.sums);
        for b in &recv {
            for rec in b.chunks_exact(record_bytes(dim)) {
                let v = u64::from_le_bytes(rec[..8].try_into().expect("8 bytes"));
                let (_, r) = locate(self.part.as_ref(), me, v);
                let s = *slot.entry(r as u64).or_insert_with(|| {
                    rows.push(r as u64);
                    sums.resize(sums.len() + dim, 0.0);
                    (rows.len() - 1) as u32
                }) as usize;
                let sum = &mut sums[s * dim..(s + 1) * dim];
                for (a, c) in sum.iter_mut().zip(rec[8..].chunks_exact(4)) {
                    *a += f32::from_le_bytes(c.try_into().expect("4 bytes"));
                }
            }
        }
        let (opt, lr, per) = (self.opt, self.lr, Optimizer::Adam.state_per_row(dim));
        let (rows, sums, state) = (&self.rows, &self.sums, &mut self.state);
        self.window.with_local_mut(|bytes| {
            let mut w = vec![0f32; dim];
            for (&r, g) in rows.iter().zip(sums.chunks_exact(dim)) {
                let r = r as usize;
                let b = &mut bytes[r * 4 * dim..(r + 1) * 4 * dim];
                decode_row(Dtype::F32, b, &mut w);
                apply_update(&opt, lr, &mut w, g, &mut state[r * per..(r + 1) * per]);
                encode_row(Dtype::F32, &w, b);
            }
        });
        // The next step reads the rows every owner has updated. Its sampling exchanges used to
        // order these writes before those reads; a node whose ranks sample each other's
        // adjacency in place exchanges nothing, so the order is kept here.
        self.comm.barrier();
    }
}

/// Held rows `first, first + step, ...` of a [`Learned`], as rows `0, 1, ...`.
pub(super) struct Share<'l> {
    l: &'l Learned<'l>,
    first: usize,
    step: usize,
}

impl crate::embeddings::RowSource for Share<'_> {
    fn dim(&self) -> usize {
        self.l.dim
    }

    fn with_rows(&self, f: &mut dyn FnMut(crate::embeddings::ReadRow)) {
        let (rb, first, step) = (4 * self.l.dim, self.first, self.step);
        self.l.window.with_local(|bytes| {
            f(&|i, out| {
                let r = first + i * step;
                decode_row(Dtype::F32, &bytes[r * rb..(r + 1) * rb], out)
            });
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn initial_rows_are_spread_and_independent_of_the_place() {
        let dim = 64;
        let row: Vec<f32> = (0..dim).map(|j| initial(3, 17, j, dim)).collect();
        let a = (3.0f32 / dim as f32).sqrt();
        assert!(row.iter().all(|x| x.abs() < a));
        let sq: f32 = row.iter().map(|x| x * x).sum();
        assert!((0.6..1.4).contains(&sq), "squared norm {sq}");
        assert_ne!(row[0], initial(3, 18, 0, dim));
        assert_ne!(row[0], initial(4, 17, 0, dim));
        assert_eq!(row[5], initial(3, 17, 5, dim));
    }
}
