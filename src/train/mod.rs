//! The solver loop. Per step on every rank: sample pairs (walk superstep or edge draws), draw
//! negatives, deduplicate the batch's rows, read local rows directly and fetch remote rows with
//! one-sided gets grouped by owner, compute loss and gradients on the rayon pool, sum gradients
//! per row, push them to their owners in one aggregated all-to-all, and apply the optimizer on
//! the owner (`--update batched`). With `--update hogwild` (the default for sgd, on f32, f16 or bf16
//! rows) the pool updates local rows in place pair by pair, remote rows in a fetched copy whose change
//! is pushed, and the next batch is sampled meanwhile. See `docs/architecture.md` for the
//! consistency contract.

mod adagrad;
pub mod cache;
mod checkpointing;
mod edges;
mod exchange;
mod hogwild;
mod job;
mod kg;
mod replicated;
pub mod sage;
mod slots;
mod stall;
mod step;
mod triples;
mod walks;
mod wire;

use hogwild::cache_capacity;
use job::node_memory_fits;
pub use job::run;
use step::fetch_remote;

use std::io::Write;
use std::time::{Duration, Instant};

use rand::RngExt;

use crate::checkpoint::{self, Cursor, Restored, Snapshot, Writing};
use crate::comm::{decode_ids, encode_ids, Channel, Comm, Posted, ReduceOp};
use crate::config::{
    Every, FaultKind, Fetch, Kernel, Model, NodeMemory, OnNan, Optimizer, Strategy, TrainConfig,
    Update, WireDtype,
};
use crate::error::{Error, Result};
use crate::graph::node::NodeGraph;
use crate::graph::triples::{Triple, TripleFile, Weighted};
use crate::graph::{csr, LocalGraph, NodeId, Partitioner};
use crate::model::cells::Shared;
use crate::model::{self, cells, kge::Kge, sgns::Sgns, Cells, Plan, Work};
use crate::sample::edges::EdgeSampler;
use crate::sample::negatives::NegativePool;
use crate::sample::walk::{Segments, WalkEngine, WalkParams};
use crate::sample::{rng_for, Rng};
use crate::spmd::{agree, fatal};
use crate::stats::{human_bytes, peak_rss_bytes, LossWatch, RankMetrics, Timer};
use crate::store::{decode_row, decode_wire, encode_wire, InPlaceRows, OptParams, Shard};
use cache::{Admission, Combine, RowCache, UpdateCode};
use replicated::Replica;

/// Matrix ids: 0 holds vertex (input) rows, 1 context (output) rows.
const VERTEX: usize = 0;

/// Steps between refreshes of the negative pool, at least.
const NEG_REFRESH: u64 = 16;

/// Draws of each pool entry, per rank, before the pool is drawn again: what 16 steps gave at 2
/// ranks with the default batch and 5 negatives. Every rank receives the whole pool at each
/// refresh, so at a refresh period fixed in steps the pool's bytes per pair grew with the rank
/// count (BlogCatalog, 8 simulated nodes: 17 of the 105 bytes moved per pair; 16 nodes twice
/// that); a period in draws keeps them per pair at any rank count.
const POOL_USES: f64 = 10.0;

/// Steps between refreshes of a negative pool of `pool` entries for a rank that trains
/// `pairs_per_step` pairs of `negatives` negatives each per step: [`POOL_USES`] draws per entry,
/// and at least [`NEG_REFRESH`] steps.
fn pool_refresh_steps(pool: usize, pairs_per_step: usize, negatives: usize) -> u64 {
    let draws = (pairs_per_step.max(1) * negatives.max(1)) as f64;
    ((POOL_USES * pool as f64 / draws).round() as u64).max(NEG_REFRESH)
}
/// Result of a run, identical on every rank.
pub struct Outcome {
    pub metrics: Vec<RankMetrics>,
}

/// Everything one rank trains with.
pub struct Trainer<'a, M: model::Model> {
    comm: &'a Comm,
    cfg: &'a TrainConfig,
    g: &'a LocalGraph,
    shards: Vec<Shard>,
    opt: OptParams,
    pool: std::sync::Arc<rayon::ThreadPool>,
    /// The pool's one thread is this rank's main thread (`--threads 1`): see [`trainer_pool`].
    inline: bool,
    neg: NegativePool,
    rng: Rng,
    /// What a batch samples, the rows it touches and its kernels.
    model: M,
    pub m: RankMetrics,
    step: u64,
    /// Per matrix and local row: (step stamp, batch slot) for deduplicating local rows.
    local_slot: Vec<Vec<(u64, u32)>>,
    /// Remote rows' slots in the batch being planned.
    remote_slot: slots::KeySlots,
    stamp: u64,
    /// Batches launched on the pool and not yet finished, oldest first.
    pending: std::collections::VecDeque<Pending>,
    /// The negative pool's next draw, under way (installed NEG_REFRESH steps after it is
    /// posted; none before the first step, after a resume or a drain).
    next_pool: Option<Posted>,
    /// This rank's shares of the installed pool, possibly still on their way.
    pool_sending: Option<Posted>,
    /// Steps between refreshes of the negative pool ([`pool_refresh_steps`]).
    pool_every: u64,
    ckpt: Option<Checkpointing>,
    /// Set when a signal stopped the run: the committed checkpoint version and its step.
    pub stopped: Option<(u64, u64)>,
    resumed: Option<Restored>,
    /// `--update hogwild`: every matrix's rows the pool updates in place (this rank's, or with
    /// `--node-memory shared` those of every rank on its node).
    shared: Option<Vec<InPlaceRows>>,
    /// How the steps run: chosen once, when the trainer is set up.
    path: StepPath,
    /// Hogwild on node-shared rows, on every rank alike (some node has several ranks; a rank
    /// alone on its node takes part too): batches end in a barrier, walks cross node ranks.
    node_rows: bool,
    /// Hogwild across nodes with `--cache-rows` > 0: copies of other nodes' rows, trained in
    /// place and synchronised every `--cache-refresh` steps.
    cache: Option<RowCache>,
    /// `--optimizer adagrad` in place: the accumulators of the rows in place.
    adagrad: Option<adagrad::InPlaceAdagrad>,
    adm: Admission,
    /// Walkers and step counts that ride in the next exchange (walks with the row cache), and
    /// what that exchange brought back: per source rank its walkers, and the global sums.
    carry: Option<(Vec<Vec<u8>>, [u64; 2])>,
    carried: Option<(Vec<Vec<u8>>, [u64; 2])>,
    /// `--fetch alltoall`: the batches whose rows were asked for and have not arrived (each
    /// gets its rows with the exchange that answers the one that asked, which then launches
    /// it), and the rows other ranks asked this rank for (per source rank, row heads),
    /// answered in the next exchange it sends.
    deferred: std::collections::VecDeque<Deferred<M::Plan>>,
    /// The batch whose rows the last absorbed exchange brought: launched once this rank's
    /// next exchange is posted, so that the peers' steps do not wait for its training.
    ready: Option<Deferred<M::Plan>>,
    to_answer: Vec<Vec<u32>>,
    /// The deltas of the exchange being absorbed, combined per row (`cache::Combine`).
    combine: Combine,
    /// The learning rate of the step in flight (the owner's `Combine` reads it).
    lr_now: f32,
    /// How a pushed delta's head carries its copy's updates.
    update_code: UpdateCode,
    loss_watch: LossWatch,
    stall: stall::StallWatch,
    /// The exchange posted and not yet collected (`--fetch alltoall`), with its sequence
    /// number; and the next exchange's.
    posted: Option<(Posted, u64)>,
    /// This rank's sends of the exchange collected last, completed at the next collect and
    /// moved on meanwhile ([`Trainer::poke`]).
    sending: Option<Posted>,
    seq: u64,
    /// `--strategy replicated`: every row of every matrix, the same on every rank.
    replica: Option<Replica>,
    /// The pool's activity: batches spawned and not finished, and when the last one ended
    /// (nanoseconds since `t0`), for the `idle` phase.
    inflight: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    last_end: std::sync::Arc<std::sync::atomic::AtomicU64>,
    t0: Instant,
}

/// Checkpoint bookkeeping of a run with --checkpoint-dir.
struct Checkpointing {
    dir: std::path::PathBuf,
    every: Every,
    next_version: u64,
    last: Instant,
    writing: Option<Writing>,
    identity: String,
}

/// A planned and fetched batch: unique row keys (node << 1 | matrix), its plan (references are
/// slots into `rows`), and the rows as f32.
struct Batch<P> {
    keys: Vec<u64>,
    plan: P,
    rows: Vec<f32>,
}

/// A planned batch waiting for the rows it asked for (`--fetch alltoall`): per owner, the slots
/// its rows go to, in request order.
struct Deferred<P> {
    planned: P,
    lr: f32,
    step: u64,
    asked: Vec<Vec<(u32, bool)>>,
    /// The exchange that carried its requests.
    seq: u64,
}

/// How a job's steps run (`Trainer::train`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StepPath {
    /// `--strategy replicated`: every rank holds every row (the data-parallel baseline).
    Replicated,
    /// Hogwild with rows in place: the pool updates this rank's (or node's) rows where they
    /// live, remote rows as fetched or cached copies whose deltas go to their owners.
    InPlace,
    /// The batch's distinct rows are read, and its gradients pushed to their owners, which
    /// apply the optimizer (`--update batched`, or rows that cannot be updated in place).
    Batched,
}

/// A batch on the pool: its keys, and where its (gradients, loss, compute seconds) arrive.
struct Pending {
    keys: Vec<u64>,
    pairs: usize,
    /// Loss terms of the batch (`Plan::loss_terms`).
    terms: u64,
    /// (row gradients or deltas, replicated parameters' gradients, loss, compute seconds)
    rx: std::sync::mpsc::Receiver<(Vec<f32>, Vec<f32>, f64, f64)>,
    /// The step that launched it.
    step: u64,
    /// Its remote rows live in the row cache: nothing to push when it ends.
    cached: bool,
}

impl<'a, M: model::Model> Trainer<'a, M> {
    pub fn new(comm: &'a Comm, cfg: &'a TrainConfig, g: &'a LocalGraph) -> Result<Self> {
        let rows = g.num_local();
        let node_shared = cfg.node_memory == NodeMemory::Shared
            && node_memory_fits(comm, cfg, g.num_local(), g.bytes());
        let shards = new_shards(comm, cfg, g, node_shared)?;
        let (rank, seed) = (comm.rank(), cfg.seed);
        let (pool, inline) = trainer_pool(cfg, rank)?;
        let pool_size = (1 << 16).max(cfg.batch_size * 4);
        let pool_every = pool_refresh_steps(
            pool_size,
            cfg.batch_size.div_ceil(comm.size()),
            cfg.negatives as usize,
        );
        let mut neg = NegativePool::new(g, comm.rank(), pool_size, 0.75);
        neg.set_total(comm.all_reduce_f64(&[neg.mass()], ReduceOp::Sum)[0]);
        Ok(Trainer {
            comm,
            cfg,
            g,
            shards,
            opt: OptParams::new(cfg.optimizer, cfg.momentum),
            pool,
            inline,
            neg,
            rng: rng_for(seed, rank, 2),
            model: agree(comm, M::new(cfg, g))?,
            m: RankMetrics {
                rank,
                ..Default::default()
            },
            step: 0,
            local_slot: vec![vec![(0, 0); rows]; 2],
            remote_slot: slots::KeySlots::new(g.part.num_nodes().saturating_mul(2)),
            stamp: 0,
            pending: Default::default(),
            next_pool: None,
            pool_sending: None,
            pool_every,
            ckpt: None,
            stopped: None,
            resumed: None,
            shared: None,
            path: if cfg.strategy == Strategy::Replicated {
                StepPath::Replicated
            } else {
                StepPath::Batched
            },
            node_rows: false,
            cache: None,
            adagrad: None,
            adm: Admission::default(),
            carry: None,
            carried: None,
            deferred: Default::default(),
            ready: None,
            to_answer: vec![Vec::new(); comm.size()],
            combine: Combine::new(cfg.dim),
            lr_now: cfg.lr,
            update_code: UpdateCode::new(
                (0..comm.size())
                    .map(|r| g.part.num_local(r))
                    .max()
                    .unwrap_or(1),
            ),
            loss_watch: LossWatch::default(),
            stall: stall::StallWatch::default(),
            posted: None,
            sending: None,
            seq: 0,
            replica: (cfg.strategy == Strategy::Replicated)
                .then(|| Replica::new(cfg, g.num_nodes())),
            inflight: Default::default(),
            last_end: Default::default(),
            t0: Instant::now(),
        })
        .and_then(|mut t| {
            t.settle_in_place(node_shared)?;
            Ok(t)
        })
    }

    /// Hogwild on sharded rows: every rank takes the node-shared rows, or every rank its own
    /// (whether a batch needs the fetch and push exchanges must be the same on all of them),
    /// and the row cache of hogwild across nodes with its clock. Collective.
    fn settle_in_place(&mut self, node_shared: bool) -> Result<()> {
        let (cfg, comm, g) = (self.cfg, self.comm, self.g);
        if cfg.update == Update::Hogwild && cfg.strategy == Strategy::Sharded {
            // Every rank takes the node-shared rows, or every rank its own: whether a batch
            // needs the fetch and push exchanges must be the same on all of them.
            let (me, n) = (comm.rank(), comm.size());
            let mut rows_of = |node: bool| -> Option<Vec<InPlaceRows>> {
                self.shards
                    .iter_mut()
                    .map(|s| {
                        s.in_place_rows(me, n, node)
                            .filter(|r| r.cells.len() / cfg.dim < model::REMOTE as usize)
                    })
                    .collect()
            };
            let own = rows_of(false);
            let node = if node_shared { rows_of(true) } else { None };
            let ok = comm.all_reduce_u64(
                &[u64::from(own.is_some()), u64::from(node.is_some())],
                ReduceOp::Min,
            );
            if ok[0] == 1 {
                self.node_rows = ok[1] == 1;
                self.shared = if self.node_rows { node } else { own };
                self.path = StepPath::InPlace;
                if cfg.optimizer == Optimizer::Adagrad {
                    let rows = self.shared.as_deref().expect("in-place rows");
                    self.adagrad = Some(adagrad::InPlaceAdagrad::new(
                        comm,
                        g.num_local(),
                        cfg.dim,
                        rows,
                        self.node_rows,
                    )?);
                }
            }
            // The job's nodes: the sum over ranks of 1 / (ranks on its node).
            let nodes = job_nodes(comm);
            // Every rank keeps its own copies: the clock is shared by all of them. The same
            // answer on every rank (sizes and flags only), so all refuse together.
            let copies = comm.size() as u64;
            let max = crate::config::max_cache_refresh(copies);
            if let Some(r) = cfg.cache_refresh.filter(|&r| nodes > 1 && r > max) {
                return Err(Error::config(format!(
                    "--cache-refresh {r} with {copies} ranks keeping copies of remote rows: at most {max} (the copies of a row take at most 32 batches summed over ranks unseen by each other; BlogCatalog at 8 simulated nodes diverged with 8); lower --cache-refresh or leave it to its default"
                )));
            }
            if let Some(rows) = self.shared.as_ref().filter(|s| !s[VERTEX].all()) {
                let capacity = cache_capacity(cfg, g, rows);
                if capacity > 0 {
                    let clock = cfg
                        .cache_refresh
                        .unwrap_or_else(|| crate::config::default_cache_refresh(copies));
                    let keys = 2 * g.num_nodes();
                    self.cache = Some(RowCache::new(capacity, cfg.dim, clock, keys));
                    self.m.cache_rows = capacity as u64;
                    self.m.cache_refresh = clock;
                }
            }
        }
        Ok(())
    }

    /// The `--inject-fault` test hook.
    fn maybe_fail(&self) {
        let Some(f) = self.cfg.inject_fault else {
            return;
        };
        if f.rank != self.comm.rank() || f.step != self.step {
            return;
        }
        eprintln!(
            "graphscale: rank {}: injecting fault {:?} at step {} (test hook)",
            f.rank, f.kind, f.step
        );
        match f.kind {
            FaultKind::Panic => panic!("injected fault at step {}", f.step),
            FaultKind::Exit => std::process::exit(3),
            FaultKind::Hang => loop {
                std::thread::sleep(Duration::from_secs(3600));
            },
            FaultKind::Kill => {
                // SIGKILL from outside, as a node failure or the OOM killer would deliver it.
                let _ = std::process::Command::new("kill")
                    .args(["-KILL", &std::process::id().to_string()])
                    .status();
                loop {
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }
    }

    /// Learning rate at `progress` in [0, 1]: held for `lr_hold` of the run, then a linear decay
    /// to lr * 1e-4; optional warm-up.
    fn lr_at(&self, progress: f64) -> f32 {
        let p = progress.clamp(0.0, 1.0) as f32;
        // Held for the first `lr_hold` of the run, then the linear decay over the rest.
        let hold = self.cfg.lr_hold.clamp(0.0, 0.99);
        let q = ((p - hold) / (1.0 - hold)).max(0.0);
        let mut lr = self.cfg.lr * (1.0 - q).max(1e-4);
        if self.cfg.warmup > 0.0 && p < self.cfg.warmup {
            lr *= (p / self.cfg.warmup).max(1e-3);
        }
        lr
    }
}

impl<M: model::Model> Drop for Trainer<'_, M> {
    /// A task may still update rows in place: wait for it before the shards go away.
    fn drop(&mut self) {
        for p in self.pending.drain(..) {
            let _ = p.rx.recv();
        }
    }
}

/// Seconds as `42s`, `3m05s` or `2h07m`.
/// This rank's row shards (the vertex matrix, and the context matrix of two-matrix models),
/// in memory (node-shared when `node_shared`) or memory-mapped, the vertex rows initialised.
fn new_shards(
    comm: &Comm,
    cfg: &TrainConfig,
    g: &LocalGraph,
    node_shared: bool,
) -> Result<Vec<Shard>> {
    let rows = g.num_local();
    let shard = |m: usize| -> Result<Shard> {
        match &cfg.mmap_rows {
            Some(dir) => {
                let name = format!(
                    "graphscale-rows-{}-rank{}-m{m}.bin",
                    std::process::id(),
                    comm.rank()
                );
                Shard::mapped(
                    comm,
                    rows,
                    cfg.dim,
                    cfg.dtype,
                    cfg.optimizer,
                    &dir.join(name),
                )
            }
            None => Ok(Shard::new(
                comm,
                rows,
                cfg.dim,
                cfg.dtype,
                cfg.optimizer,
                node_shared,
            )),
        }
    };
    let mut shards = vec![shard(0)?];
    if cfg.matrices() > 1 {
        shards.push(shard(1)?);
    }
    // gensim 4's init: vertex rows uniform in [-1/d, 1/d] (word2vec C uses half that; the
    // wider range gave +0.2-0.3 Micro-F1 and +0.4-0.7 Macro-F1 on BlogCatalog 10 x 80, mean of
    // two seeds, docs/results.md), seeded by node id so the initial matrix is the same for
    // any number of ranks; context rows zero.
    let (rank, seed, dim) = (comm.rank(), cfg.seed, cfg.dim);
    let part = g.part.clone();
    // At the small budgets' rates (docs/tuning.md) this scale learned best too: a planted
    // partition of 2^22 nodes at 1 walk x 20 gave Micro-F1 85.9 at it, 51.2 at 1/100 of it and
    // 67.5 at 4 times it (one run each).
    shards[VERTEX].init(|r, out| {
        let mut rng = rng_for(seed, 0, 1 + part.global(rank, r));
        for x in out.iter_mut() {
            *x = (rng.random::<f32>() * 2.0 - 1.0) / dim as f32;
        }
    });
    Ok(shards)
}

thread_local! {
    /// The pool whose one thread is this thread ([`trainer_pool`]): a thread joins at most one
    /// pool, so later trainers on the thread reuse it.
    static ON_THIS_THREAD: std::cell::OnceCell<std::sync::Arc<rayon::ThreadPool>> =
        const { std::cell::OnceCell::new() };
}

/// The walk and edge models' compute pool, and whether its one thread is the calling (main)
/// thread. With `--threads 1` it is: a batch runs where it is launched ([`Trainer::submit`]),
/// so a rank uses one core and hands no batch to another thread, and a run is reproducible
/// where ranks do not share rows (one rank per node, or `--node-memory private`): the same
/// command writes the same embeddings, bit for bit, over shared memory or TCP. The speed on
/// 2-8 simulated nodes was the same within noise (docs/performance.md). A thread that already
/// belongs to another pool gets a pool thread instead.
fn trainer_pool(
    cfg: &TrainConfig,
    rank: usize,
) -> Result<(std::sync::Arc<rayon::ThreadPool>, bool)> {
    use std::sync::Arc;
    if cfg.threads == 1 {
        if let Some(p) = ON_THIS_THREAD.with(|c| c.get().cloned()) {
            return Ok((p, true));
        }
        if rayon::current_thread_index().is_none() {
            if let Ok(p) = rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .use_current_thread()
                .build()
            {
                let p = Arc::new(p);
                ON_THIS_THREAD.with(|c| c.set(p.clone()).ok());
                return Ok((p, true));
            }
        }
    }
    Ok((Arc::new(compute_pool(cfg, rank)?), false))
}

/// The rank's compute pool of `--threads` threads.
fn compute_pool(cfg: &TrainConfig, rank: usize) -> Result<rayon::ThreadPool> {
    // mpirun binds a rank to one core by default: its threads would then share that core.
    let cpus = std::thread::available_parallelism().map_or(cfg.threads, |n| n.get());
    if cfg.threads > cpus {
        log::warn!(
            "rank {rank} may run on {cpus} CPU(s) but has {} compute threads: they will \
             share them. Under mpirun give each rank its CPUs (--map-by slot:PE={} or \
             --bind-to none), or lower --threads",
            cfg.threads,
            cfg.threads
        );
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(cfg.threads)
        .thread_name(move |i| format!("compute-{rank}-{i}"))
        .build()
        .map_err(|e| Error::config(format!("--threads {}: {e}", cfg.threads)))
}

/// The job's nodes (collective): the sum over ranks of 1 / (ranks on its node).
fn job_nodes(comm: &Comm) -> u64 {
    comm.all_reduce_f64(&[1.0 / comm.node_size().max(1) as f64], ReduceOp::Sum)[0].round() as u64
}

fn clock(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

/// A progress line on rank 0 every few seconds (stderr).
struct Progress {
    on: bool,
    /// stderr is a terminal: one bar redrawn in place, twice a second; otherwise (job logs) a
    /// line every 5 s.
    bar: bool,
    drawn: bool,
    start: Instant,
    last: Instant,
    /// What `RankMetrics::pairs` counts (pairs, triples or GraphSAGE's seeds).
    unit: &'static str,
}

impl Progress {
    fn new(on: bool) -> Self {
        use std::io::IsTerminal;
        Progress {
            on,
            bar: on && std::io::stderr().is_terminal(),
            drawn: false,
            start: Instant::now(),
            last: Instant::now(),
            unit: "pairs",
        }
    }

    /// GraphSAGE's: its steps count seeds.
    fn sage(on: bool) -> Self {
        Progress {
            unit: "seeds",
            ..Progress::new(on)
        }
    }

    fn tick(&mut self, frac: f64, m: &RankMetrics, lr: f32) {
        let every = Duration::from_millis(if self.bar { 500 } else { 5000 });
        if !self.on || self.last.elapsed() < every {
            return;
        }
        self.last = Instant::now();
        let secs = self.start.elapsed().as_secs_f64();
        let frac = frac.clamp(0.0, 1.0);
        // Time left at the mean rate so far (the rate is steady after the first steps).
        let eta = if frac > 1e-3 {
            clock(secs * (1.0 - frac) / frac)
        } else {
            "?".into()
        };
        let text = format!(
            "{:5.1}% of the run  step {}  rank-0 {}/s {:.0}  loss {:.4}  lr {:.5}  elapsed {}  left ~{eta}",
            100.0 * frac,
            m.steps,
            self.unit,
            m.pairs as f64 / secs,
            m.loss_sum / m.loss_terms.max(1) as f64,
            lr,
            clock(secs)
        );
        if self.bar {
            let filled = (frac * 30.0) as usize;
            eprint!(
                "\r[{}{}] {text}",
                "#".repeat(filled),
                " ".repeat(30 - filled)
            );
            self.drawn = true;
        } else {
            eprintln!("graphscale: {text}");
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        // End the bar's line so that the summary starts on its own.
        if self.drawn {
            eprintln!();
        }
    }
}
