//! GraphSAGE (Hamilton, Ying and Leskovec, NeurIPS 2017) with the mean aggregator, as math on
//! sampled blocks: no sampling, no I/O (issue 34; the work source samples and moves rows).
//!
//! A mini-batch is a stack of blocks, outermost first (DGL's message-flow graphs): block `l`
//! maps `num_src` input rows to `num_dst` output rows, and its first `num_dst` input rows are
//! the output nodes themselves; `nbrs[offsets[i]..offsets[i + 1]]` are the input rows of output
//! node `i`'s sampled neighbours. Layer `l` computes, per output node,
//! `z = h_self W_self + mean(h_nbrs) W_neigh + b` (a node without sampled neighbours
//! aggregates zeros), then ReLU and dropout on every layer but the last, whose `z` are the
//! class scores: softmax cross-entropy over the seeds' labels. The gradients are by hand for
//! this fixed architecture; the matrix products go through `model::dense`.

use rand::RngExt;

pub use crate::sample::neighbors::Block;
use crate::sample::Rng;

use super::{bf16, dense};

/// A mini-batch: its blocks, the outermost block's input rows and the seeds' labels.
pub struct Batch<'a> {
    pub blocks: &'a [Block],
    pub x: Input<'a>,
    pub labels: Targets<'a>,
}

/// The outermost block's input rows, as a batch gives them.
#[derive(Clone, Copy)]
pub enum Input<'a> {
    /// Every input row (`num_src x dims[0]`).
    Rows(&'a [f32]),
    /// Only the output nodes' own rows and their neighbours' means (each `num_dst x
    /// dims[0]`), gathered by the caller straight from where the rows live ([`gather_means`]):
    /// the mean and GCN aggregators need nothing else from the first layer's input, which then
    /// takes no gradient. Saves copying every input row into one matrix first.
    Means { own: &'a [f32], mean: &'a [f32] },
}

/// The seeds' labels.
#[derive(Clone, Copy)]
pub enum Targets<'a> {
    /// One class per seed: softmax cross-entropy.
    Single(&'a [u32]),
    /// Any number of classes per seed (seed i's are `ids[offsets[i]..offsets[i + 1]]`): a
    /// sigmoid cross-entropy per class (multi-label; a class is predicted when its score is
    /// above 0).
    Multi { offsets: &'a [u32], ids: &'a [u32] },
    /// No classes (GraphSAGE's unsupervised loss): the seeds' output rows are embeddings, and
    /// each anchor `anchors[i]` is pulled toward its positive `positives[i]` (a node met on a
    /// short walk from it) and pushed from every one of `negatives` (shared by the batch):
    /// `-log σ(z_a·z_p) - Σ_q log σ(-z_a·z_q)`. Entries are seed rows.
    Pairs {
        anchors: &'a [u32],
        positives: &'a [u32],
        negatives: &'a [u32],
    },
}

/// How a node's neighbours are combined with it (`--aggregator`).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Aggregator {
    /// `h_self W_self + mean(h_nbrs) W_neigh + b` (GraphSAGE-mean).
    Mean,
    /// `mean({h_self} and h_nbrs) W + b` (GraphSAGE-GCN: the node counts as one of its
    /// neighbours; one weight matrix).
    Gcn,
    /// `h_self W_self + max_j(ReLU(h_j W_pool + b_pool)) W_neigh + b` (GraphSAGE-pool: each
    /// neighbour's row through a dense layer of the input's width, then an elementwise max).
    Pool,
}

/// The dense parameters of every layer, flat: per layer `W_self` (in x out, row-major), then
/// `W_neigh` (in x out), then `b` (out); with the GCN aggregator `W` (in x out), then `b`; with
/// the pool aggregator `W_self`, `W_neigh` and `b`, then `W_pool` (in x in) and `b_pool` (in).
#[derive(Clone, Debug)]
pub struct Sage {
    /// Widths: input features, hidden widths, classes.
    pub dims: Vec<usize>,
    pub params: Vec<f32>,
    pub aggregator: Aggregator,
}

/// The dropout's draws per value: 16 bits.
const DRAWS: f32 = 65536.0;

/// What one layer's forward keeps for its backward.
#[derive(Default)]
struct Saved {
    /// The neighbours' means of the layer's input rows (num_dst x in).
    mean: Vec<f32>,
    /// The layer's output rows (num_dst x out): after ReLU and dropout on hidden layers.
    out: Vec<f32>,
    /// Hidden layers: the dropout's scale per output value (0 where dropped or where ReLU cut).
    gate: Vec<f32>,
    /// The pool aggregator: every input row through its dense layer and ReLU (num_src x in),
    /// and per output value the input row its max came from (`u32::MAX`: no neighbour).
    pool: Vec<f32>,
    arg: Vec<u32>,
}

/// The buffers of a step, kept across steps (no allocation once they have grown to the
/// largest batch).
#[derive(Default)]
pub struct Work {
    saved: Vec<Saved>,
    dz: Vec<f32>,
    dh: Vec<f32>,
    dm: Vec<f32>,
    dp: Vec<f32>,
    /// Per block of rows, a weight gradient's partial sum ([`matmul_tn`]).
    parts: Vec<Vec<f32>>,
    /// The rank's compute pool (`--threads`): the products' row blocks and the neighbours'
    /// means run on it; without one, in order on the calling thread. Either way the same
    /// arithmetic: the blocks do not depend on the number of threads.
    pub pool: Option<std::sync::Arc<rayon::ThreadPool>>,
    /// Training steps' dense products with bf16 operands and f32 sums where their output width
    /// allows ([`bf16::fits`]; `--compute-dtype bf16`). Evaluation stays f32.
    pub bf16: bool,
}

impl Work {
    /// Empty buffers whose products and means run on `pool`, training's products in bf16 if
    /// `bf16` ([`Work::bf16`]).
    pub fn on(pool: std::sync::Arc<rayon::ThreadPool>, bf16: bool) -> Work {
        Work {
            pool: Some(pool),
            bf16,
            ..Work::default()
        }
    }
}

/// Rows of a product or of the means computed as one task.
const TASK_ROWS: usize = 256;

/// Whether the caller runs on a rayon pool's thread (inside [`Work::pool`]'s `install`): then
/// the blocks go to its threads.
fn in_pool() -> bool {
    rayon::current_thread_index().is_some()
}

/// `f` on the calling thread, inside `pool` when there is one.
fn on<R: Send>(pool: Option<std::sync::Arc<rayon::ThreadPool>>, f: impl FnOnce() -> R + Send) -> R {
    match pool {
        Some(p) => p.install(f),
        None => f(),
    }
}

/// `v` as `n` zeros, reusing its allocation.
fn zeroed(v: &mut Vec<f32>, n: usize) {
    v.clear();
    v.resize(n, 0.0);
}

impl Sage {
    /// GraphSAGE-mean with Glorot-uniform weights (ReLU's gain), zero biases.
    pub fn new(dims: &[usize], rng: &mut Rng) -> Sage {
        Sage::with_aggregator(dims, Aggregator::Mean, rng)
    }

    /// Glorot-uniform weights (ReLU's gain), zero biases.
    pub fn with_aggregator(dims: &[usize], aggregator: Aggregator, rng: &mut Rng) -> Sage {
        assert!(dims.len() >= 2 && dims.iter().all(|&d| d > 0));
        let mut params = Vec::new();
        for w in dims.windows(2) {
            let (i, o) = (w[0], w[1]);
            // Glorot-uniform scaled by ReLU's gain, sqrt(2), as DGL's SAGEConv starts: on the
            // 2^20 contextual SBM one epoch then reaches DGL's test accuracy (0.759 against
            // 0.754 without the gain, seeds 1-3; docs/results.md).
            let a = (12.0 / (i + o) as f32).sqrt();
            for _ in 0..Sage::matrices(aggregator) * i * o {
                params.push(rng.random_range(-a..a));
            }
            params.extend(std::iter::repeat_n(0.0, o));
            if aggregator == Aggregator::Pool {
                let a = (3.0 / i as f32).sqrt();
                for _ in 0..i * i {
                    params.push(rng.random_range(-a..a));
                }
                params.extend(std::iter::repeat_n(0.0, i));
            }
        }
        Sage {
            dims: dims.to_vec(),
            params,
            aggregator,
        }
    }

    /// Weight matrices per layer.
    fn matrices(aggregator: Aggregator) -> usize {
        match aggregator {
            Aggregator::Mean | Aggregator::Pool => 2,
            Aggregator::Gcn => 1,
        }
    }

    /// The parameters of a layer from `i` to `o` values.
    fn layer_size(aggregator: Aggregator, i: usize, o: usize) -> usize {
        let pool = if aggregator == Aggregator::Pool {
            i * i + i
        } else {
            0
        };
        Sage::matrices(aggregator) * i * o + o + pool
    }

    /// The parameters `dims` and `aggregator` take.
    pub fn param_count(dims: &[usize], aggregator: Aggregator) -> usize {
        dims.windows(2)
            .map(|w| Sage::layer_size(aggregator, w[0], w[1]))
            .sum()
    }

    pub fn layers(&self) -> usize {
        self.dims.len() - 1
    }

    /// Offset of layer `l`'s parameters and their count.
    fn span(&self, l: usize) -> (usize, usize) {
        let size = |w: &[usize]| Sage::layer_size(self.aggregator, w[0], w[1]);
        let at = self.dims.windows(2).take(l).map(size).sum();
        (at, size(&self.dims[l..l + 2]))
    }

    /// The output rows of `blocks` (the seeds: `blocks.last().num_dst` rows of the last
    /// width, left in `w.saved[last].out`) from the outermost block's input rows `x`
    /// (`blocks[0].num_src` x `dims[0]`). `dropout` (a probability) applies with `rng`;
    /// `None` evaluates.
    fn forward(
        &self,
        w: &mut Work,
        (blocks, x): (&[Block], Input),
        dropout: Option<(f32, &mut Rng)>,
        bf: bool,
    ) {
        assert_eq!(blocks.len(), self.layers(), "one block per layer");
        w.saved.resize_with(blocks.len(), Saved::default);
        let mut dropout = dropout;
        for (l, b) in blocks.iter().enumerate() {
            let (done, rest) = w.saved.split_at_mut(l);
            let h = if l == 0 {
                x
            } else {
                Input::Rows(&done[l - 1].out)
            };
            self.layer(l, b, h, &mut rest[0], (&mut dropout, bf));
        }
    }

    /// Layer `l` over block `b` from its input rows `h`, into `s`: ReLU and dropout unless
    /// it is the last layer.
    fn layer(
        &self,
        l: usize,
        b: &Block,
        h: Input,
        s: &mut Saved,
        (dropout, bf): (&mut Option<(f32, &mut Rng)>, bool),
    ) {
        let (din, dout) = (self.dims[l], self.dims[l + 1]);
        let (at, _) = self.span(l);
        // The gathered means, read in place where the aggregator leaves them as they are.
        let mut given: Option<&[f32]> = None;
        let h: &[f32] = match h {
            Input::Rows(h) => {
                assert_eq!(h.len(), b.num_src * din, "layer {l}: input rows");
                if self.aggregator == Aggregator::Pool {
                    let wp = &self.params[at + 2 * din * dout + dout..];
                    pool_max(
                        b,
                        h,
                        din,
                        (&wp[..din * din], &wp[din * din..din * din + din]),
                        s,
                    );
                } else {
                    let add = |j: usize, acc: &mut [f32]| {
                        add_row(acc, &h[j * din..(j + 1) * din]);
                    };
                    means_with(b, din, &mut s.mean, add, |_| {});
                }
                &h[..b.num_dst * din]
            }
            Input::Means { own, mean } => {
                assert!(
                    self.aggregator != Aggregator::Pool,
                    "the pool aggregator needs every input row"
                );
                assert_eq!(own.len(), b.num_dst * din, "layer {l}: own rows");
                assert_eq!(mean.len(), b.num_dst * din, "layer {l}: means");
                s.mean.clear();
                if self.aggregator == Aggregator::Gcn {
                    s.mean.extend_from_slice(mean);
                } else {
                    given = Some(mean);
                }
                own
            }
        };
        let p = &self.params[at..];
        let k = Sage::matrices(self.aggregator);
        let bias = &p[k * din * dout..k * din * dout + dout];
        let z = &mut s.out;
        z.clear();
        for _ in 0..b.num_dst {
            z.extend_from_slice(bias);
        }
        match self.aggregator {
            Aggregator::Mean | Aggregator::Pool => {
                let (ws, wn) = (&p[..din * dout], &p[din * dout..2 * din * dout]);
                matmul(h, ws, z, (b.num_dst, din, dout), bf);
                matmul(given.unwrap_or(&s.mean), wn, z, (b.num_dst, din, dout), bf);
            }
            Aggregator::Gcn => {
                // The node among its neighbours: (h_self + deg * mean) / (deg + 1).
                for (i, m) in s.mean.chunks_exact_mut(din).enumerate() {
                    let deg = (b.offsets[i + 1] - b.offsets[i]) as f32;
                    let inv = 1.0 / (deg + 1.0);
                    let own = &h[i * din..(i + 1) * din];
                    m.iter_mut()
                        .zip(own)
                        .for_each(|(a, x)| *a = (*a * deg + x) * inv);
                }
                matmul(&s.mean, &p[..din * dout], z, (b.num_dst, din, dout), bf);
            }
        }
        s.gate.clear();
        if l + 1 < self.layers() {
            zeroed(&mut s.gate, z.len());
            relu_dropout(
                z,
                &mut s.gate,
                dropout.as_mut().map(|(p, r)| (*p, &mut **r)),
            );
        }
    }

    /// Layer `l` alone over `block` (evaluation, layer by layer over the whole graph): its
    /// output rows, in `w` until its next use.
    pub fn layer_in<'w>(&self, w: &'w mut Work, l: usize, block: &Block, h: Input) -> &'w [f32] {
        w.saved.resize_with(1, Saved::default);
        let saved = &mut w.saved[0];
        on(w.pool.clone(), || {
            self.layer(l, block, h, saved, (&mut None, false))
        });
        &w.saved[0].out
    }

    /// Class scores of the seeds (evaluation: no dropout).
    pub fn predict(&self, blocks: &[Block], x: &[f32]) -> Vec<f32> {
        self.predict_in(&mut Work::default(), blocks, x).to_vec()
    }

    /// As [`Sage::predict`], in `w`'s buffers: the scores stay in `w` until its next use.
    pub fn predict_in<'w>(&self, w: &'w mut Work, blocks: &[Block], x: &[f32]) -> &'w [f32] {
        self.forward(w, (blocks, Input::Rows(x)), None, false);
        &w.saved.last().expect("layers").out
    }

    /// The loss of the seeds against their labels (softmax cross-entropy for one class each,
    /// a sigmoid cross-entropy per class for several), its gradient added into `grads` (as
    /// `params`), and the gradient of the input rows `x` into `gx` when given (learnable input
    /// rows). Returns the summed loss and the seeds predicted right (multi-label: whose
    /// predicted set is their labels).
    pub fn train_step(
        &self,
        batch: &Batch,
        dropout: f32,
        rng: &mut Rng,
        grads: &mut [f32],
        gx: Option<&mut [f32]>,
    ) -> (f64, usize) {
        self.train_step_in(&mut Work::default(), batch, dropout, rng, grads, gx)
    }

    /// As [`Sage::train_step`], in `w`'s buffers (on its pool).
    pub fn train_step_in(
        &self,
        w: &mut Work,
        batch: &Batch,
        dropout: f32,
        rng: &mut Rng,
        grads: &mut [f32],
        gx: Option<&mut [f32]>,
    ) -> (f64, usize) {
        on(w.pool.clone(), || {
            self.step(w, batch, (dropout, rng), grads, gx)
        })
    }

    fn step(
        &self,
        w: &mut Work,
        batch: &Batch,
        (dropout, rng): (f32, &mut Rng),
        grads: &mut [f32],
        gx: Option<&mut [f32]>,
    ) -> (f64, usize) {
        assert_eq!(grads.len(), self.params.len());
        let (blocks, x, labels) = (batch.blocks, batch.x, batch.labels);
        let (bf, drop) = (w.bf16, (dropout > 0.0).then_some((dropout, rng)));
        self.forward(w, (blocks, x), drop, bf);
        let classes = *self.dims.last().expect("dims");
        let scores = &w.saved.last().expect("layers").out;
        let (loss, correct) = loss_and_gradient(scores, labels, classes, &mut w.dz);
        if let Input::Means { .. } = x {
            assert!(gx.is_none(), "gathered means take no input gradient");
        }
        for l in (0..blocks.len()).rev() {
            let b = &blocks[l];
            let (din, dout) = (self.dims[l], self.dims[l + 1]);
            let input: &[f32] = match x {
                _ if l > 0 => &w.saved[l - 1].out,
                Input::Rows(x) => x,
                Input::Means { own, .. } => own,
            };
            let s = &w.saved[l];
            // The means the forward pass used (see `layer`).
            let mean: &[f32] = match x {
                Input::Means { mean, .. } if l == 0 && self.aggregator != Aggregator::Gcn => mean,
                _ => &s.mean,
            };
            let (at, n) = self.span(l);
            let g = &mut grads[at..at + n];
            let gcn = self.aggregator == Aggregator::Gcn;
            let pool = self.aggregator == Aggregator::Pool;
            let dz = &w.dz;
            let p = &self.params[at..];
            // The first layer's input gradient is needed only for learnable input rows.
            let need_dh = l > 0 || gx.is_some();
            if need_dh {
                zeroed(&mut w.dh, b.num_src * din);
            }
            if need_dh || pool {
                zeroed(&mut w.dm, b.num_dst * din);
            }
            if gcn {
                // dW += M^T dZ, db += sum dZ; dM = dZ W^T.
                let (gw, gb) = g.split_at_mut(din * dout);
                matmul_tn(
                    (&s.mean, dz, gw),
                    (b.num_dst, din, dout),
                    (&mut w.parts, bf),
                );
                add_rows(gb, dz, dout);
                if l == 0 && gx.is_none() {
                    break;
                }
                matmul_nt(dz, &p[..din * dout], &mut w.dm, b.num_dst, dout, din);
            } else {
                // dW_self += H_self^T dZ, dW_neigh += M^T dZ, db += sum dZ.
                let (gws, rest) = g.split_at_mut(din * dout);
                let (gwn, gb) = rest.split_at_mut(din * dout);
                let own = &input[..b.num_dst * din];
                matmul_tn((own, dz, gws), (b.num_dst, din, dout), (&mut w.parts, bf));
                matmul_tn((mean, dz, gwn), (b.num_dst, din, dout), (&mut w.parts, bf));
                let (gb, gpool) = gb.split_at_mut(dout);
                add_rows(gb, dz, dout);
                let (ws, wn) = (&p[..din * dout], &p[din * dout..2 * din * dout]);
                if pool {
                    // dM = dZ W_neigh^T, then through the max and the pool's layer.
                    matmul_nt(dz, wn, &mut w.dm, b.num_dst, dout, din);
                    let wp = &p[2 * din * dout + dout..2 * din * dout + dout + din * din];
                    let dh = need_dh.then_some(&mut w.dh[..]);
                    pool_backward(
                        (b, input, s),
                        (&w.dm, &mut w.dp, &mut w.parts),
                        (wp, gpool),
                        dh,
                    );
                }
                if !need_dh {
                    break;
                }
                // dH_self = dZ W_self^T (and, without pooling, dM = dZ W_neigh^T).
                matmul_nt(dz, ws, &mut w.dh[..b.num_dst * din], b.num_dst, dout, din);
                if !pool {
                    matmul_nt(dz, wn, &mut w.dm, b.num_dst, dout, din);
                }
            }
            // dM spread over the neighbours (and, with GCN, the node itself; the pool's went
            // through its max above).
            let (dh, dm) = (&mut w.dh, &w.dm);
            for i in (0..b.num_dst).filter(|_| !pool) {
                let nb = &b.nbrs[b.offsets[i] as usize..b.offsets[i + 1] as usize];
                let share = nb.len() + usize::from(gcn);
                if share == 0 {
                    continue;
                }
                let inv = 1.0 / share as f32;
                let src = &dm[i * din..(i + 1) * din];
                let own = gcn.then_some(i as u32);
                for &j in nb.iter().chain(own.as_ref()) {
                    let dst = &mut dh[j as usize * din..(j as usize + 1) * din];
                    dst.iter_mut().zip(src).for_each(|(a, d)| *a += d * inv);
                }
            }
            if l == 0 {
                if let Some(gx) = gx {
                    gx.iter_mut().zip(dh.iter()).for_each(|(a, d)| *a += d);
                }
                break;
            }
            // Through the previous layer's ReLU and dropout.
            let prev = &w.saved[l - 1].gate;
            dh.iter_mut().zip(prev).for_each(|(d, g)| *d *= g);
            std::mem::swap(&mut w.dz, &mut w.dh);
        }
        (loss, correct)
    }
}

/// The pool aggregator's forward: every input row through `ReLU(h W_pool + b_pool)` into
/// `s.pool`, then per output node the elementwise max over its neighbours' into `s.mean`
/// (zeros without neighbours) with the row each max came from in `s.arg`.
fn pool_max(b: &Block, h: &[f32], d: usize, (wp, bp): (&[f32], &[f32]), s: &mut Saved) {
    s.pool.clear();
    for _ in 0..b.num_src {
        s.pool.extend_from_slice(bp);
    }
    matmul(h, wp, &mut s.pool, (b.num_src, d, d), false);
    s.pool.iter_mut().for_each(|x| *x = x.max(0.0));
    zeroed(&mut s.mean, b.num_dst * d);
    s.arg.clear();
    s.arg.resize(b.num_dst * d, u32::MAX);
    for (i, (out, arg)) in s
        .mean
        .chunks_exact_mut(d)
        .zip(s.arg.chunks_exact_mut(d))
        .enumerate()
    {
        for &j in &b.nbrs[b.offsets[i] as usize..b.offsets[i + 1] as usize] {
            let r = &s.pool[j as usize * d..(j as usize + 1) * d];
            for ((o, a), &x) in out.iter_mut().zip(arg.iter_mut()).zip(r) {
                if *a == u32::MAX || x > *o {
                    (*o, *a) = (x, j);
                }
            }
        }
    }
}

/// The pool aggregator's backward from `dm` (the gradient of the max-pooled rows): each value
/// to the row its max came from (`dp`), through the ReLU, into the pool layer's gradients
/// (`gpool`: `W_pool` then `b_pool`) and, when given, the input rows' gradient `dh`.
fn pool_backward(
    (b, h, s): (&Block, &[f32], &Saved),
    (dm, dp, parts): (&[f32], &mut Vec<f32>, &mut Vec<Vec<f32>>),
    (wp, gpool): (&[f32], &mut [f32]),
    dh: Option<&mut [f32]>,
) {
    let d = dm.len() / b.num_dst.max(1);
    zeroed(dp, b.num_src * d);
    for (g, (&v, &a)) in dm.iter().zip(&s.arg).enumerate() {
        if a != u32::MAX {
            dp[a as usize * d + g % d] += v;
        }
    }
    dp.iter_mut()
        .zip(&s.pool)
        .for_each(|(g, &x)| *g *= f32::from(u8::from(x > 0.0)));
    let (gw, gb) = gpool.split_at_mut(d * d);
    matmul_tn(
        (&h[..b.num_src * d], dp, gw),
        (b.num_src, d, d),
        (parts, false),
    );
    add_rows(gb, dp, d);
    if let Some(dh) = dh {
        matmul_nt(dp, wp, dh, b.num_src, d, d);
    }
}

/// Neighbour rows a mean asks to be fetched ahead of their use ([`means_with`]'s `hint`).
const AHEAD: usize = 4;

/// ReLU and dropout on a hidden layer's rows `z`, in place: `gate` (as long, zeroed) gets
/// each value's factor (0 where ReLU cut or dropout dropped it, the keep rate's inverse or 1
/// where kept), for the backward. Dropout drops a value when a 16-bit draw falls below `p`'s
/// share, four draws from each 64-bit output of `rng` (one draw per value cost as much as a
/// layer's product); kept values are scaled by the exact keep rate.
fn relu_dropout(z: &mut [f32], gate: &mut [f32], dropout: Option<(f32, &mut Rng)>) {
    match dropout {
        Some((p, rng)) => {
            let cut = (p * DRAWS).round().min(DRAWS - 1.0);
            let scale = DRAWS / (DRAWS - cut);
            let cut = cut as u16;
            // Draws for a block of values first, then the block without a branch per value
            // (the draws are random, so such branches mispredict half the time).
            const BLOCK: usize = 64;
            let mut draws = [0u16; BLOCK];
            for (zc, gc) in z.chunks_mut(BLOCK).zip(gate.chunks_mut(BLOCK)) {
                let words = zc.len().div_ceil(4);
                for w in draws[..words * 4].chunks_exact_mut(4) {
                    let bits: u64 = rng.random();
                    for (k, d) in w.iter_mut().enumerate() {
                        *d = (bits >> (16 * k)) as u16;
                    }
                }
                for ((zi, g), &d) in zc.iter_mut().zip(gc).zip(&draws) {
                    *g = if d >= cut && *zi > 0.0 { scale } else { 0.0 };
                    *zi *= *g;
                }
            }
        }
        None => {
            for (zi, g) in z.iter_mut().zip(gate.iter_mut()) {
                *g = if *zi > 0.0 { 1.0 } else { 0.0 };
                *zi *= *g;
            }
        }
    }
}

/// Per output node of `b`, the mean of its neighbours' input rows (zeros without neighbours),
/// into `m` (`d` wide), where `add(j, acc)` adds input row `j` to `acc`, and `hint(j)` asks
/// the CPU to fetch row `j`, which is added soon (rows scattered over a large window miss the
/// caches: the next node's rows load while this one's are added).
fn means_with(
    b: &Block,
    d: usize,
    m: &mut Vec<f32>,
    add: impl Fn(usize, &mut [f32]) + Sync,
    hint: impl Fn(usize) + Sync,
) {
    zeroed(m, b.num_dst * d);
    let one = |(i, out): (usize, &mut [f32])| {
        let (a, z) = (b.offsets[i] as usize, b.offsets[i + 1] as usize);
        let nb = &b.nbrs[a..z];
        for (k, &j) in nb.iter().enumerate() {
            if let Some(&next) = b.nbrs.get(a + k + AHEAD) {
                hint(next as usize);
            }
            add(j as usize, out);
        }
        if !nb.is_empty() {
            let inv = 1.0 / nb.len() as f32;
            out.iter_mut().for_each(|a| *a *= inv);
        }
    };
    if in_pool() {
        use rayon::prelude::*;
        m.par_chunks_mut(d).enumerate().for_each(one);
    } else {
        m.chunks_mut(d).enumerate().for_each(one);
    }
}

/// The outermost block's [`Input::Means`] into `own` and `mean` (`d` wide), where `add(j,
/// acc)` adds input row `j` to `acc` wherever that row lives (a window, a cache, a buffer of
/// rows read from their owners): each input row is read where it is as often as it is
/// referenced, never copied into a matrix of all input rows first.
/// `hint(j)` asks for row `j` ahead of its use (a no-op where rows are close together).
pub fn gather_means(
    b: &Block,
    d: usize,
    (add, hint): (impl Fn(usize, &mut [f32]) + Sync, impl Fn(usize) + Sync),
    own: &mut Vec<f32>,
    mean: &mut Vec<f32>,
) {
    zeroed(own, b.num_dst * d);
    for (i, row) in own.chunks_exact_mut(d).enumerate() {
        if i + AHEAD < b.num_dst {
            hint(i + AHEAD);
        }
        add(i, row);
    }
    means_with(b, d, mean, &add, hint);
}

/// `acc += row`.
fn add_row(acc: &mut [f32], row: &[f32]) {
    acc.iter_mut().zip(row).for_each(|(a, x)| *a += x);
}

/// `acc += ` every row of `rows` (`width` each).
fn add_rows(acc: &mut [f32], rows: &[f32], width: usize) {
    for row in rows.chunks_exact(width) {
        add_row(acc, row);
    }
}

thread_local! {
    /// A thread's packed bf16 operands (no allocation per product once grown).
    static PACKED: std::cell::RefCell<bf16::Packed> = std::cell::RefCell::default();
}

/// `c (m x n) += a (m x k) b (k x n)`, a task per [`TASK_ROWS`] rows; with `bf` and an `n`
/// that [fits](bf16::fits), bf16 operands and f32 sums.
fn matmul(a: &[f32], b: &[f32], c: &mut [f32], (m, k, n): (usize, usize, usize), bf: bool) {
    debug_assert_eq!((a.len(), c.len()), (m * k, m * n));
    let bf = bf && bf16::fits(n);
    rows_by_task(a, k, c, n, |a, c, rows| {
        if bf {
            PACKED.with_borrow_mut(|p| bf16::mul(c, a, b, (rows, k, n), p));
        } else {
            dense::mul(c, a, b, (rows, k, n), 1.0);
        }
    });
}

/// `c (k x n) += a^T b`, `a` (m x k), `b` (m x n): per [`TASK_ROWS`] rows of `a` and `b` a partial
/// sum (into `parts`), added in order; with `bf` and an `n` that [fits](bf16::fits), bf16
/// operands and f32 sums.
fn matmul_tn(
    (a, b, c): (&[f32], &[f32], &mut [f32]),
    (m, k, n): (usize, usize, usize),
    (parts, bf): (&mut Vec<Vec<f32>>, bool),
) {
    let bf = bf && bf16::fits(n);
    let one = |(i, p): (usize, &mut Vec<f32>)| {
        let (r0, r1) = (i * TASK_ROWS, ((i + 1) * TASK_ROWS).min(m));
        let (a, b) = (&a[r0 * k..r1 * k], &b[r0 * n..r1 * n]);
        p.resize(k * n, 0.0);
        if bf {
            PACKED.with_borrow_mut(|q| bf16::mul_tn(p, (a, b, 0.0), (r1 - r0, k, n), q));
        } else {
            dense::mul_tn(p, a, b, (r1 - r0, k, n));
        }
    };
    let tasks = m.div_ceil(TASK_ROWS);
    parts.resize_with(parts.len().max(tasks), Vec::new);
    let parts = &mut parts[..tasks];
    if in_pool() {
        use rayon::prelude::*;
        parts.par_iter_mut().enumerate().for_each(one);
    } else {
        parts.iter_mut().enumerate().for_each(one);
    }
    for p in parts.iter() {
        add_row(c, p);
    }
}

/// `c (m x k) += a b^T`, `a` (m x n), `b` (k x n), a task per [`TASK_ROWS`] rows.
fn matmul_nt(a: &[f32], b: &[f32], c: &mut [f32], m: usize, n: usize, k: usize) {
    debug_assert_eq!((a.len(), c.len()), (m * n, m * k));
    rows_by_task(a, n, c, k, |a, c, rows| {
        dense::mul_nt(c, a, b, (rows, n, k), 1.0);
    });
}

/// `f(a rows, c rows, rows)` over blocks of [`TASK_ROWS`] rows of `a` (`ka` wide) and `c` (`kc`
/// wide): on the pool's threads inside one, else in order.
fn rows_by_task(
    a: &[f32],
    ka: usize,
    c: &mut [f32],
    kc: usize,
    f: impl Fn(&[f32], &mut [f32], usize) + Sync,
) {
    let one = |(c, a): (&mut [f32], &[f32])| f(a, c, c.len() / kc);
    if in_pool() && c.len() > TASK_ROWS * kc {
        use rayon::prelude::*;
        c.par_chunks_mut(TASK_ROWS * kc)
            .zip(a.par_chunks(TASK_ROWS * ka))
            .for_each(one);
    } else {
        c.chunks_mut(TASK_ROWS * kc)
            .zip(a.chunks(TASK_ROWS * ka))
            .for_each(one);
    }
}

/// The summed loss of `scores` (rows of `classes`) against `labels`, the seeds predicted
/// right, and the loss's gradient into `dz`.
fn loss_and_gradient(
    scores: &[f32],
    labels: Targets,
    classes: usize,
    dz: &mut Vec<f32>,
) -> (f64, usize) {
    match labels {
        Targets::Single(y) => softmax_xent(scores, y, classes, dz),
        Targets::Multi { offsets, ids } => sigmoid_xent(scores, (offsets, ids), classes, dz),
        Targets::Pairs {
            anchors,
            positives,
            negatives,
        } => pair_xent(scores, (anchors, positives, negatives), classes, dz),
    }
}

/// Summed softmax cross-entropy of `scores` (rows of `classes`) against `labels` and the rows
/// whose top score is their label; the gradient of the summed loss into `grad`.
fn softmax_xent(
    scores: &[f32],
    labels: &[u32],
    classes: usize,
    grad: &mut Vec<f32>,
) -> (f64, usize) {
    zeroed(grad, scores.len());
    let (mut loss, mut correct) = (0f64, 0usize);
    for ((s, g), &y) in scores
        .chunks_exact(classes)
        .zip(grad.chunks_exact_mut(classes))
        .zip(labels)
    {
        let m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let z: f32 = s.iter().map(|x| (x - m).exp()).sum();
        for (gi, x) in g.iter_mut().zip(s) {
            *gi = (x - m).exp() / z;
        }
        g[y as usize] -= 1.0;
        loss += f64::from(z.ln() + m - s[y as usize]);
        let top = (0..classes)
            .max_by(|&a, &b| s[a].total_cmp(&s[b]))
            .expect("classes");
        correct += usize::from(top == y as usize);
    }
    (loss, correct)
}

/// Summed sigmoid cross-entropy of `scores` (rows of `classes`) against each row's label set
/// (`ids[offsets[i]..offsets[i + 1]]`) and the rows whose predicted set (scores above 0) is
/// their set; the gradient of the summed loss into `grad`.
fn sigmoid_xent(
    scores: &[f32],
    (offsets, ids): (&[u32], &[u32]),
    classes: usize,
    grad: &mut Vec<f32>,
) -> (f64, usize) {
    zeroed(grad, scores.len());
    let (mut loss, mut correct) = (0f64, 0usize);
    let mut truth = vec![false; classes];
    for (i, (s, g)) in scores
        .chunks_exact(classes)
        .zip(grad.chunks_exact_mut(classes))
        .enumerate()
    {
        truth.iter_mut().for_each(|t| *t = false);
        for &c in &ids[offsets[i] as usize..offsets[i + 1] as usize] {
            truth[c as usize] = true;
        }
        let mut all_right = true;
        for ((&x, gi), &t) in s.iter().zip(g.iter_mut()).zip(&truth) {
            // log(1 + e^x) - t x.
            loss += f64::from(softplus(x) - if t { x } else { 0.0 });
            *gi = sigmoid(x) - f32::from(u8::from(t));
            all_right &= (x > 0.0) == t;
        }
        correct += usize::from(all_right);
    }
    (loss, correct)
}

/// `log(1 + e^x)`, stable for either sign of `x`.
fn softplus(x: f32) -> f32 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// GraphSAGE's unsupervised loss ([`Targets::Pairs`]) over the seeds' output rows `z` (`d`
/// wide) scaled to unit length (as the paper's embeddings: bounded scores, so that the
/// negatives cannot win by shrinking every row toward zero), summed over the anchors, and the
/// anchors whose positive scores above every negative; the gradient of the summed loss with
/// respect to `z` into `grad`.
fn pair_xent(
    z: &[f32],
    (anchors, positives, negatives): (&[u32], &[u32], &[u32]),
    d: usize,
    grad: &mut Vec<f32>,
) -> (f64, usize) {
    zeroed(grad, z.len());
    let norms: Vec<f32> = z
        .chunks_exact(d)
        .map(|r| r.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12))
        .collect();
    let unit: Vec<f32> = z
        .chunks_exact(d)
        .zip(&norms)
        .flat_map(|(r, &n)| r.iter().map(move |x| x / n))
        .collect();
    let row = |i: u32| &unit[i as usize * d..(i as usize + 1) * d];
    let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
    // The gradient with respect to the unit rows first.
    let mut gu = vec![0f32; z.len()];
    let mut add = |i: u32, k: f32, r: &[f32]| {
        gu[i as usize * d..(i as usize + 1) * d]
            .iter_mut()
            .zip(r)
            .for_each(|(a, x)| *a += k * x);
    };
    let (mut loss, mut ranked) = (0f64, 0usize);
    for (&a, &p) in anchors.iter().zip(positives) {
        let (za, zp) = (row(a), row(p));
        let s = dot(za, zp);
        loss += f64::from(softplus(-s));
        // d/ds of -log σ(s) is -σ(-s).
        let k = -sigmoid(-s);
        add(a, k, zp);
        add(p, k, za);
        let mut above = true;
        for &q in negatives {
            let zq = row(q);
            let t = dot(za, zq);
            loss += f64::from(softplus(t));
            let k = sigmoid(t);
            add(a, k, zq);
            add(q, k, za);
            above &= s > t;
        }
        ranked += usize::from(above);
    }
    // Through the scaling: d(z/|z|) = (I - u u^T) / |z|.
    for (((g, gu), u), &n) in grad
        .chunks_exact_mut(d)
        .zip(gu.chunks_exact(d))
        .zip(unit.chunks_exact(d))
        .zip(&norms)
    {
        let along = dot(u, gu);
        for ((g, &gu), &u) in g.iter_mut().zip(gu).zip(u) {
            *g = (gu - u * along) / n;
        }
    }
    (loss, ranked)
}

/// Adam (Kingma and Ba) over a flat parameter vector, with L2 weight decay added to the
/// gradient (as PyTorch's `Adam(weight_decay=...)`).
#[derive(Clone, Debug)]
pub struct Adam {
    pub lr: f32,
    pub weight_decay: f32,
    m: Vec<f32>,
    v: Vec<f32>,
    t: i32,
}

impl Adam {
    pub fn new(n: usize, lr: f32, weight_decay: f32) -> Adam {
        Adam {
            lr,
            weight_decay,
            m: vec![0.0; n],
            v: vec![0.0; n],
            t: 0,
        }
    }

    /// The moments and the step count (a checkpoint's).
    pub fn state(&self) -> (&[f32], &[f32], i32) {
        (&self.m, &self.v, self.t)
    }

    /// Back to a saved [`Adam::state`]; `false` when its lengths are not this optimizer's.
    pub fn restore(&mut self, m: Vec<f32>, v: Vec<f32>, t: i32) -> bool {
        if m.len() != self.m.len() || v.len() != self.v.len() {
            return false;
        }
        (self.m, self.v, self.t) = (m, v, t);
        true
    }

    /// One step on `params` with the mean gradient `grads`.
    pub fn step(&mut self, params: &mut [f32], grads: &[f32]) {
        const B1: f32 = 0.9;
        const B2: f32 = 0.999;
        self.t += 1;
        let (c1, c2) = (1.0 - B1.powi(self.t), 1.0 - B2.powi(self.t));
        for (((x, &g), m), v) in params
            .iter_mut()
            .zip(grads)
            .zip(self.m.iter_mut())
            .zip(self.v.iter_mut())
        {
            let g = g + self.weight_decay * *x;
            *m = B1 * *m + (1.0 - B1) * g;
            *v = B2 * *v + (1.0 - B2) * g * g;
            *x -= self.lr * (*m / c1) / ((*v / c2).sqrt() + 1e-8);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn rng(seed: u64) -> Rng {
        Rng::seed_from_u64(seed)
    }

    /// Two blocks over 7 input rows: 4 middle rows, 2 seeds; a seed without neighbours too.
    fn blocks() -> Vec<Block> {
        vec![
            Block {
                num_src: 7,
                num_dst: 4,
                offsets: vec![0, 2, 3, 3, 6],
                nbrs: vec![4, 5, 6, 1, 4, 6],
            },
            Block {
                num_src: 4,
                num_dst: 2,
                offsets: vec![0, 3, 3],
                nbrs: vec![2, 3, 1],
            },
        ]
    }

    /// The hand-written gradients (weights and input rows) match central differences, for
    /// either aggregator and either loss (one class per seed; a set per seed, one empty).
    /// Dropout drops each value with probability p (the 16-bit draws: within 4 standard
    /// deviations over 2^18 values), the kept ones scaled so that the mean is kept; ReLU's cut
    /// values and a run without dropout gate as ReLU alone.
    #[test]
    fn dropout_keeps_the_mean_and_drops_its_share() {
        let n = 1 << 18;
        for p in [0.1f32, 0.5, 0.9] {
            let (mut z, mut gate) = (vec![1f32; n], vec![0f32; n]);
            relu_dropout(&mut z, &mut gate, Some((p, &mut rng(7))));
            let dropped = gate.iter().filter(|&&g| g == 0.0).count() as f64 / n as f64;
            let sd = (p as f64 * (1.0 - p as f64) / n as f64).sqrt();
            assert!(
                (dropped - p as f64).abs() < 4.0 * sd,
                "p {p}: dropped {dropped}"
            );
            let mean = z.iter().map(|&x| x as f64).sum::<f64>() / n as f64;
            assert!(
                (mean - 1.0).abs() < 4.0 * sd / (1.0 - p as f64),
                "p {p}: mean {mean}"
            );
            assert!(z.iter().zip(&gate).all(|(x, g)| x == g));
        }
        let mut z: Vec<f32> = (0..8).map(|i| i as f32 - 3.5).collect();
        let mut gate = vec![0f32; 8];
        relu_dropout(&mut z, &mut gate, None);
        assert_eq!(gate, [0., 0., 0., 0., 1., 1., 1., 1.]);
        assert_eq!(z, [0., 0., 0., 0., 0.5, 1.5, 2.5, 3.5]);
        let mut z = vec![-1f32; 8];
        relu_dropout(&mut z, &mut gate, Some((0.5, &mut rng(1))));
        assert!(gate.iter().all(|&g| g == 0.0));
        // Value i takes bits 16 (i % 4) of the (i / 4)-th output, at any length.
        for n in [1usize, 3, 4, 63, 64, 65, 130] {
            let x: Vec<f32> = (0..n).map(|i| (i % 7) as f32 - 2.0).collect();
            let (mut z, mut gate) = (x.clone(), vec![0f32; n]);
            relu_dropout(&mut z, &mut gate, Some((0.3, &mut rng(5))));
            let mut r = rng(5);
            let words: Vec<u64> = (0..n.div_ceil(4)).map(|_| r.random()).collect();
            let cut = (0.3 * DRAWS).round() as u64;
            for i in 0..n {
                let kept = (words[i / 4] >> (16 * (i % 4))) & 0xffff >= cut && x[i] > 0.0;
                let g = if kept {
                    DRAWS / (DRAWS - cut as f32)
                } else {
                    0.0
                };
                assert_eq!((gate[i], z[i]), (g, x[i] * g), "n {n}, value {i}");
            }
        }
    }

    /// A step with bf16 products (`--compute-dtype bf16`) follows the f32 step, for every
    /// aggregator: the same loss and weights' gradient within bf16's rounding (8 bits), and not
    /// the same bits (the path ran). The first layer's width (32) takes it; the classes (3) stay
    /// f32.
    #[test]
    fn a_bf16_step_follows_the_f32_step() {
        if !bf16::available() {
            eprintln!("no AVX-512 BF16 here: the bf16 step is not run");
            return;
        }
        for aggregator in [Aggregator::Mean, Aggregator::Gcn, Aggregator::Pool] {
            bf16_step_follows_for(aggregator);
        }
    }

    fn bf16_step_follows_for(aggregator: Aggregator) {
        let mut r = rng(3);
        let sage = Sage::with_aggregator(&[32, 32, 3], aggregator, &mut r);
        let x: Vec<f32> = (0..7 * 32).map(|_| r.random_range(-1.0..1.0)).collect();
        let b = blocks();
        let batch = Batch {
            blocks: &b,
            x: Input::Rows(&x),
            labels: Targets::Single(&[2, 0]),
        };
        let run = |bf: bool| {
            let mut w = Work {
                bf16: bf,
                ..Work::default()
            };
            let mut g = vec![0f32; sage.params.len()];
            let (loss, _) = sage.train_step_in(&mut w, &batch, 0.0, &mut rng(0), &mut g, None);
            (loss, g)
        };
        let ((l32, g32), (l16, g16)) = (run(false), run(true));
        assert!(
            (l32 - l16).abs() < 1e-2 * l32.abs(),
            "{aggregator:?}: loss {l32} against {l16}"
        );
        let scale = g32.iter().fold(0f32, |m, g| m.max(g.abs()));
        let off = g32
            .iter()
            .zip(&g16)
            .fold(0f32, |m, (a, c)| m.max((a - c).abs()));
        assert!(
            off < 0.02 * scale,
            "{aggregator:?}: gradients differ by {off} (largest {scale})"
        );
        assert!(off > 0.0, "{aggregator:?}: the bf16 products did not run");
    }

    #[test]
    fn gradients_match_finite_differences() {
        let single = Targets::Single(&[2, 0]);
        let multi = Targets::Multi {
            offsets: &[0, 2, 2],
            ids: &[0, 2],
        };
        // Unsupervised: seed 0 pulled toward seed 1, pushed from seed 1 too (a node can be
        // both), and seed 1 toward seed 0 against seed 0 itself.
        let pairs = Targets::Pairs {
            anchors: &[0, 1],
            positives: &[1, 0],
            negatives: &[1, 0],
        };
        for aggregator in [Aggregator::Mean, Aggregator::Gcn, Aggregator::Pool] {
            for labels in [single, multi, pairs] {
                gradients_match_for(aggregator, labels);
            }
        }
    }

    fn gradients_match_for(aggregator: Aggregator, labels: Targets) {
        let mut r = rng(1);
        let sage = Sage::with_aggregator(&[5, 6, 3], aggregator, &mut r);
        assert_eq!(sage.params.len(), Sage::param_count(&[5, 6, 3], aggregator));
        let x: Vec<f32> = (0..7 * 5).map(|_| r.random_range(-1.0..1.0)).collect();
        let b = blocks();
        let loss = |s: &Sage, x: &[f32]| {
            let mut g = vec![0f32; s.params.len()];
            let batch = Batch {
                blocks: &b,
                x: Input::Rows(x),
                labels,
            };
            s.train_step(&batch, 0.0, &mut rng(0), &mut g, None).0
        };
        let mut g = vec![0f32; sage.params.len()];
        let mut gx = vec![0f32; x.len()];
        let batch = Batch {
            blocks: &b,
            x: Input::Rows(&x),
            labels,
        };
        let (loss0, _) = sage.train_step(&batch, 0.0, &mut rng(0), &mut g, Some(&mut gx));
        if aggregator != Aggregator::Pool {
            // The first layer's means gathered where the rows are: the same loss and weights'
            // gradient.
            let (mut own, mut mean) = (Vec::new(), Vec::new());
            let add = |j: usize, acc: &mut [f32]| add_row(acc, &x[j * 5..(j + 1) * 5]);
            gather_means(&b[0], 5, (add, |_| {}), &mut own, &mut mean);
            let mut gm = vec![0f32; sage.params.len()];
            let batch = Batch {
                blocks: &b,
                x: Input::Means {
                    own: &own,
                    mean: &mean,
                },
                labels,
            };
            let (loss1, _) = sage.train_step(&batch, 0.0, &mut rng(0), &mut gm, None);
            assert!((loss0 - loss1).abs() < 1e-5, "{loss0} against {loss1}");
            let off = g
                .iter()
                .zip(&gm)
                .map(|(a, c)| (a - c).abs())
                .fold(0f32, f32::max);
            assert!(off < 1e-5, "{aggregator:?}: gradients differ by {off}");
        }
        // Central differences at three steps; an entry passes at any of them. The pool's ReLU
        // and max have kinks: a step that crosses one (a pre-activation within the step of 0,
        // two neighbours within it of each other) is not the derivative, a smaller step misses
        // the kink, and the smallest is limited by f32 rounding.
        let err = |f: &dyn Fn(f32) -> f64, g: f32| {
            [1e-2f32, 2e-3, 3e-4, 1e-4]
                .iter()
                .map(|&h| {
                    let fd = (f(h) - f(-h)) / (2.0 * f64::from(h));
                    (fd - f64::from(g)).abs() / (fd.abs() + 1e-2)
                })
                .fold(f64::INFINITY, f64::min)
        };
        let mut worst = 0f64;
        for i in (0..sage.params.len()).step_by(3) {
            let at = |h: f32| {
                let mut s = sage.clone();
                s.params[i] += h;
                loss(&s, &x)
            };
            worst = worst.max(err(&at, g[i]));
        }
        for i in 0..x.len() {
            let at = |h: f32| {
                let mut y = x.clone();
                y[i] += h;
                loss(&sage, &y)
            };
            worst = worst.max(err(&at, gx[i]));
        }
        assert!(worst < 0.05, "{aggregator:?}: worst relative error {worst}");
        assert!(g.iter().any(|&v| v != 0.0) && gx.iter().any(|&v| v != 0.0));
    }

    /// On a graph whose classes show in the neighbours' features more than in a node's own,
    /// Adam on the mean aggregator learns the classes.
    #[test]
    fn a_two_layer_sage_learns_classes_from_neighbours() {
        let (n, k, f) = (300usize, 3usize, 8usize);
        let mut r = rng(5);
        let class: Vec<usize> = (0..n).map(|v| v % k).collect();
        // Weak own signal, neighbours of the same class.
        let x: Vec<f32> = (0..n * f)
            .map(|i| {
                let (v, j) = (i / f, i % f);
                r.random_range(-1.0f32..1.0) + if j == class[v] { 0.4 } else { 0.0 }
            })
            .collect();
        let nbrs_of = |v: usize| -> Vec<usize> { (1..=6).map(|s| (v + s * k) % n).collect() };
        // Full two-hop blocks over every node (seeds: all of them).
        let block = |dst: usize| Block {
            num_src: n,
            num_dst: dst,
            offsets: (0..=dst).map(|i| (i * 6) as u32).collect(),
            nbrs: (0..dst)
                .flat_map(|v| nbrs_of(v).into_iter().map(|u| u as u32))
                .collect(),
        };
        let b = vec![block(n), block(n)];
        let labels: Vec<u32> = class.iter().map(|&c| c as u32).collect();
        let mut sage = Sage::new(&[f, 16, k], &mut r);
        let mut adam = Adam::new(sage.params.len(), 0.01, 5e-4);
        let mut g = vec![0f32; sage.params.len()];
        for _ in 0..100 {
            g.iter_mut().for_each(|v| *v = 0.0);
            let batch = Batch {
                blocks: &b,
                x: Input::Rows(&x),
                labels: Targets::Single(&labels),
            };
            sage.train_step(&batch, 0.2, &mut r, &mut g, None);
            g.iter_mut().for_each(|v| *v /= n as f32);
            adam.step(&mut sage.params, &g);
        }
        let s = sage.predict(&b, &x);
        let acc = (0..n)
            .filter(|&v| {
                let row = &s[v * k..(v + 1) * k];
                (0..k).max_by(|&a, &c| row[a].total_cmp(&row[c])) == Some(class[v])
            })
            .count() as f64
            / n as f64;
        assert!(acc > 0.9, "accuracy {acc}");
    }
}
