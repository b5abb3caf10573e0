//! The solver loop. Per step on every rank: sample pairs (walk superstep or edge draws), draw
//! negatives, deduplicate the batch's rows, read local rows directly and fetch remote rows with
//! one-sided gets grouped by owner, compute loss and gradients on the rayon pool, sum gradients
//! per row, push them to their owners in one aggregated all-to-all, and apply the optimizer on
//! the owner (`--update batched`). With `--update hogwild` (the default for sgd, on f32, f16 or bf16
//! rows) the pool updates local rows in place pair by pair, remote rows in a fetched copy whose change
//! is pushed, and the next batch is sampled meanwhile. See `docs/architecture.md` for the
//! consistency contract.

pub mod cache;
mod kg;
mod replicated;

use std::io::Write;
use std::time::{Duration, Instant};

use rand::RngExt;
use rustc_hash::FxHashMap;

use crate::checkpoint::{self, Cursor, Restored, Snapshot, Writing};
use crate::comm::{decode_ids, encode_ids, Channel, Comm, Posted, ReduceOp};
use crate::config::{
    Every, FaultKind, Fetch, Kernel, Model, NodeMemory, OnNan, Strategy, TrainConfig, Update,
    WireDtype,
};
use crate::error::{Error, Result};
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
/// A pushed delta's head on the wire: the owner's row with the updates its copy took
/// (`cache::UpdateCode`), before its `dim` values.
const DELTA_HEAD: usize = 4;

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
    pool: rayon::ThreadPool,
    neg: NegativePool,
    rng: Rng,
    /// What a batch samples, the rows it touches and its kernels.
    model: M,
    pub m: RankMetrics,
    step: u64,
    /// Per matrix and local row: (step stamp, batch slot) for deduplicating local rows.
    local_slot: Vec<Vec<(u64, u32)>>,
    remote_slot: FxHashMap<u64, u32>,
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
    /// Hogwild on node-shared rows, on every rank alike (some node has several ranks; a rank
    /// alone on its node takes part too): batches end in a barrier, walks cross node ranks.
    node_rows: bool,
    /// Hogwild across nodes with `--cache-rows` > 0: copies of other nodes' rows, trained in
    /// place and synchronised every `--cache-refresh` steps.
    cache: Option<RowCache>,
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
    to_answer: Vec<Vec<u32>>,
    /// The deltas of the exchange being absorbed, combined per row (`cache::Combine`).
    combine: Combine,
    /// The learning rate of the step in flight (the owner's `Combine` reads it).
    lr_now: f32,
    /// How a pushed delta's head carries its copy's updates.
    update_code: UpdateCode,
    loss_watch: LossWatch,
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

/// Collective: load the graph, allocate storage, train, write the output.
pub fn run(comm: &Comm, cfg: &TrainConfig) -> Result<Outcome> {
    // What the process holds before it reads anything (libraries, MPI's buffers): the base of
    // the printed memory estimate.
    let process = crate::stats::peak_rss_bytes();
    // A walk or edge model given triples, or a knowledge-graph model given a plain graph; the
    // graph's node count otherwise.
    let num_nodes = crate::graph::h5::EdgeFile::open(&cfg.graph).and_then(|f| {
        if f.has_rel && !cfg.model.is_kg() {
            Err(Error::bad_input(
                &cfg.graph,
                format!(
                    "a knowledge graph (dataset 'rel': triples); --model {} trains plain graphs: use --model distmult, complex, transe or rotate, or convert a plain edge list",
                    format!("{:?}", cfg.model).to_lowercase()
                ),
            ))
        } else if cfg.model.is_kg() {
            TripleFile::open(&cfg.graph).map(|_| f.num_nodes)
        } else {
            Ok(f.num_nodes)
        }
    });
    let num_nodes = agree(comm, num_nodes)?;
    // The storage (rows, optimizer state, the row cache, replicas) follows from the partition:
    // checked against --max-memory before anything is loaded.
    let local_nodes =
        Partitioner::new(cfg.partition, num_nodes, comm.size()).num_local(comm.rank());
    let rows = local_nodes as u64;
    // The row cache of hogwild across nodes (its copies and their bases).
    let cached = if cfg.update == Update::Hogwild
        && cfg.strategy == Strategy::Sharded
        && comm.node_size() < comm.size()
    {
        cfg.cache_rows_for(local_nodes)
    } else {
        0
    };
    let replica = cfg.replica_bytes(num_nodes);
    let storage = cfg.memory_estimate(rows) + RowCache::bytes(cached, cfg.dim) + replica;
    agree(
        comm,
        match cfg.max_memory {
            Some(limit) if storage > limit && RowCache::bytes(cached, cfg.dim) > 0 => {
                Err(Error::config(format!(
                    "the storage estimate {} (of which the remote-row cache, --cache-rows {}: {}) exceeds --max-memory {}; lower --cache-rows (0 disables the cache), use more ranks, or a smaller --dim",
                    human_bytes(storage),
                    cached,
                    human_bytes(RowCache::bytes(cached, cfg.dim)),
                    human_bytes(limit)
                )))
            }
            Some(limit) if storage > limit && replica > 0 => Err(Error::config(format!(
                "the storage estimate {} (of which --strategy replicated's copy of every row: {}) exceeds --max-memory {}; the replicated strategy needs every row on every rank: use --strategy sharded, --sync sparse, or a smaller --dim",
                human_bytes(storage),
                human_bytes(replica),
                human_bytes(limit)
            ))),
            Some(limit) if storage > limit => Err(Error::config(format!(
                "the storage estimate {} exceeds --max-memory {}; use more ranks, --dtype f16, or a smaller --dim",
                human_bytes(storage),
                human_bytes(limit)
            ))),
            _ => Ok(()),
        },
    )?;
    let t = Timer::start();
    // Once the load has counted the degrees, the adjacency's size is known: with the storage it
    // must fit --max-memory before the entries are read. Walks across a node's ranks read each
    // other's adjacency: the load then writes it into node-shared windows (the trainer's own
    // decision, `node_memory_fits`, is the same).
    let walks = matches!(cfg.model, Model::Deepwalk | Model::Node2vec);
    let counted = |csr: u64| -> Result<bool> {
        let most = comm.all_reduce_u64(&[storage + csr, csr], ReduceOp::Max);
        if let Some(limit) = cfg.max_memory.filter(|&l| most[0] > l) {
            return Err(Error::config(format!(
                "{}: the adjacency takes {} on the largest rank, which with the storage ({}) makes {} and exceeds --max-memory {}; use more ranks or nodes, or a smaller --dim or --dtype f16",
                cfg.graph.display(),
                human_bytes(most[1]),
                human_bytes(storage),
                human_bytes(most[0]),
                human_bytes(limit)
            )));
        }
        Ok(walks
            && cfg.node_memory == NodeMemory::Shared
            && node_memory_fits(comm, cfg, local_nodes, csr))
    };
    let g = csr::load(
        comm,
        &cfg.graph,
        cfg.partition,
        csr::LOAD_CHUNK_EDGES,
        counted,
    )?;
    let load_secs = t.secs();
    let samplers = crate::estimate::sampler_bytes(
        cfg.model,
        cfg.batch_size as u64,
        g.num_local() as u64,
        g.local_entries(),
        g.cum_weights.is_some(),
    );
    let estimate = crate::estimate::rank_estimate(
        process,
        g.bytes(),
        g.file_edges.div_ceil(comm.size() as u64),
        storage,
        samplers,
        cfg.output.is_some(),
    );
    let [max_est, max_rows, max_csr, max_samplers, max_process] = comm
        .all_reduce_u64(
            &[estimate, rows, g.bytes(), samplers, process],
            ReduceOp::Max,
        )
        .try_into()
        .expect("five maxima");
    // The storage and the adjacency were checked before they were allocated; the rest (the
    // samplers, buffers and the process itself) is known now. Every rank sees the same maximum.
    if let Some(limit) = cfg.max_memory.filter(|&l| max_est > l) {
        return Err(Error::config(format!(
            "the memory estimate {} per rank (besides the storage: adjacency {}, samplers and step buffers {}, the process before loading {}) exceeds --max-memory {}; use more ranks or nodes, or a smaller --dim or --dtype f16",
            human_bytes(max_est),
            human_bytes(max_csr),
            human_bytes(max_samplers),
            human_bytes(max_process),
            human_bytes(limit)
        )));
    }
    if comm.rank() == 0 {
        eprintln!(
            "graphscale: {} nodes, {} edges, {} ranks; memory per rank {} (storage: {} rows x {} dims x {} B x {} matrices + optimizer state; adjacency {}; samplers and step buffers {}; the process before loading {})",
            g.num_nodes(),
            g.file_edges,
            comm.size(),
            human_bytes(max_est),
            max_rows,
            cfg.dim,
            cfg.dtype.size(),
            cfg.matrices(),
            human_bytes(max_csr),
            human_bytes(max_samplers),
            human_bytes(max_process),
        );
        if let Some(dir) = &cfg.mmap_rows {
            eprintln!(
                "graphscale: --mmap-rows: each rank's rows ({} per rank) live in unlinked files in {}, paged by the kernel, outside the estimate",
                human_bytes(rows * (cfg.dim * cfg.dtype.size() * cfg.matrices()) as u64),
                dir.display()
            );
        }
        if replica > 0 {
            eprintln!(
                "graphscale: --strategy replicated --sync {}: every rank holds all {} rows ({} per rank{})",
                format!("{:?}", cfg.sync).to_lowercase(),
                g.num_nodes(),
                human_bytes(replica),
                if cfg.sync == crate::config::Sync::Dense {
                    ", half of it the dense gradient matrices"
                } else {
                    ""
                }
            );
        }
        if cfg.update == Update::Hogwild && cfg.max_staleness > 0 {
            log::warn!(
                "--max-staleness applies to --update batched; hogwild always overlaps sampling with the in-place updates"
            );
        }
    }
    if cfg.model.is_kg() {
        run_model::<Kge>(comm, cfg, &g, load_secs, estimate)
    } else {
        run_model::<Sgns>(comm, cfg, &g, load_secs, estimate)
    }
}

/// Collective: train `M` on the loaded graph and write its output.
fn run_model<M: model::Model>(
    comm: &Comm,
    cfg: &TrainConfig,
    g: &LocalGraph,
    load_secs: f64,
    estimate: u64,
) -> Result<Outcome> {
    // Triples of a knowledge graph: this rank's contiguous share of the file; with --valid,
    // the validation triples and the filter (every training and validation triple) on every
    // rank.
    let triples = if cfg.model.is_kg() {
        let read = TripleFile::open(&cfg.graph).and_then(|f| {
            let (n, r) = (f.len(), comm.rank() as u64);
            let p = comm.size() as u64;
            let mine = f.read(n * r / p, n * (r + 1) / p)?;
            let valid = match &cfg.valid {
                Some(v) => {
                    let (e, rels) = (f.num_entities(), f.num_relations);
                    let valid = crate::graph::triples::read_all(std::slice::from_ref(v), e, rels)?;
                    let mut known = f.read(0, n)?;
                    known.extend_from_slice(&valid);
                    Some((valid, known))
                }
                None => None,
            };
            Ok((mine, valid))
        });
        let (mine, valid) = agree(comm, read)?;
        Some((kg::weigh(comm, &mine, cfg.triple_weights), valid))
    } else {
        None
    };
    let mut tr = Trainer::<M>::new(comm, cfg, g)?;
    tr.prepare_checkpoints()?;
    tr.m.seconds.load = load_secs;
    // A knowledge graph's triples held in memory (this rank's share, the validation set and
    // its filter).
    let held = triples.as_ref().map_or(0, |(mine, valid)| {
        mine.len() + valid.as_ref().map_or(0, |(v, k)| v.len() + k.len())
    });
    tr.m.memory_estimate_bytes =
        estimate + (held * std::mem::size_of::<crate::graph::triples::Triple>()) as u64;
    tr.m.strategy = match cfg.strategy {
        Strategy::Sharded => "sharded".into(),
        Strategy::Replicated => format!("replicated-{:?}", cfg.sync).to_lowercase(),
    };
    tr.m.ranks = comm.size();
    tr.m.nodes = comm.all_reduce_f64(&[1.0 / comm.node_size().max(1) as f64], ReduceOp::Sum)[0]
        .round() as u64;
    tr.m.model = format!("{:?}", cfg.model).to_lowercase();
    (tr.m.threads, tr.m.dim, tr.m.wire_bytes) = (cfg.threads, cfg.dim, cfg.wire_dtype.size());
    tr.m.graph_rows = g.num_nodes() * cfg.matrices() as u64;
    let t = Timer::start();
    let cpu = crate::stats::cpu_seconds();
    match (cfg.model, triples) {
        (_, Some((t, valid))) => tr.train_triples(t, valid.as_ref()),
        (Model::Deepwalk | Model::Node2vec, None) => tr.train_walks(),
        (_, None) => tr.train_line(),
    }
    tr.m.train_seconds = t.secs();
    if let (Some((version, step)), Some(dir)) = (tr.stopped, &cfg.checkpoint_dir) {
        return Err(Error::Stopped(format!(
            "stopped by a signal (SIGTERM or SIGUSR1) at step {step} after committing checkpoint version {version} in {}; no embeddings were written; continue with --resume-if-present {} (exit code 4)",
            dir.display(),
            dir.display()
        )));
    }
    let sent = comm
        .traffic()
        .sent
        .load(std::sync::atomic::Ordering::Relaxed);
    let end = [
        tr.t0.elapsed().as_secs_f64(),
        tr.m.pairs as f64,
        (sent + tr.m.one_sided_bytes) as f64,
    ];
    tr.m.timeline.push(end);
    (tr.m.cpu_seconds_main, tr.m.cpu_seconds_process) = crate::stats::cpu_seconds();
    tr.m.cpu_seconds_main_train = tr.m.cpu_seconds_main - cpu.0;
    tr.m.cpu_seconds_process_train = tr.m.cpu_seconds_process - cpu.1;
    if let Some(out) = &cfg.output {
        // Written to a partial file beside the target and renamed over it once complete: a
        // failed or killed job leaves an earlier file there intact.
        let t = Timer::start();
        let tmp = crate::outfile::partial(out);
        let written = crate::embeddings::write_embeddings(comm, &tmp, g, &tr.shards[VERTEX], cfg)
            .and_then(|()| {
                let extra = if comm.rank() == 0 {
                    crate::embeddings::write_names(&tmp, &cfg.graph, cfg.model.is_kg())
                        .and_then(|()| tr.model.write_output(&tmp))
                        .and_then(|()| crate::outfile::commit(out))
                } else {
                    Ok(())
                };
                agree(comm, extra)
            });
        if let Err(e) = written {
            if comm.rank() == 0 {
                crate::outfile::discard(out);
            }
            return Err(crate::outfile::failed(out, e));
        }
        tr.m.seconds.output = t.secs();
    }
    tr.m.peak_rss_bytes = peak_rss_bytes();
    let t = comm.traffic();
    tr.m.comm_bytes_sent = t.sent.load(std::sync::atomic::Ordering::Relaxed);
    tr.m.comm_bytes_received = t.received.load(std::sync::atomic::Ordering::Relaxed);
    let mine = serde_json::to_vec(&tr.m).expect("metrics serialize");
    let metrics: Vec<RankMetrics> = comm
        .all_gather_bytes(&mine)
        .iter()
        .map(|b| serde_json::from_slice(b).expect("metrics parse"))
        .collect();
    if comm.rank() == 0 {
        if let Some(path) = &cfg.metrics {
            crate::outfile::write_with(path, |tmp| {
                let mut f = std::fs::File::create(tmp).map_err(|e| Error::io(tmp, e))?;
                for m in &metrics {
                    let line = serde_json::to_string(m).expect("metrics serialize");
                    writeln!(f, "{line}").map_err(|e| Error::io(tmp, e))?;
                }
                Ok(())
            })?;
        }
    }
    Ok(Outcome { metrics })
}

impl<'a, M: model::Model> Trainer<'a, M> {
    pub fn new(comm: &'a Comm, cfg: &'a TrainConfig, g: &'a LocalGraph) -> Result<Self> {
        let rows = g.num_local();
        let one_matrix = cfg.matrices() == 1;
        let node_shared = cfg.node_memory == NodeMemory::Shared
            && node_memory_fits(comm, cfg, g.num_local(), g.bytes());
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
        if !one_matrix {
            shards.push(shard(1)?);
        }
        // gensim 4's init: vertex rows uniform in [-1/d, 1/d] (word2vec C uses half that; the
        // wider range gave +0.2-0.3 Micro-F1 and +0.4-0.7 Macro-F1 on BlogCatalog 10 x 80, mean of
        // two seeds, docs/results.md), seeded by node id so the initial matrix is the same for
        // any number of ranks; context rows zero.
        let (rank, seed, dim) = (comm.rank(), cfg.seed, cfg.dim);
        let part = g.part.clone();
        shards[VERTEX].init(|r, out| {
            let mut rng = rng_for(seed, 0, 1 + part.global(rank, r));
            for x in out.iter_mut() {
                *x = (rng.random::<f32>() * 2.0 - 1.0) / dim as f32;
            }
        });
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
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(cfg.threads)
            .thread_name(move |i| format!("compute-{rank}-{i}"))
            .build()
            .map_err(|e| Error::config(format!("--threads {}: {e}", cfg.threads)))?;
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
            neg,
            rng: rng_for(seed, rank, 2),
            model: agree(comm, M::new(cfg, g))?,
            m: RankMetrics {
                rank,
                ..Default::default()
            },
            step: 0,
            local_slot: vec![vec![(0, 0); rows]; 2],
            remote_slot: FxHashMap::default(),
            stamp: 0,
            pending: Default::default(),
            next_pool: None,
            pool_sending: None,
            pool_every,
            ckpt: None,
            stopped: None,
            resumed: None,
            shared: None,
            node_rows: false,
            cache: None,
            adm: Admission::default(),
            carry: None,
            carried: None,
            deferred: Default::default(),
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
            if cfg.update == Update::Hogwild && cfg.strategy == Strategy::Sharded {
                // Every rank takes the node-shared rows, or every rank its own: whether a batch
                // needs the fetch and push exchanges must be the same on all of them.
                let (me, n) = (comm.rank(), comm.size());
                let mut rows_of = |node: bool| -> Option<Vec<InPlaceRows>> {
                    t.shards
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
                    t.node_rows = ok[1] == 1;
                    t.shared = if t.node_rows { node } else { own };
                }
                // The job's nodes: the sum over ranks of 1 / (ranks on its node).
                let nodes = comm
                    .all_reduce_f64(&[1.0 / comm.node_size().max(1) as f64], ReduceOp::Sum)[0]
                    .round() as u64;
                // Every rank keeps its own copies: the clock is shared by all of them. The same
                // answer on every rank (sizes and flags only), so all refuse together.
                let copies = comm.size() as u64;
                let max = crate::config::max_cache_refresh(copies);
                if let Some(r) = cfg.cache_refresh.filter(|&r| nodes > 1 && r > max) {
                    return Err(Error::config(format!(
                        "--cache-refresh {r} with {copies} ranks keeping copies of remote rows: at most {max} (the copies of a row take at most 32 batches summed over ranks unseen by each other; BlogCatalog at 8 simulated nodes diverged with 8); lower --cache-refresh or leave it to its default"
                    )));
                }
                if let Some(rows) = t.shared.as_ref().filter(|s| !s[VERTEX].all()) {
                    let capacity = cache_capacity(cfg, g, rows);
                    if capacity > 0 {
                        let clock = cfg
                            .cache_refresh
                            .unwrap_or_else(|| crate::config::default_cache_refresh(copies));
                        t.cache = Some(RowCache::new(capacity, cfg.dim, clock));
                        t.m.cache_rows = capacity as u64;
                        t.m.cache_refresh = clock;
                    }
                }
            }
            Ok(t)
        })
    }

    /// Collective: set up checkpointing and resume from `--resume` if given.
    pub fn prepare_checkpoints(&mut self) -> Result<()> {
        let cfg = self.cfg;
        if cfg.checkpoint_dir.is_none() && cfg.resume.is_none() {
            return Ok(());
        }
        let digest = csr::digest(self.comm, self.g);
        let ident = checkpoint::identity(cfg, self.g, digest);
        if let Some(dir) = &cfg.resume {
            let part = self.g.part.clone();
            let window = cfg.window;
            let kg = cfg.model.is_kg();
            let r =
                checkpoint::restore(self.comm, dir, self.g, &ident, &mut self.shards, |b, n| {
                    if kg {
                        // The model's own state (rank 0 saved it): every rank gets a copy.
                        Ok(vec![b.to_vec(); n])
                    } else {
                        WalkEngine::route_walkers(b, &part, window)
                    }
                })?;
            if let Some(r) = &r {
                if kg {
                    self.model
                        .restore_state(&r.walkers)
                        .map_err(|e| Error::bad_input(dir, e))?;
                }
                // Fresh streams for the rest of the run, derived from the seed and the step.
                let salt = r.cursor.step.wrapping_mul(0x2545_F491_4F6C_DD1D);
                self.rng = rng_for(cfg.seed ^ salt, self.comm.rank(), 2);
                self.step = r.cursor.step;
                self.m.resumed_from = Some(r.version);
            }
            self.resumed = r;
        }
        if let (Some(dir), Some(every)) = (&cfg.checkpoint_dir, cfg.checkpoint_every) {
            if let Err(e) = crate::signals::arm() {
                log::warn!("cannot catch SIGTERM/SIGUSR1 (no checkpoint on a signal): {e}");
            }
            self.ckpt = Some(Checkpointing {
                dir: dir.clone(),
                every,
                next_version: checkpoint::next_version(self.comm, dir)?,
                last: Instant::now(),
                writing: None,
                identity: ident.to_string(),
            });
        }
        Ok(())
    }

    /// Collective, between steps: commit a finished background write; start a checkpoint when
    /// one is due. `state` gives the encoded walkers and the cursor at this point.
    fn checkpoint_tick(
        &mut self,
        lr: f32,
        force: bool,
        state: impl FnOnce(&mut Self) -> (Vec<u8>, Cursor),
    ) {
        if self.ckpt.is_none() || self.stopped.is_some() {
            return;
        }
        // SIGTERM or SIGUSR1 on any rank: every rank checkpoints at this step, commits, stops.
        let signalled = !force
            && crate::signals::armed()
            && self.comm.max_u64(u64::from(crate::signals::raised())) > 0;
        let force = force || signalled;
        let Some(ck) = &mut self.ckpt else {
            return;
        };
        let (due, all_done) = match ck.every {
            _ if force => (true, true),
            Every::Steps(n) if ck.writing.is_none() => (self.step.is_multiple_of(n), true),
            Every::Steps(n) => {
                let (_, done) =
                    checkpoint::poll(self.comm, false, checkpoint::writer_done(&ck.writing));
                (self.step.is_multiple_of(n), done)
            }
            Every::Seconds(t) => {
                // Rank 0's clock decides, so that all ranks checkpoint at the same step.
                let mine = self.comm.rank() == 0 && ck.last.elapsed().as_secs_f64() >= t;
                checkpoint::poll(self.comm, mine, checkpoint::writer_done(&ck.writing))
            }
        };
        if ck.writing.is_some() && (all_done || due) {
            let w = ck.writing.take().expect("checked");
            if let Err(e) = checkpoint::finish_writing(self.comm, &ck.dir, w) {
                fatal(
                    self.comm,
                    Some(self.step),
                    &format!("checkpoint failed: {e}"),
                );
            }
        }
        if !due {
            return;
        }
        // The snapshot must hold every applied gradient: finish the batch in flight first.
        self.drain(lr);
        let t = Timer::start();
        let (walkers, mut cursor) = state(self);
        cursor.step = self.step;
        let ck = self.ckpt.as_mut().expect("checked above");
        let mut snap = Snapshot::take(self.g, &self.shards, walkers, cursor.clone());
        snap.identity = ck.identity.clone();
        snap.config = self.cfg.to_json();
        let version = ck.next_version;
        ck.next_version += 1;
        ck.last = Instant::now();
        let path = checkpoint::shard_path(&ck.dir, version, self.comm.rank());
        self.m.checkpoint_bytes += snap.bytes();
        self.m.checkpoints += 1;
        let handle = std::thread::Builder::new()
            .name("checkpoint-writer".into())
            .spawn(move || {
                if let Some(d) = path.parent() {
                    std::fs::create_dir_all(d).map_err(|e| Error::io(d, e))?;
                }
                checkpoint::write_shard(&path, &snap)?;
                checkpoint::file_sum(&path)
            })
            .expect("spawn the checkpoint writer");
        ck.writing = Some(Writing {
            version,
            cursor,
            handle,
        });
        self.m.checkpoint_pause_seconds += t.secs();
        if signalled {
            let w = ck.writing.take().expect("just started");
            if let Err(e) = checkpoint::finish_writing(self.comm, &ck.dir, w) {
                fatal(
                    self.comm,
                    Some(self.step),
                    &format!("checkpoint failed: {e}"),
                );
            }
            self.stopped = Some((version, self.step));
        }
    }

    /// Collective, at the end of training: write the final state and commit it.
    fn checkpoint_finish(&mut self, state: impl FnOnce(&mut Self) -> (Vec<u8>, Cursor)) {
        if self.stopped.is_some() {
            return;
        }
        self.checkpoint_tick(self.lr_at(1.0), true, state);
        if let Some(ck) = &mut self.ckpt {
            if let Some(w) = ck.writing.take() {
                if let Err(e) = checkpoint::finish_writing(self.comm, &ck.dir, w) {
                    fatal(
                        self.comm,
                        Some(self.step),
                        &format!("checkpoint failed: {e}"),
                    );
                }
            }
        }
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

    /// Learning rate at `progress` in [0, 1]: linear decay to lr * 1e-4, optional warm-up.
    fn lr_at(&self, progress: f64) -> f32 {
        let p = progress.clamp(0.0, 1.0) as f32;
        let mut lr = self.cfg.lr * (1.0 - p).max(1e-4);
        if self.cfg.warmup > 0.0 && p < self.cfg.warmup {
            lr *= (p / self.cfg.warmup).max(1e-3);
        }
        lr
    }

    fn train_walks(&mut self) {
        let cfg = self.cfg;
        // With node-shared rows the node's ranks also share their adjacency: a walk continues
        // across them and only moves to another node ship it. The job's "nodes" are counted
        // as the sum over ranks of 1 / (ranks on its node).
        let on_node = self.shared.as_ref().map_or(1, |s| {
            s[VERTEX].first_row.iter().filter(|f| f.is_some()).count()
        });
        // The same on every rank (the adjacency windows are collective), also on a rank alone
        // on its node.
        let node_walks = self.node_rows;
        let parts = self
            .comm
            .all_reduce_f64(&[1.0 / on_node as f64], ReduceOp::Sum)[0]
            .round();
        // A walker keeps walking while its next node is on this rank (or node): the whole walk
        // there, or min(L, P / (P - 1)) steps per superstep on average when nodes are spread
        // evenly over P ranks (or nodes).
        let spread = if node_walks {
            parts
        } else {
            self.comm.size() as f64
        };
        let batch_parts = if node_walks && parts > 1.0 {
            self.comm.size()
        } else {
            spread as usize
        };
        let steps = if spread > 1.0 {
            (spread / (spread - 1.0)).min(f64::from(cfg.walk_length))
        } else {
            f64::from(cfg.walk_length)
        };
        let params = WalkParams {
            walk_length: cfg.walk_length,
            window: cfg.window,
            walks_per_node: cfg.walks_per_node,
            node2vec: (cfg.model == Model::Node2vec).then_some((cfg.p, cfg.q)),
            // A walker emits about window + 1 pairs per step. At most 1/16 of a rank's walks are
            // in flight, so that small graphs still get many optimizer steps.
            // --batch-size is the number of pairs per step of one copy of the rows: remote rows
            // are copies as old as a step. With private rows every rank holds such copies and
            // takes its share of walkers in flight, so the optimisation is the same at any rank
            // count. With node-shared rows a node's ranks update one copy in place (nothing of
            // the node is stale), so each rank takes its node's share: the ranks of one node
            // step as single-rank jobs would (BlogCatalog, 4 ranks on one node: 5.3M pairs/s
            // at the same Micro-F1, against 3.6M with a quarter of the walkers each). Across
            // nodes every rank also trains its own copies of the remote rows, so each takes its
            // share of the job's ranks as private rows do: with its node's share, 4 nodes of 2
            // ranks (BlogCatalog) trained copies twice as long per step and lost 0.8 Micro-F1
            // (36.58 at clock 1 against 37.42 with private rows).
            in_flight: ((cfg.batch_size.div_ceil(batch_parts) as f64
                / ((cfg.window as usize + 1) as f64 * steps)) as usize)
                .min((self.g.num_local() * cfg.walks_per_node as usize).div_ceil(16))
                .max(1),
            local_steps: cfg.walk_length,
            node_walks,
        };
        let mut wrng = rng_for(cfg.seed, self.comm.rank(), 3);
        let mut engine = WalkEngine::new(self.comm, self.g, params, cfg.subsample, &mut wrng);
        let total = cfg.epochs as f64
            * f64::from(cfg.walks_per_node)
            * self.g.num_nodes() as f64
            * f64::from(cfg.walk_length);
        let mut done = 0f64;
        let mut first_epoch = 0;
        if let Some(r) = self.resumed.take() {
            let c = &r.cursor;
            let (_, starts) = engine.cursor();
            let next = if r.same_ranks {
                c.next_start
            } else {
                (c.started * starts as f64).round() as u64
            };
            engine.resume(next, &r.walkers);
            done = c.done;
            first_epoch = c.epoch;
            let salt = c.step.wrapping_mul(0x2545_F491_4F6C_DD1D);
            wrng = rng_for(cfg.seed ^ salt, self.comm.rank(), 3);
        }
        let mut segs = Segments::default();
        let mut pairs = Vec::new();
        let by_token =
            (self.shared.is_some() || self.replica.is_some()) && cfg.kernel == Kernel::Token;
        let carry = self.cache.is_some();
        let mut progress = Progress::new(self.comm.rank() == 0);
        for epoch in first_epoch..cfg.epochs {
            if epoch > first_epoch || self.m.resumed_from.is_none() {
                engine.new_epoch();
            }
            loop {
                let t = Timer::start();
                segs.clear();
                pairs.clear();
                // With the row cache, walkers and the step's counts travel in the rows'
                // exchange (one collective less per step), and the rate is that of the progress
                // before this step; otherwise they have their own exchange and all-reduce.
                let (out, global) = if carry {
                    let (out, send) =
                        engine.superstep_local(self.comm, self.g, &mut wrng, &mut segs);
                    self.carry = Some((send, [engine.pending(), out.tokens]));
                    (out, None)
                } else {
                    let out = engine.superstep(self.comm, self.g, &mut wrng, &mut segs);
                    let g = self
                        .comm
                        .all_reduce_u64(&[engine.pending(), out.tokens], ReduceOp::Sum);
                    done += g[1] as f64;
                    (out, Some([g[0], g[1]]))
                };
                if !by_token {
                    segs.pairs(&mut pairs);
                }
                self.m.seconds.sample += t.secs();
                let lr = self.lr_at(done / total);
                if by_token {
                    self.train(Work::Segments(&segs), lr);
                } else {
                    self.train_step(&pairs, lr);
                }
                let global = global.unwrap_or_else(|| {
                    let (walkers, global) = self.carried.take().expect("the exchange ran");
                    let t = Timer::start();
                    engine.deliver(walkers.iter().map(Vec::as_slice));
                    self.m.seconds.sample += t.secs();
                    done += global[1] as f64;
                    global
                });
                self.m.tokens += out.tokens;
                progress.tick(done / total, &self.m, lr);
                if global[0] == 0 {
                    break;
                }
                let comm = self.comm;
                self.checkpoint_tick(lr, false, |tr| {
                    // Walkers the drain's exchanges brought join the engine before it is saved.
                    if let Some((walkers, _)) = tr.carried.take() {
                        engine.deliver(walkers.iter().map(Vec::as_slice));
                    }
                    let (next, starts) = engine.cursor();
                    let g = comm.all_reduce_u64(&[next, starts], ReduceOp::Sum);
                    let cursor = Cursor {
                        step: 0,
                        epoch,
                        done,
                        started: g[0] as f64 / g[1].max(1) as f64,
                        next_start: next,
                        ..Cursor::default()
                    };
                    (engine.encode_walkers(), cursor)
                });
                if self.stopped.is_some() {
                    break;
                }
            }
            if self.stopped.is_some() {
                break;
            }
        }
        self.drain(self.lr_at(1.0));
        self.m.walker_crossings = engine.crossed;
        // Walks started here x their length: the tokens the walks would have without dead ends
        // (`graphscale plan` counts pairs per such token).
        self.m.walk_tokens_nominal =
            engine.cursor().1 * u64::from(cfg.walk_length) * u64::from(cfg.epochs);
        let epochs = cfg.epochs;
        self.checkpoint_finish(|_| {
            let cursor = Cursor {
                epoch: epochs,
                done,
                started: 1.0,
                ..Cursor::default()
            };
            (Vec::new(), cursor)
        });
    }

    /// Knowledge graphs: every epoch shuffles the triples this rank holds (its share of the
    /// file, or with shard negatives the share the ring has passed it) and trains them in steps
    /// of its share of `--batch-size`; every rank takes the same number of steps (the largest
    /// share's), the others with empty batches. Adagrad's learning rate stays constant.
    fn train_triples(
        &mut self,
        mut triples: Vec<Weighted>,
        valid: Option<&(Vec<Triple>, Vec<Triple>)>,
    ) {
        use rand::seq::SliceRandom;
        let cfg = self.cfg;
        let per_rank = cfg.batch_size.div_ceil(self.comm.size()).max(1);
        let steps = self
            .comm
            .max_u64(triples.len().div_ceil(per_rank) as u64)
            .max(1);
        let total = f64::from(cfg.epochs) * steps as f64;
        let mut progress = Progress::new(self.comm.rank() == 0);
        let lr = cfg.lr;
        // --patience: the best validation MRR so far and the validations since it rose.
        let (mut best, mut flat) = (f64::NEG_INFINITY, 0u32);
        // A resumed run continues the epoch in progress, after the share of its steps done.
        let (mut first_epoch, mut first_step) = (1, 0);
        if let Some(r) = self.resumed.take() {
            first_epoch = r.cursor.epoch.max(1);
            first_step = (r.cursor.started * steps as f64).round() as u64;
            best = r.cursor.valid_best.unwrap_or(f64::NEG_INFINITY);
            flat = r.cursor.valid_flat;
        }
        let mut done = f64::from(first_epoch - 1) * steps as f64 + first_step as f64;
        // Where training stands after `s` steps of `epoch`, for a checkpoint.
        let cursor = |epoch: u32, s: u64, best: f64, flat: u32| Cursor {
            epoch,
            started: s as f64 / steps as f64,
            done: f64::from(epoch - 1) * steps as f64 + s as f64,
            valid_best: best.is_finite().then_some(best),
            valid_flat: flat,
            ..Cursor::default()
        };
        let state = |t: &mut Self| {
            if t.comm.rank() == 0 {
                t.model.state()
            } else {
                Vec::new()
            }
        };
        // With negatives from the rank's own shard, a triple trained on the same rank every
        // epoch would only ever meet that shard's entities as negatives (its query is never
        // contrasted with the other shards' entities). Epoch e trains the share of rank
        // (r + e - 1) mod p instead, passed one rank along the ring each epoch (one exchange of
        // the triples, 24 B per triple against kilobytes of rows): over p epochs every
        // triple meets every shard.
        let rotate =
            cfg.negatives_from == crate::config::NegativesFrom::Shard && self.comm.size() > 1;
        let mut held = 0u64;
        for epoch in first_epoch..=cfg.epochs {
            if rotate {
                let want = u64::from(epoch - 1) % self.comm.size() as u64;
                let t = Timer::start();
                triples = kg::pass_along(self.comm, triples, want + self.comm.size() as u64 - held);
                held = want;
                self.m.seconds.sample += t.secs();
            }
            // Each epoch's order depends on the seed, the epoch and the triples this rank holds
            // alone, so that a resumed run shuffles an epoch as the interrupted one did.
            triples.sort_unstable_by_key(Weighted::triple);
            let salt = u64::from(epoch).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            triples.shuffle(&mut rng_for(cfg.seed ^ salt, self.comm.rank(), 5));
            let skip = if epoch == first_epoch { first_step } else { 0 };
            for s in skip..steps {
                let lo = (s as usize * per_rank).min(triples.len());
                let hi = (lo + per_rank).min(triples.len());
                self.train(Work::Triples(&triples[lo..hi]), lr);
                self.m.tokens += (hi - lo) as u64;
                done += 1.0;
                progress.tick(done / total, &self.m, lr);
                // The last step of an epoch is saved as the start of the next.
                let (e, k) = if s + 1 == steps {
                    (epoch + 1, 0)
                } else {
                    (epoch, s + 1)
                };
                self.checkpoint_tick(lr, false, |t| (state(t), cursor(e, k, best, flat)));
                if self.stopped.is_some() {
                    break;
                }
            }
            if self.stopped.is_some() {
                break;
            }
            if let Some((v, known)) = valid {
                if epoch % cfg.valid_every == 0 || epoch == cfg.epochs {
                    self.drain(lr);
                    self.validate(epoch, v, known);
                    // Every rank ranks the same triples with the same rows: the same MRR, so
                    // all stop at the same epoch.
                    if let (Some(patience), Some(&[_, mrr, _])) =
                        (cfg.patience, self.m.valid.last())
                    {
                        if mrr > best + 1e-4 {
                            (best, flat) = (mrr, 0);
                        } else {
                            flat += 1;
                        }
                        if flat >= patience && epoch < cfg.epochs {
                            self.m.stopped_at_epoch = Some(epoch);
                            if self.comm.rank() == 0 {
                                eprintln!(
                                    "graphscale: epoch {epoch}: stopping early: validation MRR has not risen above {best:.4} for {flat} validation(s) (--patience {patience})"
                                );
                            }
                            break;
                        }
                    }
                }
            }
        }
        self.drain(lr);
        // The run is over (all epochs, or stopped early): a resume trains no further.
        self.checkpoint_finish(|t| (state(t), cursor(cfg.epochs + 1, 0, best, flat)));
    }

    /// Collective (`--valid`): rank the validation triples with the rows as they are now.
    fn validate(&mut self, epoch: u32, valid: &[Triple], known: &[Triple]) {
        let t = Timer::start();
        let (shard, dim) = (&self.shards[VERTEX], self.cfg.dim);
        let rows = shard.window.with_local(|bytes| {
            let mut out = vec![0f32; shard.rows * dim];
            for (o, b) in out
                .chunks_exact_mut(dim)
                .zip(bytes.chunks_exact(shard.row_bytes()))
            {
                decode_row(shard.dtype, b, o);
            }
            out
        });
        let Some(r) = self.model.ranking() else {
            return;
        };
        let emb = crate::kgeval::KgEmbeddings {
            score: r.score,
            gamma: r.gamma,
            entities: self.g.num_nodes() as usize,
            dim,
            rows,
            part: self.g.part.clone(),
            rank: self.comm.rank(),
            relations: r.relations,
            rel_dim: r.rel_dim,
        };
        let m = crate::kgeval::rank_distributed(self.comm, &emb, valid, known);
        self.m.valid.push([f64::from(epoch), m.mrr, m.hits10]);
        if self.comm.rank() == 0 {
            eprintln!(
                "graphscale: epoch {epoch}: valid MRR {:.4}  Hits@1 {:.4}  Hits@10 {:.4}  ({} triples, filtered; {:.1} s)",
                m.mrr,
                m.hits1,
                m.hits10,
                m.triples,
                t.secs()
            );
        }
    }

    fn train_line(&mut self) {
        let cfg = self.cfg;
        let g = self.g;
        let sampler = EdgeSampler::new(g);
        let mass = sampler.mass;
        let total_mass = self.comm.all_reduce_f64(&[mass], ReduceOp::Sum)[0];
        let total_samples = cfg.line_samples * g.file_edges as f64 * f64::from(cfg.epochs);
        // --batch-size edges per step over all ranks, each rank its weight share.
        let steps = (total_samples / cfg.batch_size as f64).ceil().max(1.0) as u64;
        let my_batch = cfg.batch_size as f64 * mass / total_mass.max(1e-300);
        // Samples per node, not per edge, decide whether LINE has trained: Cora's 100 per edge
        // are 195 per node and give Micro-F1 38 where DeepWalk (16,000 pairs per node) gives 80;
        // BlogCatalog's are 3,200 per node and match DeepWalk.
        let per_node = total_samples / g.num_nodes().max(1) as f64;
        if self.comm.rank() == 0 && per_node < LINE_MIN_SAMPLES_PER_NODE {
            let need = (LINE_MIN_SAMPLES_PER_NODE * g.num_nodes() as f64
                / (g.file_edges.max(1) as f64 * f64::from(cfg.epochs)))
            .ceil();
            eprintln!(
                "graphscale: WARNING: LINE draws {per_node:.0} edge samples per node (--line-samples {} x {} edges / {} nodes): too few to train a graph this sparse; --line-samples {need} gives {LINE_MIN_SAMPLES_PER_NODE:.0} per node",
                cfg.line_samples,
                g.file_edges,
                g.num_nodes()
            );
        }
        let mut rng = rng_for(cfg.seed, self.comm.rank(), 4);
        let mut first = 0;
        if let Some(r) = self.resumed.take() {
            first = r.cursor.step;
            let salt = first.wrapping_mul(0x2545_F491_4F6C_DD1D);
            rng = rng_for(cfg.seed ^ salt, self.comm.rank(), 4);
        }
        let mut pairs = Vec::new();
        let mut progress = Progress::new(self.comm.rank() == 0);
        for s in first..steps {
            let t = Timer::start();
            pairs.clear();
            let k = my_batch as u64 + u64::from(rng.random::<f64>() < my_batch.fract());
            pairs.extend((0..k).map_while(|_| sampler.draw(g, &mut rng)));
            self.m.seconds.sample += t.secs();
            self.m.tokens += pairs.len() as u64;
            let p = s as f64 / steps as f64;
            let lr = self.lr_at(p);
            self.train_step(&pairs, lr);
            progress.tick(p, &self.m, lr);
            self.checkpoint_tick(lr, false, |_| (Vec::new(), Cursor::default()));
            if self.stopped.is_some() {
                break;
            }
        }
        self.drain(self.lr_at(1.0));
        self.checkpoint_finish(|_| (Vec::new(), Cursor::default()));
    }

    /// One collective step over this rank's `pairs` (center, context).
    pub fn train_step(&mut self, pairs: &[(NodeId, NodeId)], lr: f32) {
        self.train(Work::Pairs(pairs), lr);
    }

    /// One collective step over this rank's pairs or walk segments (segments need hogwild).
    fn train(&mut self, work: Work, lr: f32) {
        let cfg = self.cfg;
        let (comm, g, dim) = (self.comm, self.g, cfg.dim);
        if self.step.is_multiple_of(self.pool_every) || self.next_pool.is_none() {
            // Split phase: the pool drawn `pool_every` steps ago is installed and the next one
            // posted, so ranks a few steps apart never wait here. Without one under way (the
            // first step, after a resume or a drain) the pool is drawn on the spot.
            let t = Timer::start();
            match self.next_pool.take() {
                Some(p) => self.install_pool(p),
                None => {
                    let p = self.post_pool();
                    self.install_pool(p);
                    self.finish_pool();
                }
            }
            self.next_pool = Some(self.post_pool());
            self.m.seconds.sample += t.secs();
        }
        self.step += 1;
        crate::comm::STEP.store(self.step, std::sync::atomic::Ordering::Relaxed);
        let sent = comm
            .traffic()
            .sent
            .load(std::sync::atomic::Ordering::Relaxed);
        self.m.sample(
            self.t0.elapsed().as_secs_f64(),
            sent + self.m.one_sided_bytes,
        );
        self.maybe_fail();
        if self.replica.is_some() {
            self.replicated_step(work, lr);
            return;
        }
        if self.shared.is_some() {
            self.hogwild_step(work, lr);
            return;
        }
        // Plan: unique rows of the batch, keyed (node, matrix).
        let t = Timer::start();
        let me = comm.rank();
        self.stamp += 1;
        let stamp = self.stamp;
        let part = &g.part;
        let (local_slot, remote_slot) = (&mut self.local_slot, &mut self.remote_slot);
        remote_slot.clear();
        let mut keys: Vec<u64> = Vec::new();
        // Local rows are found through a stamped array (no hashing); remote rows through a map.
        let mut slot = |key: u64| -> u32 {
            let (owner, row) = part.locate(key >> 1);
            if owner == me {
                let e = &mut local_slot[(key & 1) as usize][row];
                if e.0 != stamp {
                    *e = (stamp, keys.len() as u32);
                    keys.push(key);
                }
                e.1
            } else {
                *remote_slot.entry(key).or_insert_with(|| {
                    keys.push(key);
                    (keys.len() - 1) as u32
                })
            }
        };
        let plan = self.model.plan(work, &self.neg, &mut self.rng, &mut slot);
        self.m.seconds.sample += t.secs();

        // Fetch: local rows directly, remote rows one-sidedly, grouped by matrix and owner.
        let t = Timer::start();
        let nslots = keys.len();
        let mut rows = vec![0f32; nslots * dim];
        let mut remote: Vec<Vec<Vec<(u32, u32)>>> =
            vec![vec![Vec::new(); comm.size()]; self.shards.len()];
        let mut local: Vec<Vec<(u32, u32)>> = vec![Vec::new(); self.shards.len()];
        for (s, &key) in keys.iter().enumerate() {
            let (owner, row) = g.part.locate(key >> 1);
            let m = (key & 1) as usize;
            if owner == me {
                local[m].push((s as u32, row as u32));
            } else {
                remote[m][owner].push((s as u32, row as u32));
            }
        }
        for (m, shard) in self.shards.iter().enumerate() {
            let rb = shard.row_bytes();
            let parallel = cfg.max_staleness == 0;
            let dtype = shard.dtype;
            shard.window.with_local(|bytes| {
                if parallel && local[m].len() >= 1024 {
                    // The pool is idle: decode the local rows in parallel, slot by slot.
                    use rayon::prelude::*;
                    let mut src = vec![u32::MAX; nslots];
                    for &(s, r) in &local[m] {
                        src[s as usize] = r;
                    }
                    self.pool.install(|| {
                        rows.par_chunks_mut(dim)
                            .zip(src.par_iter())
                            .with_min_len(256)
                            .for_each(|(out, &r)| {
                                if r != u32::MAX {
                                    let r = r as usize;
                                    decode_row(dtype, &bytes[r * rb..(r + 1) * rb], out);
                                }
                            });
                    });
                    return;
                }
                for &(s, r) in &local[m] {
                    let (s, r) = (s as usize, r as usize);
                    decode_row(
                        shard.dtype,
                        &bytes[r * rb..(r + 1) * rb],
                        &mut rows[s * dim..(s + 1) * dim],
                    );
                }
            });
            self.m.local_rows += local[m].len() as u64;
            let count = fetch_remote(comm, cfg, shard, &remote[m], &mut rows);
            self.m.remote_rows += count as u64;
            self.m.fetch_bytes += (count * shard.row_bytes()) as u64;
            self.m.one_sided_bytes += (count * shard.row_bytes()) as u64;
        }
        self.m.seconds.fetch += t.secs();

        let batch = Batch { keys, plan, rows };
        let pending = self.launch(batch);
        if self.cfg.max_staleness == 0 {
            self.finish(pending, lr);
        } else {
            // Compute of this batch runs on the pool while the next batch is sampled and
            // fetched; its push and apply happen after that fetch (staleness 1).
            self.pending.push_back(pending);
            if self.pending.len() > 1 {
                let prev = self.pending.pop_front().expect("two pending");
                self.finish(prev, lr);
            }
        }
    }

    /// `--update hogwild`: plan the batch (only remote rows get slots), finish the previous
    /// batch, fetch the remote rows, and launch this batch's in-place updates on the pool. The
    /// caller samples the next batch while they run.
    fn hogwild_step(&mut self, work: Work, lr: f32) {
        let (comm, g, cfg) = (self.comm, self.g, self.cfg);
        let dim = cfg.dim;
        let t = Timer::start();
        let part = &g.part;
        let in_place = self
            .shared
            .clone()
            .expect("hogwild_step needs rows to update in place");
        let remote_slot = &mut self.remote_slot;
        remote_slot.clear();
        let mut keys: Vec<u64> = Vec::new();
        // Per slot: its references (updates), and whether a reference of the random half
        // (`remote_uses_half`) reached it.
        let mut refs: Vec<u32> = Vec::new();
        let mut half: Vec<bool> = Vec::new();
        let mut nref = 0u64;
        // A row of this node is referenced by its place in the in-place cells (no copy, no
        // deduplication); a row of another node gets a slot in the fetch buffer.
        let mut refer = |key: u64| -> u32 {
            let (owner, row) = part.locate(key >> 1);
            match in_place[(key & 1) as usize].first_row[owner] {
                Some(first) => first + row as u32,
                None => {
                    let slot = *remote_slot.entry(key).or_insert_with(|| {
                        keys.push(key);
                        refs.push(0);
                        half.push(false);
                        (keys.len() - 1) as u32
                    });
                    refs[slot as usize] += 1;
                    nref += 1;
                    half[slot as usize] |= coin(nref);
                    model::REMOTE | slot
                }
            }
        };
        let planned = self.model.plan(work, &self.neg, &mut self.rng, &mut refer);
        self.m.remote_uses_half += half.iter().filter(|&&h| h).count() as u64;
        // Rows read in place: every reference to this node (a row may be read by several pairs).
        let (mut local, mut remote) = (0u64, 0u64);
        for &r in planned.references().into_iter().flatten() {
            if r & model::REMOTE == 0 {
                local += 1;
            } else if r != model::SKIP {
                remote += 1;
            }
        }
        self.m.local_rows += local;
        self.m.remote_refs += remote;
        self.m.seconds.sample += t.secs();
        if self.cache.is_some() {
            self.cached_launch(planned, keys, &refs, lr);
            return;
        }

        // Across ranks, a batch reads remote rows as they are after every update of the
        // previous step: the previous batch ends, its deltas are pushed and applied everywhere
        // (first barrier), and no owner writes rows in place while others still read them
        // (second barrier). With one thread per rank a run is then reproducible.
        // With every row in place (one node, node-shared rows) nothing waits for a batch's
        // end: up to IN_PLACE_DEPTH batches are on the pool at once, so that its threads do not
        // idle while the last segments of a batch finish. Otherwise the previous batch ends
        // first.
        let depth = if in_place[VERTEX].all() {
            crate::estimate::IN_PLACE_DEPTH
        } else {
            1
        };
        while self.pending.len() >= depth {
            let prev = self.pending.pop_front().expect("pending batch");
            self.finish(prev, lr);
        }
        let t = Timer::start();
        // With every rank's rows in place (one node, node-shared rows) nothing is fetched.
        let ranks = comm.size() > 1 && !in_place[VERTEX].all();
        if ranks {
            comm.barrier();
        }
        let mut rows = vec![0f32; keys.len() * dim];
        let mut remote: Vec<Vec<Vec<(u32, u32)>>> =
            vec![vec![Vec::new(); comm.size()]; self.shards.len()];
        for (s, &key) in keys.iter().enumerate() {
            let (owner, row) = part.locate(key >> 1);
            remote[(key & 1) as usize][owner].push((s as u32, row as u32));
        }
        for (m, shard) in self.shards.iter().enumerate() {
            let count = fetch_remote(comm, cfg, shard, &remote[m], &mut rows);
            self.m.remote_rows += count as u64;
            self.m.fetch_bytes += (count * shard.row_bytes()) as u64;
            self.m.one_sided_bytes += (count * shard.row_bytes()) as u64;
        }
        if ranks {
            comm.barrier();
        }
        self.m.seconds.fetch += t.secs();

        let (centers, targets) = (in_place[VERTEX].cells, in_place[in_place.len() - 1].cells);
        let (tx, rx) = std::sync::mpsc::channel();
        let (npairs, terms) = (planned.examples(), planned.loss_terms());
        let done = self.pool_started();
        self.pool.spawn(move || {
            let t = Timer::start();
            // SAFETY: the trainer keeps its shards alive and takes no `&mut` access to their
            // windows until it has received this task's result (`finish`, `drain`, `Drop`).
            let (c, tg) = unsafe { (centers.cells(), targets.cells()) };
            let (deltas, loss) = planned.train_copy([c, tg], &rows, dim, lr);
            let secs = t.secs();
            done();
            // The receiver only disappears if the rank is already failing.
            let _ = tx.send((deltas, Vec::new(), loss, secs));
        });
        self.pending.push_back(Pending {
            keys,
            pairs: npairs,
            terms,
            rx,
            step: self.step,
            cached: false,
        });
    }

    /// A batch is about to go to the pool: add the time the pool stood without work to the
    /// `idle` phase. Returns what the task calls when it ends.
    fn pool_started(&mut self) -> impl FnOnce() + Send + 'static {
        use std::sync::atomic::Ordering::SeqCst;
        if self.inflight.fetch_add(1, SeqCst) == 0 {
            let end = self.last_end.load(SeqCst);
            let now = self.t0.elapsed().as_nanos() as u64;
            if end > 0 && now > end {
                self.m.seconds.idle += (now - end) as f64 * 1e-9;
            }
        }
        let (inflight, last_end, t0) = (self.inflight.clone(), self.last_end.clone(), self.t0);
        move || {
            last_end.store(t0.elapsed().as_nanos() as u64, SeqCst);
            inflight.fetch_sub(1, SeqCst);
        }
    }

    /// Hogwild across nodes with the row cache: give the batch's remote rows cache slots,
    /// exchange deltas and rows with their owners (collective), and launch the batch. Up to
    /// `CACHE_DEPTH` batches are on the pool, so the exchange overlaps the previous batch.
    fn cached_launch(&mut self, mut planned: M::Plan, keys: Vec<u64>, refs: &[u32], lr: f32) {
        self.lr_now = lr;
        self.poke();
        while self.pending.len() >= CACHE_DEPTH {
            let prev = self.pending.pop_front().expect("pending batch");
            self.finish(prev, lr);
        }
        self.poke();
        let t = Timer::start();
        let mut adm = std::mem::take(&mut self.adm);
        adm.clear();
        loop {
            // Rows of batches on the pool, or waiting for their rows, stay.
            let oldest = self
                .pending
                .front()
                .map_or(self.step, |p| p.step)
                .min(self.deferred.front().map_or(self.step, |d| d.step));
            let cache = self.cache.as_mut().expect("cached_launch needs the cache");
            if cache.admit(&keys, refs, self.step, oldest, &mut adm) {
                break;
            }
            if self.pending.is_empty() {
                // One batch (with the one waiting for its rows) needs more rows than the cache
                // holds. No pool task holds the cache now: it may grow.
                let want = (cache.len() + keys.len()).max(cache.capacity() * 5 / 4);
                log::warn!(
                    "rank {}: step {}: a batch needs {} remote rows, the cache holds {}: growing it to {want} (raise --cache-rows or lower --batch-size)",
                    self.comm.rank(),
                    self.step,
                    keys.len(),
                    cache.capacity()
                );
                cache.grow(want);
                self.m.cache_rows = want as u64;
            } else {
                // Rows of the batches on the pool cannot be evicted: let them end.
                while let Some(prev) = self.pending.pop_front() {
                    self.finish(prev, lr);
                }
            }
        }
        self.m.cache_hits += adm.hits;
        self.m.cache_misses += adm.misses;
        self.m.cache_refreshes += adm.refreshes;
        self.m.cache_evictions += adm.evictions;
        planned.remap_remote(&adm.slots);
        self.m.seconds.sample += t.secs();
        let seq = self.seq;
        let asked = self.exchange(&adm);
        self.adm = adm;
        if self.cfg.fetch == Fetch::Rma {
            // The rows are in: train now.
            self.launch_cached(planned, lr, self.step);
        } else {
            // Its rows arrive with the exchange that answers this one, which launches it.
            self.deferred.push_back(Deferred {
                planned,
                lr,
                step: self.step,
                asked,
                seq,
            });
        }
    }

    /// Collective: end the batches on the pool and those waiting for their rows: collect the
    /// exchange under way, and send exchanges without new requests (answering the others') until
    /// every batch has its rows. Every rank has as many batches waiting (all take the same
    /// steps), so all run the same rounds.
    fn settle(&mut self, lr: f32) {
        let carry = self.carry.take();
        loop {
            self.collect_posted();
            if self.deferred.is_empty() {
                if let Some(p) = self.sending.take() {
                    self.comm.complete(p);
                }
                break;
            }
            // No new requests; the answers to the others' ride along.
            let mut adm = std::mem::take(&mut self.adm);
            adm.clear();
            self.exchange(&adm);
            self.adm = adm;
        }
        self.carry = carry;
        while let Some(prev) = self.pending.pop_front() {
            self.finish(prev, lr);
        }
    }

    /// Put a batch whose rows are all in place or cached on the pool.
    fn launch_cached(&mut self, planned: M::Plan, lr: f32, step: u64) {
        let in_place = self.shared.clone().expect("hogwild rows");
        let (centers, targets) = (in_place[VERTEX].cells, in_place[in_place.len() - 1].cells);
        let remote = self.cache.as_ref().expect("cache").cells.clone();
        let dim = self.cfg.dim;
        let (tx, rx) = std::sync::mpsc::channel();
        let (npairs, terms) = (planned.examples(), planned.loss_terms());
        let done = self.pool_started();
        self.pool.spawn(move || {
            let t = Timer::start();
            // SAFETY: as in `hogwild_step`: the trainer keeps its shards alive and takes no
            // `&mut` access to their windows until it has received this task's result.
            let (c, tg) = unsafe { (centers.cells(), targets.cells()) };
            let rows = Cells {
                matrices: [c, tg],
                remote: Shared::F32(&remote),
                dim,
            };
            let loss = planned.train(&rows, lr);
            // Let go of the cache's rows before reporting: the trainer may then grow it.
            drop(remote);
            let secs = t.secs();
            done();
            // The receiver only disappears if the rank is already failing.
            let _ = tx.send((Vec::new(), Vec::new(), loss, secs));
        });
        self.pending.push_back(Pending {
            keys: Vec::new(),
            pairs: npairs,
            terms,
            rx,
            step,
            cached: true,
        });
    }

    /// Collective: send the admission's deltas to their owners and add the deltas received to
    /// this rank's rows, and read the rows it asks for, in `--wire-dtype`. With `--fetch
    /// alltoall` the requests ride in the exchange and are answered in the next one a rank
    /// sends, which brings the rows of the batch waiting for them (installed, and the batch
    /// launched); the exchange is split-phase: this step's is posted, and collected at the next
    /// step after its sampling and planning, so that no rank waits for another to finish a step
    /// (a rank may run one exchange ahead; rows then arrive two steps after they are asked for,
    /// deltas are added one step later). With `--fetch rma` the exchange is one all-to-all per
    /// step, the rows are read one-sidedly after a barrier and installed at once.
    /// Returns, per owner, the slots of the rows asked for in this exchange (alltoall).
    fn exchange(&mut self, adm: &Admission) -> Vec<Vec<(u32, bool)>> {
        let comm = self.comm;
        let seq = self.seq;
        self.seq += 1;
        if self.cfg.fetch == Fetch::Rma {
            let (send, asked) = self.encode_exchange(adm, 0);
            let t = Timer::start();
            let recv = comm.all_to_all_v(send);
            self.m.seconds.push += t.secs();
            self.absorb(recv, seq, adm);
            return asked;
        }
        // The exchange a step ago: its walkers, deltas, requests and rows.
        let arrived = self.collect_posted().unwrap_or_else(|| {
            // The first step (or the first after a settle): no sums are known yet.
            self.carried
                .get_or_insert((vec![Vec::new(); comm.size()], [u64::MAX, 0]));
            0
        });
        let (send, asked) = self.encode_exchange(adm, arrived);
        self.posted = Some((comm.post(Channel::Rows, send), seq));
        asked
    }

    /// Let the sends of the last collected exchange move on while this rank computes: over TCP
    /// (without Open MPI's `btl_tcp_progress_thread`) a message moves only while both ranks are
    /// inside MPI, and a test drives the progress engine.
    fn poke(&mut self) {
        if let Some(p) = &mut self.sending {
            if self.comm.progress(p) {
                let done = self.sending.take().expect("checked");
                self.comm.complete(done);
            }
        }
    }

    /// Collect and absorb the exchange under way, if any; returns the walkers it brought.
    fn collect_posted(&mut self) -> Option<u64> {
        let (mut p, seq) = self.posted.take()?;
        let t = Timer::start();
        let recv = self.comm.receive(&mut p);
        // This rank's sends of the exchange before: by now every peer has taken them. Waiting
        // for this exchange's own sends at once would wait for the slowest peer's receive.
        if let Some(prev) = self.sending.replace(p) {
            self.comm.complete(prev);
        }
        self.m.seconds.push += t.secs();
        Some(self.absorb(recv, seq, &Admission::default()))
    }

    /// The messages of an exchange: per peer [pending, tokens: u64 x 2][walker bytes: u32]
    /// [walkers][deltas: u32][deltas x (head, dim x wire)][requests: u32][requests x head][rows
    /// the peer asked for in the exchange this rank absorbed last, dim x wire each, in its
    /// order]. `arrived` walkers (absorbed since the walkers' step) count as this rank's
    /// pending ones. Returns them and, per owner, the slots of the rows asked for.
    #[allow(clippy::type_complexity)]
    fn encode_exchange(
        &mut self,
        adm: &Admission,
        arrived: u64,
    ) -> (Vec<Vec<u8>>, Vec<Vec<(u32, bool)>>) {
        let (comm, cfg, part) = (self.comm, self.cfg, &self.g.part);
        let (dim, wire, n) = (cfg.dim, cfg.wire_dtype, comm.size());
        let wb = wire.row_bytes(dim);
        let rma = cfg.fetch == Fetch::Rma;
        let in_place = self.shared.clone().expect("hogwild rows");
        let head = |key: u64| -> (usize, u32) {
            let (owner, row) = part.locate(key >> 1);
            (owner, (row as u32) | (((key & 1) as u32) << 31))
        };
        let t = Timer::start();
        let (walkers, mut counts) = match self.carry.take() {
            Some((w, c)) => (w, c),
            None => (vec![Vec::new(); n], [0; 2]),
        };
        counts[0] += arrived;
        let mut send: Vec<Vec<u8>> = walkers
            .into_iter()
            .map(|w| {
                let mut b = Vec::with_capacity(28 + w.len());
                b.extend_from_slice(&counts[0].to_le_bytes());
                b.extend_from_slice(&counts[1].to_le_bytes());
                b.extend_from_slice(&(w.len() as u32).to_le_bytes());
                b.extend_from_slice(&w);
                b
            })
            .collect();
        let mut by_owner: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, &key) in adm.push_keys.iter().enumerate() {
            by_owner[head(key).0].push(i);
        }
        let mut enc = vec![0u8; wb];
        for (o, idx) in by_owner.iter().enumerate() {
            send[o].extend_from_slice(&(idx.len() as u32).to_le_bytes());
            for &i in idx {
                // Dithered per delta: the step, the row and the owner seed the rounding.
                let dither = self.cfg.seed ^ (self.step << 24) ^ adm.push_keys[i].rotate_left(40);
                encode_wire(
                    wire,
                    &adm.push_vals[i * dim..(i + 1) * dim],
                    &mut enc,
                    Some(dither),
                );
                let h = (self.update_code).encode(head(adm.push_keys[i]).1, adm.push_refs[i]);
                send[o].extend_from_slice(&h.to_le_bytes());
                send[o].extend_from_slice(&enc);
            }
        }
        self.m.push_bytes_sent += adm.push_keys.len() as u64 * (DELTA_HEAD + wb) as u64;
        // Where each owner's rows go, in request order.
        let mut asked: Vec<Vec<(u32, bool)>> = vec![Vec::new(); n];
        let mut heads: Vec<Vec<u32>> = vec![Vec::new(); n];
        for &(slot, key, new) in &adm.fetch {
            let (o, h) = head(key);
            heads[o].push(h);
            asked[o].push((slot, new));
        }
        let mut row = vec![0f32; dim];
        for (o, b) in send.iter_mut().enumerate() {
            let h = if rma { &[][..] } else { &heads[o][..] };
            b.extend_from_slice(&(h.len() as u32).to_le_bytes());
            for x in h {
                b.extend_from_slice(&x.to_le_bytes());
            }
            // The rows `o` asked for in the exchange absorbed last, as they are now.
            for &h in &self.to_answer[o] {
                let (m, at) = self.own_row(h);
                // SAFETY: the shards outlive this call and nothing takes `&mut` access to
                // their windows while cells are in use; pool tasks update rows with relaxed
                // atomic accesses, as these are.
                let cells = unsafe { in_place[m].cells.cells() };
                cells::load(cells.slice(at, dim), &mut row);
                encode_wire(wire, &row, &mut enc, None);
                b.extend_from_slice(&enc);
            }
        }
        self.m.seconds.push += t.secs();
        (send, asked)
    }

    /// Matrix and value offset of one of this rank's rows, from its head in a message; a head
    /// of a row it does not own ends the job.
    fn own_row(&self, h: u32) -> (usize, usize) {
        let (m, row) = ((h >> 31) as usize, (h & 0x7fff_ffff) as usize);
        if m >= self.shards.len() || row >= self.shards[m].rows {
            fatal(
                self.comm,
                Some(self.step),
                &"received a row this rank does not own",
            );
        }
        let in_place = self.shared.as_ref().expect("hogwild rows");
        let first =
            in_place[m].first_row[self.comm.rank()].expect("a rank's own rows are in place");
        (m, (first as usize + row) * self.cfg.dim)
    }

    /// Take in exchange `seq`: add the deltas for this rank's rows (as the pool adds: relaxed
    /// atomics), keep the requests for the next exchange, hand its walkers and the global sums
    /// to the driver (`carried`), install the rows for the batch that asked for them in
    /// exchange `seq - 1` and launch it. With `--fetch rma` read `adm`'s rows one-sidedly.
    /// Returns the number of walkers that arrived.
    fn absorb(&mut self, recv: Vec<Vec<u8>>, seq: u64, adm: &Admission) -> u64 {
        let (comm, cfg, part) = (self.comm, self.cfg, &self.g.part);
        let (dim, wire, n) = (cfg.dim, cfg.wire_dtype, comm.size());
        let wb = wire.row_bytes(dim);
        let rma = cfg.fetch == Fetch::Rma;
        let in_place = self.shared.clone().expect("hogwild rows");
        let bad = |what: &str| -> ! {
            fatal(comm, Some(self.step), &format!("received {what}"));
        };
        let t = Timer::start();
        let mut row = vec![0f32; dim];
        let mut sums = [0u64; 2];
        let mut arrived = Vec::with_capacity(n);
        let mut walkers = 0;
        let u32_at = |b: &[u8], i: usize| -> usize {
            match b.get(i..i + 4) {
                Some(x) => u32::from_le_bytes(x.try_into().expect("4 bytes")) as usize,
                None => bad("a truncated exchange message"),
            }
        };
        let waiting = match self.deferred.front() {
            Some(d) if d.seq + 1 == seq => self.deferred.pop_front(),
            _ => None,
        };
        let expected: Vec<usize> = (0..n)
            .map(|o| waiting.as_ref().map_or(0, |d| d.asked[o].len()))
            .collect();
        let mut rows_in: Vec<&[u8]> = Vec::with_capacity(n);
        let mut combine = std::mem::replace(&mut self.combine, Combine::new(0));
        for (src, b) in recv.iter().enumerate() {
            if b.len() < 24 {
                bad("a truncated exchange message");
            }
            for (i, x) in sums.iter_mut().enumerate() {
                *x += u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().expect("8 bytes"));
            }
            let wl = u32_at(b, 16);
            let Some(w) = b.get(20..20 + wl) else {
                bad("a truncated exchange message")
            };
            walkers += WalkEngine::count_encoded(w, self.g.num_nodes());
            arrived.push(w.to_vec());
            let mut at = 20 + wl;
            let deltas = u32_at(b, at);
            at += 4;
            let rec = DELTA_HEAD + wb;
            let Some(d) = b.get(at..at + deltas * rec) else {
                bad("a truncated exchange message")
            };
            at += deltas * rec;
            self.m.push_bytes_received += d.len() as u64;
            for r in d.chunks_exact(rec) {
                let (h, updates) = (self.update_code)
                    .decode(u32::from_le_bytes(r[..4].try_into().expect("4 bytes")));
                let at = self.own_row(h);
                decode_wire(wire, &r[DELTA_HEAD..], &mut row);
                combine.add(at, &row, updates);
            }
            let reqs = u32_at(b, at);
            at += 4;
            let Some(q) = b.get(at..at + 4 * reqs) else {
                bad("a truncated exchange message")
            };
            at += 4 * reqs;
            self.to_answer[src].clear();
            self.to_answer[src].extend(
                q.chunks_exact(4)
                    .map(|h| u32::from_le_bytes(h.try_into().expect("4 bytes"))),
            );
            let r = &b[at..];
            if r.len() != expected[src] * wb {
                bad(&format!(
                    "{} bytes of rows from rank {src} for {} rows asked",
                    r.len(),
                    expected[src]
                ));
            }
            rows_in.push(r);
        }
        // Copies that synchronised in this exchange are combined (the rule in `cache`).
        let norm2 = |(m, o): (usize, usize)| {
            // SAFETY: as in `encode_exchange`.
            let cells = unsafe { in_place[m].cells.cells() };
            cells::load(cells.slice(o, dim), &mut row);
            row.iter().map(|x| x * x).sum::<f32>()
        };
        self.m.cache_deltas_damped += combine.drain(self.lr_now, norm2, |(m, o), delta, _| {
            // SAFETY: as in `encode_exchange`.
            let cells = unsafe { in_place[m].cells.cells() };
            cells::add_to(cells.slice(o, dim), delta);
        });
        self.combine = combine;
        // Walkers of settle's exchanges join those not yet handed over.
        match &mut self.carried {
            Some((w, s)) => {
                for (mine, new) in w.iter_mut().zip(arrived) {
                    mine.extend_from_slice(&new);
                }
                *s = sums;
            }
            None => self.carried = Some((arrived, sums)),
        }
        self.m.seconds.apply += t.secs();

        let t = Timer::start();
        let cache = self.cache.as_mut().expect("exchange needs the cache");
        if let Some(d) = &waiting {
            for (o, b) in rows_in.iter().enumerate() {
                self.m.fetch_bytes += b.len() as u64;
                for (&(slot, new), r) in d.asked[o].iter().zip(b.chunks_exact(wb)) {
                    decode_wire(wire, r, &mut row);
                    cache.install(slot, &row, new);
                }
            }
        }
        let fetched = adm.fetch.len();
        if rma {
            // Every owner has added the deltas before any rank reads.
            comm.barrier();
            let mut by: Vec<Vec<Vec<(u32, u32)>>> = vec![vec![Vec::new(); n]; self.shards.len()];
            let mut slot_new = Vec::with_capacity(fetched);
            for &(slot, key, new) in &adm.fetch {
                let (o, r) = part.locate(key >> 1);
                by[(key & 1) as usize][o].push((slot_new.len() as u32, r as u32));
                slot_new.push((slot, new));
            }
            let mut rows = vec![0f32; fetched * dim];
            for (m, shard) in self.shards.iter().enumerate() {
                let c = fetch_remote(comm, cfg, shard, &by[m], &mut rows);
                self.m.fetch_bytes += (c * shard.row_bytes()) as u64;
                self.m.one_sided_bytes += (c * shard.row_bytes()) as u64;
            }
            for (&(slot, new), r) in slot_new.iter().zip(rows.chunks_exact(dim)) {
                cache.install(slot, r, new);
            }
        }
        self.m.remote_rows += fetched as u64;
        self.m.remote_rows += waiting
            .as_ref()
            .map_or(0, |d| d.asked.iter().map(Vec::len).sum::<usize>())
            as u64;
        self.m.seconds.fetch += t.secs();
        if let Some(d) = waiting {
            self.launch_cached(d.planned, d.lr, d.step);
        }
        walkers
    }

    /// Follow the loss per term; say so once if it climbs far past its lowest (the run is
    /// training badly: diverging, or its rows' copies too stale).
    fn watch_loss(&mut self, loss: f64, terms: u64) {
        if let Some((now, best)) =
            self.loss_watch
                .add(loss, terms, self.m.pairs, &mut self.m.loss_curve)
        {
            log::warn!(
                "rank {}: step {}: loss per term {now:.3}, up from {best:.3}: the run is training badly (diverging, or copies of rows too stale); lower --lr or --cache-refresh (docs/troubleshooting.md)",
                self.comm.rank(),
                self.step
            );
        }
    }

    /// Collective: this rank's share of the next negative pool starts on its way to every rank
    /// (the pool in use stays until [`Trainer::install_pool`]). Every rank posts and installs
    /// in the same order.
    fn post_pool(&mut self) -> Posted {
        let share = encode_ids(&self.neg.draw_share(&mut self.rng), self.narrow_ids());
        self.comm.post(Channel::Pool, vec![share; self.comm.size()])
    }

    /// The pool every rank's posted shares make, the same on every rank. This rank's own sends
    /// are waited for at the next install (or [`Trainer::finish_pool`]), when every rank has
    /// long received them.
    fn install_pool(&mut self, mut posted: Posted) {
        let shares = self.comm.receive(&mut posted);
        let narrow = self.narrow_ids();
        self.neg
            .install(shares.iter().map(|b| decode_ids(b, narrow)));
        self.finish_pool();
        self.pool_sending = Some(posted);
    }

    /// Whether node ids travel in 4 bytes (graphs of fewer than 2^32 nodes).
    fn narrow_ids(&self) -> bool {
        self.g.num_nodes() <= u64::from(u32::MAX)
    }

    /// Wait for this rank's shares of the installed pool to leave (before the job's end).
    fn finish_pool(&mut self) {
        if let Some(p) = self.pool_sending.take() {
            self.comm.complete(p);
        }
    }

    /// Apply the batch still in flight, if any (end of training).
    /// Collective when rows are node-shared: returns when no rank of the node updates rows.
    pub fn drain(&mut self, lr: f32) {
        if let Some(p) = self.next_pool.take() {
            self.install_pool(p);
        }
        self.finish_pool();
        if self.replica.is_some() {
            self.replica_drain();
            return;
        }
        self.settle(lr);
        if let Some(cache) = &mut self.cache {
            // Owners get every cached delta (the output and checkpoints hold them).
            let mut adm = std::mem::take(&mut self.adm);
            cache.flush(&mut adm);
            let carry = self.carry.take();
            self.exchange(&adm);
            self.carry = carry;
            self.adm = adm;
            // Collect it (split-phase exchanges).
            self.settle(lr);
        }
        if self.node_rows {
            self.comm.barrier();
        }
    }

    /// Start computing a batch's gradients on the pool; returns at once.
    fn launch(&self, b: Batch<M::Plan>) -> Pending {
        let dim = self.cfg.dim;
        let (tx, rx) = std::sync::mpsc::channel();
        let (pairs, terms) = (b.plan.examples(), b.plan.loss_terms());
        let Batch { keys, plan, rows } = b;
        self.pool.spawn(move || {
            let t = Timer::start();
            let g = plan.gradients(&rows, dim);
            // The receiver only disappears if the rank is already failing.
            let _ = tx.send((g.rows, g.replicated, g.loss, t.secs()));
        });
        Pending {
            keys,
            pairs,
            terms,
            rx,
            step: self.step,
            cached: false,
        }
    }

    /// Wait for a launched batch, check it, push its gradients and apply them.
    fn finish(&mut self, p: Pending, lr: f32) {
        let (comm, g, dim) = (self.comm, self.g, self.cfg.dim);
        let me = comm.rank();
        let t = Timer::start();
        let Ok((grads, replicated, loss, compute_secs)) = p.rx.recv() else {
            fatal(
                comm,
                Some(self.step),
                &"a compute task ended without a result",
            );
        };
        self.m.seconds.wait += t.secs();
        self.m.seconds.compute += compute_secs;
        if p.cached {
            if !loss.is_finite() {
                fatal(comm, Some(self.step), &"non-finite loss; lower --lr");
            }
            self.m.loss_sum += loss;
            self.m.loss_terms += p.terms;
            self.m.pairs += p.pairs as u64;
            self.m.steps += 1;
            self.watch_loss(loss, p.terms);
            return;
        }
        let keys = p.keys;
        let nslots = keys.len();
        let mut grads = grads;
        let finite = loss.is_finite() && grads.iter().all(|x| x.is_finite());
        if !finite && self.cfg.on_nan == OnNan::Abort {
            let bad: Vec<u64> = (0..nslots)
                .filter(|&s| grads[s * dim..(s + 1) * dim].iter().any(|x| !x.is_finite()))
                .take(5)
                .map(|s| keys[s] >> 1)
                .collect();
            fatal(
                comm,
                Some(self.step),
                &format!(
                    "non-finite loss or gradient{}; lower --lr, use --optimizer adagrad or --clip-grad, or --on-nan skip to drop such batches",
                    if bad.is_empty() {
                        String::new()
                    } else {
                        format!(" (rows of nodes {bad:?})")
                    }
                ),
            );
        }
        // --on-nan skip: drop the whole batch (it still takes part in the exchange).
        let keys = if finite {
            keys
        } else {
            self.m.skipped_batches += 1;
            log::warn!("rank {me}: step {}: non-finite batch skipped", self.step);
            Vec::new()
        };
        if self.cfg.clip_grad > 0.0 {
            let c = self.cfg.clip_grad;
            for g in grads.chunks_exact_mut(dim) {
                let norm = g.iter().map(|x| x * x).sum::<f32>().sqrt();
                if norm > c {
                    g.iter_mut().for_each(|x| *x *= c / norm);
                }
            }
        }
        if finite {
            self.m.loss_sum += loss;
            self.m.loss_terms += p.terms;
            self.m.pairs += p.pairs as u64;
            self.watch_loss(loss, p.terms);
        }

        // Push: gradient rows to their owners in one exchange; local rows applied directly.
        // Batched gradients travel in --wire-dtype (f32, or bf16: f32's range); whatever
        // hogwild pushes through here, in f32.
        let wire = if self.cfg.update == Update::Batched {
            self.cfg.wire_dtype
        } else {
            WireDtype::F32
        };
        let wb = wire.row_bytes(dim);
        let t = Timer::start();
        let mut send = vec![Vec::new(); comm.size()];
        let mut mine: Vec<Vec<(u32, u32)>> = vec![Vec::new(); self.shards.len()];
        for (s, &key) in keys.iter().enumerate() {
            let (owner, row) = g.part.locate(key >> 1);
            let m = (key & 1) as usize;
            if owner == me {
                mine[m].push((row as u32, s as u32));
            } else {
                let b = &mut send[owner];
                b.extend_from_slice(&((row as u32) | ((m as u32) << 31)).to_le_bytes());
                let at = b.len();
                b.resize(at + wb, 0);
                encode_wire(wire, &grads[s * dim..(s + 1) * dim], &mut b[at..], None);
            }
        }
        self.m.push_bytes_sent += send.iter().map(|b| b.len() as u64).sum::<u64>();
        // Hogwild on one node with node-shared rows: every row was updated in place.
        let recv = if self.shared.as_ref().is_some_and(|s| s[VERTEX].all()) {
            vec![Vec::new(); comm.size()]
        } else {
            comm.all_to_all_v(send)
        };
        self.m.push_bytes_received += recv.iter().map(|b| b.len() as u64).sum::<u64>();
        self.m.seconds.push += t.secs();

        let t = Timer::start();
        // Received rows: [row | matrix << 31][dim x wire], in rank order (deterministic).
        let rec = 4 + wb;
        let mut theirs: Vec<(Vec<u32>, Vec<f32>)> =
            vec![(Vec::new(), Vec::new()); self.shards.len()];
        for b in &recv {
            for r in b.chunks_exact(rec) {
                let head = u32::from_le_bytes(r[..4].try_into().expect("4 bytes"));
                let (m, row_id) = ((head >> 31) as usize, head & 0x7fff_ffff);
                if m >= self.shards.len() || row_id as usize >= self.shards[m].rows {
                    fatal(
                        comm,
                        Some(self.step),
                        &"received a gradient for a row this rank does not own",
                    );
                }
                theirs[m].0.push(row_id);
                let vals = &mut theirs[m].1;
                let at = vals.len();
                vals.resize(at + dim, 0.0);
                decode_wire(wire, &r[4..], &mut vals[at..]);
            }
        }
        if let Some(in_place) = &self.shared {
            // Hogwild: this node's rows were updated in place; received rows are deltas, added
            // as the pool adds (relaxed atomics: the node's other ranks may update them now).
            for (m, rows) in in_place.iter().enumerate() {
                let first = rows.first_row[me].expect("a rank's own rows are in place") as usize;
                // SAFETY: the shards outlive this call, and nothing takes `&mut` access to their
                // windows while cells are in use (rows are applied, snapshot or dropped only
                // after `drain`). Pool tasks may be updating other rows meanwhile: these are
                // relaxed atomic accesses, as theirs are.
                let cells = unsafe { rows.cells.cells() };
                for (&r, d) in theirs[m].0.iter().zip(theirs[m].1.chunks_exact(dim)) {
                    cells::add_to(cells.row(first + r as usize, dim), d);
                }
            }
            self.m.seconds.apply += t.secs();
            self.m.steps += 1;
            return;
        }
        let parallel = self.cfg.max_staleness == 0;
        for (m, shard) in self.shards.iter_mut().enumerate() {
            let local = mine[m]
                .iter()
                .map(|&(r, s)| (r, &grads[s as usize * dim..(s as usize + 1) * dim]));
            let remote = theirs[m]
                .0
                .iter()
                .copied()
                .zip(theirs[m].1.chunks_exact(dim));
            if parallel {
                // The pool is idle between batches: rows are updated in parallel.
                shard.apply_par(&self.pool, &self.opt, lr, local.chain(remote).collect());
            } else {
                // The pool computes the next batch meanwhile: apply on this thread.
                shard.apply(&self.opt, lr, local.chain(remote));
            }
        }
        self.m.seconds.apply += t.secs();
        // Parameters every rank holds whole (relations): their gradients summed over the ranks
        // (collective; a skipped batch adds zeros), then the same update everywhere.
        let n = self.model.replicated_len();
        if n > 0 {
            let t = Timer::start();
            let mut sum = if finite && replicated.len() == n {
                replicated
            } else {
                vec![0f32; n]
            };
            comm.all_reduce_sum_f32(&mut sum);
            self.m.seconds.push += t.secs();
            let t = Timer::start();
            self.model.apply_replicated(&sum, lr);
            self.m.seconds.apply += t.secs();
        }
        self.m.steps += 1;
    }
}

/// A fair coin for the `n`-th reference (a SplitMix64 finalizer's top bit): which references
/// form the random half of `remote_uses_half`, the same for every run.
fn coin(n: u64) -> bool {
    let mut z = n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) >> 63 == 1
}

/// Collective: whether this node's shared segments fit where Open MPI puts them (`/dev/shm`,
/// measured with Open MPI 4.1): every rank's rows (`local_nodes` of them per matrix), and for
/// walks its adjacency (`csr_bytes`), times the ranks on the node. When one node lacks the room every rank falls back to private memory
/// with a warning, instead of a bus error when a page of the segment cannot be backed.
/// `GRAPHSCALE_SHM_BYTES` overrides the free space (test hook).
fn node_memory_fits(comm: &Comm, cfg: &TrainConfig, local_nodes: usize, csr_bytes: u64) -> bool {
    let rows = (local_nodes * cfg.dim * cfg.dtype.size() * cfg.matrices()) as u64;
    let walks = matches!(cfg.model, Model::Deepwalk | Model::Node2vec);
    let csr = if walks { csr_bytes } else { 0 };
    let most = comm.max_u64(rows + csr);
    // A rank alone on its node shares nothing, but takes part in the agreement all the same.
    let need = most.saturating_mul(comm.node_size() as u64);
    let free = if comm.node_size() < 2 {
        None
    } else {
        std::env::var("GRAPHSCALE_SHM_BYTES")
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .or_else(|| free_bytes("/dev/shm"))
    };
    let fits = !matches!(free, Some(f) if need > f);
    let all = comm.all_reduce_u64(&[u64::from(fits)], ReduceOp::Min)[0] == 1;
    if !fits && comm.rank() == 0 {
        log::warn!(
            "rank {}: node-shared memory needs {:.1} MiB in /dev/shm on this node, {:.1} MiB are \
             free: using --node-memory private (make /dev/shm larger to share rows and walks)",
            comm.rank(),
            need as f64 / 1048576.0,
            free.unwrap_or(0) as f64 / 1048576.0
        );
    } else if !all && comm.rank() == 0 {
        log::warn!("another node lacks room in /dev/shm: using --node-memory private everywhere");
    }
    all
}

/// Bytes available to an unprivileged writer on the file system holding `path`.
fn free_bytes(path: &str) -> Option<u64> {
    let c = std::ffi::CString::new(path).ok()?;
    // SAFETY: an all-zero `statvfs` is a valid value of this plain C struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a valid out-pointer for the call.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    (rc == 0).then(|| st.f_bavail as u64 * st.f_frsize as u64)
}

/// Hogwild batches on the pool at once across nodes with the row cache: the next batch's
/// exchange runs while the pool trains the previous one.
const CACHE_DEPTH: usize = 2;

/// Rows of the remote-row cache: `--cache-rows`, or by default as many rows as this rank owns
/// (over its matrices), at most the rows of other nodes.
fn cache_capacity(cfg: &TrainConfig, g: &LocalGraph, rows: &[InPlaceRows]) -> usize {
    let in_place = rows[VERTEX].cells.len() / cfg.dim;
    let remote = g.num_nodes().saturating_sub(in_place as u64) as usize * cfg.matrices();
    match cfg.cache_rows {
        Some(n) => n,
        None => cfg.cache_rows_for(g.num_local()).min(remote),
    }
}

/// Read the remote rows `remote[owner] = [(slot, row)]` of `shard` one-sidedly into
/// `rows[slot]` as f32. Returns the number of rows read (the caller counts their bytes in
/// `fetch_bytes` and `one_sided_bytes`).
fn fetch_remote(
    comm: &Comm,
    cfg: &TrainConfig,
    shard: &Shard,
    remote: &[Vec<(u32, u32)>],
    rows: &mut [f32],
) -> usize {
    let (rb, dim) = (shard.row_bytes(), shard.dim);
    let wanted: Vec<Vec<u32>> = remote
        .iter()
        .map(|v| v.iter().map(|&(_, r)| r).collect())
        .collect();
    let requests: Vec<(usize, &[u32])> = wanted
        .iter()
        .enumerate()
        .filter(|(_, v)| !v.is_empty())
        .map(|(o, v)| (o, v.as_slice()))
        .collect();
    let count: usize = requests.iter().map(|(_, v)| v.len()).sum();
    if count == 0 {
        return 0;
    }
    let mut buf = vec![0u8; count * rb];
    shard.window.get_rows(
        comm.watchdog(),
        &requests,
        rb,
        cfg.request_batch_size,
        &mut buf,
    );
    let mut i = 0;
    for (o, _) in &requests {
        for &(s, _) in &remote[*o] {
            let s = s as usize;
            decode_row(
                shard.dtype,
                &buf[i * rb..(i + 1) * rb],
                &mut rows[s * dim..(s + 1) * dim],
            );
            i += 1;
        }
    }
    count
}

impl<M: model::Model> Drop for Trainer<'_, M> {
    /// A task may still update rows in place: wait for it before the shards go away.
    fn drop(&mut self) {
        for p in self.pending.drain(..) {
            let _ = p.rx.recv();
        }
    }
}

/// Edge samples per node below which LINE warns that it is under-trained.
const LINE_MIN_SAMPLES_PER_NODE: f64 = 1000.0;

/// Seconds as `42s`, `3m05s` or `2h07m`.
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
            "{:5.1}% of the run  step {}  rank-0 pairs/s {:.0}  loss {:.4}  lr {:.5}  elapsed {}  left ~{eta}",
            100.0 * frac,
            m.steps,
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
