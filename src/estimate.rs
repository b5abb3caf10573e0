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

/// What a GraphSAGE work source holds, for its rank's memory estimate.
#[derive(Clone, Copy, Debug, Default)]
pub struct SageHeld {
    /// Bytes of adjacency (the rank's CSR, or the whole graph's).
    pub adjacency: u64,
    /// Bytes of feature rows: the rank's own (or all of them).
    pub features: u64,
    /// Bytes of the remote feature cache when full, its index included.
    pub cache: u64,
    /// Nodes whose every layer the rank computes in layer-wise inference (its own, or all).
    pub layer_rows: u64,
    /// Nodes whose scores the rank returns.
    pub scored: u64,
    /// Bytes per value of the hidden rows kept between layers.
    pub hidden_value: u64,
    /// Input rows of the largest chunk of layer-wise inference (the chunk and its neighbours).
    pub chunk_inputs: u64,
    /// Adjacency entries per node.
    pub mean_degree: f64,
    /// Bytes of the largest transient of the load besides what stays (reading the edges or the
    /// feature rows).
    pub load_transient: u64,
    /// Bytes of learnable input rows and their Adam state (`--input learned|both`), and their
    /// width (0 without).
    pub learned: u64,
    pub learned_width: u64,
}

/// A GraphSAGE rank's memory estimate by component (what `train --model sage` prints, records
/// as `memory_estimate_bytes` and holds to `--max-memory`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SageEstimate {
    pub total: u64,
    pub labels: u64,
    pub step: u64,
    pub inference: u64,
}

/// GraphSAGE's shape, as the estimate needs it.
pub struct SageShape<'a> {
    /// Widths: features, hidden layers, classes.
    pub dims: &'a [usize],
    pub fanout: &'a [usize],
    /// Seeds of a step on this rank (its share of the global step, at its largest).
    pub seeds: u64,
    /// Nodes of the graph and of its training split.
    pub nodes: u64,
    pub train: u64,
    /// The pool aggregator (its pooled input rows, their gradient and the max's sources).
    pub pool: bool,
    /// Ranks of the job: a step reads the other ranks' share of its input rows into a buffer
    /// when the first layer is gathered where the rows are (features alone, mean or GCN).
    pub ranks: u64,
}

/// A GraphSAGE rank at its largest: the process before loading, the adjacency and feature
/// rows, then the larger of the load's transients and training's needs. Training holds the
/// labels and split (13 bytes per node: class offsets, classes and split; 17 while read), the training order (16 bytes per
/// training node), the cache, a step's input rows in f32 and its blocks, the model's buffers
/// (the larger of a step's saved activations and backward and an inference chunk's), and
/// layer-wise inference's (the hidden rows of `layer_rows` nodes, a chunk's input rows, the
/// scores) with the output's write windows.
pub fn sage_estimate(process: u64, h: &SageHeld, s: &SageShape) -> SageEstimate {
    let (dims, layers) = (s.dims, s.fanout.len());
    let widest = *dims.iter().max().unwrap_or(&1) as u64;
    let (cols, classes) = (dims[0] as u64, *dims.last().unwrap_or(&1) as u64);
    let labels = 13 * s.nodes + 16 * s.train;
    // Nodes per hop from the seeds (hop 0) to the input rows (hop `layers`): layer l maps
    // hop `layers - l` onto hop `layers - 1 - l`.
    let mut hop = vec![s.seeds];
    // A node gives at most its degree: the mean degree (rounded up) stands for it.
    let degree = h.mean_degree.ceil() as u64;
    for &f in s.fanout {
        let prev = *hop.last().expect("seeds");
        // Draws of nodes: the distinct ones among them, as if uniform over the graph.
        let drawn = (prev * (f as u64).min(degree).saturating_add(1)) as f64;
        let n = s.nodes.max(1) as f64;
        let distinct = (n * -(-drawn / n).exp_m1()).ceil() as u64;
        hop.push(distinct.max(prev));
    }
    let (width, dst, src) = (
        |l: usize| (dims[l] as u64, dims[l + 1] as u64),
        |l: usize| hop[layers - 1 - l],
        |l: usize| hop[layers - l],
    );
    // The blocks (ids, offsets and neighbour indices) and the input rows; with learnable rows
    // their gradients, the rows read and the push's records sent and received. Features alone
    // through the mean or GCN aggregator are gathered where they are: the first layer's own
    // rows and means, where each input row is, and the rows read from other ranks (in the
    // features' type).
    let gathered = !s.pool && h.learned_width == 0;
    let rows = if gathered {
        let remote = hop[layers] * s.ranks.saturating_sub(1) / s.ranks.max(1);
        2 * dst(0) * 4 * cols + hop[layers] * 16 + remote * cols * h.hidden_value
    } else {
        hop[layers] * (4 * cols + 8)
    };
    let step = rows
        + hop.iter().sum::<u64>() * 16
        + if h.learned_width > 0 {
            hop[layers] * (4 * cols + 4 * h.learned_width + 2 * (8 + 4 * h.learned_width))
        } else {
            0
        };
    // Per layer the neighbours' means, the output and its gate; the backward's gradients of
    // the largest layer above the first.
    // The pool aggregator keeps every input row through its layer and each max's source.
    let pool = |l: usize, src: u64, dst: u64| {
        if s.pool {
            (src + dst) * width(l).0 * 4
        } else {
            0
        }
    };
    let saved: u64 = (0..layers)
        .map(|l| dst(l) * (width(l).0 + 2 * width(l).1) * 4 + pool(l, src(l), dst(l)))
        .sum();
    let backward = (1..layers)
        .map(|l| (src(l) * width(l).0 + dst(l) * (width(l).0 + width(l).1)) * 4)
        .max()
        .unwrap_or(0)
        + dst(0) * width(0).1 * 4
        + (0..layers).map(|l| pool(l, src(l), 0)).max().unwrap_or(0);
    let chunk_nodes = h.layer_rows.min(4096);
    let chunk_work = (0..layers)
        .map(|l| {
            chunk_nodes * (width(l).0 + 2 * width(l).1) * 4
                + pool(l, h.chunk_inputs.min(s.nodes), chunk_nodes)
        })
        .max()
        .unwrap_or(0);
    let work = (saved + backward).max(chunk_work);
    let inner = &dims[1..dims.len() - 1];
    let hidden_width = *inner.iter().max().unwrap_or(&0) as u64;
    // At most two layers' hidden rows at once (the one read, the one written).
    let hidden = (inner.len() as u64).min(2) * h.layer_rows * hidden_width * h.hidden_value;
    // A chunk's distinct input rows (at most every node).
    let chunk = h.chunk_inputs.min(s.nodes) * (4 * widest + 20);
    // The scores returned; a rank computing more nodes than it returns holds their last
    // layer's rows too.
    let scores = h.scored * (4 * classes + 8) + h.layer_rows.saturating_sub(h.scored) * 4 * classes;
    // The output's windows: rows sent, received and written.
    let window = (crate::embeddings::WRITE_BYTES as u64 / (4 * classes)).min(s.nodes);
    let write = 3 * window * (4 * classes + 8);
    // The hidden rows go before the output is written.
    let inference = scores + (hidden + chunk).max(write);
    // The best epoch's scores stay while the next epochs train and score.
    let train = labels + h.cache + step + work + scores + inference;
    let total = process
        + h.adjacency
        + h.features
        + h.learned
        + (17 * s.nodes).max(h.load_transient).max(train);
    SageEstimate {
        total,
        labels,
        step: step + work,
        inference,
    }
}
