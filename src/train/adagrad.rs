//! Row-wise Adagrad in place (`--optimizer adagrad` with `--update hogwild`, the walk and edge
//! models' default): one f32 accumulator per row, kept in windows laid out as the rows' (shared
//! by the ranks of a node when the rows are), so the pool's kernels step every row by
//! `lr / sqrt(acc)` as they update it in place (`model::adagrad_factor`).
//!
//! Copies of other nodes' rows (the row cache, or a step's fetched copies) are not sent their
//! owner's accumulator: a copy starts from a typical accumulator (the mean over the rows in
//! place, [`InPlaceAdagrad::refresh_seed`]) and keeps what it adds while it is cached. Each
//! node thus runs its own Adagrad state for the rows it trains as copies, as the trainers of
//! PyTorch-BigGraph's distributed mode do for their shared parameters; the owner's combination
//! of copies' deltas (`cache::Combine`) is unchanged.
//!
//! Checkpoints hold the accumulators as the shards' optimizer state (`Shard::state`, one value
//! per row): [`InPlaceAdagrad::save`] before a snapshot, [`InPlaceAdagrad::load`] after a resume.

use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering::Relaxed;

use crate::comm::Comm;
use crate::config::{Dtype, Optimizer};
use crate::error::{Error, Result};
use crate::model::cells::Shared;
use crate::store::{InPlaceRows, Shard, SharedRows};

/// Rows sampled (evenly spaced) for the copies' starting accumulator.
const SEED_SAMPLE: usize = 4096;

/// The accumulators of the rows a rank updates in place, per matrix.
pub struct InPlaceAdagrad {
    /// Per matrix: a window of one f32 per row of this rank (node-shared with the rows).
    shards: Vec<Shard>,
    /// Per matrix: the accumulators in place, indexed as the in-place rows.
    cells: Vec<SharedRows>,
    /// What a new copy of another node's row starts from.
    pub seed: f32,
}

impl InPlaceAdagrad {
    /// Collective: the accumulator windows of `matrices` matrices of `rows` rows each, laid out
    /// as `in_place` (the rows' in-place view: the node's span, or the rank's own rows).
    /// Refuses a node-shared layout whose rows and accumulators do not line up.
    pub fn new(
        comm: &Comm,
        rows: usize,
        dim: usize,
        in_place: &[InPlaceRows],
        node_shared: bool,
    ) -> Result<InPlaceAdagrad> {
        let (me, n) = (comm.rank(), comm.size());
        let mut shards = Vec::with_capacity(in_place.len());
        let mut cells = Vec::with_capacity(in_place.len());
        for rows_view in in_place {
            let mut shard = Shard::new(comm, rows, 1, Dtype::F32, Optimizer::Sgd, node_shared);
            let view = shard.in_place_rows(me, n, node_shared);
            let lined_up = view.as_ref().is_some_and(|v| {
                v.first_row == rows_view.first_row && v.cells.len() * dim == rows_view.cells.len()
            });
            let view = crate::spmd::agree(
                comm,
                view.filter(|_| lined_up).ok_or_else(|| {
                    Error::config(
                        "--optimizer adagrad with --update hogwild: the accumulators' shared window does not line up with the rows' on this node; use --update batched or --node-memory private",
                    )
                }),
            )?;
            cells.push(view.cells);
            shards.push(shard);
        }
        Ok(InPlaceAdagrad {
            shards,
            cells,
            seed: 0.0,
        })
    }

    /// The accumulators of in-place rows handed to a pool task ([`InPlaceAdagrad::cells`]).
    ///
    /// # Safety
    /// As [`SharedRows::cells`]: `self` outlives the view, and no `&mut` access to the
    /// windows ([`InPlaceAdagrad::save`], [`InPlaceAdagrad::load`]) happens meanwhile.
    pub unsafe fn matrix<'a>(cells: SharedRows) -> &'a [AtomicU32] {
        // SAFETY: forwarded to the caller.
        match unsafe { cells.cells() } {
            Shared::F32(c) => c,
            _ => unreachable!("accumulators are f32"),
        }
    }

    /// Matrix `m`'s accumulator cells, to hand to a pool task (see [`InPlaceAdagrad::matrix`]).
    pub fn cells(&self, m: usize) -> SharedRows {
        self.cells[m.min(self.cells.len() - 1)]
    }

    /// Set the copies' starting accumulator to the mean of the accumulators in place (a
    /// sample of them), read as the pool's kernels read them: pool tasks may be updating them.
    pub fn refresh_seed(&mut self) {
        let (mut sum, mut n) = (0f64, 0usize);
        for &c in &self.cells {
            // SAFETY: `self` holds the windows for the duration of the call and nothing takes
            // `&mut` access to them meanwhile (`save` and `load` need `&self`/`&mut self`).
            let cells = unsafe { InPlaceAdagrad::matrix(c) };
            let stride = cells.len().div_ceil(SEED_SAMPLE).max(1);
            for a in cells.iter().step_by(stride) {
                sum += f64::from(f32::from_bits(a.load(Relaxed)));
                n += 1;
            }
        }
        if n > 0 {
            self.seed = (sum / n as f64) as f32;
        }
    }

    /// Copy the accumulators into `shards`' optimizer state (before a snapshot; the pool has
    /// drained).
    pub fn save(&self, shards: &mut [Shard]) {
        for (acc, shard) in self.shards.iter().zip(shards.iter_mut()) {
            acc.window.with_local(|bytes| {
                for (s, b) in shard.state.iter_mut().zip(bytes.chunks_exact(4)) {
                    *s = f32::from_le_bytes(b.try_into().expect("4 bytes"));
                }
            });
        }
    }

    /// Install `shards`' optimizer state (a resumed checkpoint's) as the accumulators.
    pub fn load(&mut self, shards: &[Shard]) {
        for (acc, shard) in self.shards.iter_mut().zip(shards) {
            acc.window.with_local_mut(|bytes| {
                for (s, b) in shard.state.iter().zip(bytes.chunks_exact_mut(4)) {
                    b.copy_from_slice(&s.to_le_bytes());
                }
            });
        }
        self.refresh_seed();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;
    use std::time::Duration;

    /// Each rank's accumulators are its rows' optimizer state in a checkpoint, and a resume
    /// puts them back where its rows' in-place numbering finds them. (Ranks sharing a node's
    /// windows need MPI: `tests/learning.rs` trains Adagrad on 2 node-shared ranks, and a
    /// layout that did not line up is refused.)
    #[test]
    fn accumulators_survive_a_checkpoint_and_seed_the_copies() {
        let (rows, dim) = (5usize, 4usize);
        let got = crate::comm::local::run(2, Duration::from_secs(30), |comm| {
            let (me, n) = (comm.rank(), comm.size());
            let mut shard = Shard::new(&comm, rows, dim, Dtype::F32, Optimizer::Adagrad, false);
            let view = shard.in_place_rows(me, n, false).expect("own rows");
            let mut acc =
                InPlaceAdagrad::new(&comm, rows, dim, std::slice::from_ref(&view), false).unwrap();
            let first = view.first_row[me].expect("own rows") as usize;
            // SAFETY: `acc` lives to the end of this closure and nothing takes `&mut` of its
            // windows until `save` below.
            let cells = unsafe { InPlaceAdagrad::matrix(acc.cells(0)) };
            for r in 0..rows {
                cells[first + r].store((100.0 * me as f32 + r as f32).to_bits(), Relaxed);
            }
            comm.barrier();
            let mut shards = vec![shard];
            acc.save(&mut shards);
            let saved = shards[0].state.clone();
            // A resume: the windows start over, the state comes back.
            for c in cells.iter() {
                c.store(0, Relaxed);
            }
            comm.barrier();
            acc.load(&shards);
            comm.barrier();
            let back: Vec<f32> = (0..rows)
                .map(|r| f32::from_bits(cells[first + r].load(Relaxed)))
                .collect();
            (saved, back, acc.seed)
        });
        for (rank, (saved, back, seed)) in got.into_iter().enumerate() {
            let want: Vec<f32> = (0..rows).map(|r| 100.0 * rank as f32 + r as f32).collect();
            assert_eq!(saved, want, "rank {rank}: saved state");
            assert_eq!(back, want, "rank {rank}: restored accumulators");
            let mean = want.iter().sum::<f32>() / rows as f32;
            assert!(
                (seed - mean).abs() < 1e-4,
                "rank {rank}: seed {seed}, mean {mean}"
            );
        }
    }
}
