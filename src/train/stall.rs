//! A walk or edge run that is not learning says so (`--on-stall`): skip-gram's loss per term
//! starts at ln 2 (context rows start at zero, so every score is 0), and a learning rate too
//! small for the samples each row gets leaves it there to the end, with embeddings at chance
//! (a 4.2M-node planted partition at 1 walk x 20 per node and word2vec's 0.025: 0.6931 from the
//! first step to the last). At a tenth of the run every rank adds its loss over the run's 5-10%
//! (one collective); if the mean is still within [`STALL_BAND`] of ln 2, rank 0 warns once with
//! the cause and the flags to change, the metrics record it, and `--on-stall abort` ends the
//! job there.

use crate::comm::{Comm, ReduceOp};
use crate::config::{OnStall, TrainConfig};
use crate::spmd::fatal;
use crate::stats::RankMetrics;

/// How close to ln 2 the loss per term must still be to count as not learning. A run that
/// learns leaves it by far more within a tenth (2^20-node planted partition, the defaults:
/// 0.62 by then).
pub const STALL_BAND: f64 = 0.005;

/// Where the check starts its window and where it decides (fractions of the run).
const FROM: f64 = 0.05;
const AT: f64 = 0.1;

/// The check's state on one rank.
#[derive(Default)]
pub struct StallWatch {
    /// This rank's (loss sum, loss terms, pairs) when the run reached `FROM`.
    start: Option<(f64, u64, u64)>,
    done: bool,
}

impl StallWatch {
    /// Collective once (at the first call with `frac >= AT`, the same call on every rank: `frac`
    /// is the global progress): decide whether the run is learning; warn or abort if not.
    pub fn check(
        &mut self,
        comm: &Comm,
        cfg: &TrainConfig,
        m: &mut RankMetrics,
        frac: f64,
        num_nodes: u64,
    ) {
        if self.done {
            return;
        }
        if frac >= FROM && self.start.is_none() {
            self.start = Some((m.loss_sum, m.loss_terms, m.pairs));
        }
        if frac < AT {
            return;
        }
        self.done = true;
        let (l0, t0, _) = self.start.unwrap_or((0.0, 0, 0));
        let g = comm.all_reduce_f64(
            &[m.loss_sum - l0, (m.loss_terms - t0) as f64, m.pairs as f64],
            ReduceOp::Sum,
        );
        if g[1] <= 0.0 || !g[0].is_finite() {
            return;
        }
        let loss = g[0] / g[1];
        m.stall_loss = Some(loss);
        if (loss - std::f64::consts::LN_2).abs() > STALL_BAND {
            return;
        }
        m.stalled = true;
        let per_node = g[2] / frac.max(AT) / num_nodes.max(1) as f64;
        let msg = stall_message(cfg, loss, frac, per_node);
        if cfg.on_stall == OnStall::Abort {
            fatal(comm, None, &msg);
        }
        if comm.rank() == 0 {
            log::warn!("{msg}");
            eprintln!("graphscale: WARNING: {msg}");
        }
    }
}

/// What a stalled run is told: the evidence, the likely cause and what to change.
pub fn stall_message(cfg: &TrainConfig, loss: f64, frac: f64, pairs_per_node: f64) -> String {
    format!(
        "the loss per pair is {loss:.4} at {:.0}% of the run, still ln 2 = 0.6931 where it starts: the rows are not learning, and the embeddings will be at chance. Each node gets about {pairs_per_node:.0} training pairs at --lr {}: too small a learning rate for so few samples per row. Raise --lr (leave it unset for the budget's default), or give more samples (--walks-per-node, --walk-length, --line-samples); --on-stall abort ends such runs here (docs/tuning.md)",
        100.0 * frac,
        cfg.lr
    )
}
