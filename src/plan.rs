//! `graphscale plan`: what a job needs before it is submitted. Memory per rank and per node for
//! graphscale's sharded strategy and the data-parallel baseline (`--strategy replicated`), the
//! bytes a step and an epoch move, and the time per epoch from a model: an alpha-beta network
//! (per-message latency, per-node bandwidth shared by the node's ranks) and compute, sampling
//! and traffic rates per pair, either defaults measured on R-MAT 2^20 (docs/scaling.md) or
//! fitted from measured runs (`--calibrate METRICS.jsonl`, repeatable: a sharded and a
//! replicated run fit both strategies' traffic).
//!
//! The sharded strategy overlaps its one all-to-all per step with the pool's compute (a step
//! costs the larger of the two plus the main thread's sampling); the replicated strategy's sync
//! follows its step's compute (a step costs their sum), as synchronous data parallelism does.

use serde::Serialize;

use crate::config::{default_cache_refresh, Model, Optimizer};
use crate::error::{Error, Result};
use crate::stats::{human_bytes, RankMetrics};

/// What the planner is told (flags of `graphscale plan`).
#[derive(Clone, Debug)]
pub struct Job {
    pub nodes: f64,
    pub edges: f64,
    pub directed: bool,
    pub dim: usize,
    /// Bytes per stored value (f32 4, f16/bf16 2).
    pub dtype_bytes: usize,
    pub optimizer: Optimizer,
    pub model: Model,
    pub order: u32,
    pub walks_per_node: f64,
    pub walk_length: f64,
    pub window: f64,
    pub line_samples: f64,
    pub batch_size: f64,
    pub ranks: usize,
    pub ranks_per_node: usize,
    pub threads: usize,
    pub mem_per_node: Option<f64>,
    /// Wire bytes per value of the sharded strategy's rows and deltas.
    pub wire_bytes: usize,
    pub latency: f64,
    pub bandwidth: f64,
}

/// Per-pair costs of a run: measured defaults or fitted from metrics.
#[derive(Clone, Debug, Serialize)]
pub struct Rates {
    /// Pairs per second of one compute thread (the pool's busy time), at `dim_at`.
    pub pairs_per_thread_second: f64,
    pub dim_at: usize,
    /// Main-thread seconds of sampling per pair.
    pub sample_seconds_per_pair: f64,
    /// Sharded: rows (row-equivalents of `dim` values) moved per trained pair, per unit of the
    /// remote fraction (nodes - 1) / nodes.
    pub sharded_rows_per_pair: f64,
    /// Replicated, sparse: distinct rows a rank's batch touches per pair.
    pub replicated_rows_per_pair: f64,
    /// Skip-gram pairs per walk token (walks x length; after subsampling and dead ends).
    pub pairs_per_token: f64,
    pub source: String,
}

impl Rates {
    /// Measured with `bench/run_benchmarks.sh scaling` on R-MAT 2^20 (d 64, DeepWalk 1 x 20,
    /// 1 rank x 2 threads and 4 simulated nodes): see docs/scaling.md.
    pub fn defaults() -> Rates {
        Rates {
            pairs_per_thread_second: 5.0e6,
            dim_at: 64,
            sample_seconds_per_pair: 2.5e-9,
            sharded_rows_per_pair: 1.0,
            replicated_rows_per_pair: 0.8,
            pairs_per_token: 5.7,
            source: "defaults (R-MAT 2^20, docs/scaling.md)".into(),
        }
    }

    /// Fit the rates to a measured run (one `--metrics` file): compute rate from the pool's busy
    /// seconds, sampling from the main thread's, traffic per pair from the bytes each strategy
    /// moved. Rates a run cannot show (the other strategy's traffic, or any traffic at one
    /// node) keep their defaults.
    /// Several runs (`--calibrate` repeated): compute, sampling and pairs per token from the
    /// first, the traffic of each strategy from a run of that strategy.
    pub fn calibrate(paths: &[std::path::PathBuf]) -> Result<Rates> {
        let mut r = Rates::defaults();
        for (i, path) in paths.iter().enumerate() {
            r = r.fit(path, i == 0)?;
        }
        r.source = format!(
            "calibrated from {}",
            paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        Ok(r)
    }

    fn fit(mut self, path: &std::path::Path, first: bool) -> Result<Rates> {
        let runs = crate::report::load(&[path.to_path_buf()])?;
        let ms: &[RankMetrics] = &runs[0].ranks;
        let m0 = &ms[0];
        if m0.threads == 0 || m0.dim == 0 || m0.wire_bytes == 0 {
            return Err(Error::config(format!(
                "{}: metrics without threads, dim and wire bytes, written by an older graphscale: run the job again with this version's --metrics to calibrate from it",
                path.display()
            )));
        }
        let r = &mut self;
        let pairs: f64 = ms.iter().map(|m| m.pairs as f64).sum();
        let tokens: f64 = ms.iter().map(|m| m.walk_tokens_nominal as f64).sum();
        if pairs <= 0.0 {
            return Err(Error::config(format!(
                "{}: the run trained no pairs",
                path.display()
            )));
        }
        if first {
            let threads = m0.threads.max(1) as f64;
            let busy: f64 = ms.iter().map(|m| m.seconds.compute).sum::<f64>() * threads;
            r.pairs_per_thread_second = pairs / busy.max(1e-9);
            r.dim_at = m0.dim.max(1);
            r.sample_seconds_per_pair = ms.iter().map(|m| m.seconds.sample).sum::<f64>() / pairs;
            if m0.model != "line" && tokens > 0.0 {
                r.pairs_per_token = pairs / tokens;
            }
        }
        let nodes = m0.nodes.max(1) as f64;
        let moved: f64 = ms
            .iter()
            .map(|m| (m.comm_bytes_sent + m.one_sided_bytes) as f64)
            .sum();
        let p = m0.ranks as f64;
        if m0.strategy == "sharded" && nodes > 1.0 {
            let row = (m0.dim * m0.wire_bytes.max(1)) as f64;
            r.sharded_rows_per_pair = moved / pairs / row / ((nodes - 1.0) / nodes);
        }
        if m0.strategy == "replicated-sparse" && p > 1.0 {
            let rec = (8 + 4 * m0.dim) as f64;
            let sent: f64 = ms.iter().map(|m| m.push_bytes_sent as f64).sum();
            r.replicated_rows_per_pair = sent / pairs / rec / (p - 1.0);
        }
        Ok(self)
    }
}

/// One strategy's plan.
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    pub strategy: String,
    /// Per rank, bytes: embeddings, optimizer state, adjacency, remote-row cache (or, replicated,
    /// the dense gradient matrices), step buffers.
    pub embeddings: f64,
    pub optimizer: f64,
    pub adjacency: f64,
    pub cache: f64,
    pub buffers: f64,
    pub per_rank: f64,
    pub per_node: f64,
    pub bytes_per_step_per_rank: f64,
    pub bytes_per_epoch: f64,
    pub steps_per_epoch: f64,
    pub compute_seconds_per_epoch: f64,
    pub communication_seconds_per_epoch: f64,
    pub seconds_per_epoch: f64,
    pub fits: bool,
}

/// Both strategies' plans for `job` at `rates`.
pub fn plan(job: &Job, rates: &Rates) -> Result<(f64, Vec<Plan>)> {
    check(job)?;
    let (n, d, p) = (job.nodes, job.dim as f64, job.ranks as f64);
    let machines = (p / job.ranks_per_node as f64).ceil();
    let matrices = if job.model == Model::Line && job.order == 1 {
        1.0
    } else {
        2.0
    };
    let state = job.optimizer.state_per_row(job.dim) as f64 * 4.0;
    let rows = (n / p).ceil();
    let entries = job.edges * if job.directed { 1.0 } else { 2.0 };
    // CSR: u64 targets and offsets; walks on several ranks per node map a node-shared copy.
    let walks = job.model != Model::Line;
    let copies = if walks && job.ranks_per_node > 1 {
        2.0
    } else {
        1.0
    };
    let adjacency = (entries / p * 8.0 + (rows + 1.0) * 8.0) * copies;
    let pairs = match job.model {
        Model::Line => job.line_samples * job.edges,
        _ => n * job.walks_per_node * job.walk_length * rates.pairs_per_token,
    };
    let steps = (pairs / job.batch_size).ceil().max(1.0);
    let per_rank_step = job.batch_size / p;
    // The negative pool (u64 ids) and a step's plan, rows of remote pairs and walkers.
    let buffers = (65536f64).max(4.0 * job.batch_size) * 8.0 + per_rank_step * 96.0;
    let compute_rate = rates.pairs_per_thread_second * rates.dim_at as f64 / d;
    let compute = pairs / (compute_rate * job.threads as f64 * p);
    let sample = pairs / p * rates.sample_seconds_per_pair;
    let per_node_share = job.ranks_per_node.min(job.ranks) as f64;
    let net = |bytes_per_rank_step: f64| -> f64 {
        if machines <= 1.0 {
            return 0.0;
        }
        // One all-to-all (or all-gather) per step: a message to every other rank, and the
        // node's ranks share its link.
        steps * (job.latency * (p - 1.0) + bytes_per_rank_step * per_node_share / job.bandwidth)
    };
    let mut out = Vec::new();

    // Sharded.
    let remote = (machines - 1.0) / machines;
    let row = d * job.wire_bytes as f64;
    let sharded_bytes = per_rank_step * rates.sharded_rows_per_pair * row * remote;
    let cache = if machines > 1.0 {
        rows * matrices * d * 8.0
    } else {
        0.0
    };
    let comm = net(sharded_bytes);
    let emb = rows * d * job.dtype_bytes as f64 * matrices;
    let opt = rows * state * matrices;
    out.push(finish(
        job,
        "sharded",
        [emb, opt, adjacency, cache, buffers],
        sharded_bytes,
        steps,
        compute,
        comm,
        compute.max(comm) + sample,
    ));

    // Replicated: every rank every row in f32, optimizer state for every row.
    let emb = n * d * 4.0 * matrices;
    let opt = n * state * matrices;
    let sparse = per_rank_step * rates.replicated_rows_per_pair * (8.0 + 4.0 * d) * (p - 1.0);
    let comm = net(sparse);
    out.push(finish(
        job,
        "replicated-sparse",
        [emb, opt, adjacency, 0.0, buffers],
        sparse,
        steps,
        compute,
        comm,
        compute + comm + sample,
    ));
    let dense = 2.0 * (p - 1.0) / p * n * d * 4.0 * matrices;
    let comm = net(dense);
    out.push(finish(
        job,
        "replicated-dense",
        [emb, opt, adjacency, emb, buffers],
        dense,
        steps,
        compute,
        comm,
        compute + comm + sample,
    ));
    Ok((pairs, out))
}

#[allow(clippy::too_many_arguments)]
fn finish(
    job: &Job,
    strategy: &str,
    [embeddings, optimizer, adjacency, cache, buffers]: [f64; 5],
    bytes_per_step: f64,
    steps: f64,
    compute: f64,
    comm: f64,
    seconds: f64,
) -> Plan {
    let per_rank = embeddings + optimizer + adjacency + cache + buffers;
    let per_node = per_rank * job.ranks_per_node.min(job.ranks) as f64;
    Plan {
        strategy: strategy.into(),
        embeddings,
        optimizer,
        adjacency,
        cache,
        buffers,
        per_rank,
        per_node,
        bytes_per_step_per_rank: bytes_per_step,
        bytes_per_epoch: bytes_per_step * steps * job.ranks as f64,
        steps_per_epoch: steps,
        compute_seconds_per_epoch: compute,
        communication_seconds_per_epoch: comm,
        seconds_per_epoch: seconds,
        fits: job.mem_per_node.map_or(true, |m| per_node <= m),
    }
}

fn check(job: &Job) -> Result<()> {
    let mut errs = Vec::new();
    for (v, name) in [
        (job.nodes, "--nodes"),
        (job.edges, "--edges"),
        (job.batch_size, "--batch-size"),
        (job.bandwidth, "--bandwidth"),
        (job.walks_per_node, "--walks-per-node"),
        (job.walk_length, "--walk-length"),
        (job.line_samples, "--line-samples"),
    ] {
        if !(v.is_finite() && v > 0.0) {
            errs.push(format!("{name} must be a positive number (got {v})"));
        }
    }
    if !(job.latency.is_finite() && job.latency >= 0.0) {
        errs.push("--latency must be >= 0".into());
    }
    if job.dim == 0 || job.ranks == 0 || job.ranks_per_node == 0 || job.threads == 0 {
        errs.push("--dim, --ranks, --ranks-per-node and --threads must be at least 1".into());
    }
    if job.mem_per_node.is_some_and(|m| m.is_nan() || m <= 0.0) {
        errs.push("--mem-per-node must be positive".into());
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(Error::config(errs.join("; ")))
    }
}

/// The plan as text: a table per strategy, then the verdict.
pub fn render(job: &Job, rates: &Rates, pairs: f64, plans: &[Plan]) -> String {
    use std::fmt::Write as _;
    let h = |b: f64| human_bytes(b.max(0.0) as u64);
    let machines = (job.ranks as f64 / job.ranks_per_node as f64).ceil();
    let mut o = String::new();
    let _ = writeln!(
        o,
        "graphscale plan: {:.3e} nodes, {:.3e} edges, dim {}, {} ranks on {} nodes ({} per node, {} threads each); {:.3e} pairs per epoch in {:.0} steps",
        job.nodes, job.edges, job.dim, job.ranks, machines, job.ranks_per_node, job.threads, pairs, plans[0].steps_per_epoch
    );
    let _ = writeln!(
        o,
        "rates: {:.2e} pairs/s per thread at dim {}, {:.2} pairs per token, {:.2} rows moved per pair (sharded), {:.2} rows per pair (replicated); {}",
        rates.pairs_per_thread_second, rates.dim_at, rates.pairs_per_token, rates.sharded_rows_per_pair, rates.replicated_rows_per_pair, rates.source
    );
    let _ = writeln!(
        o,
        "network: {:.1} us per message, {}/s per node",
        job.latency * 1e6,
        h(job.bandwidth)
    );
    let _ = writeln!(
        o,
        "{:<18} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12} {:>12} {:>10}",
        "strategy",
        "rows",
        "optimizer",
        "adjacency",
        "cache/grad",
        "buffers",
        "per rank",
        "per node",
        "bytes/step",
        "bytes/epoch",
        "s/epoch"
    );
    for p in plans {
        let _ = writeln!(
            o,
            "{:<18} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12} {:>12} {:>10.0}",
            p.strategy,
            h(p.embeddings),
            h(p.optimizer),
            h(p.adjacency),
            h(p.cache),
            h(p.buffers),
            h(p.per_rank),
            h(p.per_node),
            h(p.bytes_per_step_per_rank),
            h(p.bytes_per_epoch),
            p.seconds_per_epoch
        );
    }
    if let Some(m) = job.mem_per_node {
        for p in plans {
            if !p.fits {
                let _ = writeln!(
                    o,
                    "{}: needs {} per node, {} more than --mem-per-node {} ({:.1}x)",
                    p.strategy,
                    h(p.per_node),
                    h(p.per_node - m),
                    h(m),
                    p.per_node / m
                );
            }
        }
    }
    let steps = plans[0].steps_per_epoch;
    let latency = steps * job.latency * (job.ranks as f64 - 1.0);
    if machines > 1.0
        && latency > 0.5 * plans[0].communication_seconds_per_epoch
        && latency > plans[0].compute_seconds_per_epoch
    {
        let _ = writeln!(
            o,
            "note: the sharded strategy's communication is latency-bound ({:.0} of its {:.0} s per epoch are message latency, {:.0} pairs per rank and step): raise --batch-size",
            latency,
            plans[0].communication_seconds_per_epoch,
            job.batch_size / job.ranks as f64
        );
    }
    let _ = writeln!(
        o,
        "sharded cache: {} rows per rank (the default --cache-rows), clock {} (the default --cache-refresh)",
        if machines > 1.0 { ((job.nodes / job.ranks as f64).ceil() as u64 * 2).to_string() } else { "no".into() },
        default_cache_refresh(machines as u64)
    );
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> Job {
        Job {
            nodes: 1e6,
            edges: 1e7,
            directed: false,
            dim: 64,
            dtype_bytes: 4,
            optimizer: Optimizer::Sgd,
            model: Model::Deepwalk,
            order: 2,
            walks_per_node: 1.0,
            walk_length: 20.0,
            window: 10.0,
            line_samples: 100.0,
            batch_size: 16384.0,
            ranks: 4,
            ranks_per_node: 1,
            threads: 1,
            mem_per_node: None,
            wire_bytes: 2,
            latency: 2e-6,
            bandwidth: 12.5e9,
        }
    }

    #[test]
    fn memory_follows_the_layout() {
        let (pairs, p) = plan(&job(), &Rates::defaults()).unwrap();
        let rows = 250_000.0;
        // Rows of two f32 matrices; u64 adjacency entries (both directions) and offsets.
        assert_eq!(p[0].embeddings, rows * 64.0 * 4.0 * 2.0);
        assert_eq!(p[0].adjacency, 2e7 / 4.0 * 8.0 + (rows + 1.0) * 8.0);
        assert_eq!(p[0].cache, rows * 2.0 * 64.0 * 8.0);
        // Every rank holds every row when replicated; dense adds gradient matrices as large.
        assert_eq!(p[1].embeddings, 1e6 * 64.0 * 4.0 * 2.0);
        assert_eq!(p[2].cache, p[2].embeddings);
        assert!((pairs - 1e6 * 20.0 * Rates::defaults().pairs_per_token).abs() < 1.0);
        // A ring all-reduce: 2 (p - 1) / p of the matrices per rank and step.
        assert_eq!(p[2].bytes_per_step_per_rank, 1.5 * 1e6 * 64.0 * 4.0 * 2.0);
        assert!(p.iter().all(|x| x.fits));
    }

    #[test]
    fn adagrad_state_and_a_node_budget() {
        let mut j = job();
        j.optimizer = Optimizer::Adagrad;
        j.mem_per_node = Some(1e9);
        let (_, p) = plan(&j, &Rates::defaults()).unwrap();
        assert_eq!(p[0].optimizer, 250_000.0 * 4.0 * 2.0);
        assert!(p[0].fits, "{}", p[0].per_node);
        assert!(!p[2].fits, "{}", p[2].per_node);
        j.mem_per_node = Some(1e6);
        let (_, p) = plan(&j, &Rates::defaults()).unwrap();
        assert!(!p[0].fits);
    }

    #[test]
    fn one_node_moves_nothing_and_more_nodes_cost_time() {
        let mut j = job();
        j.ranks_per_node = 4;
        let (_, one) = plan(&j, &Rates::defaults()).unwrap();
        assert_eq!(one[0].communication_seconds_per_epoch, 0.0);
        j.ranks_per_node = 1;
        let (_, four) = plan(&j, &Rates::defaults()).unwrap();
        assert!(four[0].communication_seconds_per_epoch > 0.0);
        // The sync follows compute in the replicated strategy: never faster than sharded here.
        assert!(four[1].seconds_per_epoch > four[0].seconds_per_epoch);
    }

    #[test]
    fn zero_and_negative_sizes_are_refused() {
        for f in [
            |j: &mut Job| j.nodes = 0.0,
            |j: &mut Job| j.edges = -1.0,
            |j: &mut Job| j.ranks = 0,
        ] {
            let mut j = job();
            f(&mut j);
            assert!(plan(&j, &Rates::defaults()).is_err());
        }
    }
}
