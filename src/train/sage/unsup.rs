//! GraphSAGE's unsupervised loss (Hamilton et al. 2017, eq. 1; `--objective unsupervised`):
//! no labels. Every node is an anchor once per epoch; its positive is the node a short random
//! walk from it reaches after a uniform number of steps (1 to [`WALK`]: the paper's
//! co-occurrence on walks of length 5), and the anchors of a step on a rank share `--negatives`
//! nodes drawn by degree^0.75 (the paper's Q = 20, as its reference code shares them per
//! batch). The step's seeds are the anchors, positives and negatives, deduplicated; the model's
//! output rows are embeddings, scored by `model::sage`'s `Targets::Pairs`.
//!
//! Across ranks a walk moves as the sampler's hops do: each of the [`WALK`] steps is one hop
//! with a fan-out of 1, answered by the owners of the walkers' nodes (the same exchange for
//! every rank, also one without anchors). The negatives come from a pool of the global
//! degree^0.75 distribution drawn at each epoch's start (`sample::negatives`): every rank draws
//! its share from its own nodes' alias table and every rank installs every share.

use rand::RngExt;
use rustc_hash::FxHashMap;

use crate::comm::{decode_u64, encode_u64, Comm, ReduceOp};
use crate::graph::LocalGraph;
use crate::model::sage::Targets;
use crate::sample::negatives::NegativePool;
use crate::sample::Rng;

use super::Source;

/// Steps of a positive's walk at most.
pub(super) const WALK: usize = 5;

/// Negatives drawn at each epoch's start, over all ranks, to draw a step's from.
const POOL: usize = 1 << 16;

/// A step's anchors, positives and negatives as seeds, and the epoch's pool of negatives.
#[derive(Default)]
pub(super) struct Pairs {
    /// Negatives per step on a rank.
    q: usize,
    pool: Vec<u64>,
    /// The step's seeds (anchors first, in order), and each one's row among them.
    pub(super) seeds: Vec<u64>,
    index: FxHashMap<u64, u32>,
    anchors: Vec<u32>,
    positives: Vec<u32>,
    negatives: Vec<u32>,
    /// Scratch of the walks: where each walker is, the step it stops at, a hop's answers.
    at: Vec<u64>,
    stop: Vec<u8>,
    counts: Vec<u32>,
    picked: Vec<u64>,
}

impl Pairs {
    pub(super) fn new(negatives: usize) -> Pairs {
        Pairs {
            q: negatives,
            ..Pairs::default()
        }
    }

    /// Collective: a fresh pool of negatives (at an epoch's start).
    pub(super) fn refresh(&mut self, src: &mut dyn Source, rng: &mut Rng) {
        self.pool = src.negative_pool(POOL, rng);
    }

    /// Collective: the seeds of this rank's `anchors` (into `self.seeds`): each anchor's
    /// positive found by a walk, the step's negatives drawn from the pool.
    pub(super) fn draw(&mut self, src: &mut dyn Source, anchors: &[u64], rng: &mut Rng) {
        self.at.clear();
        self.at.extend_from_slice(anchors);
        self.stop.clear();
        self.stop
            .extend(anchors.iter().map(|_| rng.random_range(1..=WALK as u8)));
        let mut positive = anchors.to_vec();
        for step in 1..=WALK as u8 {
            self.counts.clear();
            self.picked.clear();
            src.hop(&self.at, 1, rng, &mut self.counts, &mut self.picked);
            // A node without neighbours keeps its walker where it is.
            let mut next = self.picked.iter();
            for (i, &c) in self.counts.iter().enumerate() {
                if c > 0 {
                    self.at[i] = *next.next().expect("one per count");
                }
                if self.stop[i] == step {
                    positive[i] = self.at[i];
                }
            }
        }
        self.seeds.clear();
        self.index.clear();
        let (seeds, index) = (&mut self.seeds, &mut self.index);
        let mut row = |v: u64| -> u32 {
            *index.entry(v).or_insert_with(|| {
                seeds.push(v);
                (seeds.len() - 1) as u32
            })
        };
        self.anchors.clear();
        self.anchors.extend(anchors.iter().map(|&v| row(v)));
        self.positives.clear();
        self.positives.extend(positive.iter().map(|&v| row(v)));
        self.negatives.clear();
        if !anchors.is_empty() && !self.pool.is_empty() {
            for _ in 0..self.q {
                let v = self.pool[rng.random_range(0..self.pool.len())];
                self.negatives.push(row(v));
            }
        }
    }

    /// The step's targets for the model (rows of `self.seeds`).
    pub(super) fn targets(&self) -> Targets<'_> {
        Targets::Pairs {
            anchors: &self.anchors,
            positives: &self.positives,
            negatives: &self.negatives,
        }
    }
}

/// Collective: `size` nodes of the global degree^0.75 distribution when every rank holds its
/// own nodes `g`: each rank draws its share from its alias table, every rank gets every share.
pub(super) fn pool_of_shards(comm: &Comm, g: &LocalGraph, size: usize, rng: &mut Rng) -> Vec<u64> {
    let mut p = NegativePool::new(g, comm.rank(), size, 0.75);
    p.set_total(comm.all_reduce_f64(&[p.mass()], ReduceOp::Sum)[0]);
    let shares = comm.all_gather_bytes(&encode_u64(&p.draw_share(rng)));
    p.install(shares.iter().map(|b| decode_u64(b)));
    p.into_pool()
}
