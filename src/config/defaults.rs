//! The defaults that measurements chose: the step, the row cache's clock, and the
//! knowledge-graph models' settings (without a config file).

/// The default `--batch-size` of the walk and edge models: pairs per step over all ranks.
pub const BATCH: usize = 16384;

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
/// Adagrad's learning rate for DistMult and ComplEx (WN18RR, 30 epochs, filtered MRR on the
/// validation set: DistMult 0.407 at 0.3, 0.418 at 0.5, 0.411 at 1.0 (test 0.335 at 0.1);
/// ComplEx 0.402 at 0.1, 0.439 at 0.5). TransE and RotatE keep Adagrad's 0.1 (RotatE: valid
/// 0.462).
pub const KG_ADAGRAD_LR: f32 = 0.5;
