//! `graphscale plan`: what a job needs before it is submitted. Memory per rank and per node for
//! graphscale's sharded strategy and the data-parallel baseline (`--strategy replicated`), the
//! bytes a step and an epoch move, and the time per epoch from a model, with rates per pair
//! either measured on R-MAT 2^20 (the defaults, docs/scaling.md) or fitted from measured runs
//! (`--calibrate METRICS.jsonl`, repeatable).
//!
//! Memory is the estimate `graphscale train` prints and enforces (`estimate::rank_estimate`, the
//! same functions): the process, the adjacency, and the larger of a load round and training's
//! storage, row cache, samplers and step buffers.
//!
//! Traffic of the sharded strategy follows its row cache: a rank reads each remote row it
//! touches once, then re-reads a copy when its clock (`--cache-refresh`, by default 32 / nodes)
//! runs out, so re-reads are a share of the remote rows' uses that grows with the node count;
//! every read moves the row and (almost always) a delta, and walkers cross with their waiting
//! tokens. A use is a distinct row of a rank's batch: as a rank's share of the batch shrinks
//! with more ranks, its batch holds fewer duplicates and the uses per pair grow (measured by
//! the half-batch counter `remote_uses_half`). The replicated strategy all-gathers the rows
//! each batch touched.
//!
//! Time: the pool's compute and the main thread's work (sampling, planning, the cache's
//! bookkeeping and the exchange; gathers and applies when replicated), in CPU seconds per pair
//! and per byte sent, on the cores a rank has (`--cores-per-node` / ranks per node; by default
//! one per compute thread plus one for the main thread), and an alpha-beta network (per-message
//! latency, per-node bandwidth shared by the node's ranks). The sharded strategy overlaps its
//! main thread and its one all-to-all per step with the pool's compute; the replicated
//! strategy's main thread (its gathers and applies) and sync follow its step's compute, as
//! synchronous data parallelism does.

use serde::Serialize;

use crate::config::{default_cache_refresh, Model, Optimizer};
use crate::error::{Error, Result};
use crate::stats::{human_bytes, RankMetrics};

/// What the process holds before it reads anything (libraries, MPI's buffers), for one rank on
/// the project machine (the printed estimate's "process before loading"): measured 19-21 MiB
/// with Open MPI 4.1, 27.6 MiB with MPICH 4.0 (`mpi_library` is `MPI_Get_library_version`'s).
pub fn process_bytes(mpi_library: &str) -> f64 {
    let mib = if mpi_library.contains("MPICH") {
        28.0
    } else {
        20.0
    };
    mib * 1024.0 * 1024.0
}

/// What the planner is told (flags of `graphscale plan`).
#[derive(Clone, Debug)]
pub struct Job {
    pub nodes: f64,
    pub edges: f64,
    pub directed: bool,
    /// Edge weights (LINE's alias table; 4 more bytes per adjacency entry).
    pub weighted: bool,
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
    /// Cores of one node the job's ranks share (fractions allowed: simulated nodes on one
    /// machine share its cores).
    pub cores_per_node: f64,
    pub mem_per_node: Option<f64>,
    /// Wire bytes per value of the sharded strategy's rows and deltas.
    pub wire_bytes: usize,
    pub latency: f64,
    pub bandwidth: f64,
    /// What a rank holds before it loads anything ([`process_bytes`]).
    pub process: f64,
}

/// Per-pair costs of a run: measured defaults or fitted from metrics.
#[derive(Clone, Debug, Serialize)]
pub struct Rates {
    /// Pairs per CPU second of the pool (compute threads), at `dim_at`.
    pub pairs_per_thread_second: f64,
    pub dim_at: usize,
    /// Main-thread CPU seconds per pair on one node (sampling, planning, launching batches).
    pub main_seconds_per_pair: f64,
    /// Sharded, across nodes: main-thread CPU seconds per byte the rank sends (the cache's
    /// bookkeeping, encoding and installing rows, walkers, the exchange itself); measured on
    /// R-MAT 2^20 as 4.5-4.6 ns per byte at both 2 and 4 simulated nodes.
    pub main_seconds_per_byte: f64,
    /// Replicated: main-thread CPU seconds per pair on one rank (its gradient fold and apply
    /// included), and per byte it sends across ranks (gathered rows it applies).
    pub replicated_main_seconds_per_pair: f64,
    pub replicated_main_seconds_per_byte: f64,
    /// Sharded: uses of remote rows (distinct rows of a batch) per pair, per unit of the remote
    /// fraction, at `uses_batch` pairs per rank and step.
    pub uses_per_pair: f64,
    /// Sharded: the pairs per rank and step at which `uses_per_pair` was measured, and how the
    /// distinct rows of a rank's batch grow with its pairs (as pairs^`dedup`, measured as the
    /// distinct rows of a random half of the references against all of them): a rank's share of
    /// a batch shrinks with more ranks, and so do its duplicates. Capped at `refs_per_pair`,
    /// the references to remote rows per pair (per unit of the remote fraction).
    pub uses_batch: f64,
    pub dedup: f64,
    pub refs_per_pair: f64,
    /// Sharded: the share of the remote rows a rank reads at least once.
    pub touched: f64,
    /// Sharded: re-reads per use times the cache's clock.
    pub refresh_share: f64,
    /// Sharded: deltas pushed per row read.
    pub pushes_per_read: f64,
    /// Walks, sharded: walker crossings per pair, per unit of the remote fraction, and the
    /// bytes a crossing sends (the walker and its waiting tokens).
    pub crossings_per_pair: f64,
    pub bytes_per_crossing: f64,
    /// Sharded: bytes a rank sends per step besides rows, deltas and walkers (the negative
    /// pool's refresh, counts); fitted from runs without walkers (LINE), in a walk run's bytes
    /// per crossing otherwise.
    pub step_bytes: f64,
    /// Replicated, sparse: distinct rows a rank's batch touches per pair.
    pub replicated_rows_per_pair: f64,
    /// Skip-gram pairs per walk token (walks x length; after subsampling and dead ends).
    pub pairs_per_token: f64,
    pub source: String,
}

impl Rates {
    /// Fitted to `bench/run_benchmarks.sh scaling` on R-MAT 2^20 (d 64, DeepWalk 1 x 20, f16
    /// on the wire; both strategies at 1 rank x 2 threads and at 2 simulated nodes, 2026-12-01):
    /// see docs/scaling.md.
    pub fn defaults() -> Rates {
        Rates {
            pairs_per_thread_second: 7.8e6,
            dim_at: 64,
            main_seconds_per_pair: 3.3e-8,
            main_seconds_per_byte: 4.5e-9,
            replicated_main_seconds_per_pair: 1.9e-7,
            replicated_main_seconds_per_byte: 1.7e-9,
            uses_per_pair: 0.73,
            // From the 2-node DeepWalk run's half-batch counter: walks' batches hold few
            // duplicate remote rows (LINE's grow as pairs^0.71, docs/scaling.md).
            uses_batch: 5864.0,
            dedup: 0.98,
            refs_per_pair: 0.78,
            touched: 0.55,
            refresh_share: 4.8,
            pushes_per_read: 1.0,
            crossings_per_pair: 0.108,
            bytes_per_crossing: 157.0,
            step_bytes: 0.0,
            replicated_rows_per_pair: 0.75,
            pairs_per_token: 5.4,
            source: "defaults (R-MAT 2^20, docs/scaling.md)".into(),
        }
    }

    /// Fit the rates to measured runs (`--metrics` files), each file giving what it can show:
    /// a run on one node the main thread's cost per pair (and the first such run the pool's
    /// rate and pairs per token);
    /// a sharded run across nodes the cache's traffic, the crossings and the main thread's cost
    /// per byte sent; a replicated run on one rank its main thread's cost per pair, across
    /// ranks its rows per pair and cost per byte. Give the one-node runs first: the costs per
    /// byte are counted above their rates per pair. Rates no file shows keep their defaults.
    pub fn calibrate(paths: &[std::path::PathBuf]) -> Result<Rates> {
        let mut r = Rates::defaults();
        let mut pool_fitted = false;
        for path in paths {
            r = r.fit(path, &mut pool_fitted)?;
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

    fn fit(mut self, path: &std::path::Path, pool_fitted: &mut bool) -> Result<Rates> {
        let runs = crate::report::load(&[path.to_path_buf()])?;
        let ms: &[RankMetrics] = &runs[0].ranks;
        let m0 = &ms[0];
        if m0.threads == 0
            || m0.dim == 0
            || m0.wire_bytes == 0
            || m0.cpu_seconds_process_train <= 0.0
        {
            return Err(Error::config(format!(
                "{}: metrics without threads, dim, wire bytes and training's CPU seconds, written by an older graphscale: run the job again with this version's --metrics to calibrate from it",
                path.display()
            )));
        }
        let r = &mut self;
        let sum = |f: &dyn Fn(&RankMetrics) -> f64| ms.iter().map(f).sum::<f64>();
        let pairs = sum(&|m| m.pairs as f64);
        if pairs <= 0.0 {
            return Err(Error::config(format!(
                "{}: the run trained no pairs",
                path.display()
            )));
        }
        let main = sum(&|m| m.cpu_seconds_main_train) / pairs;
        let nodes = m0.nodes.max(1) as f64;
        let p = m0.ranks.max(1) as f64;
        let sharded = m0.strategy == "sharded";
        if nodes <= 1.0 {
            // The pool's rate and pairs per token from the first run on one node.
            if !std::mem::replace(pool_fitted, true) {
                let pool = sum(&|m| m.cpu_seconds_process_train - m.cpu_seconds_main_train);
                r.pairs_per_thread_second = pairs / pool.max(1e-9);
                r.dim_at = m0.dim.max(1);
                let tokens = sum(&|m| m.walk_tokens_nominal as f64);
                if m0.model != "line" && tokens > 0.0 {
                    r.pairs_per_token = pairs / tokens;
                }
            }
            if sharded {
                r.main_seconds_per_pair = main;
            } else if p <= 1.0 {
                r.replicated_main_seconds_per_pair = main;
            }
        }
        if sharded && nodes > 1.0 {
            let remote = (nodes - 1.0) / nodes;
            let sent = sum(&|m| (m.comm_bytes_sent + m.one_sided_bytes) as f64);
            r.main_seconds_per_byte =
                ((main - r.main_seconds_per_pair) * pairs / sent.max(1.0)).max(0.0);
            let get = |f: &dyn Fn(&RankMetrics) -> u64| sum(&|m| f(m) as f64);
            let (hits, misses, refreshes) = (
                get(&|m| m.cache_hits),
                get(&|m| m.cache_misses),
                get(&|m| m.cache_refreshes),
            );
            let uses = hits + misses + refreshes;
            if uses > 0.0 {
                let wb = crate::config::wire_row_bytes(m0.dim, m0.wire_bytes) as f64;
                let remote_rows = m0.graph_rows as f64 * remote;
                r.uses_per_pair = uses / (pairs * remote);
                r.uses_batch = pairs / sum(&|m| m.steps as f64).max(1.0);
                let half = get(&|m| m.remote_uses_half);
                if half > 0.0 {
                    r.dedup = (uses / half).log2().clamp(0.0, 1.0);
                }
                let refs = get(&|m| m.remote_refs);
                if refs > 0.0 {
                    r.refs_per_pair = refs / (pairs * remote);
                }
                // First reads per rank over the rows a rank does not hold.
                r.touched = (misses / p / remote_rows.max(1.0)).min(1.0);
                r.refresh_share =
                    refreshes / (uses - misses).max(1.0) * m0.cache_refresh.max(1) as f64;
                let reads = misses + refreshes;
                r.pushes_per_read = get(&|m| m.push_bytes_sent) / (4.0 + wb) / reads.max(1.0);
                let crossings = get(&|m| m.walker_crossings);
                r.crossings_per_pair = crossings / (pairs * remote);
                let sent = get(&|m| m.comm_bytes_sent + m.one_sided_bytes);
                let rows = reads * (4.0 + wb) + get(&|m| m.push_bytes_sent);
                if crossings > 0.0 {
                    r.bytes_per_crossing = ((sent - rows) / crossings).max(0.0);
                    r.step_bytes = 0.0;
                } else {
                    let steps = sum(&|m| m.steps as f64);
                    r.step_bytes = ((sent - rows) / steps.max(1.0)).max(0.0);
                }
            }
        }
        if m0.strategy == "replicated-sparse" && p > 1.0 {
            let rec = (8 + 4 * m0.dim) as f64;
            let sent = sum(&|m| m.push_bytes_sent as f64);
            r.replicated_rows_per_pair = sent / pairs / rec / (p - 1.0);
            let all = sum(&|m| (m.comm_bytes_sent + m.one_sided_bytes) as f64);
            r.replicated_main_seconds_per_byte =
                ((main - r.replicated_main_seconds_per_pair) * pairs / all.max(1.0)).max(0.0);
        }
        Ok(self)
    }
}

/// One strategy's plan.
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    pub strategy: String,
    /// Per rank, bytes: embeddings (replicated: the local shard and the replica of every row),
    /// optimizer state, adjacency, remote-row cache (or, replicated dense, the gradient
    /// matrices), samplers and step buffers, and the process itself.
    pub embeddings: f64,
    pub optimizer: f64,
    pub adjacency: f64,
    pub cache: f64,
    pub buffers: f64,
    pub process: f64,
    pub per_rank: f64,
    pub per_node: f64,
    pub bytes_per_step_per_rank: f64,
    pub bytes_per_epoch: f64,
    pub steps_per_epoch: f64,
    /// Per rank and epoch: CPU seconds of the pool and of the main thread, and seconds on the
    /// network.
    pub compute_seconds_per_epoch: f64,
    pub main_seconds_per_epoch: f64,
    pub communication_seconds_per_epoch: f64,
    pub seconds_per_epoch: f64,
    pub fits: bool,
}

/// The sharded strategy's bytes sent per rank and epoch at `rates`, for `pairs` pairs in `steps`
/// steps per rank with `remote` of their rows on other nodes, `remote_rows` rows on other
/// nodes, a cache clock of `clock` and rows of `wb` wire bytes.
pub fn sharded_bytes(
    rates: &Rates,
    [pairs, steps]: [f64; 2],
    remote: f64,
    remote_rows: f64,
    clock: f64,
    wb: f64,
) -> f64 {
    if remote <= 0.0 {
        return 0.0;
    }
    let uses = uses_per_pair(rates, pairs / steps.max(1.0)) * pairs * remote;
    let first = (rates.touched * remote_rows).min(uses);
    let again = (rates.refresh_share / clock.max(1.0)).min(1.0) * (uses - first);
    let reads = first + again;
    // A read: its request (4 bytes) and the row; a push: the delta and its row's head.
    reads * (4.0 + wb) * (1.0 + rates.pushes_per_read)
        + rates.crossings_per_pair * pairs * remote * rates.bytes_per_crossing
        + rates.step_bytes * steps
}

/// Distinct remote rows per pair (per unit of the remote fraction) of batches of `batch` pairs
/// per rank: the measured rate, scaled as the batch's distinct rows grow (`Rates::dedup`).
pub fn uses_per_pair(rates: &Rates, batch: f64) -> f64 {
    let scale = (batch / rates.uses_batch.max(1.0)).powf(rates.dedup - 1.0);
    (rates.uses_per_pair * scale).min(rates.refs_per_pair.max(rates.uses_per_pair))
}

/// Both strategies' plans for `job` at `rates`.
pub fn plan(job: &Job, rates: &Rates) -> Result<(f64, Vec<Plan>)> {
    check(job)?;
    let c = Common::new(job, rates);
    let mut out = vec![c.sharded()];
    out.extend(c.replicated());
    Ok((c.pairs, out))
}

/// What every strategy's plan shares: the job's sizes per rank and its time model.
struct Common<'a> {
    job: &'a Job,
    rates: &'a Rates,
    /// Nodes, dimension, ranks, machines, matrices.
    n: f64,
    d: f64,
    p: f64,
    machines: f64,
    matrices: f64,
    /// Rows per rank and their optimizer state's bytes per row.
    rows: f64,
    state: f64,
    adjacency: f64,
    samplers: f64,
    pairs: f64,
    steps: f64,
    pairs_rank: f64,
    /// The pool's CPU seconds per rank and epoch, the cores per rank and the pool's share.
    compute: f64,
    cores: f64,
    pool: f64,
}

impl<'a> Common<'a> {
    fn new(job: &'a Job, rates: &'a Rates) -> Common<'a> {
        use crate::estimate::sampler_bytes;
        let (n, d, p) = (job.nodes, job.dim as f64, job.ranks as f64);
        let rows = (n / p).ceil();
        let entries = (job.edges * if job.directed { 1.0 } else { 2.0 } / p).ceil();
        // The CSR: offsets, targets in 4 bytes when ids fit, prefix sums of weights; walks on
        // several ranks per node map it in node-shared windows (no second copy).
        let target = if n <= u32::MAX as f64 { 4.0 } else { 8.0 };
        let weights = if job.weighted { 4.0 } else { 0.0 };
        let pairs = match job.model {
            Model::Line => job.line_samples * job.edges,
            _ => n * job.walks_per_node * job.walk_length * rates.pairs_per_token,
        };
        let pairs_rank = pairs / p;
        let cores = (job.cores_per_node / job.ranks_per_node as f64).max(1e-3);
        Common {
            job,
            rates,
            n,
            d,
            p,
            machines: (p / job.ranks_per_node as f64).ceil(),
            matrices: if job.model == Model::Line && job.order == 1 {
                1.0
            } else {
                2.0
            },
            rows,
            state: job.optimizer.state_per_row(job.dim) as f64 * 4.0,
            adjacency: (rows + 1.0) * 8.0 + entries * (target + weights),
            samplers: sampler_bytes(
                job.model,
                job.batch_size as u64,
                rows as u64,
                entries as u64,
                job.weighted,
            ) as f64,
            pairs,
            steps: (pairs / job.batch_size).ceil().max(1.0),
            pairs_rank,
            compute: pairs_rank / (rates.pairs_per_thread_second * rates.dim_at as f64 / d),
            cores,
            pool: (job.threads as f64).min(cores),
        }
    }

    /// The printed memory estimate of a rank holding `storage` bytes of rows and state.
    fn estimate(&self, storage: f64) -> f64 {
        crate::estimate::rank_estimate(
            self.job.process as u64,
            self.adjacency as u64,
            (self.job.edges / self.p).ceil() as u64,
            storage as u64,
            self.samplers as u64,
            true,
        ) as f64
    }

    /// Seconds of a step whose main thread work overlaps the pool's.
    fn busy(&self, main: f64) -> f64 {
        (self.compute / self.pool).max((self.compute + main) / self.cores)
    }

    /// The replicated step does not overlap: the pool computes, then the main thread gathers
    /// and applies.
    fn serial(&self, main: f64) -> f64 {
        (self.compute / self.pool + main).max((self.compute + main) / self.cores)
    }

    /// Network seconds per epoch of `bytes_per_rank_step`.
    fn net(&self, bytes_per_rank_step: f64) -> f64 {
        if self.machines <= 1.0 {
            return 0.0;
        }
        // One all-to-all (or all-gather) per step: a message to every other rank, and the
        // node's ranks share its link.
        let job = self.job;
        let per_node_share = job.ranks_per_node.min(job.ranks) as f64;
        self.steps
            * (job.latency * (self.p - 1.0) + bytes_per_rank_step * per_node_share / job.bandwidth)
    }

    /// The rank's rows (in `--dtype`) and their optimizer state.
    fn storage(&self) -> (f64, f64) {
        let (rows, m) = (self.rows, self.matrices);
        (
            rows * self.d * self.job.dtype_bytes as f64 * m,
            rows * self.state * m,
        )
    }

    fn sharded(&self) -> Plan {
        let (job, rates, steps) = (self.job, self.rates, self.steps);
        let remote = (self.machines - 1.0) / self.machines;
        let wb = crate::config::wire_row_bytes(job.dim, job.wire_bytes) as f64;
        let clock = default_cache_refresh(job.ranks as u64) as f64;
        let bytes_rank = sharded_bytes(
            rates,
            [self.pairs_rank, steps],
            remote,
            self.n * self.matrices * remote,
            clock,
            wb,
        );
        let cache = if self.machines > 1.0 {
            self.rows * self.matrices * self.d * 8.0
        } else {
            0.0
        };
        let comm = self.net(bytes_rank / steps);
        let main = self.pairs_rank * rates.main_seconds_per_pair
            + bytes_rank * rates.main_seconds_per_byte;
        let (emb, opt) = self.storage();
        finish(
            job,
            "sharded",
            [emb, opt, self.adjacency, cache, self.samplers],
            self.estimate(emb + opt + cache),
            bytes_rank / steps,
            steps,
            [self.compute, main, comm],
            self.busy(main).max(main + comm),
        )
    }

    /// Replicated: every rank holds a f32 copy of every row besides its shard; the sync
    /// follows the step (sparse rows, or the dense all-reduce).
    fn replicated(&self) -> [Plan; 2] {
        let (job, rates, steps, p, d) = (self.job, self.rates, self.steps, self.p, self.d);
        let (emb, opt) = self.storage();
        let replica = self.n * d * 4.0 * self.matrices;
        let per_rank_step = job.batch_size / p;
        let sparse = per_rank_step * rates.replicated_rows_per_pair * (8.0 + 4.0 * d) * (p - 1.0);
        let dense = 2.0 * (p - 1.0) / p * self.n * d * 4.0 * self.matrices;
        let one = |name: &str, bytes: f64, grads: f64| {
            let comm = self.net(bytes);
            let main = self.pairs_rank * rates.replicated_main_seconds_per_pair
                + bytes * steps * rates.replicated_main_seconds_per_byte;
            finish(
                job,
                name,
                [emb + replica, opt, self.adjacency, grads, self.samplers],
                self.estimate(emb + (replica + grads) + opt),
                bytes,
                steps,
                [self.compute, main, comm],
                self.serial(main) + comm,
            )
        };
        [
            one("replicated-sparse", sparse, 0.0),
            one("replicated-dense", dense, replica),
        ]
    }
}

#[allow(clippy::too_many_arguments)]
fn finish(
    job: &Job,
    strategy: &str,
    [embeddings, optimizer, adjacency, cache, buffers]: [f64; 5],
    per_rank: f64,
    bytes_per_step: f64,
    steps: f64,
    [compute, main, comm]: [f64; 3],
    seconds: f64,
) -> Plan {
    let per_node = per_rank * job.ranks_per_node.min(job.ranks) as f64;
    Plan {
        strategy: strategy.into(),
        embeddings,
        optimizer,
        adjacency,
        cache,
        buffers,
        process: job.process,
        per_rank,
        per_node,
        bytes_per_step_per_rank: bytes_per_step,
        bytes_per_epoch: bytes_per_step * steps * job.ranks as f64,
        steps_per_epoch: steps,
        compute_seconds_per_epoch: compute,
        main_seconds_per_epoch: main,
        communication_seconds_per_epoch: comm,
        seconds_per_epoch: seconds,
        fits: job.mem_per_node.is_none_or(|m| per_node <= m),
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

/// The rates a plan was computed at, as one line.
fn rates_line(rates: &Rates) -> String {
    format!(
        "rates: {:.2e} pairs per pool CPU second at dim {}, {:.2} pairs per token; main thread {:.0} ns per pair and {:.1} ns per byte sent (replicated: {:.0} ns, {:.1} ns); sharded cache: {:.2} remote row uses per pair at {:.0} pairs per rank and step (a batch's distinct rows grow as pairs^{:.2}; at most {:.2} per pair), {:.2} of remote rows read, re-reads {:.2} / clock of uses; {:.3} walker crossings per pair, {:.0} B each; {:.2} rows per pair (replicated); {}",
        rates.pairs_per_thread_second,
        rates.dim_at,
        rates.pairs_per_token,
        rates.main_seconds_per_pair * 1e9,
        rates.main_seconds_per_byte * 1e9,
        rates.replicated_main_seconds_per_pair * 1e9,
        rates.replicated_main_seconds_per_byte * 1e9,
        rates.uses_per_pair,
        rates.uses_batch,
        rates.dedup,
        rates.refs_per_pair,
        rates.touched,
        rates.refresh_share,
        rates.crossings_per_pair,
        rates.bytes_per_crossing,
        rates.replicated_rows_per_pair,
        rates.source
    )
}

/// A note when the sharded plan's communication is latency-bound: what a larger batch buys.
fn latency_note(job: &Job, p0: &Plan, machines: f64) -> Option<String> {
    let steps = p0.steps_per_epoch;
    let latency = steps * job.latency * (job.ranks as f64 - 1.0);
    if !(machines > 1.0
        && latency > 0.5 * p0.communication_seconds_per_epoch
        && latency > p0.compute_seconds_per_epoch)
    {
        return None;
    }
    // What a larger batch buys: latency falls as 1/batch, the main thread's per-pair and
    // per-byte work does not, so the saving is stated against the whole epoch.
    Some(format!(
        "note: the sharded strategy's communication is latency-bound: {:.0} of its {:.0} network seconds per epoch are message latency ({:.0} pairs per rank and step); --batch-size {:.0} (4x) would save up to {:.0} of the {:.0} s per epoch{}",
        latency,
        p0.communication_seconds_per_epoch,
        job.batch_size / job.ranks as f64,
        job.batch_size * 4.0,
        0.75 * latency,
        p0.seconds_per_epoch,
        if p0.main_seconds_per_epoch > 0.5 * p0.seconds_per_epoch {
            format!(
                "; the main thread's own work ({:.0} s) stays",
                p0.main_seconds_per_epoch
            )
        } else {
            String::new()
        }
    ))
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
    let _ = writeln!(o, "{}", rates_line(rates));
    let _ = writeln!(
        o,
        "cores: {} per node ({:.2} per rank for {} compute threads and the main thread)",
        job.cores_per_node,
        job.cores_per_node / job.ranks_per_node as f64,
        job.threads
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
        "samplers",
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
    if let Some(note) = latency_note(job, &plans[0], machines) {
        let _ = writeln!(o, "{note}");
    }
    let _ = writeln!(
        o,
        "sharded cache: {} rows per rank (the default --cache-rows), clock {} (the default --cache-refresh)",
        if machines > 1.0 { ((job.nodes / job.ranks as f64).ceil() as u64 * 2).to_string() } else { "no".into() },
        default_cache_refresh(job.ranks as u64)
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
            weighted: false,
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
            cores_per_node: 2.0,
            mem_per_node: None,
            wire_bytes: 2,
            latency: 2e-6,
            bandwidth: 12.5e9,
            process: process_bytes("Open MPI v4.1.4"),
        }
    }

    /// The latency note's numbers agree with the table: the epoch it names is the plan's, and
    /// the saving it promises is bounded by the latency it counts.
    #[test]
    fn the_latency_note_states_the_epoch_of_the_table() {
        let mut j = job();
        (j.nodes, j.edges, j.dim, j.ranks, j.ranks_per_node) = (1e9, 9.2e10, 128, 80, 8);
        (j.walks_per_node, j.walk_length, j.cores_per_node) = (10.0, 80.0, 16.0);
        let r = Rates::defaults();
        let (pairs, p) = plan(&j, &r).unwrap();
        let text = render(&j, &r, pairs, &p);
        let note = text
            .lines()
            .find(|l| l.contains("latency-bound"))
            .expect(&text);
        let epoch = format!("of the {:.0} s per epoch", p[0].seconds_per_epoch);
        assert!(note.contains(&epoch), "{note}\n{text}");
        let num = |after: &str| -> f64 {
            let t = note.split(after).nth(1).expect(after).trim_start();
            t.split(|c: char| !c.is_ascii_digit())
                .next()
                .unwrap()
                .parse()
                .unwrap()
        };
        let (latency, saved) = (num("latency-bound:"), num("save up to"));
        assert!(
            saved > 0.0 && saved <= latency && saved < p[0].seconds_per_epoch,
            "{note}"
        );
    }

    #[test]
    fn memory_follows_the_layout() {
        let (pairs, p) = plan(&job(), &Rates::defaults()).unwrap();
        let rows = 250_000.0;
        // Rows of two f32 matrices; 4-byte adjacency entries (both directions) and offsets.
        assert_eq!(p[0].embeddings, rows * 64.0 * 4.0 * 2.0);
        assert_eq!(p[0].adjacency, 2e7 / 4.0 * 4.0 + (rows + 1.0) * 8.0);
        assert_eq!(p[0].cache, rows * 2.0 * 64.0 * 8.0);
        // Per rank: the process, the adjacency, and the larger of a load round (80 bytes per
        // edge of the rank's share, at most 2^20 edges) and training's storage, samplers and
        // output blocks (two of 8 MiB).
        let train = p[0].embeddings + p[0].cache + p[0].buffers + 16.0 * 1024.0 * 1024.0;
        let round = 80.0 * (1u64 << 20) as f64;
        assert_eq!(
            p[0].per_rank,
            p[0].process + p[0].adjacency + train.max(round),
            "{:?}",
            p[0]
        );
        // Samplers of a walk model: the negative table's build (20 B per node) at least.
        assert!(p[0].buffers >= 20.0 * rows, "{}", p[0].buffers);
        // Every rank holds every row when replicated (besides its shard); dense adds gradient
        // matrices as large.
        assert_eq!(p[1].embeddings, p[0].embeddings + 1e6 * 64.0 * 4.0 * 2.0);
        assert_eq!(p[2].cache, 1e6 * 64.0 * 4.0 * 2.0);
        assert!((pairs - 1e6 * 20.0 * Rates::defaults().pairs_per_token).abs() < 1.0);
        // A ring all-reduce: 2 (p - 1) / p of the matrices per rank and step.
        assert_eq!(p[2].bytes_per_step_per_rank, 1.5 * 1e6 * 64.0 * 4.0 * 2.0);
        assert!(p.iter().all(|x| x.fits));
        // Ids beyond 32 bits take 8-byte adjacency entries.
        let mut j = job();
        j.nodes = 8e9;
        j.ranks = 4000;
        let (_, p) = plan(&j, &Rates::defaults()).unwrap();
        assert_eq!(p[0].adjacency, 2e7 / 4000.0 * 8.0 + (2e6 + 1.0) * 8.0);
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
        j.cores_per_node = 8.0;
        let (_, one) = plan(&j, &Rates::defaults()).unwrap();
        assert_eq!(one[0].communication_seconds_per_epoch, 0.0);
        assert_eq!(one[0].bytes_per_epoch, 0.0);
        j.ranks_per_node = 1;
        j.cores_per_node = 2.0;
        let (_, four) = plan(&j, &Rates::defaults()).unwrap();
        assert!(four[0].communication_seconds_per_epoch > 0.0);
        // The sync follows compute in the replicated strategy: never faster than sharded here.
        assert!(four[1].seconds_per_epoch > four[0].seconds_per_epoch);
        // The cache's clock shortens with more nodes: bytes grow faster than the remote
        // fraction (3/4 against 1/2 of the rows, at half the pairs per rank: 0.75x at most
        // without re-reads).
        j.ranks = 2;
        let (_, two) = plan(&j, &Rates::defaults()).unwrap();
        let per_rank = |p: &Plan| p.bytes_per_epoch / p.steps_per_epoch;
        assert!(per_rank(&four[0]) / 4.0 > 0.75 * per_rank(&two[0]) / 2.0);
    }

    #[test]
    fn fewer_cores_take_longer_and_the_main_thread_counts() {
        let mut j = job();
        let (_, own) = plan(&j, &Rates::defaults()).unwrap();
        // Half a core per rank (4 simulated nodes on 2 cores): compute and the main thread
        // share it.
        j.cores_per_node = 0.5;
        let (_, shared) = plan(&j, &Rates::defaults()).unwrap();
        let s = &shared[0];
        assert!(
            (s.seconds_per_epoch
                - ((s.compute_seconds_per_epoch + s.main_seconds_per_epoch) / 0.5)
                    .max(s.main_seconds_per_epoch + s.communication_seconds_per_epoch))
            .abs()
                < 1e-9,
            "{s:?}"
        );
        assert!(
            s.seconds_per_epoch > 2.0 * own[0].seconds_per_epoch,
            "{s:?} {:?}",
            own[0]
        );
    }

    /// Metrics of a sharded run across 2 nodes (2 ranks, one each).
    fn measured() -> Vec<RankMetrics> {
        (0..2)
            .map(|rank| RankMetrics {
                rank,
                strategy: "sharded".into(),
                ranks: 2,
                nodes: 2,
                model: "deepwalk".into(),
                threads: 1,
                dim: 64,
                wire_bytes: 2,
                graph_rows: 2 << 20,
                pairs: 50_000_000,
                steps: 9000,
                cpu_seconds_main_train: 8.0,
                cpu_seconds_process_train: 15.0,
                cache_refresh: 16,
                cache_hits: 14_000_000,
                cache_misses: 600_000,
                cache_refreshes: 6_000_000,
                push_bytes_sent: 6_000_000 * 132,
                walker_crossings: 3_000_000,
                remote_refs: 50_000_000,
                // A random half of the references reaches 2^-0.75 of the distinct rows.
                remote_uses_half: (20_600_000.0 / 2f64.powf(0.75)) as u64,
                comm_bytes_sent: 2_300_000_000,
                ..RankMetrics::default()
            })
            .collect()
    }

    #[test]
    fn calibrated_traffic_reproduces_the_run_it_was_fitted_to() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("m.jsonl");
        let text: Vec<String> = measured()
            .iter()
            .map(|m| serde_json::to_string(m).unwrap())
            .collect();
        std::fs::write(&path, text.join("\n")).unwrap();
        let r = Rates::calibrate(&[path]).unwrap();
        assert!(r.source.contains("m.jsonl"));
        // Main-thread seconds per byte sent across nodes, above the default one-node rate per
        // pair.
        let want = (8.0 - 5e7 * Rates::defaults().main_seconds_per_pair) / 2.3e9;
        assert!((r.main_seconds_per_byte / want - 1.0).abs() < 1e-9, "{r:?}");
        let bytes = sharded_bytes(&r, [5e7, 9000.0], 0.5, (2 << 20) as f64 * 0.5, 16.0, 128.0);
        assert!((bytes / 2.3e9 - 1.0).abs() < 1e-9, "{bytes}");
        // Twice the nodes: a clock of 8 re-reads twice the share of uses.
        let four = sharded_bytes(
            &r,
            [2.5e7, 9000.0],
            0.75,
            (2 << 20) as f64 * 0.75,
            8.0,
            128.0,
        );
        assert!(four > 2.3e9 * 0.75, "{four}");
        // Half the pairs per rank and step: the batch's distinct rows shrink as pairs^0.75, so
        // its uses per pair grow by 2^0.25, but never beyond its references (2 per pair).
        assert!((r.dedup - 0.75).abs() < 1e-6, "{r:?}");
        let batch = r.uses_batch;
        let up = uses_per_pair(&r, batch / 2.0) / uses_per_pair(&r, batch);
        assert!((up - 2f64.powf(0.25)).abs() < 1e-6, "{up}");
        assert_eq!(uses_per_pair(&r, 1.0), r.refs_per_pair);
        assert_eq!(r.refs_per_pair, 2.0);
        // A file of an older graphscale (no training CPU seconds) is refused, naming it.
        let mut old = measured();
        for m in &mut old {
            m.cpu_seconds_process_train = 0.0;
        }
        let path = d.path().join("old.jsonl");
        let text: Vec<String> = old
            .iter()
            .map(|m| serde_json::to_string(m).unwrap())
            .collect();
        std::fs::write(&path, text.join("\n")).unwrap();
        let e = Rates::calibrate(&[path]).unwrap_err().to_string();
        assert!(
            e.contains("old.jsonl") && e.contains("older graphscale"),
            "{e}"
        );
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
