//! GraphSAGE's work source (`--model sage`, issue 34). Two strategies over one driver:
//! `--strategy sharded` (the default, `sharded.rs`): every rank owns its nodes' adjacency and
//! feature rows, the owners answer the sampling of their nodes and the input rows of other ranks
//! are read one-sidedly through a read-only cache; `--strategy replicated` (`whole.rs`, the
//! baseline): every rank holds the whole graph and every feature row. A step's seeds are a
//! global batch of the shuffled training nodes (the same on every rank), each rank taking its
//! share; each rank samples its blocks (`sample::neighbors`) and computes its gradient
//! (`model::sage`), the gradients are summed over the ranks (one all-reduce of the dense
//! weights: their bytes are counted) and every rank takes the same Adam step. After every epoch
//! the validation nodes are scored with every neighbour; the parameters of the best validation
//! epoch are kept, and `--patience` epochs without a better one end training. The output holds
//! the weights, the effective configuration and every node's class scores (`embeddings`).

mod ckpt;
mod eval;
mod labels;
mod learned;
mod sharded;
mod unsup;
mod whole;

use std::path::Path;

use rand::seq::SliceRandom;
use rand::SeedableRng;

use crate::comm::{Comm, ReduceOp};
use crate::config::{FeatureNorm, SageInput, SageObjective, SageSettings, Strategy, TrainConfig};
use crate::error::{Error, Result};
use crate::estimate::{SageHeld, SageShape};
use crate::graph::nodedata::{self, TEST, TRAIN, VALID};
use crate::model::sage::{Adam, Aggregator, Batch, Input, Sage, Work};
use crate::sample::neighbors::Blocks;
use crate::sample::{rng_for, Rng};
use crate::spmd::agree;
use crate::stats::{RankMetrics, Timer};

use super::Outcome;
use labels::{micro_f1, Labelled};
use learned::Learned;
use sharded::Sharded;
use std::sync::atomic::Ordering::Relaxed;
use unsup::Pairs;
use whole::Whole;

pub use eval::{evaluate, SplitScores};

/// Nodes whose layer output is computed at once in layer-wise inference.
const INFER_CHUNK: usize = 4096;

/// What a rank's work source gives the driver: its share of nodes and a batch's blocks with
/// their input rows.
trait Source {
    /// Feature columns.
    fn cols(&self) -> usize;
    /// This rank's share of `nodes` (the ranks' shares partition them).
    fn mine(&self, nodes: &[u64]) -> Vec<u64>;
    /// Collective for the sharded strategy (every rank calls it, also with no seeds): the blocks
    /// of this rank's `seeds` and their input nodes, and the feature rows of those nodes, into
    /// `out` (as [`Drawn`] says).
    fn batch(
        &mut self,
        seeds: &[u64],
        fanouts: &[usize],
        rng: &mut Rng,
        m: &mut RankMetrics,
        out: &mut Drawn,
    );
    /// Collective: the class scores of this rank's share of the nodes with every neighbour,
    /// layer by layer over the whole graph: the nodes and their scores (`classes` each). The
    /// first layer's input rows are the feature rows, with the `learned` rows after them.
    fn infer(
        &mut self,
        sage: &Sage,
        work: &mut Work,
        m: &mut RankMetrics,
        learned: Option<&Learned>,
    ) -> (Vec<u64>, Vec<f32>);
    /// Collective for the sharded strategy: one hop for the frontier `dst`, as
    /// [`crate::sample::neighbors::sample_blocks_by_hop`] takes it (this rank's nodes sampled
    /// here, the others' by their owners).
    fn hop(
        &mut self,
        dst: &[u64],
        fanout: usize,
        rng: &mut Rng,
        counts: &mut Vec<u32>,
        picked: &mut Vec<u64>,
    );
    /// Collective: `size` nodes drawn by degree^0.75 over the whole graph (the unsupervised
    /// loss's negatives).
    fn negative_pool(&mut self, size: usize, rng: &mut Rng) -> Vec<u64>;
    /// Whose node a node is (the sharded strategy); `None` when every rank holds every node.
    fn partitioner(&self) -> Option<crate::graph::partition::Partitioner>;
    /// What this rank holds, for its memory estimate.
    fn held(&self) -> SageHeld;
}

/// Input rows of the largest chunk of layer-wise inference over `nodes` (a chunk's nodes and
/// their neighbours), with `degree` a node's.
fn largest_chunk(nodes: usize, degree: impl Fn(usize) -> u64) -> u64 {
    (0..nodes)
        .step_by(INFER_CHUNK)
        .map(|a| {
            (a..(a + INFER_CHUNK).min(nodes))
                .map(|v| degree(v) + 1)
                .sum()
        })
        .max()
        .unwrap_or(0)
}

/// Scale every row of `x` (`cols` wide) to sum 1 (rows summing to 0 stay).
fn scale_rows(x: &mut [f32], cols: usize) {
    for row in x.chunks_exact_mut(cols.max(1)) {
        let sum: f32 = row.iter().sum();
        if sum > 0.0 {
            row.iter_mut().for_each(|v| *v /= sum);
        }
    }
}

/// Every node's class scores of this rank's share (layer-wise, every neighbour), with the
/// bytes this rank sent for them (evaluation's rows and exchanges are not the training's: the
/// metrics leave them out).
struct Scored {
    nodes: Vec<u64>,
    scores: Vec<f32>,
    sent: u64,
}

impl Scored {
    /// Collective: score this rank's share with `sage` (and the `learned` input rows).
    fn new(
        comm: &Comm,
        sage: &Sage,
        src: &mut dyn Source,
        work: &mut Work,
        learned: Option<&Learned>,
    ) -> Scored {
        if learned.is_some() {
            // Every rank has applied the last step's pushes before any reads the rows.
            comm.barrier();
        }
        let before = comm.traffic().sent.load(Relaxed);
        let (nodes, scores) = src.infer(sage, work, &mut RankMetrics::default(), learned);
        let sent = comm.traffic().sent.load(Relaxed) - before;
        Scored {
            nodes,
            scores,
            sent,
        }
    }

    /// Collective: the micro-F1 of the nodes of split `code` (with one class per node, the
    /// share predicted right).
    fn accuracy(&self, comm: &Comm, l: &Labelled, code: u8) -> f64 {
        let c = comm.all_reduce_u64(&l.counts(&self.nodes, &self.scores, code), ReduceOp::Sum);
        micro_f1(&c, l.classes.max(2))
    }
}

/// What the steps of an epoch share.
struct Epochs<'a> {
    comm: &'a Comm,
    l: &'a Labelled,
    s: &'a SageSettings,
    /// Seeds per step over all ranks.
    batch: usize,
    adam: Adam,
    rng: Rng,
    grads: Vec<f32>,
    /// The learnable input rows (`--input learned|both`), after the `cols` feature values.
    learned: Option<Learned<'a>>,
    cols: usize,
    b: Bufs,
    m: RankMetrics,
    /// Rank 0's progress line, and the epoch under way of how many.
    progress: super::Progress,
    epoch: (u32, u32),
    /// GraphSAGE's unsupervised loss (`--objective unsupervised`): a step's pairs.
    pairs: Option<Pairs>,
}

/// A batch as its source draws it: its blocks and input nodes, and the first layer's input.
#[derive(Default)]
struct Drawn {
    blocks: Blocks,
    /// Every input node's feature row; with `gather`, only the outermost block's output nodes'
    /// rows, and their neighbours' means in `means` ([`Input::Means`], read where the rows are).
    rows: Vec<f32>,
    means: Vec<f32>,
    gather: bool,
}

impl Drawn {
    /// The first layer's input.
    fn input(&self) -> Input<'_> {
        match self.gather {
            true => Input::Means {
                own: &self.rows,
                mean: &self.means,
            },
            false => Input::Rows(&self.rows),
        }
    }
}

/// A step's input rows and the model's buffers, kept across steps and evaluations (no
/// allocation per step once grown).
#[derive(Default)]
struct Bufs {
    drawn: Drawn,
    work: Work,
    /// The input rows' gradients and the learnable rows read (`--input learned|both`).
    gx: Vec<f32>,
    scratch: Vec<f32>,
    /// A step's labels: offsets and classes.
    labels: (Vec<u32>, Vec<u32>),
}

impl Epochs<'_> {
    /// Collective: one pass over the training seeds in `order` (the same on every rank), a
    /// step per `batch` of them. Returns the summed loss and the seeds predicted right.
    fn epoch(&mut self, sage: &mut Sage, src: &mut dyn Source, order: &[u64]) -> (f64, f64) {
        let (comm, l, s) = (self.comm, self.l, self.s);
        let (mut loss, mut right) = (0f64, 0f64);
        for (k, step) in order.chunks(self.batch).enumerate() {
            let mine = src.mine(step);
            self.grads.iter_mut().for_each(|g| *g = 0.0);
            let ts = Timer::start();
            // Features alone through the mean or GCN aggregator: the first layer needs only the
            // output nodes' rows and their neighbours' means, gathered where the rows are.
            self.b.drawn.gather = self.learned.is_none() && sage.aggregator != Aggregator::Pool;
            // Unsupervised: the anchors' positives and the step's negatives are seeds too.
            if let Some(p) = &mut self.pairs {
                p.draw(src, &mine, &mut self.rng);
            }
            let seeds = self.pairs.as_ref().map_or(&mine[..], |p| &p.seeds[..]);
            src.batch(
                seeds,
                &s.fanout,
                &mut self.rng,
                &mut self.m,
                &mut self.b.drawn,
            );

            if let Some(lr) = &self.learned {
                let b = &mut self.b;
                lr.join(
                    &b.drawn.blocks.input,
                    self.cols,
                    &mut b.drawn.rows,
                    &mut b.scratch,
                    &mut self.m,
                );
                b.gx.clear();
                b.gx.resize(b.drawn.blocks.input.len() * sage.dims[0], 0.0);
            }
            self.m.seconds.sample += ts.secs();
            let (mut lo, mut c) = (0f64, 0usize);
            if !mine.is_empty() {
                let tc = Timer::start();
                let batch = Batch {
                    blocks: &self.b.drawn.blocks.blocks,
                    x: self.b.drawn.input(),
                    labels: match &self.pairs {
                        Some(p) => p.targets(),
                        None => l.targets(&mine, &mut self.b.labels),
                    },
                };
                (lo, c) = sage.train_step_in(
                    &mut self.b.work,
                    &batch,
                    s.dropout,
                    &mut self.rng,
                    &mut self.grads,
                    self.learned.is_some().then_some(&mut self.b.gx[..]),
                );
                self.m.seconds.compute += tc.secs();
            }
            let tp = Timer::start();
            // Counted in the comm's traffic as a ring all-reduce moves it.
            comm.all_reduce_sum_f32(&mut self.grads);
            let sums = comm.all_reduce_f64(&[lo, c as f64], ReduceOp::Sum);
            let inv = 1.0 / step.len() as f32;
            if let Some(lr) = &mut self.learned {
                // The rows' gradients to their owners, as the weights' of the global batch.
                lr.push(
                    &self.b.drawn.blocks.input,
                    &self.b.gx,
                    self.cols,
                    inv,
                    &mut self.m,
                );
            }
            self.m.seconds.push += tp.secs();
            self.grads.iter_mut().for_each(|g| *g *= inv);
            self.adam.step(&mut sage.params, &self.grads);
            (loss, right) = (loss + sums[0], right + sums[1]);
            self.m.steps += 1;
            self.m.pairs += mine.len() as u64;
            // This rank's loss per seed, for the progress line.
            self.m.loss_sum += lo;
            self.m.loss_terms += mine.len() as u64;
            let seen = (k * self.batch + step.len()) as f64 / order.len().max(1) as f64;
            let done = (self.epoch.0 as f64 + seen) / self.epoch.1.max(1) as f64;
            self.progress.tick(done, &self.m, self.adam.lr);
        }
        (loss, right)
    }

    /// Collective: the epoch's validation score and every node's scores behind it, with rank
    /// 0's line. The unsupervised loss has no labels to score: the last epoch counts as the best
    /// (its score is its number) and the nodes are scored once, after training.
    fn validate(
        &mut self,
        sage: &Sage,
        src: &mut dyn Source,
        epoch: u32,
        (loss, right): (f64, f64),
        seeds: usize,
    ) -> (f64, Option<Scored>) {
        let (comm, l) = (self.comm, self.l);
        let (loss, right) = (loss / seeds as f64, right / seeds as f64);
        if self.pairs.is_some() {
            if comm.rank() == 0 {
                eprintln!(
                    "graphscale: epoch {:>3}  loss {loss:.4}  positives above every negative {right:.3}",
                    epoch + 1
                );
            }
            return (f64::from(epoch + 1), None);
        }
        let te = Timer::start();
        let scored = Scored::new(comm, sage, src, &mut self.b.work, self.learned.as_ref());
        let v = scored.accuracy(comm, l, VALID);
        self.m.eval_seconds += te.secs();
        self.m.valid_accuracy.push(v);
        if comm.rank() == 0 {
            let (train, valid) = l.names();
            eprintln!(
                "graphscale: epoch {:>3}  loss {loss:.4}  train {train} {right:.3}  valid {valid} {v:.3}",
                epoch + 1,
            );
        }
        (v, Some(scored))
    }

    /// Collective: the epochs, each followed by scoring every node and the validation split;
    /// the parameters (and learnable rows) of the best validation epoch are kept, and
    /// `--patience` epochs without a better one stop training. Returns the best validation
    /// score, its parameters and its scores (the output's and the test's: layer-wise inference
    /// is deterministic, so scoring those parameters again would give the same), with the
    /// bytes this rank sent for scoring.
    fn train(
        &mut self,
        sage: &mut Sage,
        src: &mut dyn Source,
        train: &[u64],
        (cfg, ident, resumed): (&TrainConfig, &serde_json::Value, Option<ckpt::State>),
    ) -> Result<(Best, u64)> {
        let comm = self.comm;
        let (mut best, mut best_params, mut since) = (-1f64, sage.params.clone(), 0u32);
        let (mut best_scored, mut eval_sent, mut first) = (None, 0, 0);
        if let Some(st) = resumed {
            (best, since) = (st.cursor.valid_best.unwrap_or(-1.0), st.cursor.valid_flat);
            (best_params, first, self.m.steps) = (st.best_params, st.cursor.epoch, st.cursor.step);
        }
        let mut due = Due::new(cfg, self.m.steps);
        let mut order = train.to_vec();
        for epoch in first..cfg.epochs {
            self.epoch.0 = epoch;
            // Each epoch's streams from the seed and the epoch: a resumed run draws what the
            // uninterrupted one would have.
            let salt = u64::from(epoch + 1).wrapping_mul(0x2545_F491_4F6C_DD1D);
            self.rng = rng_for(cfg.seed ^ salt, comm.rank(), 7);
            order.copy_from_slice(train);
            order.shuffle(&mut Rng::seed_from_u64(cfg.seed ^ salt));
            if let Some(p) = &mut self.pairs {
                p.refresh(src, &mut self.rng);
            }
            let (loss, right) = self.epoch(sage, src, &order);
            let (v, scored) = self.validate(sage, src, epoch, (loss, right), train.len());
            eval_sent += scored.as_ref().map_or(0, |s| s.sent);
            if v > best {
                (best, since) = (v, 0);
                best_params.clone_from(&sage.params);
                if let Some(lr) = &mut self.learned {
                    lr.keep();
                }
                best_scored = scored;
            } else {
                since += 1;
                if cfg.kg.patience.is_some_and(|p| since >= p) {
                    break;
                }
            }
            let (save, stop) = due.check(comm, self.m.steps);
            if let (true, Some(dir)) = (save, &cfg.checkpoint_dir) {
                let cursor = crate::checkpoint::Cursor {
                    step: self.m.steps,
                    epoch: epoch + 1,
                    valid_best: Some(best),
                    valid_flat: since,
                    ..Default::default()
                };
                let dense = (&*sage, &self.adam, &best_params[..]);
                let v = ckpt::save(comm, dir, ident, dense, &cursor, self.learned.as_ref())?;
                if stop {
                    return Err(Error::Stopped(format!(
                        "stopped by a signal (SIGTERM or SIGUSR1) after epoch {} and committing checkpoint version {v} in {}; no output was written; continue with --resume-if-present {} (exit code 4)",
                        epoch + 1,
                        dir.display(),
                        dir.display()
                    )));
                }
            }
        }
        let best = Best {
            score: best,
            params: best_params,
            scored: best_scored,
        };
        Ok((best, eval_sent))
    }
}

/// The best validation epoch: its score, parameters and every node's scores (`None` when no
/// epoch since a resume beat the checkpoint's best).
struct Best {
    score: f64,
    params: Vec<f32>,
    scored: Option<Scored>,
}

/// When the next checkpoint is due (`--checkpoint-every`, checked at the end of each epoch),
/// and whether a signal asks for one and a stop.
struct Due {
    every: Option<crate::config::Every>,
    since: std::time::Instant,
    steps: u64,
}

impl Due {
    fn new(cfg: &TrainConfig, steps: u64) -> Due {
        let every = cfg.checkpoint_dir.as_ref().and(cfg.checkpoint_every);
        if every.is_some() {
            if let Err(e) = crate::signals::arm() {
                log::warn!("cannot catch SIGTERM/SIGUSR1 (no checkpoint on a signal): {e}");
            }
        }
        Due {
            every,
            since: std::time::Instant::now(),
            steps,
        }
    }

    /// Collective: whether to checkpoint now, and whether to stop after it (a signal reached
    /// some rank).
    fn check(&mut self, comm: &Comm, steps: u64) -> (bool, bool) {
        use crate::config::Every;
        let Some(every) = self.every else {
            return (false, false);
        };
        let time = match every {
            Every::Seconds(s) => self.since.elapsed().as_secs_f64() >= s,
            Every::Steps(n) => steps - self.steps >= n,
        };
        let v = comm.all_reduce_u64(
            &[u64::from(time), u64::from(crate::signals::raised())],
            ReduceOp::Max,
        );
        let (save, stop) = (v[0] == 1 || v[1] == 1, v[1] == 1);
        if save {
            (self.since, self.steps) = (std::time::Instant::now(), steps);
        }
        (save, stop)
    }
}

/// Where a run's node data is and how it is spread over the ranks.
struct Placement {
    graph: std::path::PathBuf,
    strategy: Strategy,
    partition: crate::graph::partition::Scheme,
    cache_rows: Option<usize>,
    /// Whether the input rows hold the features (`--input features|both`).
    features: bool,
    /// Whether the ranks of a node may share their feature and hidden rows' memory
    /// (`--node-memory shared`), and the hidden layers' widths summed (their windows' share).
    node_memory: bool,
    hidden_cols: usize,
}

impl Placement {
    fn of(cfg: &TrainConfig) -> Placement {
        Placement {
            graph: cfg.graph.clone(),
            strategy: cfg.strategy,
            partition: cfg.partition,
            cache_rows: cfg.cache_rows,
            features: cfg.sage.as_ref().is_none_or(|s| s.input.features()),
            node_memory: cfg.node_memory == crate::config::NodeMemory::Shared,
            hidden_cols: cfg
                .sage
                .as_ref()
                .map_or(0, |s| s.hidden * s.fanout.len().saturating_sub(1)),
        }
    }
}

/// Collective: this rank's work source, and whether its rows were scaled.
fn source<'a>(
    comm: &'a Comm,
    at: &Placement,
    norm: FeatureNorm,
) -> Result<(Box<dyn Source + 'a>, bool)> {
    let triples = agree(
        comm,
        crate::graph::h5::open_h5(&at.graph).map(|f| f.dataset("rel").is_ok()),
    )?;
    let missing = || {
        Error::bad_input(
            &at.graph,
            if triples {
                "a knowledge-graph triple file (dataset 'rel'): GraphSAGE trains on a graph with node features (convert EDGES --features F --labels L --split S; the KG models are --model distmult|complex|transe|rotate)"
            } else {
                "--model sage needs node features: convert the graph with --features (docs/formats.md), or train a learnable input row per node with --input learned"
            },
        )
    };
    if triples {
        return Err(missing());
    }
    if !at.features {
        // Learnable input rows alone: the graph, no features.
        let src: Box<dyn Source + 'a> = if at.strategy == Strategy::Replicated {
            Box::new(agree(comm, Whole::load(comm, &at.graph, 0, Vec::new()))?)
        } else {
            Box::new(Sharded::load(comm, at, (0, false), norm)?.0)
        };
        return Ok((src, false));
    }
    if at.strategy == Strategy::Replicated {
        let nd = agree(comm, nodedata::read(&at.graph))?;
        let (cols, x) = agree(comm, nd.features.ok_or_else(missing))?;
        let mut w = agree(comm, Whole::load(comm, &at.graph, cols, x))?;
        let scaled = norm == FeatureNorm::Row || (norm == FeatureNorm::Auto && w.non_negative());
        if scaled {
            w.scale();
        }
        return Ok((Box::new(w), scaled));
    }
    let shape = agree(comm, nodedata::feature_shape(&at.graph))?;
    let (_, cols, half) = agree(comm, shape.ok_or_else(missing))?;
    let (s, scaled) = Sharded::load(comm, at, (cols, half), norm)?;
    Ok((Box::new(s), scaled))
}

fn strategy_name(cfg: &TrainConfig) -> &'static str {
    if cfg.strategy == Strategy::Replicated {
        "replicated"
    } else {
        "sharded"
    }
}

/// Rank 0's line at the start: the model, the split, the step and where the rows live.
fn announce(
    (cfg, ranks): (&TrainConfig, usize),
    dims: &[usize],
    l: &Labelled,
    src: &dyn Source,
    normalized: bool,
) {
    let s = cfg.sage.as_ref().expect("sage settings");
    let strategy = strategy_name(cfg);
    let count = |code| l.split.iter().filter(|&&c| c == code).count();
    let (train, valid, test) = (count(TRAIN), count(VALID), count(TEST));
    let nodes = if s.objective == SageObjective::Unsupervised {
        format!(
            "unsupervised over {} nodes ({} negatives per step and rank)",
            l.split.len(),
            cfg.negatives
        )
    } else {
        format!("{train} train / {valid} valid / {test} test nodes")
    };
    let held = if cfg.strategy == Strategy::Replicated {
        "every rank holds the graph and every feature row"
    } else {
        "every rank holds its nodes' adjacency and feature rows"
    };
    eprintln!(
        "graphscale: GraphSAGE-{} {dims:?}, fan-out {:?}, {nodes}, {} seeds per step{} over {} ranks; {strategy}: {held} ({} x {} features{}; {} of feature rows on rank 0)",
        format!("{:?}", s.aggregator).to_lowercase(),
        s.fanout,
        cfg.batch_size,
        if cfg.batch_size_is_default {
            " (the default: 512, at most a quarter of the training nodes)"
        } else {
            ""
        },
        ranks,
        l.split.len(),
        dims[0],
        if normalized {
            ", rows scaled to sum 1: --feature-norm"
        } else {
            ""
        },
        crate::stats::human_bytes(src.held().features + src.held().cache)
    );
}

/// Collective: this rank's memory estimate (`estimate::sage_estimate`), its maximum over the
/// ranks held to `--max-memory` and printed by rank 0 with rank 0's parts.
fn memory(
    comm: &Comm,
    cfg: &TrainConfig,
    process: u64,
    (src, learned): (&dyn Source, Option<&Learned>),
    dims: &[usize],
    l: &Labelled,
) -> Result<u64> {
    let s = cfg.sage.as_ref().expect("sage settings");
    let share = cfg.batch_size.div_ceil(comm.size()) as u64 * 5 / 4 + 1;
    let shape = SageShape {
        dims,
        fanout: &s.fanout,
        // A rank's share of a step's seeds, with room for an unlucky step (unsupervised:
        // its anchors, their positives and the negatives).
        seeds: match s.objective {
            SageObjective::Supervised => share,
            SageObjective::Unsupervised => 2 * share + u64::from(cfg.negatives),
        },
        nodes: l.split.len() as u64,
        train: l.split.iter().filter(|&&c| c == TRAIN).count() as u64,
        pool: s.aggregator == Aggregator::Pool,
        // Replicated, every row is read where it is.
        ranks: match cfg.strategy {
            Strategy::Replicated => 1,
            _ => comm.size() as u64,
        },
    };
    let mut h = src.held();
    if let Some(lr) = learned {
        (h.learned, h.learned_width) = (lr.bytes(), lr.dim as u64);
        if cfg.checkpoint_dir.is_some() {
            // A checkpoint's copies of the rows, the best epoch's and the ids, while written.
            h.learned += lr.held() as u64 * (8 + 8 * lr.dim as u64);
        }
    }
    let est = crate::estimate::sage_estimate(process, &h, &shape);
    let most = comm.all_reduce_u64(&[est.total], ReduceOp::Max)[0];
    if let Some(limit) = cfg.max_memory.filter(|&l| most > l) {
        return Err(Error::config(format!(
            "the memory estimate {} per rank exceeds --max-memory {}; {}",
            crate::stats::human_bytes(most),
            crate::stats::human_bytes(limit),
            if cfg.strategy == Strategy::Replicated {
                "--strategy replicated holds the whole graph and every feature row on every rank: use --strategy sharded (the default)"
            } else {
                "use more ranks or nodes, f16 features (convert or generate with --dtype f16), a smaller --hidden or --cache-rows"
            }
        )));
    }
    if comm.rank() == 0 {
        eprintln!(
            "graphscale: memory per rank {} at most (rank 0: adjacency {}, feature rows {}, cache {}, learnable rows and their Adam state {}, labels and split {}, a step {}, layer-wise inference and the output {}, the process before loading {})",
            crate::stats::human_bytes(most),
            crate::stats::human_bytes(h.adjacency),
            crate::stats::human_bytes(h.features),
            crate::stats::human_bytes(h.cache),
            crate::stats::human_bytes(h.learned),
            crate::stats::human_bytes(est.labels),
            crate::stats::human_bytes(est.step),
            crate::stats::human_bytes(est.inference),
            crate::stats::human_bytes(process),
        );
    }
    Ok(est.total)
}

/// Collective: train GraphSAGE on `cfg.graph` and write the output.
pub fn run(comm: &Comm, cfg: &TrainConfig) -> Result<Outcome> {
    let s: &SageSettings = cfg.sage.as_ref().expect("--model sage has its settings");
    // What the process holds before it reads anything: the base of the memory estimate.
    let process = crate::stats::peak_rss_bytes();
    let t = Timer::start();
    // Features first: without them nothing else matters (the error names the flag).
    let (mut src, normalized) = source(comm, &Placement::of(cfg), s.feature_norm)?;
    let unsup = s.objective == SageObjective::Unsupervised;
    let labels = if unsup {
        Labelled::unlabelled
    } else {
        Labelled::load
    };
    let l = agree(comm, labels(&cfg.graph))?;
    let load = t.secs();
    let train = l.nodes(TRAIN);
    if train.is_empty() {
        return Err(Error::bad_input(
            &cfg.graph,
            "no node is in the training split",
        ));
    }
    let mut settled = cfg.clone();
    if cfg.batch_size_is_default {
        settled.batch_size = crate::config::sage_batch(train.len());
    }
    let cfg = &settled;
    let cols = src.cols();
    let learned = s.input.learned().then(|| {
        let at = (cfg.seed, cfg.lr);
        Learned::new(
            comm,
            src.partitioner(),
            l.split.len() as u64,
            s.learned_dim,
            at,
        )
    });
    let mut dims = vec![cols + learned.as_ref().map_or(0, |l| l.dim)];
    dims.extend(std::iter::repeat_n(s.hidden, s.fanout.len() - 1));
    // Unsupervised: the last layer's output rows are the embeddings, --hidden wide.
    dims.push(if unsup { s.hidden } else { l.classes.max(2) });
    let mut sage = Sage::with_aggregator(&dims, s.aggregator, &mut Rng::seed_from_u64(cfg.seed));
    let mut adam = Adam::new(sage.params.len(), cfg.lr, s.weight_decay);
    let mut learned = learned;
    let ident = ckpt::identity(cfg, &dims, l.split.len() as u64);
    let resumed = ckpt::resume(comm, cfg, &ident, (&mut sage, &mut adam), learned.as_mut())?;
    let rng = rng_for(cfg.seed, comm.rank(), 7);
    let grads = vec![0f32; sage.params.len()];
    let strategy = strategy_name(cfg);
    let mut m = RankMetrics {
        rank: comm.rank(),
        ranks: comm.size(),
        model: "sage".into(),
        strategy: strategy.into(),
        threads: cfg.threads,
        dim: s.hidden,
        ..RankMetrics::default()
    };
    m.seconds.load = load;
    if comm.rank() == 0 {
        announce((cfg, comm.size()), &dims, &l, src.as_ref(), normalized);
    }
    m.memory_estimate_bytes = memory(
        comm,
        cfg,
        process,
        (src.as_ref(), learned.as_ref()),
        &dims,
        &l,
    )?;
    // What the load moved (edges to their owners, feature rows) is not the training's.
    let loaded = comm.traffic().totals();
    let t = Timer::start();
    let mut ep = Epochs {
        comm,
        l: &l,
        s,
        batch: cfg.batch_size.max(1),
        adam,
        rng,
        grads,
        learned,
        cols,
        b: Bufs {
            work: Work::on(
                std::sync::Arc::new(super::compute_pool(cfg, comm.rank())?),
                s.bf16(),
            ),
            ..Bufs::default()
        },
        m,
        progress: super::Progress::sage(comm.rank() == 0),
        epoch: (0, cfg.epochs),
        pairs: unsup.then(|| Pairs::new(cfg.negatives as usize)),
    };
    let (best, eval_sent) = ep.train(&mut sage, src.as_mut(), &train, (cfg, &ident, resumed))?;
    let Best {
        score: best,
        params: best_params,
        scored: best_scored,
    } = best;
    let (mut m, mut b, mut learned) = (ep.m, ep.b, ep.learned);
    if let Some(lr) = &mut learned {
        lr.restore();
    }
    m.train_seconds = t.secs();
    // The sampling's exchanges and the gradients' all-reduce of the training steps.
    let (sent, received) = comm.traffic().totals();
    (m.comm_bytes_sent, m.comm_bytes_received) = (sent - eval_sent - loaded.0, received - loaded.1);
    sage.params = best_params;
    let mut scored = match best_scored {
        Some(s) => s,
        None => Scored::new(comm, &sage, src.as_mut(), &mut b.work, learned.as_ref()),
    };
    conclude(comm, (unsup, s.hidden), &l, &mut scored, best);
    finish(comm, cfg, (&sage, learned.as_ref()), &l, (m, scored))
}

/// Collective: rank 0's last line. Supervised, the test split's score; unsupervised, the
/// embeddings, scaled to unit length as the loss scored them.
fn conclude(
    comm: &Comm,
    (unsup, hidden): (bool, usize),
    l: &Labelled,
    scored: &mut Scored,
    best: f64,
) {
    if unsup {
        // The loss scored the rows at unit length: so are the embeddings written.
        for r in scored.scores.chunks_exact_mut(hidden) {
            let n = r.iter().map(|x| x * x).sum::<f32>().sqrt();
            if n > 0.0 {
                r.iter_mut().for_each(|x| *x /= n);
            }
        }
        if comm.rank() == 0 {
            eprintln!(
                "graphscale: unsupervised: every node's output row ({} values) is its embedding (eval nodeclf, eval linkpred)",
                hidden
            );
        }
    } else {
        let acc = scored.accuracy(comm, l, TEST);
        if comm.rank() == 0 {
            let name = l.names().1;
            if l.split.contains(&TEST) {
                eprintln!("graphscale: test {name} {acc:.4} (the best validation epoch's parameters: valid {name} {best:.4})");
            } else {
                eprintln!("graphscale: no test nodes in the split (the best validation epoch's parameters: valid {name} {best:.4})");
            }
        }
    }
}

/// Collective: every node's class scores to the output, and the metrics of every rank.
fn finish(
    comm: &Comm,
    cfg: &TrainConfig,
    model: (&Sage, Option<&Learned>),
    l: &Labelled,
    (mut m, scored): (RankMetrics, Scored),
) -> Result<Outcome> {
    if let Some(out) = &cfg.output {
        write(comm, cfg, model, &scored, l.split.len(), out)?;
    }
    m.peak_rss_bytes = crate::stats::peak_rss_bytes();
    super::job::gather_metrics(comm, cfg, &m)
}

/// Collective: the output, through its partial file: `weights` (flat, as `model::sage` lays
/// them out) with the widths, the effective configuration, every node's class scores as
/// `embeddings` (each rank's written at their ids, window by window: no rank gathers them),
/// the learnable input rows as `input_rows` (`--input learned|both`) and the graph's node
/// names.
fn write(
    comm: &Comm,
    cfg: &TrainConfig,
    (sage, learned): (&Sage, Option<&Learned>),
    scored: &Scored,
    nodes: usize,
    out: &Path,
) -> Result<()> {
    use crate::embeddings::{create_rows, write_by_id};
    let classes = *sage.dims.last().expect("layers");
    let rows = crate::embeddings::DenseRows(&scored.scores, classes);
    crate::outfile::write_collective(
        comm,
        out,
        |tmp| {
            let created = if comm.rank() == 0 {
                crate::embeddings::create(tmp, nodes, classes, cfg, comm.size())
                    .and_then(|()| write_weights(tmp, sage))
                    .and_then(|()| match learned {
                        Some(l) => create_rows(tmp, "input_rows", nodes, l.dim),
                        None => Ok(()),
                    })
            } else {
                Ok(())
            };
            agree(comm, created)?;
            if let Some(l) = learned {
                let (rows, ids) = l.share();
                write_by_id(comm, (tmp, "input_rows"), &cfg.graph, nodes, &rows, &ids)?;
            }
            let at = (tmp, "embeddings");
            write_by_id(comm, at, &cfg.graph, nodes, &rows, &scored.nodes)
        },
        |tmp| crate::embeddings::write_names(tmp, &cfg.graph, false),
    )
}

/// `weights` and their widths `dims` into the output rank 0 created.
fn write_weights(path: &Path, sage: &Sage) -> Result<()> {
    let f = hdf5::File::open_rw(path).map_err(|e| Error::hdf5(path, "open output", e))?;
    let err = |what: &'static str| move |e| Error::hdf5(path, what, e);
    f.new_dataset_builder()
        .with_data(&sage.params)
        .create("weights")
        .map_err(err("write weights"))?;
    let dims: Vec<u64> = sage.dims.iter().map(|&x| x as u64).collect();
    f.new_attr::<u64>()
        .shape(dims.len())
        .create("dims")
        .and_then(|a| a.write(&dims))
        .map_err(err("attribute dims"))?;
    crate::graph::h5::flush(&f, path)
}
