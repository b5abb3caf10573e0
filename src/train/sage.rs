//! GraphSAGE's work source (`--model sage`, issue 34), data-parallel: every rank holds the whole
//! adjacency and every feature row (the replicated baseline; the sharded feature rows
//! and owner-answered sampling come next). A step's seeds are dealt over the ranks; each
//! samples its blocks (`sample::neighbors`), computes its gradient (`model::sage`), the
//! gradients are summed over the ranks (one all-reduce of the dense weights: their bytes are
//! counted) and every rank takes the same Adam step. After every epoch the validation nodes are
//! scored with every neighbour; the parameters of the best validation epoch are kept, and
//! `--patience` epochs without a better one end training. The output holds the weights, the
//! effective configuration and every node's class scores (`embeddings`).

use std::path::Path;

use rand::seq::SliceRandom;
use rand::SeedableRng;

use crate::comm::{Comm, ReduceOp};
use crate::config::{FeatureNorm, SageSettings, TrainConfig};
use crate::error::{Error, Result};
use crate::graph::h5::EdgeFile;
use crate::graph::nodedata::{self, TEST, TRAIN, VALID};
use crate::model::sage::{Adam, Batch, Sage};
use crate::sample::neighbors::sample_blocks;
use crate::sample::{rng_for, Rng};
use crate::spmd::agree;
use crate::stats::{RankMetrics, Timer};

use super::Outcome;

/// Nodes scored at once in evaluation.
const EVAL_CHUNK: usize = 1024;

/// A graph with node data, whole on this rank.
struct Data {
    /// Undirected adjacency as CSR.
    offsets: Vec<u64>,
    targets: Vec<u64>,
    cols: usize,
    x: Vec<f32>,
    y: Vec<u32>,
    classes: usize,
    split: Vec<u8>,
    /// The feature rows were scaled to sum 1.
    normalized: bool,
}

impl Data {
    fn load(path: &Path, norm: FeatureNorm) -> Result<Data> {
        let nd = nodedata::read(path)?;
        let missing = |what: &str, flag: &str| {
            Error::bad_input(
                path,
                format!(
                    "--model sage needs {what}: convert the graph with {flag} (docs/formats.md)"
                ),
            )
        };
        let (cols, mut x) = nd
            .features
            .ok_or_else(|| missing("node features", "--features"))?;
        let normalized =
            norm == FeatureNorm::Row || (norm == FeatureNorm::Auto && x.iter().all(|&v| v >= 0.0));
        if normalized {
            for row in x.chunks_exact_mut(cols.max(1)) {
                let sum: f32 = row.iter().sum();
                if sum > 0.0 {
                    row.iter_mut().for_each(|v| *v /= sum);
                }
            }
        }
        let labels = nd
            .labels
            .ok_or_else(|| missing("node labels", "--labels"))?;
        let split = nd
            .split
            .ok_or_else(|| missing("a split", "--split or --train-fraction"))?;
        if labels.multilabel() {
            return Err(Error::bad_input(
                path,
                "multi-label nodes: --model sage trains one class per node so far (a sigmoid loss for several is issue 34's next part)",
            ));
        }
        let n = split.len();
        let y: Vec<u32> = (0..n)
            .map(|v| labels.of(v).first().copied().unwrap_or(0))
            .collect();
        let unlabelled = (0..n).find(|&v| split[v] != nodedata::NONE && labels.of(v).is_empty());
        if let Some(v) = unlabelled {
            return Err(Error::bad_input(
                path,
                format!("node {v} is in the split but has no label"),
            ));
        }
        let ef = EdgeFile::open(path)?;
        let edges = ef.read_edges(0, ef.num_edges)?;
        let mut deg = vec![0u64; n + 1];
        for e in &edges {
            deg[e.src as usize + 1] += 1;
            if !ef.directed {
                deg[e.dst as usize + 1] += 1;
            }
        }
        for i in 0..n {
            deg[i + 1] += deg[i];
        }
        let mut fill = deg.clone();
        let mut targets = vec![0u64; deg[n] as usize];
        for e in &edges {
            targets[fill[e.src as usize] as usize] = e.dst;
            fill[e.src as usize] += 1;
            if !ef.directed {
                targets[fill[e.dst as usize] as usize] = e.src;
                fill[e.dst as usize] += 1;
            }
        }
        Ok(Data {
            offsets: deg,
            targets,
            cols,
            x,
            y,
            classes: labels.num_classes as usize,
            split,
            normalized,
        })
    }

    fn nbrs(&self, v: u64, out: &mut Vec<u64>) {
        let (a, b) = (self.offsets[v as usize], self.offsets[v as usize + 1]);
        out.extend_from_slice(&self.targets[a as usize..b as usize]);
    }

    fn rows(&self, nodes: &[u64]) -> Vec<f32> {
        let f = self.cols;
        nodes
            .iter()
            .flat_map(|&v| self.x[v as usize * f..(v as usize + 1) * f].iter().copied())
            .collect()
    }

    fn nodes(&self, code: u8) -> Vec<u64> {
        (0..self.split.len() as u64)
            .filter(|&v| self.split[v as usize] == code)
            .collect()
    }
}

/// Class scores of `nodes` with every neighbour (no sampling), in chunks.
fn scores(sage: &Sage, d: &Data, nodes: &[u64]) -> Vec<f32> {
    let all = vec![usize::MAX; sage.layers()];
    let mut out = Vec::with_capacity(nodes.len() * d.classes);
    let mut rng = Rng::seed_from_u64(0);
    for chunk in nodes.chunks(EVAL_CHUNK) {
        let (blocks, input) = sample_blocks(chunk, &all, |v, o| d.nbrs(v, o), &mut rng);
        out.extend(sage.predict(&blocks, &d.rows(&input)));
    }
    out
}

/// Collective: the share of `nodes` (this rank's: every size-th) predicted right, summed.
fn accuracy(comm: &Comm, sage: &Sage, d: &Data, nodes: &[u64]) -> f64 {
    let mine: Vec<u64> = nodes
        .iter()
        .skip(comm.rank())
        .step_by(comm.size())
        .copied()
        .collect();
    let s = scores(sage, d, &mine);
    let k = d.classes;
    let right = mine
        .iter()
        .enumerate()
        .filter(|&(i, &v)| {
            let row = &s[i * k..(i + 1) * k];
            (0..k).max_by(|&a, &b| row[a].total_cmp(&row[b])) == Some(d.y[v as usize] as usize)
        })
        .count();
    let g = comm.all_reduce_u64(&[right as u64, mine.len() as u64], ReduceOp::Sum);
    g[0] as f64 / g[1].max(1) as f64
}

/// What the steps of an epoch share.
struct Epochs<'a> {
    comm: &'a Comm,
    d: &'a Data,
    s: &'a SageSettings,
    /// Seeds per step over all ranks.
    batch: usize,
    adam: Adam,
    rng: Rng,
    grads: Vec<f32>,
    m: RankMetrics,
}

impl Epochs<'_> {
    /// Collective: one pass over the training seeds in `order` (the same on every rank), a
    /// step per `batch` of them. Returns the summed loss and the seeds predicted right.
    fn epoch(&mut self, sage: &mut Sage, order: &[u64]) -> (f64, f64) {
        let (comm, d, s) = (self.comm, self.d, self.s);
        let (mut loss, mut right) = (0f64, 0f64);
        for step in order.chunks(self.batch) {
            let mine: Vec<u64> = step
                .iter()
                .skip(comm.rank())
                .step_by(comm.size())
                .copied()
                .collect();
            self.grads.iter_mut().for_each(|g| *g = 0.0);
            let (mut l, mut c) = (0f64, 0usize);
            if !mine.is_empty() {
                let ts = Timer::start();
                let (blocks, input) =
                    sample_blocks(&mine, &s.fanout, |v, o| d.nbrs(v, o), &mut self.rng);
                let rows = d.rows(&input);
                let labels: Vec<u32> = mine.iter().map(|&v| d.y[v as usize]).collect();
                self.m.seconds.sample += ts.secs();
                let tc = Timer::start();
                let batch = Batch {
                    blocks: &blocks,
                    x: &rows,
                    labels: &labels,
                };
                (l, c) = sage.train_step(&batch, s.dropout, &mut self.rng, &mut self.grads, None);
                self.m.seconds.compute += tc.secs();
            }
            let tp = Timer::start();
            if comm.size() > 1 {
                comm.all_reduce_sum_f32(&mut self.grads);
                self.m.comm_bytes_sent += (self.grads.len() * 4) as u64;
            }
            let sums = comm.all_reduce_f64(&[l, c as f64], ReduceOp::Sum);
            self.m.seconds.push += tp.secs();
            let inv = 1.0 / step.len() as f32;
            self.grads.iter_mut().for_each(|g| *g *= inv);
            self.adam.step(&mut sage.params, &self.grads);
            (loss, right) = (loss + sums[0], right + sums[1]);
            self.m.steps += 1;
            self.m.pairs += mine.len() as u64;
        }
        (loss, right)
    }
}

/// Collective: train GraphSAGE on `cfg.graph` and write the output.
pub fn run(comm: &Comm, cfg: &TrainConfig) -> Result<Outcome> {
    let s: &SageSettings = cfg.sage.as_ref().expect("--model sage has its settings");
    let t = Timer::start();
    let d = agree(comm, Data::load(&cfg.graph, s.feature_norm))?;
    let load = t.secs();
    let (train, valid, test) = (d.nodes(TRAIN), d.nodes(VALID), d.nodes(TEST));
    if train.is_empty() {
        return Err(Error::bad_input(
            &cfg.graph,
            "no node is in the training split",
        ));
    }
    let mut dims = vec![d.cols];
    dims.extend(std::iter::repeat_n(s.hidden, s.fanout.len() - 1));
    dims.push(d.classes.max(2));
    let mut shared = Rng::seed_from_u64(cfg.seed);
    let mut sage = Sage::new(&dims, &mut shared);
    let adam = Adam::new(sage.params.len(), cfg.lr, s.weight_decay);
    let rng = rng_for(cfg.seed, comm.rank(), 7);
    let grads = vec![0f32; sage.params.len()];
    let mut m = RankMetrics {
        rank: comm.rank(),
        ranks: comm.size(),
        model: "sage".into(),
        strategy: "replicated".into(),
        threads: cfg.threads,
        dim: s.hidden,
        ..RankMetrics::default()
    };
    m.seconds.load = load;
    if comm.rank() == 0 {
        eprintln!(
            "graphscale: GraphSAGE-mean {dims:?}, fan-out {:?}, {} train / {} valid / {} test nodes, {} seeds per step over {} ranks; every rank holds the graph and its {} x {} features{}",
            s.fanout,
            train.len(),
            valid.len(),
            test.len(),
            cfg.batch_size,
            comm.size(),
            d.split.len(),
            d.cols,
            if d.normalized {
                " (rows scaled to sum 1: --feature-norm)"
            } else {
                ""
            }
        );
    }
    let t = Timer::start();
    let (mut best, mut best_params, mut since) = (-1f64, sage.params.clone(), 0u32);
    let mut order = train.clone();
    let mut ep = Epochs {
        comm,
        d: &d,
        s,
        batch: cfg.batch_size.max(1),
        adam,
        rng,
        grads,
        m,
    };
    for epoch in 0..cfg.epochs {
        order.shuffle(&mut shared);
        let (loss, right) = ep.epoch(&mut sage, &order);
        let v = accuracy(comm, &sage, &d, &valid);
        if comm.rank() == 0 {
            eprintln!(
                "graphscale: epoch {:>3}  loss {:.4}  train accuracy {:.3}  valid accuracy {v:.3}",
                epoch + 1,
                loss / train.len() as f64,
                right / train.len() as f64
            );
        }
        if v > best {
            (best, since) = (v, 0);
            best_params.clone_from(&sage.params);
        } else {
            since += 1;
            if cfg.kg.patience.is_some_and(|p| since >= p) {
                break;
            }
        }
    }
    let mut m = ep.m;
    m.train_seconds = t.secs();
    sage.params = best_params;
    let acc = accuracy(comm, &sage, &d, &test);
    if comm.rank() == 0 {
        eprintln!("graphscale: test accuracy {acc:.4} (the best validation epoch's parameters: valid accuracy {best:.4})");
    }
    let written = if comm.rank() == 0 {
        write(cfg, &sage, &d)
    } else {
        Ok(())
    };
    agree(comm, written)?;
    Ok(Outcome { metrics: vec![m] })
}

/// The output: `weights` (flat, as `model::sage` lays them out) with the widths, the effective
/// configuration, and every node's class scores as `embeddings`.
fn write(cfg: &TrainConfig, sage: &Sage, d: &Data) -> Result<()> {
    let Some(out) = &cfg.output else {
        return Ok(());
    };
    let all: Vec<u64> = (0..d.split.len() as u64).collect();
    let s = scores(sage, d, &all);
    crate::outfile::write_with(out, |tmp| {
        let f = hdf5::File::create(tmp).map_err(|e| Error::hdf5(tmp, "create output", e))?;
        let err = |what: &'static str| move |e| Error::hdf5(tmp, what, e);
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
        let a = ndarray::Array2::from_shape_vec((all.len(), d.classes.max(2)), s)
            .expect("nodes x classes");
        f.new_dataset_builder()
            .with_data(&a)
            .create("embeddings")
            .map_err(err("write embeddings"))?;
        let text = |name: &str, v: &str| -> hdf5::Result<()> {
            let v: hdf5::types::VarLenUnicode = v.parse().expect("no NUL in attribute text");
            f.new_attr::<hdf5::types::VarLenUnicode>()
                .create(name)?
                .write_scalar(&v)
        };
        text("config", &cfg.to_json()).map_err(err("attribute config"))?;
        text("model", "sage").map_err(err("attribute model"))?;
        crate::graph::h5::flush(&f, tmp)
    })
}
