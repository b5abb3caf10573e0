//! The defaults that measurements chose: the step, the row cache's clock, and the
//! knowledge-graph models' settings (without a config file), and the walk and edge models'
//! learning rate from the run's budget.

use super::{Model, Optimizer, TrainConfig, Update};

/// The default `--batch-size` of the walk and edge models: pairs per step over all ranks.
pub const BATCH: usize = 16384;

/// Updates of the hottest row per step made by its copies on the other nodes, with up to 7 ranks
/// holding copies (8 simulated nodes; see [`default_walk_batch`]). Measured on BlogCatalog
/// DeepWalk (docs/performance.md): the gap in Micro-F1 to one node followed `batch x hub share x
/// copies`, within 0.5 up to about 370 at 4 and 8 nodes and 0.5-1.4 points at 690-1,480 (8 and
/// 16 simulated nodes at 16,384 pairs per step); at 16 nodes 300 still left 0.32 on average over
/// 7 seeds, 140 left 0.13; 4 nodes of 2 ranks (6 copies) at 16,384 pairs per step (about 600)
/// left 0.46 over 7 seeds, at 8,192 (300) 0.28.
pub const HUB_UPDATES_PER_STEP: f64 = 300.0;

/// The count of ranks holding copies up to which [`HUB_UPDATES_PER_STEP`] holds as it is
/// (measured at 7: 8 simulated nodes).
const HUB_BOUND_COPIES: u64 = 7;

/// The bound on the hub's unseen updates per step of [`default_walk_batch`] with `copies` ranks
/// holding copies of a row: [`HUB_UPDATES_PER_STEP`] up to 7 (where it was measured), inversely
/// proportional to the copies beyond (140 at 15: 16 simulated nodes).
pub fn hub_updates_bound(copies: u64) -> f64 {
    let copies = copies.max(1) as f64;
    HUB_UPDATES_PER_STEP * (HUB_BOUND_COPIES as f64 / copies).min(1.0)
}

/// The default `--batch-size` of a walk model trained across nodes by `ranks` ranks, of which
/// `copies` hold copies of a row that another node owns: every rank keeps its own copies of the
/// remote rows its batches touch, ranks of one node too, so a row has the job's ranks less those
/// of its own node (`nodes - 1` with one rank per node, 6 for 4 nodes of 2 ranks). `hub_share`
/// is the hottest node's share of the walks' tokens (its degree over the sum of degrees: a random
/// walk's stationary distribution). Within a step the copies of a hub train without seeing each
/// other's updates, `batch x hub_share` of them in all; the combination rule
/// (`train::cache::Combine`) makes their sum one machine's step only while that stays small, and
/// the more copies are summed the smaller it must be: the step is the largest
/// that keeps `batch x hub_share x copies` within [`hub_updates_bound`] (300 up to 7 copies, 140
/// at 15; measured, docs/performance.md), at most [`BATCH`] and at least 128 pairs per rank
/// (below that a step's fixed costs dominate), in multiples of 256. A large graph's hubs take a
/// small share (a billion nodes: about 1e-5): its batch stays [`BATCH`]; a small dense graph's
/// shrinks (BlogCatalog, 0.6%: 16,384 up to 4 simulated nodes, 7,168 pairs per step at 8, 2,048
/// at 16, 8,192 at 4 nodes of 2 ranks).
pub fn default_walk_batch(ranks: usize, copies: u64, hub_share: f64) -> usize {
    if copies < 1 || hub_share.is_nan() || hub_share <= 0.0 {
        return BATCH;
    }
    let fits = hub_updates_bound(copies) / (hub_share * copies as f64);
    let floor = (128 * ranks).min(BATCH) as f64;
    let b = fits.clamp(floor, BATCH as f64) as usize;
    (b / 256 * 256).max(floor as usize).max(1)
}

/// The default clock of a cached row (`--cache-refresh`, in steps) for a job whose rows are held
/// by `copies` ranks (every rank keeps its own copies, ranks of one node too, and each trains
/// `--batch-size / copies` pairs per step): `16 / copies`, at least 1, so that the updates a
/// row's copies take unseen by each other stay near two batches at 8 simulated nodes and fall as
/// nodes are added. Measured on BlogCatalog DeepWalk with int8 rows and deltas
/// (docs/architecture.md): 8 simulated nodes clock 2 Micro-F1 37.50 at 139 B per pair (clock 4
/// in f16, the default before: 36.72 at 160 B); 16 simulated nodes clock 1 37.28.
pub fn default_cache_refresh(copies: u64) -> u64 {
    (16 / copies.max(1)).max(1)
}

/// The longest `--cache-refresh` that keeps the bound: twice the default (8 simulated nodes at
/// clock 8 diverged; clock 4 trained, docs/architecture.md).
pub fn max_cache_refresh(copies: u64) -> u64 {
    (32 / copies.max(1)).max(2)
}

/// Knowledge-graph defaults (without a config): dimension, negatives shared by a chunk of
/// positives, triples per step over all ranks, epochs, and the N3 weight of distmult and
/// complex (measured on WN18RR: docs/results.md).
pub const KG_DIM: usize = 200;
pub const KG_NEGATIVES: u32 = 256;
pub const KG_CHUNK: usize = 64;
pub const KG_BATCH: usize = 1024;
pub const KG_EPOCHS: u32 = 30;
pub const KG_N3: f32 = 0.05;

/// GraphSAGE (`--model sage`): epochs and seeds per step over all ranks, at most
/// [`sage_batch`]'s share of the training nodes.
pub const SAGE_EPOCHS: u32 = 100;
pub const SAGE_BATCH: usize = 512;

/// Negatives per anchor of GraphSAGE's unsupervised loss (the paper's Q), shared by a step's
/// anchors on a rank.
pub const SAGE_NEGATIVES: u32 = 20;

/// Steps per epoch the default GraphSAGE batch keeps at least.
pub const SAGE_STEPS_PER_EPOCH: usize = 4;

/// The default seeds per step for `train` training nodes: [`SAGE_BATCH`], but at most a quarter
/// of them, so that a small training set still takes several Adam steps per epoch. Cora's public
/// split (140 training nodes), mean test accuracy over seeds 0-4 at 1 rank (docs/results.md):
/// one step of 140 per epoch 0.791, 128 0.807, 64 0.808, 35 (this rule) 0.807, 32 0.808.
pub fn sage_batch(train: usize) -> usize {
    SAGE_BATCH.min(train.div_ceil(SAGE_STEPS_PER_EPOCH)).max(1)
}

/// word2vec's learning rate for skip-gram: the walk and edge models' default where every row
/// gets thousands of pairs (BlogCatalog at 10 walks x 80, window 10: about 8,800 per node).
pub const WORD2VEC_LR: f32 = 0.025;

/// The default learning rate times the positive pairs per node ([`budget_lr`]). A row's signal
/// grows by about `lr` times the pairs it sees before the run ends, so the rate that learns
/// from few pairs is inversely proportional to them: 0.7 at 1 walk x 20, window 5 (120 pairs
/// per node), where 0.025 leaves the loss at ln 2 (docs/tuning.md, "Learning from few
/// samples").
pub const LR_TIMES_PAIRS: f64 = 84.0;

/// The largest default learning rate: planted partitions of 2^20 and 2^22 nodes at 1 walk x 20
/// learned about as well at 0.7 as at 1.0, and worse at 2.0 (docs/tuning.md).
pub const MAX_BUDGET_LR: f32 = 0.7;

/// The share of the run the largest default learning rate is held before its linear decay
/// ([`lr_hold`]): all of it. Planted partitions at 1 walk x 20 and 0.7 learned better held to
/// the end than held for 80% (2^20 nodes: Micro-F1 95.5 against 95.1; 2^22: 85.9 against
/// 83.1), and both better than the plain decay (90.6 at 2^20, at 1.0).
pub const MAX_HOLD: f32 = 1.0;

/// The default learning rate of skip-gram trained in place for a run of `pairs_per_node`
/// positive pairs per node: [`LR_TIMES_PAIRS`] / pairs, at least word2vec's 0.025 and at most
/// [`MAX_BUDGET_LR`].
pub fn budget_lr(pairs_per_node: f64) -> f32 {
    let lr = (LR_TIMES_PAIRS / pairs_per_node.max(1.0)) as f32;
    lr.clamp(WORD2VEC_LR, MAX_BUDGET_LR)
}

/// The learning rate from which [`lr_hold`] starts holding it.
pub const HOLD_FROM_LR: f32 = 0.25;

/// The share of the run a learning rate `lr` is held before it decays linearly: none up to
/// [`HOLD_FROM_LR`] (word2vec's schedule), rising to [`MAX_HOLD`] at [`MAX_BUDGET_LR`] and above.
/// A short run needs its whole budget at full rate; a longer one needs the decay: on a
/// 1,200-node planted partition at 5 walks x 20, window 10 (1,100 pairs per node, rate 0.076)
/// across 2 simulated nodes, holding for 70% of the run gave Micro-F1 80.6, the plain decay 96.5.
pub fn lr_hold(lr: f32) -> f32 {
    ((lr - HOLD_FROM_LR) / (MAX_BUDGET_LR - HOLD_FROM_LR) * MAX_HOLD).clamp(0.0, MAX_HOLD)
}

impl TrainConfig {
    /// Positive (center, context) pairs per node over the run of a walk or edge model on a
    /// graph of `nodes` nodes and `edges` edges in its file: a walk token is the center of
    /// `window + 1` pairs on average (the dynamic window takes `(window + 1) / 2` per side);
    /// a LINE edge sample is one pair. 0 for other models.
    pub fn pairs_per_node(&self, nodes: u64, edges: u64) -> f64 {
        let epochs = f64::from(self.epochs);
        match self.model {
            Model::Deepwalk | Model::Node2vec => {
                f64::from(self.walks_per_node)
                    * f64::from(self.walk_length)
                    * f64::from(self.window + 1)
                    * epochs
            }
            Model::Line => self.line_samples * edges as f64 * epochs / nodes.max(1) as f64,
            _ => 0.0,
        }
    }

    /// Whether the learning rate follows the run's budget: skip-gram (DeepWalk, node2vec,
    /// LINE) trained in place with sgd.
    pub fn lr_follows_budget(&self) -> bool {
        matches!(self.model, Model::Deepwalk | Model::Node2vec | Model::Line)
            && self.optimizer == Optimizer::Sgd
            && self.update == Update::Hogwild
    }

    /// After the load (the same on every rank): with `--lr` left to its default, the
    /// learning rate of the pairs each node gets ([`budget_lr`]), and the hold of the rate
    /// in effect ([`lr_hold`]). Returns the pairs per node when the rate follows the budget.
    pub fn settle_lr(&mut self, nodes: u64, edges: u64) -> Option<f64> {
        if !self.lr_follows_budget() {
            return None;
        }
        let pairs = self.pairs_per_node(nodes, edges);
        if self.lr_is_default {
            self.lr = budget_lr(pairs);
        }
        if !self.lr_hold_given {
            self.lr_hold = lr_hold(self.lr);
        }
        Some(pairs)
    }
}

/// Adagrad's learning rate for DistMult and ComplEx (WN18RR, 30 epochs, filtered MRR on the
/// validation set: DistMult 0.407 at 0.3, 0.418 at 0.5, 0.411 at 1.0 (test 0.335 at 0.1);
/// ComplEx 0.402 at 0.1, 0.439 at 0.5). TransE and RotatE keep Adagrad's 0.1 (RotatE: valid
/// 0.462).
pub const KG_ADAGRAD_LR: f32 = 0.5;

#[cfg(test)]
mod tests {
    use super::*;

    /// The walk models' step across nodes: BlogCatalog's hub (3,992 of 667,966 degree units)
    /// keeps the default up to 4 nodes and shrinks at 8 and 16; a large graph's hub, one rank
    /// per node, or a job at 128 pairs per rank keeps its floor.
    #[test]
    fn a_small_training_set_takes_several_sage_steps_per_epoch() {
        assert_eq!(sage_batch(140), 35);
        assert_eq!(sage_batch(1_000_000), SAGE_BATCH);
        assert_eq!(sage_batch(1), 1);
        assert!(140usize.div_ceil(sage_batch(140)) >= SAGE_STEPS_PER_EPOCH);
    }

    #[test]
    fn walk_batch_shrinks_with_the_hub_and_the_copies() {
        use super::default_walk_batch as b;
        let blog = 3992.0 / 667_966.0;
        // One rank per node: nodes - 1 ranks hold copies.
        assert_eq!(b(1, 0, blog), BATCH);
        assert_eq!(b(2, 1, blog), BATCH);
        assert_eq!(b(4, 3, blog), BATCH);
        assert_eq!(b(8, 7, blog), 7168);
        assert_eq!(b(16, 15, blog), 2048);
        // The bound is 300 up to 7 copies and falls beyond.
        assert_eq!(super::hub_updates_bound(1), HUB_UPDATES_PER_STEP);
        assert_eq!(super::hub_updates_bound(7), HUB_UPDATES_PER_STEP);
        assert_eq!(super::hub_updates_bound(15), 140.0);
        assert_eq!(b(2, 1, 0.05), 5888);
        // Every rank keeps its own copies: 4 nodes of 2 ranks have 6 copies of a row, 3 more
        // than 4 nodes of 1; ranks also set the floor.
        assert_eq!(b(8, 6, blog), 8192);
        assert_eq!(b(80, 72, blog), 128 * 80);
        assert_eq!(b(1024, 1016, blog), BATCH);
        // A billion nodes, a hub of a million edges among 2e11 degree units.
        assert_eq!(b(80, 72, 1e6 / 2e11), BATCH);
        assert_eq!(b(8, 7, 0.0), BATCH);
        assert_eq!(b(8, 7, f64::NAN), BATCH);
        // A star: one hub takes half the walks.
        assert_eq!(b(4, 3, 0.5), 512);
        for nodes in 2..64u64 {
            let n = nodes as usize;
            assert!(b(n, nodes - 1, blog) <= b(n - 1, nodes - 2, blog).max(128 * n));
            // More ranks per node (more copies) never take a larger step.
            assert!(b(2 * n, 2 * (nodes - 1), blog) <= b(n, nodes - 1, blog).max(256 * n));
        }
    }

    #[test]
    fn the_learning_rate_follows_the_pairs_each_node_gets() {
        // 1 walk x 20, window 5: 120 pairs per node, the largest rate, held to the end.
        assert_eq!(budget_lr(120.0), MAX_BUDGET_LR);
        assert_eq!(lr_hold(budget_lr(120.0)), 1.0);
        // BlogCatalog at 10 x 80, window 10: word2vec's rate and schedule.
        assert_eq!(budget_lr(8800.0), WORD2VEC_LR);
        assert_eq!(lr_hold(WORD2VEC_LR), 0.0);
        // In between, inversely proportional; the hold starts at 0.25 and rises with the rate.
        assert!((budget_lr(840.0) - 0.1).abs() < 1e-6);
        assert_eq!(lr_hold(0.1), 0.0);
        assert_eq!(lr_hold(HOLD_FROM_LR), 0.0);
        let h = lr_hold(0.5);
        assert!(h > 0.4 && h < 0.7, "{h}");
        let mut last = (f32::INFINITY, f32::INFINITY);
        for p in [1.0, 50.0, 120.0, 200.0, 500.0, 1000.0, 3000.0, 1e4, 1e6] {
            let (lr, hold) = (budget_lr(p), lr_hold(budget_lr(p)));
            assert!(lr <= last.0 && hold <= last.1, "{p}: {lr} {hold}");
            assert!((WORD2VEC_LR..=MAX_BUDGET_LR).contains(&lr));
            last = (lr, hold);
        }
        // A rate given above the largest default is held to the end too.
        assert_eq!(lr_hold(2.0), MAX_HOLD);
    }
}
