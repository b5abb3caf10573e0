//! Per-rank, per-phase measurements: seconds, bytes, rows, pairs, loss, peak RSS. Written as JSON
//! lines and summarised by rank 0 in a table.

use std::collections::VecDeque;
use std::time::Instant;

use serde::{Deserialize, Serialize};

/// The phases of a step (DESIGN section 9).
#[derive(Default, Clone, Debug, Serialize, Deserialize)]
pub struct Phases {
    pub load: f64,
    pub sample: f64,
    pub fetch: f64,
    pub compute: f64,
    pub push: f64,
    pub apply: f64,
    /// Waiting for the compute pool (compute not hidden behind sampling and fetching).
    pub wait: f64,
    /// The compute pool without a batch (hogwild): the main thread's sampling and
    /// communication that compute did not hide.
    #[serde(default)]
    pub idle: f64,
    pub output: f64,
}

#[derive(Default, Clone, Debug, Serialize, Deserialize)]
pub struct RankMetrics {
    pub rank: usize,
    /// The run's labels for reports: `sharded`, `replicated-sparse` or `replicated-dense`; its
    /// ranks; its nodes (the sum over ranks of 1 / ranks on the rank's node, simulated nodes
    /// included); its model.
    #[serde(default)]
    pub strategy: String,
    #[serde(default)]
    pub ranks: usize,
    #[serde(default)]
    pub nodes: u64,
    #[serde(default)]
    pub model: String,
    /// Compute threads per rank, embedding dimension, and wire bytes per value of the sharded
    /// strategy's rows and deltas (for `graphscale plan --calibrate`).
    #[serde(default)]
    pub threads: usize,
    #[serde(default)]
    pub dim: usize,
    #[serde(default)]
    pub wire_bytes: usize,
    /// Walks: the walks this rank started times their length (a walk ending early at a node
    /// without neighbours has fewer tokens).
    #[serde(default)]
    pub walk_tokens_nominal: u64,
    /// Rows of the sharded matrices over the whole job (nodes x matrices).
    #[serde(default)]
    pub graph_rows: u64,
    pub seconds: Phases,
    pub steps: u64,
    pub pairs: u64,
    pub tokens: u64,
    /// Rows read from this rank's own storage: unique rows per step (batched), or every
    /// reference of a pair to a local row (hogwild, which reads rows in place).
    pub local_rows: u64,
    /// Rows fetched one-sidedly from other ranks (unique per step).
    pub remote_rows: u64,
    /// GraphSAGE: input rows read in place from the node's other ranks (node-shared windows).
    #[serde(default)]
    pub node_rows: u64,
    pub fetch_bytes: u64,
    pub push_bytes_sent: u64,
    pub push_bytes_received: u64,
    pub comm_bytes_sent: u64,
    pub comm_bytes_received: u64,
    pub loss_sum: f64,
    pub loss_terms: u64,
    /// Walk and edge models: the root mean square of a sample of the rows' scores at a tenth
    /// of the run (all ranks), and whether it was still about 0 there (the loss at ln 2): the
    /// run was not learning (`train::stall`).
    #[serde(default)]
    pub stall_score_rms: Option<f64>,
    #[serde(default)]
    pub stalled: bool,
    pub train_seconds: f64,
    /// Of `train_seconds`, the evaluations between epochs (GraphSAGE's validation).
    #[serde(default)]
    pub eval_seconds: f64,
    /// GraphSAGE: the validation accuracy after each epoch (every rank holds the same).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub valid_accuracy: Vec<f64>,
    /// CPU seconds of the rank's main thread (sampling, planning, communication, including
    /// MPI's busy waiting) and of the whole process, from start to the end of training.
    #[serde(default)]
    pub cpu_seconds_main: f64,
    #[serde(default)]
    pub cpu_seconds_process: f64,
    /// The same, of training alone (from its first step to its last; `graphscale plan
    /// --calibrate` fits the main thread's and the pool's costs per pair from them).
    #[serde(default)]
    pub cpu_seconds_main_train: f64,
    #[serde(default)]
    pub cpu_seconds_process_train: f64,
    /// Bytes this rank read one-sidedly from other ranks (`MPI_Get`), which `comm_bytes_sent`
    /// (what it sent in collectives) does not hold; their sum is what it moved.
    #[serde(default)]
    pub one_sided_bytes: u64,
    pub peak_rss_bytes: u64,
    pub memory_estimate_bytes: u64,
    /// Checkpoints started, the time training stood still for their snapshots, the bytes
    /// written, and the version this run resumed from.
    pub checkpoints: u64,
    pub checkpoint_pause_seconds: f64,
    pub checkpoint_bytes: u64,
    pub resumed_from: Option<u64>,
    /// Batches dropped by --on-nan skip.
    pub skipped_batches: u64,
    /// Remote-row cache (hogwild across nodes): its rows, and per batch row its hits, first
    /// reads, re-reads after `--cache-refresh` steps, and the rows evicted to make room.
    #[serde(default)]
    pub cache_rows: u64,
    /// The cache's clock (`--cache-refresh`, or its default for the job's nodes).
    #[serde(default)]
    pub cache_refresh: u64,
    #[serde(default)]
    pub cache_hits: u64,
    #[serde(default)]
    pub cache_misses: u64,
    #[serde(default)]
    pub cache_refreshes: u64,
    #[serde(default)]
    pub cache_evictions: u64,
    /// Deltas this rank's rows received together with other copies' deltas of the same row in
    /// one exchange and applied at less than half their sum, the copies having saturated
    /// (`train::cache`'s rule).
    #[serde(default)]
    pub cache_deltas_damped: u64,
    /// Hogwild: references of the batches' pairs to rows of other nodes (`local_rows` counts
    /// those to rows of this node); walks: walker steps that moved to another rank.
    #[serde(default)]
    pub remote_refs: u64,
    /// Hogwild across nodes: distinct remote rows among a random half of each batch's
    /// references to them (each reference kept with probability 1/2). Beside the batches'
    /// distinct remote rows (the cache's uses) it shows how deduplication grows with the batch:
    /// `graphscale plan` scales the uses per pair by it when a rank's share of a batch changes.
    #[serde(default)]
    pub remote_uses_half: u64,
    #[serde(default)]
    pub walker_crossings: u64,
    /// Periodic samples during training, every `TIMELINE_SECONDS` at first (the interval
    /// doubles whenever `TIMELINE_MAX` samples are held, keeping every other): [seconds since
    /// the trainer started, pairs trained so far, bytes moved so far (collectives sent plus
    /// one-sided reads)].
    #[serde(default)]
    pub timeline: Vec<[f64; 3]>,
    /// The loss per term over windows of training: [pairs trained so far, mean loss per term
    /// of the window] ([`LossWatch`]: windows of 2^20 terms at first, twice as long whenever
    /// `LOSS_CURVE_MAX` are held).
    #[serde(default)]
    pub loss_curve: Vec<[f64; 2]>,
    /// Knowledge graphs with `--valid`: [epoch, filtered MRR, Hits@10] of the validation
    /// triples after that epoch (the same on every rank).
    #[serde(default)]
    pub valid: Vec<[f64; 3]>,
    /// `--patience`: the epoch after which training stopped early.
    #[serde(default)]
    pub stopped_at_epoch: Option<u32>,
}

/// Windows a loss curve holds at most.
pub const LOSS_CURVE_MAX: usize = 128;

/// Watches a rank's loss per term while it trains: a run whose copies of rows overshoot or
/// whose learning rate is too high shows it as a loss that climbs instead of falling (8 simulated
/// nodes before copies were averaged: from 0.69 to 1.9 within the first quarter, where the
/// 1-node run falls to 0.45).
pub struct LossWatch {
    window: u64,
    loss: f64,
    terms: u64,
    /// The last `SMOOTH` windows' loss per term, oldest first.
    recent: VecDeque<f64>,
    best: f64,
    warned: bool,
}

impl Default for LossWatch {
    fn default() -> Self {
        LossWatch {
            window: 1 << 20,
            loss: 0.0,
            terms: 0,
            recent: VecDeque::with_capacity(LossWatch::SMOOTH),
            best: f64::INFINITY,
            warned: false,
        }
    }
}

impl LossWatch {
    /// The mean of the last `SMOOTH` windows, this many times the lowest such mean before it
    /// (and 0.1 above it), warns.
    pub const RISE: f64 = 1.5;
    /// Windows averaged before they are compared. The walk models' loss is a sample (one output
    /// token in 128, `model::sgns`), so one window of small batches reads up to 1.3x its
    /// neighbours: single windows at 4 simulated nodes (BlogCatalog) spread from 0.36 to 0.58
    /// around 0.45 and warned on 3 ranks of 4 of a run that trained well.
    pub const SMOOTH: usize = 4;

    /// Add a batch's summed `loss` over `terms` with `pairs` trained so far; closes windows into
    /// `curve`. Returns (the last `SMOOTH` windows' mean loss per term, the lowest earlier such
    /// mean) the first time it rises past `RISE` x the lowest.
    pub fn add(
        &mut self,
        loss: f64,
        terms: u64,
        pairs: u64,
        curve: &mut Vec<[f64; 2]>,
    ) -> Option<(f64, f64)> {
        self.loss += loss;
        self.terms += terms;
        if self.terms < self.window {
            return None;
        }
        let now = self.loss / self.terms as f64;
        (self.loss, self.terms) = (0.0, 0);
        curve.push([pairs as f64, now]);
        if curve.len() > LOSS_CURVE_MAX {
            // Merge neighbours: the curve keeps its span at half the resolution.
            *curve = curve
                .chunks(2)
                .map(|c| {
                    [
                        c[c.len() - 1][0],
                        c.iter().map(|x| x[1]).sum::<f64>() / c.len() as f64,
                    ]
                })
                .collect();
            self.window *= 2;
        }
        if self.recent.len() == Self::SMOOTH {
            self.recent.pop_front();
        }
        self.recent.push_back(now);
        if self.recent.len() < Self::SMOOTH {
            return None;
        }
        let now = self.recent.iter().sum::<f64>() / Self::SMOOTH as f64;
        let risen = !self.warned && now > Self::RISE * self.best && now > self.best + 0.1;
        let best = self.best;
        self.best = self.best.min(now);
        if risen {
            self.warned = true;
            return Some((now, best));
        }
        None
    }
}

/// The first interval of [`RankMetrics::timeline`].
pub const TIMELINE_SECONDS: f64 = 2.0;
/// Samples a timeline holds at most.
pub const TIMELINE_MAX: usize = 512;

impl RankMetrics {
    /// Add a timeline sample at `t` seconds if the interval since the last one has passed.
    pub fn sample(&mut self, t: f64, bytes: u64) {
        let every = self.timeline_every();
        if self.timeline.last().is_some_and(|l| t - l[0] < every) {
            return;
        }
        self.timeline.push([t, self.pairs as f64, bytes as f64]);
        if self.timeline.len() >= TIMELINE_MAX {
            let kept: Vec<[f64; 3]> = self.timeline.iter().step_by(2).copied().collect();
            self.timeline = kept;
        }
    }

    /// The current interval: doubled each time the timeline was thinned.
    fn timeline_every(&self) -> f64 {
        let span = self.timeline.last().map_or(0.0, |l| l[0])
            - self.timeline.first().map_or(0.0, |f| f[0]);
        let mut every = TIMELINE_SECONDS;
        while span / every > (TIMELINE_MAX / 2) as f64 {
            every *= 2.0;
        }
        every
    }
}

impl RankMetrics {
    pub fn pairs_per_second(&self) -> f64 {
        self.pairs as f64 / self.train_seconds.max(1e-9)
    }
}

/// CPU seconds (user + system) of the calling thread and of the whole process.
pub fn cpu_seconds() -> (f64, f64) {
    let of = |who| {
        // SAFETY: an all-zero `rusage` is a valid value of this plain C struct.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `u` is a valid out-pointer for the call.
        if unsafe { libc::getrusage(who, &mut u) } != 0 {
            return 0.0;
        }
        let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 * 1e-6;
        t(u.ru_utime) + t(u.ru_stime)
    };
    (of(libc::RUSAGE_THREAD), of(libc::RUSAGE_SELF))
}

/// Peak resident set size of this process (VmHWM), in bytes; 0 where unavailable.
pub fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// Wall-clock seconds of a phase: `let t = Timer::start(); ...; phases.fetch += t.secs();`
pub struct Timer(Instant);

impl Timer {
    pub fn start() -> Timer {
        Timer(Instant::now())
    }

    pub fn secs(&self) -> f64 {
        self.0.elapsed().as_secs_f64()
    }
}

pub fn human_bytes(b: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", units[u])
}

type Getter = fn(&RankMetrics) -> f64;

/// The end-of-run table over all ranks (max and mean per phase), printed by rank 0.
pub fn summary_table(all: &[RankMetrics]) -> String {
    let n = all.len() as f64;
    let mut s = String::new();
    let col = |f: Getter| {
        let max = all.iter().map(f).fold(0.0, f64::max);
        let mean = all.iter().map(f).sum::<f64>() / n;
        (max, mean)
    };
    s.push_str("phase        max s     mean s\n");
    let rows: [(&str, Getter); 9] = [
        ("load", |m| m.seconds.load),
        ("sample", |m| m.seconds.sample),
        ("fetch", |m| m.seconds.fetch),
        ("compute", |m| m.seconds.compute),
        ("push", |m| m.seconds.push),
        ("apply", |m| m.seconds.apply),
        ("wait", |m| m.seconds.wait),
        ("idle", |m| m.seconds.idle),
        ("output", |m| m.seconds.output),
    ];
    for (name, f) in rows {
        let (mx, mean) = col(f);
        s.push_str(&format!("{name:<10} {mx:>8.2} {mean:>10.2}\n"));
    }
    let pairs: u64 = all.iter().map(|m| m.pairs).sum();
    let train = all.iter().map(|m| m.train_seconds).fold(0.0, f64::max);
    let remote: u64 = all.iter().map(|m| m.remote_rows).sum();
    let local: u64 = all.iter().map(|m| m.local_rows).sum();
    let fetch: u64 = all.iter().map(|m| m.fetch_bytes).sum();
    let push: u64 = all.iter().map(|m| m.push_bytes_sent).sum();
    let loss: f64 = all.iter().map(|m| m.loss_sum).sum();
    let terms: u64 = all.iter().map(|m| m.loss_terms).sum();
    let rss = all.iter().map(|m| m.peak_rss_bytes).max().unwrap_or(0);
    let moved: u64 = all
        .iter()
        .map(|m| m.comm_bytes_sent + m.one_sided_bytes)
        .sum();
    if all[0].model == "sage" {
        let steps = all
            .iter()
            .map(|m| m.train_seconds - m.eval_seconds)
            .fold(0.0, f64::max);
        let (hits, misses, node) = (
            all.iter().map(|m| m.cache_hits).sum::<u64>(),
            all.iter().map(|m| m.cache_misses).sum::<u64>(),
            all.iter().map(|m| m.node_rows).sum::<u64>(),
        );
        s.push_str(&format!(
            "training seeds {pairs} in {train:.2} s, {steps:.2} s of it in steps (the rest \
             validation): {:.0} seeds/s; the steps' input rows {local} own, {node} in place on \
             the node, {hits} from the feature cache, {misses} read from their owners ({}); \
             peak RSS per rank {}\n\
             moved between ranks {} ({:.1} B per training seed; the training steps' \
             collectives sent plus one-sided reads)\n",
            pairs as f64 / steps.max(1e-9),
            human_bytes(fetch),
            human_bytes(rss),
            human_bytes(moved),
            moved as f64 / pairs.max(1) as f64
        ));
        return s;
    }
    s.push_str(&format!(
        "pairs {pairs} in {train:.2} s: {:.0} pairs/s; rows local {local} remote {remote}; \
         fetched {}, pushed {}; mean loss per pair {:.4}; peak RSS per rank {}\n",
        pairs as f64 / train.max(1e-9),
        human_bytes(fetch),
        human_bytes(push),
        loss / terms.max(1) as f64,
        human_bytes(rss)
    ));
    s.push_str(&format!(
        "moved between ranks {} ({:.1} B per pair; collectives sent plus one-sided reads)\n",
        human_bytes(moved),
        moved as f64 / pairs.max(1) as f64
    ));
    let cached = all.iter().map(|m| m.cache_rows).max().unwrap_or(0);
    if cached > 0 {
        let hits: u64 = all.iter().map(|m| m.cache_hits).sum();
        let misses: u64 = all.iter().map(|m| m.cache_misses).sum();
        let refreshes: u64 = all.iter().map(|m| m.cache_refreshes).sum();
        let evictions: u64 = all.iter().map(|m| m.cache_evictions).sum();
        let damped: u64 = all.iter().map(|m| m.cache_deltas_damped).sum();
        let deltas = (all.iter().map(|m| m.push_bytes_received).sum::<u64>()
            / (4 + crate::config::wire_row_bytes(all[0].dim, all[0].wire_bytes.max(1)) as u64))
            .max(1);
        let uses = (hits + misses + refreshes).max(1) as f64;
        s.push_str(&format!(
            "remote-row cache {cached} rows per rank, clock {}: {:.1}% of uses hit, {:.1}% first \
             reads, {:.1}% re-reads; {evictions} evictions; {:.1}% of deltas damped with \
             other copies'\n",
            all[0].cache_refresh,
            100.0 * hits as f64 / uses,
            100.0 * misses as f64 / uses,
            100.0 * refreshes as f64 / uses,
            100.0 * damped as f64 / deltas as f64
        ));
    }
    let ckpts = all.iter().map(|m| m.checkpoints).max().unwrap_or(0);
    if ckpts > 0 {
        let pause = all
            .iter()
            .map(|m| m.checkpoint_pause_seconds)
            .fold(0.0, f64::max);
        let bytes: u64 = all.iter().map(|m| m.checkpoint_bytes).sum();
        s.push_str(&format!(
            "checkpoints {ckpts}: {} written, training paused {pause:.2} s in total (slowest rank)\n",
            human_bytes(bytes)
        ));
    }
    if let Some(v) = all[0].resumed_from {
        s.push_str(&format!("resumed from checkpoint version {v}\n"));
    }
    let skipped: u64 = all.iter().map(|m| m.skipped_batches).sum();
    if skipped > 0 {
        s.push_str(&format!("batches skipped (--on-nan skip): {skipped}\n"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loss_that_climbs_warns_once_and_a_falling_one_never() {
        let w = 1u64 << 20;
        let mut curve = Vec::new();
        let mut falling = LossWatch::default();
        for i in 0..300u64 {
            let l = 0.7 - 0.25 * (i as f64 / 300.0);
            assert_eq!(falling.add(l * w as f64, w, i, &mut curve), None);
        }
        // Merged as it grew: at most LOSS_CURVE_MAX windows, in order, still falling.
        assert!(curve.len() <= LOSS_CURVE_MAX && curve.len() > LOSS_CURVE_MAX / 2);
        assert!(curve
            .windows(2)
            .all(|c| c[0][0] < c[1][0] && c[0][1] >= c[1][1]));
        let (mut curve, mut climbing, mut warned) = (Vec::new(), LossWatch::default(), Vec::new());
        for (i, l) in [0.69, 0.66, 0.65, 0.7, 0.9, 1.2, 1.9, 1.8]
            .iter()
            .enumerate()
        {
            if let Some(x) = climbing.add(l * w as f64, w, i as u64, &mut curve) {
                warned.push((i, x));
            }
        }
        // Means of four: 0.675 (the lowest), 0.7275, 0.8625, then 1.175, past 1.5 x 0.675; only
        // the first such mean warns.
        assert_eq!(warned.len(), 1);
        assert_eq!(warned[0].0, 6);
        assert!((warned[0].1 .0 - 1.175).abs() < 1e-9 && (warned[0].1 .1 - 0.675).abs() < 1e-9);
    }

    #[test]
    fn a_sampled_loss_that_wanders_around_its_level_does_not_warn() {
        // Windows of a run that trained well (4 simulated nodes, BlogCatalog, rank 3's first 24):
        // 0.58 is 1.5 x 0.36 and 0.1 above it, one window at a time.
        let w = 1u64 << 20;
        let mut curve = Vec::new();
        let mut watch = LossWatch::default();
        let seen = [
            0.67, 0.52, 0.51, 0.46, 0.45, 0.49, 0.46, 0.47, 0.50, 0.53, 0.39, 0.45, 0.46, 0.36,
            0.41, 0.51, 0.41, 0.47, 0.44, 0.40, 0.43, 0.38, 0.58, 0.40,
        ];
        for (i, l) in seen.iter().enumerate() {
            assert_eq!(
                watch.add(l * w as f64, w, i as u64, &mut curve),
                None,
                "window {i}"
            );
        }
    }
}
