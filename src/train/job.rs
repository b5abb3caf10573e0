//! A training job, collective: load the graph, allocate storage, train the model, write the
//! output.

use super::*;

/// Collective: load the graph, allocate storage, train, write the output.
pub fn run(comm: &Comm, cfg: &TrainConfig) -> Result<Outcome> {
    if cfg.model == Model::Sage {
        return super::sage::run(comm, cfg);
    }
    // What the process holds before it reads anything (libraries, MPI's buffers): the base of
    // the printed memory estimate.
    let process = crate::stats::peak_rss_bytes();
    let num_nodes = agree(comm, graph_nodes(cfg))?;
    // The storage (rows, optimizer state, the row cache, replicas) follows from the partition:
    // checked against --max-memory before anything is loaded.
    let local_nodes =
        Partitioner::new(cfg.partition, num_nodes, comm.size()).num_local(comm.rank());
    let rows = local_nodes as u64;
    let (storage, replica) = check_storage(comm, cfg, num_nodes, local_nodes)?;
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
    let mut settled = settle_walk_batch(comm, cfg, &g);
    let mut budget = cfg.clone();
    if let Some(pairs) = budget.settle_lr(g.num_nodes(), g.file_edges) {
        if comm.rank() == 0 && budget.lr_is_default {
            eprintln!(
                "graphscale: --lr {} (default for {pairs:.0} training pairs per node), {} (docs/tuning.md)",
                budget.lr,
                if budget.lr_hold >= 1.0 {
                    "held to the end of the run".to_string()
                } else {
                    format!(
                        "held for {:.0}% of the run, then decaying linearly",
                        100.0 * budget.lr_hold
                    )
                }
            );
        }
        let c = settled.get_or_insert_with(|| cfg.clone());
        (c.lr, c.lr_hold) = (budget.lr, budget.lr_hold);
    }
    let cfg = settled.as_ref().unwrap_or(cfg);
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
        let maxima = [max_est, max_rows, max_csr, max_samplers, max_process];
        announce(cfg, &g, rows, replica, maxima);
    }
    if cfg.model.is_kg() {
        run_model::<Kge>(comm, cfg, &g, load_secs, estimate)
    } else {
        run_model::<Sgns>(comm, cfg, &g, load_secs, estimate)
    }
}

/// Collective: train `M` on the loaded graph and write its output.
pub(super) fn run_model<M: model::Model>(
    comm: &Comm,
    cfg: &TrainConfig,
    g: &LocalGraph,
    load_secs: f64,
    estimate: u64,
) -> Result<Outcome> {
    let triples = read_triples(comm, cfg)?;
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
    tr.m.nodes = job_nodes(comm);
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
        let t = Timer::start();
        write_output(comm, cfg, g, &tr, out)?;
        tr.m.seconds.output = t.secs();
    }
    tr.m.peak_rss_bytes = peak_rss_bytes();
    let t = comm.traffic();
    tr.m.comm_bytes_sent = t.sent.load(std::sync::atomic::Ordering::Relaxed);
    tr.m.comm_bytes_received = t.received.load(std::sync::atomic::Ordering::Relaxed);
    gather_metrics(comm, cfg, &tr.m)
}

/// Collective: every rank's metrics to every rank, written to `--metrics` (one JSON line per
/// rank) by rank 0.
pub(super) fn gather_metrics(comm: &Comm, cfg: &TrainConfig, m: &RankMetrics) -> Result<Outcome> {
    let mine = serde_json::to_vec(m).expect("metrics serialize");
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

/// Collective: whether this node's shared segments fit where Open MPI puts them (`/dev/shm`,
/// measured with Open MPI 4.1): every rank's rows (`local_nodes` of them per matrix), and for
/// walks its adjacency (`csr_bytes`), times the ranks on the node. When one node lacks the room every rank falls back to private memory
/// with a warning, instead of a bus error when a page of the segment cannot be backed.
/// `GRAPHSCALE_SHM_BYTES` overrides the free space (test hook).
pub(super) fn node_memory_fits(
    comm: &Comm,
    cfg: &TrainConfig,
    local_nodes: usize,
    csr_bytes: u64,
) -> bool {
    let rows = (local_nodes * cfg.dim * cfg.dtype.size() * cfg.matrices()) as u64;
    let walks = matches!(cfg.model, Model::Deepwalk | Model::Node2vec);
    let csr = if walks { csr_bytes } else { 0 };
    shm_fits(comm, rows + csr)
}

/// Collective: whether every node's `/dev/shm` holds `bytes` per rank for all of its ranks
/// ([`node_memory_fits`]' rule, for any segments); warns (rank 0) when not.
pub(crate) fn shm_fits(comm: &Comm, bytes: u64) -> bool {
    let most = comm.max_u64(bytes);
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
pub(super) fn free_bytes(path: &str) -> Option<u64> {
    let c = std::ffi::CString::new(path).ok()?;
    // SAFETY: an all-zero `statvfs` is a valid value of this plain C struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a valid out-pointer for the call.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    (rc == 0).then(|| st.f_bavail as u64 * st.f_frsize as u64)
}

/// `--batch-size` left to its default, a walk model whose ranks train copies of remote rows
/// across nodes: the step of [`crate::config::default_walk_batch`] for this graph's hubs
/// (collective, the same on every rank). `None`: the configuration stands.
fn settle_walk_batch(comm: &Comm, cfg: &TrainConfig, g: &LocalGraph) -> Option<TrainConfig> {
    let trains_copies = cfg.batch_size_is_default
        && matches!(cfg.model, Model::Deepwalk | Model::Node2vec)
        && cfg.update == Update::Hogwild
        && cfg.strategy == Strategy::Sharded
        && comm.node_size() < comm.size();
    if !trains_copies {
        return None;
    }
    // Every rank keeps its own copies: a row has copies on every rank but those of its own
    // node. The rows of the smallest node have the most.
    let smallest = comm.all_reduce_u64(&[comm.node_size() as u64], ReduceOp::Min)[0];
    let copies = comm.size() as u64 - smallest.min(comm.size() as u64);
    let hub = (0..g.num_local())
        .map(|i| g.degree(i) as u64)
        .max()
        .unwrap_or(0);
    let hub = comm.all_reduce_u64(&[hub], ReduceOp::Max)[0];
    let share = hub as f64 / comm.sum_u64(g.local_entries()).max(1) as f64;
    let batch = crate::config::default_walk_batch(comm.size(), copies, share);
    if comm.rank() == 0 && batch != cfg.batch_size {
        eprintln!(
            "graphscale: --batch-size {batch} pairs per step (default with {copies} ranks on other nodes keeping copies of a row: the hottest node takes {:.3}% of the walks, and the copies of its row must not take more than {} updates per step unseen by each other; docs/tuning.md)",
            100.0 * share,
            crate::config::hub_updates_bound(copies).round()
        );
    }
    Some(TrainConfig {
        batch_size: batch,
        ..cfg.clone()
    })
}

/// The graph file's node count; an error for a walk or edge model given triples, or a
/// knowledge-graph model given a plain graph.
fn graph_nodes(cfg: &TrainConfig) -> Result<u64> {
    crate::graph::h5::EdgeFile::open(&cfg.graph).and_then(|f| {
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
})
}

/// Collective: the storage estimate of this rank's rows (with the row cache and a replicated
/// strategy's copy of every row), checked against `--max-memory` on every rank before anything
/// is loaded. Returns the storage and the replica's bytes.
fn check_storage(
    comm: &Comm,
    cfg: &TrainConfig,
    num_nodes: u64,
    local_nodes: usize,
) -> Result<(u64, u64)> {
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
    let cache = RowCache::footprint(cached, cfg.dim, 2 * num_nodes);
    let storage = cfg.memory_estimate(rows) + cache + replica;
    agree(
        comm,
        match cfg.max_memory {
            Some(limit) if storage > limit && cache > 0 => {
                Err(Error::config(format!(
                    "the storage estimate {} (of which the remote-row cache, --cache-rows {}: {}) exceeds --max-memory {}; lower --cache-rows (0 disables the cache), use more ranks, or a smaller --dim",
                    human_bytes(storage),
                    cached,
                    human_bytes(cache),
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
    Ok((storage, replica))
}

/// Rank 0: the job's size and memory per rank (`maxima`: the estimate, rows, adjacency,
/// samplers and the process before loading, largest over ranks), and where rows live.
fn announce(cfg: &TrainConfig, g: &LocalGraph, rows: u64, replica: u64, maxima: [u64; 5]) {
    let [max_est, max_rows, max_csr, max_samplers, max_process] = maxima;
    eprintln!(
        "graphscale: {} nodes, {} edges, {} ranks; memory per rank {} (storage: {} rows x {} dims x {} B x {} matrices + optimizer state; adjacency {}; samplers and step buffers {}; the process before loading {})",
        g.num_nodes(),
        g.file_edges,
        g.part.ranks(),
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

/// This rank's weighed training triples, and the validation triples with their filter.
type KgTriples = (Vec<Weighted>, Option<(Vec<Triple>, Vec<Triple>)>);

/// A knowledge graph's triples, collective: this rank's contiguous share of the file, weighed;
/// with --valid, the validation triples and the filter (every training and validation triple)
/// on every rank. `None` for the other models.
fn read_triples(comm: &Comm, cfg: &TrainConfig) -> Result<Option<KgTriples>> {
    if !cfg.model.is_kg() {
        return Ok(None);
    }
    let read = TripleFile::open(&cfg.graph).and_then(|f| {
        let (n, r) = (f.len(), comm.rank() as u64);
        let p = comm.size() as u64;
        let mine = f.read(n * r / p, n * (r + 1) / p)?;
        let valid = match &cfg.kg.valid {
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
    Ok(Some((kg::weigh(comm, &mine, cfg.kg.triple_weights), valid)))
}

/// Collective: the embeddings (and rank 0's names and the model's extra output) written to a
/// partial file beside `out` and renamed over it once complete: a failed or killed job leaves
/// an earlier file there intact.
fn write_output<M: model::Model>(
    comm: &Comm,
    cfg: &TrainConfig,
    g: &LocalGraph,
    tr: &Trainer<'_, M>,
    out: &std::path::Path,
) -> Result<()> {
    crate::outfile::write_collective(
        comm,
        out,
        |tmp| crate::embeddings::write_embeddings(comm, tmp, g, &tr.shards[VERTEX], cfg),
        |tmp| {
            crate::embeddings::write_names(tmp, &cfg.graph, cfg.model.is_kg())
                .and_then(|()| tr.model.write_output(tmp))
        },
    )
}
