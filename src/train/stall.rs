//! A walk or edge run that is not learning says so (`--on-stall`): skip-gram's context rows
//! start at zero, so every score starts at 0 and the loss per term at ln 2, and a learning rate
//! too small for the samples each row gets leaves them there to the end, with embeddings at
//! chance (a 4.2M-node planted partition at 1 walk x 20 per node and word2vec's 0.025: 0.6931
//! from the first step to the last). At a tenth of the run every rank scores a sample of its
//! own rows against each other (vertex row i against context row j, as a negative pair is
//! scored) and the ranks add the squares (one collective): if the scores' root mean square is
//! still below [`STALL_SCORE`], the loss has not moved off ln 2 and the rows are not learning;
//! rank 0 warns once with the cause and the flags to change, the metrics record it, and
//! `--on-stall abort` ends the job there.
//!
//! The scores, not the loss the run prints: that loss is a sample (one group in 128,
//! `model::sgns`), and over a tenth of a small run it read 0.654 and 0.683 in two runs of
//! rows that had not moved (16,384 nodes, a rate of 1e-4).

use crate::comm::{Comm, ReduceOp};
use crate::config::{OnStall, Strategy, TrainConfig};
use crate::spmd::fatal;
use crate::stats::RankMetrics;
use crate::store::Shard;

/// The root mean square of the probe's scores below which the rows count as not learning: a
/// score of 0.05 moves its term's loss by at most 0.025 from ln 2. Runs that learn score far
/// higher by a tenth of the run (every random pair a negative: about ln k = 1.6 once the
/// scores have found their level).
pub const STALL_SCORE: f64 = 0.05;

/// Where the check decides (a fraction of the run).
const AT: f64 = 0.1;

/// Rows of each matrix a rank reads for the probe.
const PROBE_ROWS: usize = 1024;

/// The check's state on one rank.
#[derive(Default)]
pub struct StallWatch {
    done: bool,
}

impl StallWatch {
    /// Whether the check is due at progress `frac` (the global progress: the same answer on
    /// every rank). The caller drains its batches in flight first, then calls
    /// [`StallWatch::decide`].
    pub fn due(&self, cfg: &TrainConfig, frac: f64) -> bool {
        // The replicated baseline trains its replicas, not the shards.
        !self.done && frac >= AT && cfg.strategy == Strategy::Sharded
    }

    /// Collective: score this rank's sample of `shards` (vertex rows against context rows),
    /// decide with every rank whether the run is learning; warn or abort if not.
    pub fn decide(
        &mut self,
        comm: &Comm,
        cfg: &TrainConfig,
        m: &mut RankMetrics,
        shards: &[Shard],
        frac: f64,
        num_nodes: u64,
    ) {
        self.done = true;
        let (sq, n) = probe(&shards[0], &shards[shards.len() - 1], cfg.dim);
        let g = comm.all_reduce_f64(&[sq, n as f64, m.pairs as f64], ReduceOp::Sum);
        if g[1] <= 0.0 {
            return;
        }
        let rms = (g[0] / g[1]).sqrt();
        m.stall_score_rms = Some(rms);
        if rms >= STALL_SCORE {
            return;
        }
        m.stalled = true;
        let per_node = g[2] / frac.max(AT) / num_nodes.max(1) as f64;
        let msg = stall_message(cfg, rms, frac, per_node);
        if cfg.on_stall == OnStall::Abort {
            fatal(comm, None, &msg);
        }
        if comm.rank() == 0 {
            eprintln!("graphscale: WARNING: {msg}");
        }
    }
}

/// The sum of squared scores of up to [`PROBE_ROWS`] vertex rows of `vertex` against as many
/// context rows of `context` (row i against row i + 1 of the samples, as random pairs: rows
/// are numbered apart from the graph's structure only by the partition), and their count.
fn probe(vertex: &Shard, context: &Shard, dim: usize) -> (f64, usize) {
    let rows = vertex.rows.min(context.rows);
    if rows < 2 {
        return (0.0, 0);
    }
    let stride = rows.div_ceil(PROBE_ROWS).max(1);
    let picked: Vec<usize> = (0..rows).step_by(stride).collect();
    let (mut v, mut u) = (Vec::new(), Vec::new());
    vertex.read_local(picked.iter().copied(), &mut v);
    context.read_local(picked.iter().map(|&r| (r + stride / 2 + 1) % rows), &mut u);
    let mut sq = 0f64;
    for (a, b) in v.chunks_exact(dim).zip(u.chunks_exact(dim)) {
        let s: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x * y)).sum();
        sq += s * s;
    }
    (sq, picked.len())
}

/// What a stalled run is told: the evidence, the likely cause and what to change.
pub fn stall_message(cfg: &TrainConfig, score_rms: f64, frac: f64, pairs_per_node: f64) -> String {
    format!(
        "at {:.0}% of the run the rows' scores are still about 0 (root mean square {score_rms:.4}) and the loss per pair about ln 2 = 0.6931, where it starts: the rows are not learning, and the embeddings will be at chance. Each node gets about {pairs_per_node:.0} training pairs at --lr {}: too small a learning rate for so few samples per row. Raise --lr (leave it unset for the budget's default), or give more samples (--walks-per-node, --walk-length, --line-samples); --on-stall abort ends such runs here (docs/tuning.md)",
        100.0 * frac,
        cfg.lr
    )
}
