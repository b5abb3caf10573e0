//! Memory estimates shared by the solver (the estimate it prints and enforces with
//! `--max-memory`) and `graphscale plan`: what a rank holds besides its rows, by component.

use crate::config::Model;
use crate::graph::csr;

/// A rank's memory estimate (the printed one, `memory_estimate_bytes` and `graphscale plan`'s):
/// the process before loading, the adjacency, and the larger of a load round (its share of the
/// file's edges, in rounds of at most `LOAD_CHUNK_EDGES`) and training's needs: the storage
/// (rows, optimizer state, the row cache, replicas), the samplers and step buffers, and the
/// output's blocks. The load's rounds come and go before the rows exist; the output's blocks
/// after training.
pub fn rank_estimate(
    process: u64,
    adjacency: u64,
    edges_per_rank: u64,
    storage: u64,
    samplers: u64,
    output: bool,
) -> u64 {
    let round = LOAD_BYTES_PER_EDGE * csr::LOAD_CHUNK_EDGES.min(edges_per_rank);
    let output = if output {
        2 * crate::embeddings::WRITE_BYTES as u64
    } else {
        0
    };
    process + adjacency + round.max(storage + samplers + output)
}

/// Bytes a rank's samplers and step buffers hold at their largest, besides its rows and
/// adjacency, for `nodes` local nodes and `entries` local adjacency entries: the negative table
/// over its nodes (8 bytes per node, 20 while it is built) and its pool; per node, the walk
/// order and keep probability of the walk models (8 bytes); per 256 adjacency entries, LINE's
/// source index (8 bytes), and per entry its alias table on a weighted graph (8 bytes, 20 while
/// it is built); the batches in flight (`STEP_BYTES` per example).
pub fn sampler_bytes(
    model: Model,
    batch_size: u64,
    nodes: u64,
    entries: u64,
    weighted: bool,
) -> u64 {
    use crate::sample::alias::AliasTable;
    let n = nodes;
    let pool = 8 * (1u64 << 16).max(4 * batch_size);
    let steps = STEP_BYTES * batch_size * (IN_PLACE_DEPTH as u64 + 2);
    let negatives = AliasTable::bytes(n) + pool;
    // Built after the negative table: (while built, when built).
    let (build, kept) = match model {
        Model::Deepwalk | Model::Node2vec => (8 * n, 8 * n),
        Model::Line => {
            let index = 8 * (entries / 256 + 1);
            if weighted {
                (index + 20 * entries, index + AliasTable::bytes(entries))
            } else {
                (index, index)
            }
        }
        _ => (0, 0),
    };
    // The negative table's build, then the sampler's, then training.
    (20 * n)
        .max(negatives + build)
        .max(negatives + kept + steps)
}

/// Bytes per edge of a load round at its largest (72-87 measured on R-MAT graphs of 2^16 to
/// 2^20 nodes): the edges read (24 bytes) and the HDF5 arrays they come from (16), and the
/// entries sent and received (8 to 16 each per side, in growing vectors).
const LOAD_BYTES_PER_EDGE: u64 = 80;

/// Bytes per example of a batch in flight (its sampled tokens or pairs, their row references
/// and negatives, the plan's lists), about 60 for walks with 5 negatives.
const STEP_BYTES: u64 = 64;

/// Hogwild batches on the pool at once when every row is in place. BlogCatalog 10 x 80, 1 rank
/// x 2 threads, alternated runs: 1 batch 5.71-6.11M pairs/s, 2 batches 5.32-6.93M (median of
/// six 5.80M), 3 batches 5.22-7.60M (median 6.54M), Micro-F1 the same (docs/performance.md).
pub(crate) const IN_PLACE_DEPTH: usize = 3;
