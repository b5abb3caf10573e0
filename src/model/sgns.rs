//! Skip-gram with negative sampling (word2vec; DeepWalk, node2vec, LINE). For a positive pair
//! (center c, context x) and negatives n_k: loss = -ln s(u_x . v_c) - sum_k ln s(-u_nk . v_c).
//! LINE first order is the same loss with u and v rows from one matrix.
//! Scores are clamped to [-MAX_SCORE, MAX_SCORE] like word2vec's sigmoid table.

use super::cells::{add_to, load, prefetch, store, Shared};
use super::kernels::{combine2_dyn, combine_dyn, dots2_dyn, dots_dyn, sigmoid_fast, two_rows_mut};
#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
use super::kernels::{fused, fused_grads, with_width, FUSED_TARGETS};
use super::{adagrad_factor, axpy, dot, sigmoid, softplus_neg, Cells, Grads, Model, Plan, Work};
use crate::config::TrainConfig;
use crate::error::Result;
use crate::graph::LocalGraph;
use crate::graph::NodeId;
use crate::sample::negatives::NegativePool;
use crate::sample::walk::Segments;
use crate::sample::Rng;

pub use super::{REMOTE, SKIP};

mod steps;
pub use steps::{implicit_steps, Step};

use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering::Relaxed;

/// word2vec's MAX_EXP.
pub const MAX_SCORE: f32 = 6.0;

/// Skip-gram with negative sampling over vertex rows (matrix 0) and context rows (matrix 1; LINE
/// first order uses matrix 0 for both): DeepWalk and node2vec train walk segments (or their
/// pairs), LINE edge pairs.
pub struct Sgns {
    /// Negatives per positive pair (per output token of a segment).
    k: usize,
    /// Pairs that share one draw of negatives (`--shared-negatives`).
    share: usize,
    /// Matrix of context and negative rows.
    tm: u64,
    window: u32,
    /// Implicit steps ([`implicit_steps`]).
    implicit: bool,
}

impl Model for Sgns {
    type Plan = SgnsPlan;

    fn new(cfg: &TrainConfig, _g: &LocalGraph) -> Result<Self> {
        Ok(Sgns {
            k: cfg.negatives as usize,
            share: cfg.shared_negatives,
            tm: u64::from(cfg.matrices() > 1),
            window: cfg.window,
            implicit: implicit_steps(cfg.lr),
        })
    }

    fn plan(
        &self,
        work: Work,
        neg: &NegativePool,
        rng: &mut Rng,
        refer: &mut impl FnMut(u64) -> u32,
    ) -> SgnsPlan {
        let (k, tm) = (self.k, self.tm);
        let rows = match work {
            Work::Pairs(pairs) => {
                let (pidx, nidx) = plan(pairs, k, self.share, tm, neg, rng, refer);
                PlanRows::Pairs { pidx, nidx }
            }
            Work::Segments(segs) => plan_segments(segs, k, self.share, tm, neg, rng, refer),
            Work::Triples(_) => {
                unreachable!("skip-gram trains pairs and walks (TrainConfig refuses triples)")
            }
        };
        SgnsPlan {
            rows,
            k,
            window: self.window,
            implicit: self.implicit,
        }
    }
}

/// A planned skip-gram batch.
pub struct SgnsPlan {
    rows: PlanRows,
    k: usize,
    window: u32,
    implicit: bool,
}

/// Row references of pairs (see `plan`) or of walk segments (see `plan_segments`).
enum PlanRows {
    Pairs {
        pidx: Vec<[u32; 2]>,
        nidx: Vec<u32>,
    },
    Segments {
        refs: Vec<[u32; 2]>,
        wins: Vec<u32>,
        segs: Vec<(u32, u32)>,
        negs: Vec<u32>,
        first_group: Vec<u32>,
        pairs: usize,
    },
}

impl Plan for SgnsPlan {
    fn references(&self) -> [&[u32]; 2] {
        match &self.rows {
            PlanRows::Pairs { pidx, nidx } => [pidx.as_flattened(), nidx],
            PlanRows::Segments { refs, negs, .. } => [refs.as_flattened(), negs],
        }
    }

    fn references_mut(&mut self) -> [&mut [u32]; 2] {
        match &mut self.rows {
            PlanRows::Pairs { pidx, nidx } => [pidx.as_flattened_mut(), nidx],
            PlanRows::Segments { refs, negs, .. } => [refs.as_flattened_mut(), negs],
        }
    }

    fn examples(&self) -> usize {
        match &self.rows {
            PlanRows::Pairs { pidx, .. } => pidx.len(),
            PlanRows::Segments { pairs, .. } => *pairs,
        }
    }

    fn loss_terms(&self) -> u64 {
        (self.examples() * (1 + self.k)) as u64
    }

    fn train(&self, rows: &Cells, lr: f32) -> f64 {
        let [c, tg] = rows.matrices;
        match &self.rows {
            PlanRows::Pairs { pidx, nidx } => {
                let step = Step::new(lr, self.implicit, rows.acc);
                sgd_in_place(c, tg, rows.remote, rows.dim, pidx, nidx, self.k, step)
            }
            PlanRows::Segments {
                refs,
                wins,
                segs,
                negs,
                first_group,
                ..
            } => {
                let seg_rows = SegmentRows {
                    refs,
                    wins,
                    segs,
                    negs,
                    first_group,
                };
                sgd_segments(
                    c,
                    tg,
                    rows.remote,
                    rows.dim,
                    &seg_rows,
                    self.k,
                    self.window,
                    Step::new(lr, self.implicit, rows.acc),
                )
            }
        }
    }

    fn gradients(&self, rows: &[f32], dim: usize) -> Grads {
        match &self.rows {
            PlanRows::Pairs { pidx, nidx } => {
                let (rows, loss) = batch_gradients(rows, dim, pidx, nidx, self.k);
                Grads {
                    rows,
                    replicated: Vec::new(),
                    loss,
                }
            }
            // The batched update trains pairs: `--kernel token` is hogwild's (`TrainConfig`).
            PlanRows::Segments { .. } => {
                unreachable!("walk segments are trained by hogwild only")
            }
        }
    }
}

/// Row references of walk segments for [`sgd_segments`]: per token its input (matrix 0)
/// and output (matrix `tm`) rows, and `k` negatives from `neg` per group (output token with at
/// least one input); a negative equal to its group's output node is `SKIP`.
fn plan_segments(
    segs: &Segments,
    k: usize,
    share: usize,
    tm: u64,
    neg: &NegativePool,
    rng: &mut Rng,
    refer: &mut impl FnMut(u64) -> u32,
) -> PlanRows {
    let mut first_group = Vec::with_capacity(segs.segs.len());
    let mut outputs = Vec::new();
    let mut pairs = 0;
    for s in 0..segs.segs.len() {
        first_group.push(outputs.len() as u32);
        let (t, h) = segs.segment(s);
        for (b, &(node, w)) in t.iter().enumerate() {
            let (lo, hi) = crate::sample::walk::group_inputs(t.len(), h, b, w);
            let m = group_size(lo, hi, b);
            if m > 0 {
                outputs.push(node);
                pairs += m;
            }
        }
    }
    // A chunk of `share` consecutive groups shares one draw of `k` negatives: their rows are
    // read from memory once per chunk (on graphs whose rows do not fit in cache, most of a
    // group's misses are its negatives).
    let share = share.max(1);
    let mut drawn = vec![0u64; outputs.len().div_ceil(share) * k];
    if neg.is_empty() {
        drawn.clear();
    } else {
        neg.fill(rng, &mut drawn);
    }
    let negs = if drawn.is_empty() {
        vec![SKIP; outputs.len() * k]
    } else {
        // A draw is referred to when first used (with `share` 1, in the order of the draws).
        let mut slots = vec![None; drawn.len()];
        (0..outputs.len() * k)
            .map(|i| {
                let (g, j) = (i / k, i % k);
                let d = g / share * k + j;
                if drawn[d] == outputs[g] {
                    SKIP
                } else {
                    *slots[d].get_or_insert_with(|| refer((drawn[d] << 1) | tm))
                }
            })
            .collect()
    };
    let refs = segs
        .tokens
        .iter()
        .map(|&(node, _)| [refer(node << 1), refer((node << 1) | tm)])
        .collect();
    PlanRows::Segments {
        refs,
        wins: segs.tokens.iter().map(|&(_, w)| w).collect(),
        segs: segs.segs.clone(),
        negs,
        first_group,
        pairs,
    }
}

/// Row references of `pairs` (center in matrix 0, context in matrix `tm`) and `k` negatives per
/// pair from `neg`, through `refer` (row key `node << 1 | matrix` -> reference). With
/// `share` > 1, a chunk of `share` pairs shares one draw of negatives (PyTorch-BigGraph): far
/// fewer distinct rows per pair. A negative equal to the pair's context is `SKIP`.
fn plan(
    pairs: &[(NodeId, NodeId)],
    k: usize,
    share: usize,
    tm: u64,
    neg: &NegativePool,
    rng: &mut Rng,
    refer: &mut impl FnMut(u64) -> u32,
) -> (Vec<[u32; 2]>, Vec<u32>) {
    let share = share.max(1);
    // All of the batch's draws first (see `NegativePool::fill`), then the references.
    let mut drawn = vec![0u64; pairs.len().div_ceil(share) * k];
    if neg.is_empty() {
        drawn.clear();
    } else {
        neg.fill(rng, &mut drawn);
    }
    let drawn: Vec<(u64, u32)> = drawn
        .into_iter()
        .map(|n| (n, refer((n << 1) | tm)))
        .collect();
    let mut pidx = Vec::with_capacity(pairs.len());
    let mut nidx = Vec::with_capacity(pairs.len() * k);
    for (i, &(c, x)) in pairs.iter().enumerate() {
        pidx.push([refer(c << 1), refer((x << 1) | tm)]);
        if drawn.is_empty() {
            // No negatives exist (a graph without edges): every draw is skipped.
            nidx.extend(std::iter::repeat_n(SKIP, k));
            continue;
        }
        let d = &drawn[i / share * k..(i / share + 1) * k];
        nidx.extend(d.iter().map(|&(n, sl)| if n == x { SKIP } else { sl }));
    }
    (pidx, nidx)
}

/// Add the gradients of `pairs` (center slot, context slot) with `k` negatives each into `grads`
/// (same layout as `rows`: slot * dim). Returns the summed loss.
pub fn accumulate(
    rows: &[f32],
    dim: usize,
    pairs: &[[u32; 2]],
    negs: &[u32],
    k: usize,
    grads: &mut [f32],
) -> f64 {
    let mut loss = 0f64;
    let mut gc = vec![0f32; dim];
    for (i, &[c, x]) in pairs.iter().enumerate() {
        let c = c as usize;
        let vc = &rows[c * dim..(c + 1) * dim];
        gc.iter_mut().for_each(|g| *g = 0.0);
        let targets =
            std::iter::once((x, 1.0f32)).chain(negs[i * k..(i + 1) * k].iter().map(|&n| (n, 0.0)));
        for (t, label) in targets {
            if t == SKIP {
                continue;
            }
            let t = t as usize;
            let ut = &rows[t * dim..(t + 1) * dim];
            let s = dot(ut, vc).clamp(-MAX_SCORE, MAX_SCORE);
            loss += f64::from(if label > 0.0 {
                softplus_neg(s)
            } else {
                softplus_neg(-s)
            });
            let g = sigmoid(s) - label;
            axpy(g, ut, &mut gc);
            axpy(g, vc, &mut grads[t * dim..(t + 1) * dim]);
        }
        axpy(1.0, &gc, &mut grads[c * dim..(c + 1) * dim]);
    }
    loss
}

/// [`sgd_in_place`] computes the loss of one pair in this many.
pub const LOSS_SAMPLE: usize = 8;

/// HOGWILD skip-gram: every pair updates its rows in place, in word2vec's order (targets first,
/// then the center with the accumulated gradient), at learning rate `lr`. A row reference is a
/// local row of `centers` (for pair centers) or `targets` (contexts and negatives), or
/// `REMOTE | slot` for row `slot` of `remote`. Pairs run in parallel on the current rayon pool.
/// Returns the summed loss, estimated from every `LOSS_SAMPLE`-th pair (a logarithm per target
/// costs a tenth of the kernel); a NaN score anywhere makes it NaN.
#[allow(clippy::too_many_arguments)]
pub fn sgd_in_place(
    centers: Shared,
    targets: Shared,
    remote: Shared,
    dim: usize,
    pairs: &[[u32; 2]],
    negs: &[u32],
    k: usize,
    step: Step,
) -> f64 {
    use rayon::prelude::*;
    const CHUNK: usize = 256;
    let Step { lr, implicit, acc } = step;
    const PREFETCH: usize = 2;
    let row = |center: bool, r: u32| shared_row(centers, targets, remote, dim, center, r);
    let pair_negs = |i: usize| &negs[i * k..(i + 1) * k];
    (0..pairs.len().div_ceil(CHUNK))
        .into_par_iter()
        .map_init(
            || (vec![0f32; dim], vec![0f32; dim], vec![0f32; dim]),
            |(vc, ut, gc), ch| {
                let mut loss = 0f64;
                let lo = ch * CHUNK;
                let hi = (lo + CHUNK).min(pairs.len());
                for (i, &[c, x]) in (lo..hi).zip(&pairs[lo..hi]) {
                    // The rows of a pair are random: start reading the next pair's while this
                    // one computes, so that their cache misses overlap with arithmetic.
                    if let Some(&[nc, nx]) = pairs.get(i + PREFETCH) {
                        prefetch(row(true, nc));
                        prefetch(row(false, nx));
                        for &t in pair_negs(i + PREFETCH) {
                            if t != SKIP {
                                prefetch(row(false, t));
                            }
                        }
                    }
                    let crow = row(true, c);
                    load(crow, vc);
                    gc.iter_mut().for_each(|g| *g = 0.0);
                    // Adagrad: a target's gradient is g v_c, its mean square g^2 mean(v_c^2).
                    let vc_sq = if implicit { dot(vc, vc) } else { 0.0 };
                    let vc_msq = if acc.is_some() {
                        dot(vc, vc) / dim as f32
                    } else {
                        0.0
                    };
                    let ts = std::iter::once(x).chain(pair_negs(i).iter().copied());
                    for (j, t) in ts.enumerate() {
                        if t == SKIP {
                            continue;
                        }
                        let trow = row(false, t);
                        load(trow, ut);
                        let s = dot(ut, vc).clamp(-MAX_SCORE, MAX_SCORE);
                        let e = (-s).exp();
                        let label = if j == 0 { 1.0 } else { 0.0 };
                        if i % LOSS_SAMPLE == 0 {
                            // -ln sigmoid(s) = ln(1 + e), -ln sigmoid(-s) = s + ln(1 + e).
                            let l = e.ln_1p() + if j == 0 { 0.0 } else { s };
                            loss += f64::from(l) * LOSS_SAMPLE as f64;
                        } else if s.is_nan() {
                            loss = f64::NAN;
                        }
                        let mut g = 1.0 / (1.0 + e) - label;
                        if acc.is_none() && implicit {
                            let sg = 1.0 / (1.0 + e);
                            g /= 1.0 + lr * sg * (1.0 - sg) * (dot(ut, ut) + vc_sq);
                        }
                        let (g, step) = match acc {
                            None => (g * lr, g * lr),
                            Some(a) => (g, g * adagrad_factor(a.of(false, t), g * g * vc_msq, lr)),
                        };
                        axpy(g, ut, gc);
                        axpy(-step, vc, ut);
                        store(trow, ut);
                    }
                    let factor = match acc {
                        None => 1.0,
                        Some(a) => adagrad_factor(a.of(true, c), dot(gc, gc) / dim as f32, lr),
                    };
                    // Reload: the center may also have been a target of this pair (LINE first
                    // order, or a negative equal to the center).
                    load(crow, vc);
                    axpy(-factor, gc, vc);
                    store(crow, vc);
                }
                loss
            },
        )
        .sum()
}

/// The rows of [`sgd_segments`]: per token its (input, output) row references, as in
/// [`sgd_in_place`], and its reduced window; per segment its first token and history length;
/// per group (output token with at least one input, in order) `k` negative references, or
/// `SKIP`; per segment its first group.
pub struct SegmentRows<'a> {
    pub refs: &'a [[u32; 2]],
    pub wins: &'a [u32],
    pub segs: &'a [(u32, u32)],
    pub negs: &'a [u32],
    pub first_group: &'a [u32],
}

/// Number of inputs of output `b` (positions `lo..hi` except `b`, see
/// [`crate::sample::walk::group_inputs`]).
#[inline]
pub fn group_size(lo: usize, hi: usize, b: usize) -> usize {
    (hi - lo) - usize::from((lo..hi).contains(&b))
}

/// [`sgd_segments`] computes the loss of one group (output token) in this many: a logarithm per
/// score in every eighth group cost 5% of the kernel, in every 32nd still 2% (`perf`); a batch
/// of 10^5 tokens still samples about 800 groups of 6 (1 + k) scores each.
pub const LOSS_SAMPLE_GROUPS: usize = 128;

/// Whether the group of the batch's token `token`, whose output row is `target`, is in the
/// loss's sample: a hash of both and of the batch's `salt` (its first negative, drawn afresh for
/// every batch) picks one group in [`LOSS_SAMPLE_GROUPS`] whatever its place.
/// Picking every `LOSS_SAMPLE_GROUPS`-th group of a batch picked only the first group of any
/// smaller batch (a rank's step at 8 simulated nodes trains about one walk): a walk's first
/// token, whose window reaches one side only, so the summary's loss per pair moved with the
/// batches' shape.
#[inline]
fn loss_sampled(salt: u32, token: usize, target: u32) -> bool {
    use rand::{Rng as _, SeedableRng as _};
    let key = u64::from(salt) << 32 ^ u64::from(target) << 20 ^ token as u64;
    rand_xoshiro::SplitMix64::seed_from_u64(key).next_u64() % LOSS_SAMPLE_GROUPS as u64 == 0
}

/// Token-blocked HOGWILD skip-gram (Ji et al.'s pWord2Vec, BlazingText): each output token b of
/// a segment, its inputs (the tokens of b's window, rows of `centers`) and its targets (b's row
/// of `targets` and `k` negatives shared by the group) form one dense block: scores
/// S = V U^T (m x (1 + k)), coefficients G = (label - sigmoid(S)) lr, then V += G U and
/// U += G^T V, both from the values before the block. An input row is copied once while it is
/// inside some window (a ring of 2 `window` + 1 rows) and goes back as a delta when it leaves;
/// target rows go back as deltas after each block. Segments run in parallel on the current
/// rayon pool. Returns the summed loss, estimated from one group in `LOSS_SAMPLE_GROUPS`
/// ([`loss_sampled`]); NaN if any score is NaN.
#[allow(clippy::too_many_arguments)]
pub fn sgd_segments(
    centers: Shared,
    targets: Shared,
    remote: Shared,
    dim: usize,
    rows: &SegmentRows,
    k: usize,
    window: u32,
    step: Step,
) -> f64 {
    use crate::sample::walk::group_inputs;
    let Step { lr, implicit, acc } = step;
    use rayon::prelude::*;
    let row = |center: bool, r: u32| shared_row(centers, targets, remote, dim, center, r);
    let ring = 2 * window as usize + 1;
    let nt = 1 + k;
    let SegmentRows {
        refs,
        wins,
        segs,
        negs,
        first_group,
    } = *rows;
    let salt = negs.first().copied().unwrap_or(0);
    let input_acc = |r: u32| acc.map(|a| a.of(true, r));
    (0..segs.len())
        .into_par_iter()
        .map(|s| {
            BLOCK.with_borrow_mut(|slot| {
                // A thread's buffers live across calls (allocating them per call cost a tenth).
                let blk = match slot {
                    Some(b) if b.fits(ring, nt, dim) => b,
                    _ => slot.insert(Block::new(ring, nt, dim)),
                };
                let lo = segs[s].0 as usize;
                let hi = segs.get(s + 1).map_or(refs.len(), |&(n, _)| n as usize);
                let h = segs[s].1 as usize;
                let (refs, wins) = (&refs[lo..hi], &wins[lo..hi]);
                let n = refs.len();
                blk.slot_token.iter_mut().for_each(|t| *t = usize::MAX);
                let mut g = first_group[s] as usize;
                let mut loss = 0f64;
                for b in 0..n {
                    // Write back the input that no later window reaches.
                    if b > window as usize {
                        let a = b - window as usize - 1;
                        blk.evict(a, row(true, refs[a][0]), input_acc(refs[a][0]));
                    }
                    let (ilo, ihi) = group_inputs(n, h, b, wins[b]);
                    let m = group_size(ilo, ihi, b);
                    if m == 0 {
                        continue;
                    }
                    let gn = &negs[g * k..(g + 1) * k];
                    // The next group's target rows and the next input to enter a window.
                    if b + 1 < n {
                        prefetch(row(false, refs[b + 1][1]));
                        for &t in negs.get((g + 1) * k..(g + 2) * k).unwrap_or(&[]) {
                            if t != SKIP {
                                prefetch(row(false, t));
                            }
                        }
                    }
                    if let Some(r) = refs.get(b + window as usize + 1) {
                        prefetch(row(true, r[0]));
                    }
                    let ts = std::iter::once(refs[b][1]).chain(gn.iter().copied());
                    let mut tl = 0;
                    for (j, t) in ts.enumerate() {
                        if t != SKIP {
                            blk.tref[tl] = (t, if j == 0 { 1.0 } else { 0.0 });
                            load(row(false, t), &mut blk.u[tl * dim..(tl + 1) * dim]);
                            tl += 1;
                        }
                    }
                    let mut mi = 0;
                    for a in (ilo..ihi).filter(|&a| a != b) {
                        blk.slots[mi] = blk.input(a, row(true, refs[a][0]), input_acc(refs[a][0]));
                        mi += 1;
                    }
                    // Unsampled groups return 0 (or NaN): only sampled ones are scaled.
                    let sampled = loss_sampled(salt, lo + b, refs[b][1]);
                    let l = match acc {
                        None => blk.update(mi, tl, lr, implicit, sampled, |r| row(false, r)),
                        Some(a) => blk.update_adagrad(mi, tl, lr, sampled, |r| {
                            (row(false, r), a.of(false, r))
                        }),
                    };
                    loss += if sampled {
                        l * LOSS_SAMPLE_GROUPS as f64
                    } else {
                        l
                    };
                    g += 1;
                }
                let last = n.saturating_sub(window as usize + 1);
                for (a, r) in refs.iter().enumerate().skip(last) {
                    blk.evict(a, row(true, r[0]), input_acc(r[0]));
                }
                loss
            })
        })
        .sum()
}

thread_local! {
    /// Each pool thread's [`Block`] for [`sgd_segments`].
    static BLOCK: std::cell::RefCell<Option<Block>> = const { std::cell::RefCell::new(None) };
}

/// A thread's private buffers for [`sgd_segments`].
struct Block {
    dim: usize,
    /// Ring of input rows (working copy and value when copied in) and the token in each slot.
    v: Vec<f32>,
    v0: Vec<f32>,
    slot_token: Vec<usize>,
    /// The current group's input slots, target rows, target references and labels, and
    /// scores (then coefficients); a row of scratch.
    slots: Vec<usize>,
    u: Vec<f32>,
    tref: Vec<(u32, f32)>,
    coef: Vec<f32>,
    tmp: Vec<f32>,
    /// [`fused`]'s coefficients, each broadcast to 8 lanes, and its target row changes.
    gb: Vec<f32>,
    du: Vec<f32>,
    /// Adagrad: per ring slot its accumulator (working value and value when copied in), and
    /// the block's input row changes (ring-sized rows).
    acc: Vec<f32>,
    acc0: Vec<f32>,
    dv: Vec<f32>,
    /// Per target of the block: whether it repeats an earlier one
    /// ([`Block::merge_repeated_targets`]).
    repeat: Vec<bool>,
    /// Implicit steps: squared norms of the inputs and targets, and their curvatures.
    vn: Vec<f32>,
    un: Vec<f32>,
    tc: Vec<f32>,
    ic: Vec<f32>,
}

impl Block {
    fn fits(&self, ring: usize, nt: usize, dim: usize) -> bool {
        self.dim == dim && self.slot_token.len() == ring && self.tref.len() == nt
    }

    fn new(ring: usize, nt: usize, dim: usize) -> Self {
        Block {
            dim,
            v: vec![0.0; ring * dim],
            v0: vec![0.0; ring * dim],
            slot_token: vec![usize::MAX; ring],
            slots: vec![0; ring],
            u: vec![0.0; nt * dim],
            tref: vec![(0, 0.0); nt],
            coef: vec![0.0; ring * nt],
            tmp: vec![0.0; 2 * dim],
            gb: vec![0.0; ring * nt * 8],
            du: vec![0.0; nt * dim],
            acc: vec![0.0; ring],
            acc0: vec![0.0; ring],
            dv: vec![0.0; ring * dim],
            repeat: vec![false; nt],
            vn: vec![0.0; ring],
            un: vec![0.0; nt],
            tc: vec![0.0; nt],
            ic: vec![0.0; ring],
        }
    }

    /// The ring slot of input token `a` (its shared row `row`, and with Adagrad its
    /// accumulator `acc`), copying the row in on first use.
    #[inline]
    fn input(&mut self, a: usize, row: Shared, acc: Option<&AtomicU32>) -> usize {
        let s = a % self.slot_token.len();
        if self.slot_token[s] != a {
            debug_assert_eq!(self.slot_token[s], usize::MAX, "ring slot still in use");
            let d = self.dim;
            load(row, &mut self.v[s * d..(s + 1) * d]);
            self.v0[s * d..(s + 1) * d].copy_from_slice(&self.v[s * d..(s + 1) * d]);
            if let Some(c) = acc {
                self.acc[s] = f32::from_bits(c.load(Relaxed));
                self.acc0[s] = self.acc[s];
            }
            self.slot_token[s] = a;
        }
        s
    }

    /// Add input token `a`'s change to its shared row `row` (and its accumulator's to `acc`)
    /// and free its slot (if it was copied in).
    #[inline]
    fn evict(&mut self, a: usize, row: Shared, acc: Option<&AtomicU32>) {
        let s = a % self.slot_token.len();
        if self.slot_token[s] != a {
            return;
        }
        let d = self.dim;
        let (v, v0) = (&self.v[s * d..(s + 1) * d], &self.v0[s * d..(s + 1) * d]);
        let tmp = &mut self.tmp[..d];
        load(row, tmp);
        for ((t, x), x0) in tmp.iter_mut().zip(v).zip(v0) {
            *t += x - x0;
        }
        store(row, tmp);
        if let Some(c) = acc {
            let now = f32::from_bits(c.load(Relaxed)) + (self.acc[s] - self.acc0[s]);
            c.store(now.to_bits(), Relaxed);
        }
        self.slot_token[s] = usize::MAX;
    }

    /// One block: `m` inputs (ring slots `slots`) against `nt` targets (rows `u`, references
    /// `tref`). Adds the targets' changes to their shared rows (`target`) and updates the input
    /// rows in the ring. Returns the block's loss when `with_loss`.
    fn update<'r>(
        &mut self,
        m: usize,
        nt: usize,
        lr: f32,
        implicit: bool,
        with_loss: bool,
        target: impl Fn(u32) -> Shared<'r>,
    ) -> f64 {
        let loss = self.coefficients(m, nt, lr, with_loss, implicit);
        let d = self.dim;
        #[cfg(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma"
        ))]
        if d.is_multiple_of(8) && (1..=FUSED_TARGETS).contains(&nt) {
            self.update_fused(m, nt, target);
            return loss;
        }
        let (v, slots, u) = (&self.v, &self.slots[..m], &self.u[..nt * d]);
        let vrow = |i: usize| &v[slots[i] * d..][..d];
        let coef = &self.coef[..m * nt];
        // Targets first, from the inputs before their update: row_t += sum_i G[i, t] v_i, on
        // the shared row as it is now (a target may repeat within the block).
        // Two targets at a time, unless they are the same row (the second must see the first).
        let (mut g0, mut g1) = ([0f32; 6], [0f32; 6]);
        let tref = &self.tref[..nt];
        let (tmp0, tmp1) = self.tmp.split_at_mut(d);
        let mut t = 0;
        while t < nt {
            let two = t + 1 < nt && tref[t].0 != tref[t + 1].0;
            let (s0, s1) = (target(tref[t].0), two.then(|| target(tref[t + 1].0)));
            load(s0, tmp0);
            if let Some(s1) = s1 {
                load(s1, tmp1);
            }
            for b0 in (0..m).step_by(6) {
                let n = (m - b0).min(6);
                let rows = |j: usize| vrow(b0 + j.min(n - 1));
                for j in 0..n {
                    g0[j] = coef[(b0 + j) * nt + t];
                    if two {
                        g1[j] = coef[(b0 + j) * nt + t + 1];
                    }
                }
                if two {
                    combine2_dyn(&g0[..n], &g1[..n], rows, tmp0, tmp1);
                } else {
                    combine_dyn(&g0[..n], rows, tmp0);
                }
            }
            store(s0, tmp0);
            if let Some(s1) = s1 {
                store(s1, tmp1);
            }
            t += if two { 2 } else { 1 };
        }
        // Then the inputs, two at a time: v_i += sum_t G[i, t] u_t.
        let urow = |j: usize| &u[j * d..][..d];
        for i in (0..m).step_by(2) {
            let g = &coef[i * nt..(i + 1) * nt];
            if i + 1 < m {
                let h = &coef[(i + 1) * nt..(i + 2) * nt];
                let (vi, vj) = two_rows_mut(&mut self.v, slots[i], slots[i + 1], d);
                for b0 in (0..nt).step_by(6) {
                    let n = (nt - b0).min(6);
                    let rows = |j: usize| urow(b0 + j);
                    combine2_dyn(&g[b0..b0 + n], &h[b0..b0 + n], rows, vi, vj);
                }
            } else {
                let vi = &mut self.v[slots[i] * d..][..d];
                for b0 in (0..nt).step_by(6) {
                    let n = (nt - b0).min(6);
                    combine_dyn(&g[b0..b0 + n], |j| urow(b0 + j), vi);
                }
            }
        }
        loss
    }

    /// A target repeated in the block (a negative equal to b's row or to another negative) is
    /// one row: its columns of `coef` are summed into its first occurrence and `repeat` marks
    /// the later ones, whose rows then take no change of their own.
    fn merge_repeated_targets(&mut self, m: usize, nt: usize) {
        let (tref, coef) = (&self.tref[..nt], &mut self.coef[..m * nt]);
        let repeat = &mut self.repeat[..nt];
        repeat.fill(false);
        for t in 1..nt {
            if let Some(f) = (0..t).find(|&f| tref[f].0 == tref[t].0) {
                repeat[t] = true;
                for row in coef.chunks_exact_mut(nt) {
                    row[f] += row[t];
                    row[t] = 0.0;
                }
            }
        }
    }

    /// The block's scores `S = V U^T` (m inputs against nt targets) turned into coefficients
    /// `G = (label - sigmoid(S)) lr` in `coef`; returns the block's loss when `with_loss` (NaN
    /// when a score is, else 0).
    fn coefficients(&mut self, m: usize, nt: usize, lr: f32, with_loss: bool, damped: bool) -> f64 {
        let d = self.dim;
        let (v, slots, u) = (&self.v, &self.slots[..m], &self.u[..nt * d]);
        let vrow = |i: usize| &v[slots[i] * d..][..d];
        // Two inputs at a time: each target row read from L1 once for both.
        for (p, s) in self.coef[..m * nt].chunks_mut(2 * nt).enumerate() {
            if s.len() == 2 * nt {
                let (s0, s1) = s.split_at_mut(nt);
                dots2_dyn(vrow(2 * p), vrow(2 * p + 1), u, s0, s1);
            } else {
                dots_dyn(vrow(2 * p), u, s);
            }
        }
        let scores = &mut self.coef[..m * nt];
        let mut loss = 0f64;
        if with_loss {
            for (j, &s) in scores.iter().enumerate() {
                let s = s.clamp(-MAX_SCORE, MAX_SCORE);
                // -ln sigmoid(s) for the row of b (label 1), -ln sigmoid(-s) for negatives.
                loss += f64::from((-s).exp().ln_1p() + if j % nt == 0 { 0.0 } else { s });
            }
        } else if scores.iter().sum::<f32>().is_nan() {
            loss = f64::NAN;
        }
        for c in scores.iter_mut() {
            *c = sigmoid_fast(c.clamp(-MAX_SCORE, MAX_SCORE));
        }
        if damped {
            // Implicit (proximal) steps: entry (i, t) divided by 1 + lr (T_t + I_i), where
            // T_t = sum_i s'_it |v_i|^2 is the curvature of target t's loss along its step over
            // the block's inputs and I_i = sum_t s'_it |u_t|^2 input i's, s' = s (1 - s).
            let (vn, un) = (&mut self.vn[..m], &mut self.un[..nt]);
            for (i, x) in vn.iter_mut().enumerate() {
                let r = &self.v[self.slots[i] * d..][..d];
                *x = dot(r, r);
            }
            for (t, x) in un.iter_mut().enumerate() {
                let r = &self.u[t * d..][..d];
                *x = dot(r, r);
            }
            let (tc, ic) = (&mut self.tc[..nt], &mut self.ic[..m]);
            tc.fill(0.0);
            for (i, row) in self.coef[..m * nt].chunks_exact(nt).enumerate() {
                let mut a = 0.0;
                for (t, &sg) in row.iter().enumerate() {
                    let c = sg * (1.0 - sg);
                    tc[t] += c * vn[i];
                    a += c * un[t];
                }
                ic[i] = a;
            }
            for (i, row) in self.coef[..m * nt].chunks_exact_mut(nt).enumerate() {
                for (t, c) in row.iter_mut().enumerate() {
                    let label = if t == 0 { 1.0 } else { 0.0 };
                    *c = lr * (label - *c) / (1.0 + lr * (tc[t] + ic[i]));
                }
            }
            return loss;
        }
        // G = (label - sigmoid(S)) lr; target 0 (b's own row) has label 1.
        for c in self.coef[..m * nt].iter_mut() {
            *c *= -lr;
        }
        for row in self.coef[..m * nt].chunks_exact_mut(nt) {
            row[0] += lr;
        }
        loss
    }

    /// The updates of [`Block::update`] once the coefficients are in `coef`, in one sweep over
    /// the columns ([`fused`]): each input row and target row is read once, and each target's
    /// change is added to its shared row at the end. A target repeated in the block (a negative
    /// equal to b's row or to another negative) has its columns summed into its first
    /// occurrence: its values are the same, so the inputs get the same sum, and the row gets
    /// both changes, as in the two-phase path.
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    #[inline(always)]
    fn update_fused<'r>(&mut self, m: usize, nt: usize, target: impl Fn(u32) -> Shared<'r>) {
        let d = self.dim;
        self.merge_repeated_targets(m, nt);
        let (tref, coef, repeat) = (&self.tref[..nt], &self.coef[..m * nt], &self.repeat);
        for (g, &c) in self.gb.chunks_exact_mut(8).zip(coef.iter()) {
            g.fill(c);
        }
        let (slots, u, gb) = (&self.slots[..m], &self.u[..nt * d], &self.gb[..m * nt * 8]);
        let du = &mut self.du[..nt * d];
        macro_rules! go {
            ($n:literal) => {
                fused::<$n>(&mut self.v, slots, u, gb, du)
            };
        }
        with_width!(nt, go);
        for (t, &(r, _)) in tref.iter().enumerate() {
            if !repeat[t] {
                add_to(target(r), &self.du[t * d..(t + 1) * d]);
            }
        }
    }
}

/// The row a reference names: `REMOTE | slot` is row `slot` of `remote`, otherwise a local row
/// of `centers` (for a pair's center or a block's input) or `targets`.
#[inline(always)]
fn shared_row<'a>(
    centers: Shared<'a>,
    targets: Shared<'a>,
    remote: Shared<'a>,
    dim: usize,
    center: bool,
    r: u32,
) -> Shared<'a> {
    let (m, r) = if r & REMOTE != 0 {
        (remote, (r & !REMOTE) as usize)
    } else if center {
        (centers, r as usize)
    } else {
        (targets, r as usize)
    };
    m.row(r, dim)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loss_of(rows: &[f32], dim: usize, pairs: &[[u32; 2]], negs: &[u32], k: usize) -> f64 {
        let mut g = vec![0f32; rows.len()];
        accumulate(rows, dim, pairs, negs, k, &mut g)
    }

    #[test]
    fn gradients_match_finite_differences() {
        let dim = 5;
        let mut rng = crate::sample::rng_for(3, 0, 0);
        use rand::RngExt;
        let rows: Vec<f32> = (0..6 * dim)
            .map(|_| rng.random_range(-0.6f32..0.6))
            .collect();
        // slot 0 and 1 centers; slot 2..5 contexts/negatives; one pair shares a center row with
        // another and one negative is skipped; LINE-1 style pair (row used as center and target).
        let pairs = [[0u32, 2], [1, 3], [0, 4], [5, 1]];
        let negs = [4u32, 5, 2, SKIP, 3, 3, 0, 2];
        let k = 2;
        let mut grads = vec![0f32; rows.len()];
        accumulate(&rows, dim, &pairs, &negs, k, &mut grads);
        let h = 1e-3f32;
        for i in 0..rows.len() {
            let (mut a, mut b) = (rows.clone(), rows.clone());
            a[i] += h;
            b[i] -= h;
            let fd = (loss_of(&a, dim, &pairs, &negs, k) - loss_of(&b, dim, &pairs, &negs, k))
                / (2.0 * f64::from(h));
            assert!(
                (fd - f64::from(grads[i])).abs() < 2e-3,
                "entry {i}: finite difference {fd} vs analytic {}",
                grads[i]
            );
        }
    }

    #[test]
    fn positive_pairs_pull_together() {
        let dim = 4;
        let rows = vec![0.1f32, 0.2, -0.1, 0.0, 0.3, -0.2, 0.1, 0.2];
        let mut g = vec![0f32; 8];
        accumulate(&rows, dim, &[[0, 1]], &[], 0, &mut g);
        let mut stepped = rows.clone();
        axpy(-0.5, &g, &mut stepped);
        assert!(dot(&stepped[..4], &stepped[4..]) > dot(&rows[..4], &rows[4..]));
    }
}

/// The batch's gradients without per-thread copies: pass 1 computes every (pair, target)
/// coefficient `sigmoid(score) - label` in parallel over pairs; a counting sort turns them into
/// per-row incidence lists; pass 2 computes each row's gradient in parallel over rows (each row
/// written by one task). Same result as [`accumulate`] up to summation order.
/// Returns (grads laid out like `rows`, summed loss). Runs on the current rayon pool.
pub fn batch_gradients(
    rows: &[f32],
    dim: usize,
    pairs: &[[u32; 2]],
    negs: &[u32],
    k: usize,
) -> (Vec<f32>, f64) {
    use rayon::prelude::*;
    let nslots = rows.len() / dim;
    let t1 = 1 + k;
    let row = |s: u32| &rows[s as usize * dim..(s as usize + 1) * dim];
    let target = |p: usize, j: usize| {
        if j == 0 {
            pairs[p][1]
        } else {
            negs[p * k + j - 1]
        }
    };
    let mut coef = vec![0f32; pairs.len() * t1];
    let loss: f64 = coef
        .par_chunks_mut(t1)
        .enumerate()
        .map(|(p, cf)| {
            let vc = row(pairs[p][0]);
            let mut loss = 0f64;
            for (j, c) in cf.iter_mut().enumerate() {
                let t = target(p, j);
                if t == SKIP {
                    continue;
                }
                let s = dot(row(t), vc).clamp(-MAX_SCORE, MAX_SCORE);
                let label = if j == 0 { 1.0 } else { 0.0 };
                loss += f64::from(if j == 0 {
                    softplus_neg(s)
                } else {
                    softplus_neg(-s)
                });
                *c = sigmoid(s) - label;
            }
            loss
        })
        .sum();
    // Incidences: row `c` gets coef * u_t for each target t; row `t` gets coef * v_c.
    let mut start = vec![0u32; nslots + 1];
    for (p, &[c, _]) in pairs.iter().enumerate() {
        for j in 0..t1 {
            let t = target(p, j);
            if t != SKIP {
                start[c as usize + 1] += 1;
                start[t as usize + 1] += 1;
            }
        }
    }
    for s in 0..nslots {
        start[s + 1] += start[s];
    }
    let mut fill = start.clone();
    let mut inc = vec![(0u32, 0f32); start[nslots] as usize];
    for (p, &[c, _]) in pairs.iter().enumerate() {
        for j in 0..t1 {
            let t = target(p, j);
            if t != SKIP {
                let cf = coef[p * t1 + j];
                inc[fill[c as usize] as usize] = (t, cf);
                fill[c as usize] += 1;
                inc[fill[t as usize] as usize] = (c, cf);
                fill[t as usize] += 1;
            }
        }
    }
    let mut grads = vec![0f32; rows.len()];
    grads.par_chunks_mut(dim).enumerate().for_each(|(s, g)| {
        for &(o, cf) in &inc[start[s] as usize..start[s + 1] as usize] {
            axpy(cf, row(o), g);
        }
    });
    (grads, loss)
}

#[cfg(test)]
mod plan_tests {
    use super::*;
    use crate::graph::partition::{Partitioner, Scheme};
    use crate::graph::{Edge, LocalGraph};
    use crate::sample::walk::Segments;

    /// Every chunk of `share` consecutive groups (output tokens) of a batch's segments uses one
    /// draw of `k` negatives, minus those equal to the group's own output; with `share` 1 every
    /// group has its own draw, as word2vec does.
    #[test]
    fn groups_of_a_chunk_share_their_negatives() {
        let n = 40u64;
        let edges: Vec<Edge> = (0..n)
            .flat_map(|i| {
                let j = (i + 1) % n;
                [(i, j), (j, i)].map(|(src, dst)| Edge {
                    src,
                    dst,
                    weight: 1.0,
                })
            })
            .collect();
        let g = LocalGraph::from_entries(
            0,
            Partitioner::new(Scheme::Striped, n, 1),
            &edges,
            n,
            false,
            false,
        );
        // One segment without history: every token is a group's output.
        let segs = Segments {
            tokens: (0..30).map(|i| ((i * 7) % n, 3)).collect(),
            segs: vec![(0, 0)],
        };
        {
            let mut rng = crate::sample::rng_for(1, 0, 0);
            let mut neg = NegativePool::new(&g, 0, 64, 0.75);
            neg.set_total(neg.mass());
            let share = neg.draw_share(&mut rng);
            neg.install([share]);
            let k = 4;
            for share in [1, 3] {
                let mut refer = |key: u64| (key >> 1) as u32;
                let PlanRows::Segments { negs, refs, .. } =
                    plan_segments(&segs, k, share, 1, &neg, &mut rng, &mut refer)
                else {
                    unreachable!("segments plan segments")
                };
                let groups = negs.len() / k;
                assert!(groups > 2 * share, "{groups}");
                let outputs: Vec<u32> = refs.iter().map(|r| r[1]).collect();
                assert_eq!(outputs.len(), groups);
                let distinct: std::collections::HashSet<Vec<u32>> =
                    negs.chunks(k).map(|c| c.to_vec()).collect();
                for (g, c) in negs.chunks(k).enumerate() {
                    assert!(c.iter().all(|&r| r != outputs[g]), "group {g}: {c:?}");
                    let first = g / share * share;
                    for (j, &r) in c.iter().enumerate() {
                        let lead = negs[first * k + j];
                        assert!(r == lead || r == SKIP || lead == SKIP, "{share} {g} {c:?}");
                    }
                }
                // 64 pool draws over 40 nodes: chunks almost never repeat by chance.
                assert!(distinct.len() + 2 >= groups.div_ceil(share), "{share}");
                assert!(
                    distinct.len() <= groups.div_ceil(share) + groups / 2,
                    "{share}"
                );
            }
        }
    }
}

#[cfg(test)]
mod batch_tests {
    use super::*;
    use rand::RngExt;

    #[test]
    fn batch_gradients_equal_the_sequential_kernel() {
        let (dim, nslots, k) = (16, 50, 3);
        let mut rng = crate::sample::rng_for(9, 0, 0);
        let rows: Vec<f32> = (0..nslots * dim)
            .map(|_| rng.random_range(-0.5f32..0.5))
            .collect();
        let pairs: Vec<[u32; 2]> = (0..400)
            .map(|_| {
                [
                    rng.random_range(0..nslots as u32),
                    rng.random_range(0..nslots as u32),
                ]
            })
            .collect();
        let negs: Vec<u32> = (0..400 * k)
            .map(|i| {
                if i % 7 == 0 {
                    SKIP
                } else {
                    rng.random_range(0..nslots as u32)
                }
            })
            .collect();
        let mut want = vec![0f32; rows.len()];
        let l1 = accumulate(&rows, dim, &pairs, &negs, k, &mut want);
        let (got, l2) = batch_gradients(&rows, dim, &pairs, &negs, k);
        assert!((l1 - l2).abs() < 1e-6 * l1.abs().max(1.0), "{l1} vs {l2}");
        for (a, b) in want.iter().zip(&got) {
            assert!((a - b).abs() < 1e-4, "{a} vs {b}");
        }
    }
}

#[cfg(test)]
mod in_place_tests {
    use super::*;
    use crate::config::Dtype;
    use rand::RngExt;
    use std::sync::atomic::Ordering::Relaxed;
    use std::sync::atomic::{AtomicU16, AtomicU32};

    fn cells(v: &[f32]) -> Vec<AtomicU32> {
        v.iter().map(|x| AtomicU32::new(x.to_bits())).collect()
    }

    fn values(c: &[AtomicU32]) -> Vec<f32> {
        c.iter().map(|x| f32::from_bits(x.load(Relaxed))).collect()
    }

    /// word2vec's skip-gram update for one pair, on plain vectors (the reference).
    fn reference_pair(vc: &mut [f32], targets: &mut [&mut [f32]], labels: &[f32], lr: f32) {
        let mut neu1e = vec![0f32; vc.len()];
        for (t, &label) in targets.iter_mut().zip(labels) {
            let f = dot(t, vc).clamp(-MAX_SCORE, MAX_SCORE);
            let g = (label - sigmoid(f)) * lr;
            axpy(g, t, &mut neu1e);
            axpy(g, vc, t);
        }
        axpy(1.0, &neu1e, vc);
    }

    #[test]
    fn one_thread_equals_word2vec_pair_by_pair_with_remote_rows() {
        let (dim, rows, k, lr) = (8, 12, 2, 0.05);
        let mut rng = crate::sample::rng_for(5, 0, 0);
        let mut init = |n: usize| -> Vec<f32> {
            (0..n * dim)
                .map(|_| rng.random_range(-0.5f32..0.5))
                .collect()
        };
        let (c0, t0, r0) = (init(rows), init(rows), init(3));
        // References: plain numbers are local rows; REMOTE | s is row s of the remote buffer.
        let pairs = [[0u32, 1], [2, REMOTE | 1], [REMOTE, 4], [0, 5]];
        let negs = [3u32, SKIP, 7, 1, REMOTE | 2, 0, 9, 11];
        let (centers, targets, remote) = (cells(&c0), cells(&t0), cells(&r0));
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let loss = pool.install(|| {
            sgd_in_place(
                Shared::F32(&centers),
                Shared::F32(&targets),
                Shared::F32(&remote),
                dim,
                &pairs,
                &negs,
                k,
                Step::sgd(lr),
            )
        });
        assert!(loss.is_finite() && loss > 0.0, "{loss}");

        let (mut c, mut t, mut r) = (c0.clone(), t0.clone(), r0.clone());
        for (i, &[pc, px]) in pairs.iter().enumerate() {
            let ts: Vec<u32> = std::iter::once(px)
                .chain(negs[i * k..(i + 1) * k].iter().copied())
                .collect();
            // Copy rows out, update, copy back (no row appears twice within one pair here).
            let get = |m: &[f32], s: u32| m[s as usize * dim..(s as usize + 1) * dim].to_vec();
            let mut vc = if pc & REMOTE != 0 {
                get(&r, pc & !REMOTE)
            } else {
                get(&c, pc)
            };
            let mut us: Vec<(u32, Vec<f32>, f32)> = ts
                .iter()
                .enumerate()
                .filter(|(_, &x)| x != SKIP)
                .map(|(j, &x)| {
                    let row = if x & REMOTE != 0 {
                        get(&r, x & !REMOTE)
                    } else {
                        get(&t, x)
                    };
                    (x, row, if j == 0 { 1.0 } else { 0.0 })
                })
                .collect();
            let labels: Vec<f32> = us.iter().map(|u| u.2).collect();
            let mut refs: Vec<&mut [f32]> = us.iter_mut().map(|u| u.1.as_mut_slice()).collect();
            reference_pair(&mut vc, &mut refs, &labels, lr);
            let mut put = |x: u32, v: &[f32], center: bool| {
                let (m, s) = if x & REMOTE != 0 {
                    (&mut r, x & !REMOTE)
                } else if center {
                    (&mut c, x)
                } else {
                    (&mut t, x)
                };
                m[s as usize * dim..(s as usize + 1) * dim].copy_from_slice(v);
            };
            for (x, row, _) in &us {
                put(*x, row, false);
            }
            put(pc, &vc, true);
        }
        for (got, want, name) in [
            (values(&centers), c, "centers"),
            (values(&targets), t, "targets"),
            (values(&remote), r, "remote"),
        ] {
            for (a, b) in got.iter().zip(&want) {
                assert!((a - b).abs() < 1e-6, "{name}: {a} vs {b}");
            }
        }
        // Training moved the rows.
        assert_ne!(values(&targets), t0);
    }

    /// A segment block on plain vectors: every input row gets sum_t G u_t and every target row
    /// sum_i G v_i, both from the values before the block.
    fn reference_block(
        rows: &mut [Vec<f32>; 3],
        inputs: &[(usize, usize)],
        targets: &[(usize, usize, f32)],
        dim: usize,
        lr: f32,
    ) {
        let get =
            |rows: &[Vec<f32>; 3], (m, r): (usize, usize)| rows[m][r * dim..(r + 1) * dim].to_vec();
        let vs: Vec<Vec<f32>> = inputs.iter().map(|&x| get(rows, x)).collect();
        let us: Vec<Vec<f32>> = targets.iter().map(|&(m, r, _)| get(rows, (m, r))).collect();
        let g: Vec<Vec<f32>> = vs
            .iter()
            .map(|v| {
                us.iter()
                    .zip(targets)
                    .map(|(u, t)| (t.2 - sigmoid(dot(v, u).clamp(-MAX_SCORE, MAX_SCORE))) * lr)
                    .collect()
            })
            .collect();
        for (i, &(m, r)) in inputs.iter().enumerate() {
            for (t, u) in us.iter().enumerate() {
                axpy(g[i][t], u, &mut rows[m][r * dim..(r + 1) * dim]);
            }
        }
        for (t, &(m, r, _)) in targets.iter().enumerate() {
            for (i, v) in vs.iter().enumerate() {
                axpy(g[i][t], v, &mut rows[m][r * dim..(r + 1) * dim]);
            }
        }
    }

    #[test]
    fn segments_equal_the_block_reference_with_history_and_remote_rows() {
        // dim 16: the vector kernels (when compiled in); dim 13: the portable ones. k = 6: the
        // two-pass path, targets in blocks of 6 and 1, inputs two at a time and one; k = 4 and
        // 5: the fused sweep (5 and 6 targets, AVX2/FMA builds), which sums repeated targets.
        for (dim, k) in [(16, 6), (13, 6), (16, 4), (16, 5)] {
            check_segments(dim, k, Dtype::F32);
        }
    }

    #[test]
    fn segments_on_16_bit_rows_follow_the_reference_within_their_rounding() {
        // The same blocks with centers and targets stored as f16 or bf16 (remote copies stay
        // f32): the kernels convert on every load and round on every store, so the rows
        // follow the f32 reference within a few roundings of their type.
        for dtype in [Dtype::F16, Dtype::Bf16] {
            for (dim, k) in [(16, 6), (13, 6), (16, 4)] {
                check_segments(dim, k, dtype);
            }
        }
    }

    /// Cells of `dtype` holding `v` (rounded to it), and their values back as f32.
    fn typed(dtype: Dtype, v: &[f32]) -> (Vec<AtomicU32>, Vec<AtomicU16>) {
        let wide = cells(v);
        let narrow: Vec<AtomicU16> = v
            .iter()
            .map(|&x| {
                AtomicU16::new(match dtype {
                    Dtype::Bf16 => half::bf16::from_f32(x).to_bits(),
                    _ => half::f16::from_f32(x).to_bits(),
                })
            })
            .collect();
        (wide, narrow)
    }

    fn view<'a>(dtype: Dtype, c: &'a (Vec<AtomicU32>, Vec<AtomicU16>)) -> Shared<'a> {
        match dtype {
            Dtype::F32 => Shared::F32(&c.0),
            Dtype::F16 => Shared::F16(&c.1),
            Dtype::Bf16 => Shared::Bf16(&c.1),
        }
    }

    fn typed_values(s: Shared) -> Vec<f32> {
        let mut out = vec![0f32; s.len()];
        load(s, &mut out);
        out
    }

    fn check_segments(dim: usize, k: usize, dtype: Dtype) {
        use crate::sample::walk::group_inputs;
        let (nrows, window, lr) = (40, 3u32, 0.05);
        let mut rng = crate::sample::rng_for(8, 0, 0);
        let mut init = |n: usize| -> Vec<f32> {
            (0..n * dim)
                .map(|_| rng.random_range(-0.5f32..0.5))
                .collect()
        };
        let (mut c0, mut t0, r0) = (init(nrows), init(nrows), init(8));
        // The reference starts from the stored (rounded) values.
        let (cs, ts) = (typed(dtype, &c0), typed(dtype, &t0));
        c0 = typed_values(view(dtype, &cs));
        t0 = typed_values(view(dtype, &ts));
        // Three segments; the second is led by 3 history tokens, the last is one token long
        // (no pairs). Input nodes are distinct within a segment; remote input rows are
        // REMOTE | 0..4, remote target rows REMOTE | 4..8.
        let seg_nodes: [&[u32]; 3] = [&[0, 1, 2, 3, 4, 5, 6, 7], &[5, 6, 7, 8, 9, 10, 11], &[3]];
        let seg_hist = [0u32, 3, 0];
        let mut refs = Vec::new();
        let mut wins = Vec::new();
        let mut segs = Vec::new();
        for (nodes, &h) in seg_nodes.iter().zip(&seg_hist) {
            segs.push((refs.len() as u32, h));
            for &n in nodes.iter() {
                let input = if n % 5 == 4 { REMOTE | (n % 4) } else { n };
                let output = if n % 7 == 3 {
                    REMOTE | (4 + n % 4)
                } else {
                    20 + n
                };
                refs.push([input, output]);
                wins.push(1 + rng.random_range(0..window));
            }
        }
        let mut first_group = Vec::new();
        let mut groups = 0;
        for (s, &(lo, h)) in segs.iter().enumerate() {
            first_group.push(groups as u32);
            let hi = segs.get(s + 1).map_or(refs.len(), |x| x.0 as usize);
            let n = hi - lo as usize;
            for b in 0..n {
                let (l, r) = group_inputs(n, h as usize, b, wins[lo as usize + b]);
                groups += usize::from(group_size(l, r, b) > 0);
            }
        }
        // Negatives: local or remote target rows, some skipped, some repeated in a group.
        let negs: Vec<u32> = (0..groups * k)
            .map(|i| match i % 9 {
                0 => SKIP,
                1 => REMOTE | 5,
                _ => 20 + rng.random_range(0..15),
            })
            .collect();
        let (centers, targets, remote) = (view(dtype, &cs), view(dtype, &ts), cells(&r0));
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let rows = SegmentRows {
            refs: &refs,
            wins: &wins,
            segs: &segs,
            negs: &negs,
            first_group: &first_group,
        };
        let loss = pool.install(|| {
            sgd_segments(
                centers,
                targets,
                Shared::F32(&remote),
                dim,
                &rows,
                k,
                window,
                Step::sgd(lr),
            )
        });
        // A batch this small may hold no group of the loss's sample.
        assert!(loss.is_finite() && loss >= 0.0, "{loss}");

        // Matrices: 0 centers, 1 targets, 2 remote.
        let mut want = [c0.clone(), t0.clone(), r0.clone()];
        let at = |r: u32, input: bool| -> (usize, usize) {
            if r & REMOTE != 0 {
                (2, (r & !REMOTE) as usize)
            } else {
                (if input { 0 } else { 1 }, r as usize)
            }
        };
        let mut g = 0;
        for (s, &(lo, h)) in segs.iter().enumerate() {
            let lo = lo as usize;
            let hi = segs.get(s + 1).map_or(refs.len(), |x| x.0 as usize);
            let n = hi - lo;
            for b in 0..n {
                let (l, r) = group_inputs(n, h as usize, b, wins[lo + b]);
                if group_size(l, r, b) == 0 {
                    continue;
                }
                let inputs: Vec<(usize, usize)> = (l..r)
                    .filter(|&a| a != b)
                    .map(|a| at(refs[lo + a][0], true))
                    .collect();
                let mut tl = vec![{
                    let (m, r) = at(refs[lo + b][1], false);
                    (m, r, 1.0)
                }];
                for &x in &negs[g * k..(g + 1) * k] {
                    if x != SKIP {
                        let (m, r) = at(x, false);
                        tl.push((m, r, 0.0));
                    }
                }
                reference_block(&mut want, &inputs, &tl, dim, lr);
                g += 1;
            }
        }
        assert_eq!(g, groups);
        // f16 keeps 11 significant bits, bf16 8: a few roundings of values below 1.
        let tol = match dtype {
            Dtype::F32 => 1e-5,
            Dtype::F16 => 3e-3,
            Dtype::Bf16 => 1.5e-2,
        };
        for (got, want, name) in [
            (typed_values(centers), &want[0], "centers"),
            (typed_values(targets), &want[1], "targets"),
            (values(&remote), &want[2], "remote"),
        ] {
            for (i, (a, b)) in got.iter().zip(want).enumerate() {
                assert!((a - b).abs() < tol, "{dtype:?} {name}[{i}]: {a} vs {b}");
            }
        }
        assert_ne!(typed_values(centers), c0);
        // The updates are larger than the tolerance: a kernel that dropped them would fail.
        let moved = c0
            .iter()
            .zip(&want[0])
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            moved > 4.0 * tol,
            "{dtype:?}: largest update {moved}, tolerance {tol}"
        );
    }

    /// Batches of one short segment each (fewer groups than `LOSS_SAMPLE_GROUPS`, like a
    /// rank's step at 8 simulated nodes): the loss the kernel estimates follows the loss of all
    /// its groups (computed here, with a learning rate of 0 so that no row moves). Taking every
    /// `LOSS_SAMPLE_GROUPS`-th group took each batch's first, and read 6.2x the whole here.
    #[test]
    fn the_sampled_loss_follows_the_whole_loss_in_small_batches() {
        use crate::sample::walk::group_inputs;
        let (dim, k, window, nrows, len) = (8usize, 2usize, 3u32, 4096u32, 12usize);
        let mut rng = crate::sample::rng_for(9, 0, 0);
        let mut init = || -> Vec<f32> {
            (0..nrows as usize * dim)
                .map(|_| rng.random_range(-0.6f32..0.6))
                .collect()
        };
        let (c, t) = (init(), init());
        let (centers, targets) = (cells(&c), cells(&t));
        let score = |a: u32, b: u32| -> f64 {
            (0..dim)
                .map(|i| f64::from(c[a as usize * dim + i]) * f64::from(t[b as usize * dim + i]))
                .sum()
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let (mut estimated, mut whole) = (0f64, 0f64);
        for _ in 0..4000 {
            let refs: Vec<[u32; 2]> = (0..len)
                .map(|_| {
                    let n = rng.random_range(0..nrows);
                    [n, n]
                })
                .collect();
            let wins: Vec<u32> = (0..len).map(|_| 1 + rng.random_range(0..window)).collect();
            let mut negs = Vec::new();
            for b in 0..len {
                let (lo, hi) = group_inputs(len, 0, b, wins[b]);
                if group_size(lo, hi, b) == 0 {
                    continue;
                }
                let g: Vec<u32> = (0..k).map(|_| rng.random_range(0..nrows)).collect();
                for a in (lo..hi).filter(|&a| a != b) {
                    let v = refs[a][0];
                    whole += (-score(v, refs[b][1])).exp().ln_1p();
                    whole += g.iter().map(|&x| score(v, x).exp().ln_1p()).sum::<f64>();
                }
                negs.extend(g);
            }
            let rows = SegmentRows {
                refs: &refs,
                wins: &wins,
                segs: &[(0, 0)],
                negs: &negs,
                first_group: &[0],
            };
            estimated += pool.install(|| {
                sgd_segments(
                    Shared::F32(&centers),
                    Shared::F32(&targets),
                    Shared::F32(&[]),
                    dim,
                    &rows,
                    k,
                    window,
                    Step::sgd(0.0),
                )
            });
        }
        let ratio = estimated / whole;
        assert!((ratio - 1.0).abs() < 0.15, "estimated / whole loss {ratio}");
    }

    #[test]
    fn fast_sigmoid_matches_the_exact_one() {
        let mut worst = 0f32;
        for i in -60_000..=60_000 {
            let x = i as f32 * 1e-4;
            worst = worst.max((sigmoid_fast(x) - sigmoid(x)).abs() / sigmoid(x));
        }
        assert!(worst < 1e-6, "relative error {worst}");
    }

    #[test]
    fn a_nan_row_makes_the_loss_nan() {
        let dim = 4;
        let mut c = vec![0.1f32; 3 * dim];
        c[dim + 2] = f32::NAN;
        let t = vec![0.2f32; 3 * dim];
        let (centers, targets) = (cells(&c), cells(&t));
        // Pair 1 (not a loss-sampled pair) has the NaN center.
        let pairs = [[0u32, 1], [1, 2]];
        let loss = sgd_in_place(
            Shared::F32(&centers),
            Shared::F32(&targets),
            Shared::F32(&[]),
            dim,
            &pairs,
            &[],
            0,
            Step::sgd(0.1),
        );
        assert!(loss.is_nan(), "{loss}");
    }
}

#[cfg(test)]
mod step_tests;
