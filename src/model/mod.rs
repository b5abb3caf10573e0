//! Models. A model is one unit ([`Model`]): it turns a step's sampled work into a [`Plan`] (the
//! rows the batch touches, as references the pipeline hands it, and its negatives), and a plan
//! knows its loss and its kernels: HOGWILD updates in place ([`Plan::train`]) and gradients of
//! a dense copy of its rows ([`Plan::gradients`]). The pipeline (`crate::train`: sampling
//! drivers, planning through `refer`, fetching, the row cache, overlap, push, apply, the
//! replicated baseline, checkpoints) drives any model through these two traits and never looks
//! inside a plan. Row keys are `node << 1 | matrix`; matrix 0 holds vertex (input) rows and
//! matrix 1, when the model has it, context (output) rows.
//!
//! A new model is one file here (its `Model` and `Plan`), plus its sampler under
//! `crate::sample` when it needs new work (see [`Work`]).

pub mod bf16;
pub mod cells;
pub mod dense;
mod kernels;
pub mod kge;
pub mod sage;
pub mod sgns;

use std::sync::atomic::AtomicU32;

use cells::Shared;

use crate::config::TrainConfig;
use crate::error::Result;
use crate::graph::triples::Weighted;
use crate::graph::{LocalGraph, NodeId};
use crate::sample::negatives::NegativePool;
use crate::sample::walk::Segments;
use crate::sample::Rng;

/// A row reference to row `slot` of the batch's other rows (the row cache, or a private copy):
/// `REMOTE | slot`. A reference without it is a row of the in-place rows of its matrix.
pub const REMOTE: u32 = 1 << 31;

/// A reference to no row (e.g. a negative that equalled the positive): the kernel skips it.
pub const SKIP: u32 = u32::MAX;

/// What one step samples, from the sampler drivers of `crate::train`.
pub enum Work<'a> {
    /// (center, context) pairs: edges (LINE), or walks with `--kernel pair`.
    Pairs(&'a [(NodeId, NodeId)]),
    /// Walk segments, trained token by token.
    Segments(&'a Segments),
    /// Knowledge-graph triples (head, relation, tail) and the weights of their losses.
    Triples(&'a [Weighted]),
}

/// What [`Plan::gradients`] returns: the gradient of every row of the batch (laid out like its
/// rows), of the model's replicated parameters (empty without them), and the summed loss.
pub struct Grads {
    pub rows: Vec<f32>,
    pub replicated: Vec<f32>,
    pub loss: f64,
}

/// The rows a plan trains in place: per matrix the rows of this rank (or its node) as cells
/// of their storage type (a model with one matrix gets it twice), and the batch's `REMOTE`
/// rows (f32 copies).
pub struct Cells<'a> {
    pub matrices: [Shared<'a>; 2],
    pub remote: Shared<'a>,
    pub dim: usize,
    /// Row-wise Adagrad in place (`--optimizer adagrad`): each row's accumulator, laid out as
    /// the rows are; `None` for plain SGD.
    pub acc: Option<Accumulators<'a>>,
}

/// Row-wise Adagrad's accumulators of [`Cells`] (PyTorch-BigGraph's optimizer): one f32 (as
/// bits) per row, the running sum of the mean squared entry of the row's gradients. A row steps
/// by `lr / sqrt(acc)` times its gradient, `acc` including the step's own gradient, so the first
/// step of a row moves each entry by about `lr` whatever the gradient's scale.
#[derive(Clone, Copy)]
pub struct Accumulators<'a> {
    /// Per matrix: one per in-place row.
    pub matrices: [&'a [AtomicU32]; 2],
    /// One per `REMOTE` slot.
    pub remote: &'a [AtomicU32],
}

impl<'a> Accumulators<'a> {
    /// The accumulator of row reference `r` (as [`Cells`]' rows: `REMOTE | slot`, or a row of
    /// matrix 0 for a center, matrix 1 for a target).
    #[inline(always)]
    pub fn of(&self, center: bool, r: u32) -> &'a AtomicU32 {
        if r & REMOTE != 0 {
            &self.remote[(r & !REMOTE) as usize]
        } else {
            &self.matrices[usize::from(!center)][r as usize]
        }
    }
}

/// Row-wise Adagrad's step factor: add `mean_square` (the mean squared entry of this step's
/// gradient) to the accumulator `acc` and return `lr / sqrt(acc)` (0 for a zero gradient on a
/// fresh row). HOGWILD: a load and a store, as the rows' updates; a lost increment only makes
/// one later step a little larger.
#[inline(always)]
pub fn adagrad_factor(acc: &AtomicU32, mean_square: f32, lr: f32) -> f32 {
    use std::sync::atomic::Ordering::Relaxed;
    let a = f32::from_bits(acc.load(Relaxed)) + mean_square;
    acc.store(a.to_bits(), Relaxed);
    if a > 0.0 {
        lr / a.sqrt()
    } else {
        0.0
    }
}

/// A model: how a step's work becomes a plan.
pub trait Model: Send + Sync + Sized + 'static {
    type Plan: Plan;

    /// Collective-free: the same on every rank (replicated parameters start equal).
    fn new(cfg: &TrainConfig, g: &LocalGraph) -> Result<Self>;

    /// Plan a step's `work`: draw its negatives from `neg` with `rng` and reference every row
    /// it touches through `refer` (row key `node << 1 | matrix` to reference: an in-place row,
    /// `REMOTE | slot`, or a dense slot for [`Plan::gradients`]).
    fn plan(
        &self,
        work: Work,
        neg: &NegativePool,
        rng: &mut Rng,
        refer: &mut impl FnMut(u64) -> u32,
    ) -> Self::Plan;

    /// Floats of the parameters every rank holds whole (relations), 0 for none. Their
    /// gradients ([`Grads::replicated`]) are summed over the ranks after every step.
    fn replicated_len(&self) -> usize {
        0
    }

    /// Apply the summed gradient of the replicated parameters (the same on every rank).
    fn apply_replicated(&mut self, grads: &[f32], lr: f32) {
        let _ = (grads, lr);
    }

    /// The parameters a ranking evaluation scores with besides the entity rows (the score
    /// function, its margin, the relations); `None` for a model without one. The solver hands
    /// them with the rows to `kgeval` (`--valid`): a model does no evaluation or communication.
    fn ranking(&self) -> Option<kge::Ranking> {
        None
    }

    /// What the model holds besides its sharded rows (e.g. relations and their optimizer
    /// state), encoded for a checkpoint; empty for none. It is the same on every rank.
    fn state(&self) -> Vec<u8> {
        Vec::new()
    }

    /// Install [`Model::state`]'s bytes from a checkpoint; the error says what does not fit.
    fn restore_state(&mut self, bytes: &[u8]) -> std::result::Result<(), String> {
        if bytes.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "the checkpoint holds {} bytes of model state this model does not have",
                bytes.len()
            ))
        }
    }

    /// Add what the model holds besides its sharded rows to the written output (rank 0, after
    /// the rows are written): e.g. relation parameters.
    fn write_output(&self, path: &std::path::Path) -> Result<()> {
        let _ = path;
        Ok(())
    }
}

/// A planned batch.
pub trait Plan: Send + 'static {
    /// Every row reference of the plan (in-place, `REMOTE | slot` or `SKIP`), as flat lists.
    fn references(&self) -> [&[u32]; 2];

    /// The same lists, to rewrite (the row cache gives remote rows their slots).
    fn references_mut(&mut self) -> [&mut [u32]; 2];

    /// Training examples (positive pairs) in the batch.
    fn examples(&self) -> usize;

    /// Loss terms the batch's loss sums (positives and negatives), for the mean loss.
    fn loss_terms(&self) -> u64;

    /// HOGWILD: update the rows in place at learning rate `lr`, in parallel on the current
    /// rayon pool; returns the (sampled) summed loss, NaN if any score was.
    fn train(&self, rows: &Cells, lr: f32) -> f64;

    /// The loss gradient of every row of `rows` (the references are dense slots into it, laid
    /// out `slot * dim`) and of the replicated parameters, computed on the current rayon pool.
    fn gradients(&self, rows: &[f32], dim: usize) -> Grads;

    /// Rewrite `REMOTE | i` (the batch's i-th remote row) to `REMOTE | slots[i]`.
    fn remap_remote(&mut self, slots: &[u32]) {
        for list in self.references_mut() {
            for r in list.iter_mut() {
                if *r != SKIP && *r & REMOTE != 0 {
                    *r = REMOTE | slots[(*r & !REMOTE) as usize];
                }
            }
        }
    }

    /// Train with the `REMOTE` references on a private copy of `rows` (their values as f32);
    /// returns each copied row's change (its delta) and the summed loss. With `acc` (Adagrad:
    /// the in-place rows' accumulators and a copy's starting accumulator) each copy steps as
    /// a row with that accumulator would.
    fn train_copy(
        &self,
        matrices: [Shared; 2],
        rows: &[f32],
        dim: usize,
        lr: f32,
        acc: Option<([&[AtomicU32]; 2], f32)>,
    ) -> (Vec<f32>, f64) {
        use std::sync::atomic::Ordering::Relaxed;
        let cells: Vec<AtomicU32> = rows.iter().map(|x| AtomicU32::new(x.to_bits())).collect();
        let copies = rows.len() / dim.max(1);
        let copy_acc: Vec<AtomicU32> = match acc {
            Some((_, seed)) => (0..copies)
                .map(|_| AtomicU32::new(seed.to_bits()))
                .collect(),
            None => Vec::new(),
        };
        let view = Cells {
            matrices,
            remote: Shared::F32(&cells),
            dim,
            acc: acc.map(|(matrices, _)| Accumulators {
                matrices,
                remote: &copy_acc,
            }),
        };
        let loss = self.train(&view, lr);
        let deltas = cells
            .iter()
            .zip(rows)
            .map(|(c, o)| f32::from_bits(c.load(Relaxed)) - o)
            .collect();
        (deltas, loss)
    }
}

/// `sum(a[i] * b[i])` with eight independent accumulators so that it vectorises.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// `y += alpha * x`
#[inline]
pub fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += alpha * x;
    }
}

#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `-ln(sigmoid(x))`, stable for large |x|.
#[inline]
pub fn softplus_neg(x: f32) -> f32 {
    if x > 0.0 {
        (-x).exp().ln_1p()
    } else {
        -x + x.exp().ln_1p()
    }
}
