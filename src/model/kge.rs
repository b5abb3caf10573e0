//! Knowledge-graph embeddings: DistMult, ComplEx, TransE and RotatE over entity rows (matrix 0,
//! sharded, fetched and pushed like node rows) and relation parameters that every rank holds
//! whole (replicated; their gradients are summed over the ranks after every step and every rank
//! applies the same update).
//!
//! Scores (`dim` = d; complex vectors are stored as halves `[re | im]` of d/2 each):
//! - DistMult `<h, r, t>`; ComplEx `Re(<h, r, conj(t)>)`;
//! - TransE `gamma - ||h + r - t||_1`; RotatE `gamma - sum_k |h_k e^{i theta_k} - t_k|` with
//!   d/2 relation phases.
//!
//! Negatives (PyTorch-BigGraph's batched negatives): a chunk of `--shared-negatives` positives
//! shares `--negatives` entities, and every positive is scored against all of them as tails
//! (h, r, n) and as heads (n, r, t); a negative equal to the true entity is skipped. Losses per
//! positive and side: `softmax` (cross-entropy of the positive among itself and its negatives),
//! `logistic` (softplus of -score for the positive and of the negatives' scores, averaged, or
//! weighted by the softmax of `--adversarial-temperature` x score: RotatE's self-adversarial
//! sampling) and `margin` (mean hinge `max(0, gamma - s_pos + s_neg)`). Regularisation per
//! positive: N3 (`lambda sum |x|^3` over h, r, t, with complex moduli for ComplEx and RotatE;
//! Lacroix et al. 2018) or L2 (`lambda sum x^2`).

use std::sync::Arc;

use rand::RngExt;
use wide::f32x8;

use super::{Cells, Grads, Model, Plan, Work, SKIP};
use crate::config::{KgLoss, Model as Kind, NegSampling, NegativesFrom, Reg, TrainConfig};
use crate::error::{Error, Result};
use crate::graph::triples::TripleFile;
use crate::graph::LocalGraph;
use crate::sample::negatives::NegativePool;
use crate::sample::Rng;

/// The first bytes of a knowledge-graph model's checkpointed state.
const KG_STATE_MAGIC: &[u8; 4] = b"KGST";

/// What ranks triples besides the entity rows: the score function, its margin (TransE, RotatE)
/// and the relations (`rel_dim` values each), as a trained model holds them.
#[derive(Clone, Debug)]
pub struct Ranking {
    pub score: Score,
    pub gamma: f32,
    pub relations: Vec<f32>,
    pub rel_dim: usize,
}

/// A knowledge-graph score function.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Score {
    DistMult,
    ComplEx,
    TransE,
    RotatE,
}

impl Score {
    pub fn of(kind: Kind) -> Option<Score> {
        match kind {
            Kind::Distmult => Some(Score::DistMult),
            Kind::Complex => Some(Score::ComplEx),
            Kind::Transe => Some(Score::TransE),
            Kind::Rotate => Some(Score::RotatE),
            Kind::Deepwalk | Kind::Node2vec | Kind::Line => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Score::DistMult => "distmult",
            Score::ComplEx => "complex",
            Score::TransE => "transe",
            Score::RotatE => "rotate",
        }
    }

    pub fn parse(name: &str) -> Option<Score> {
        [
            Score::DistMult,
            Score::ComplEx,
            Score::TransE,
            Score::RotatE,
        ]
        .into_iter()
        .find(|s| s.name() == name)
    }

    /// Floats per relation for entity dimension `dim`: d, or d/2 phases (RotatE).
    pub fn rel_dim(self, dim: usize) -> usize {
        match self {
            Score::RotatE => dim / 2,
            _ => dim,
        }
    }

    /// Whether the coordinates are complex (halves `[re | im]`): N3 then takes moduli.
    fn complex(self) -> bool {
        matches!(self, Score::ComplEx | Score::RotatE)
    }

    /// The score of (h, r, t); `gamma` is the margin of the distance models.
    #[inline]
    pub fn score(self, h: &[f32], r: &[f32], t: &[f32], gamma: f32) -> f32 {
        match self {
            Score::DistMult => {
                let mut acc = [0f32; 8];
                let (ch, cr, ct) = (h.chunks_exact(8), r.chunks_exact(8), t.chunks_exact(8));
                let rest: f32 = ch
                    .remainder()
                    .iter()
                    .zip(cr.remainder())
                    .zip(ct.remainder())
                    .map(|((a, b), c)| a * b * c)
                    .sum();
                for ((a, b), c) in ch.zip(cr).zip(ct) {
                    for l in 0..8 {
                        acc[l] += a[l] * b[l] * c[l];
                    }
                }
                acc.iter().sum::<f32>() + rest
            }
            Score::ComplEx => {
                let m = h.len() / 2;
                let (hr, hi) = h.split_at(m);
                let (rr, ri) = r.split_at(m);
                let (tr, ti) = t.split_at(m);
                let mut s = 0f32;
                for k in 0..m {
                    s += hr[k] * rr[k] * tr[k] + hi[k] * rr[k] * ti[k] + hr[k] * ri[k] * ti[k]
                        - hi[k] * ri[k] * tr[k];
                }
                s
            }
            Score::TransE => {
                let d: f32 = h
                    .iter()
                    .zip(r)
                    .zip(t)
                    .map(|((a, b), c)| (a + b - c).abs())
                    .sum();
                gamma - d
            }
            Score::RotatE => {
                let m = h.len() / 2;
                let (hr, hi) = h.split_at(m);
                let (tr, ti) = t.split_at(m);
                let mut d = 0f32;
                for k in 0..m {
                    let (s, c) = r[k].sin_cos();
                    let ur = hr[k] * c - hi[k] * s - tr[k];
                    let ui = hr[k] * s + hi[k] * c - ti[k];
                    d += (ur * ur + ui * ui).sqrt();
                }
                gamma - d
            }
        }
    }

    /// Add `coef` times the gradient of the score of (h, r, t) to `gh`, `gr`, `gt`.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub fn add_grad(
        self,
        h: &[f32],
        r: &[f32],
        t: &[f32],
        coef: f32,
        gh: &mut [f32],
        gr: &mut [f32],
        gt: &mut [f32],
    ) {
        match self {
            Score::DistMult => {
                for k in 0..h.len() {
                    gh[k] += coef * r[k] * t[k];
                    gr[k] += coef * h[k] * t[k];
                    gt[k] += coef * h[k] * r[k];
                }
            }
            Score::ComplEx => {
                let m = h.len() / 2;
                for k in 0..m {
                    let (hr, hi, rr, ri, tr, ti) = (h[k], h[m + k], r[k], r[m + k], t[k], t[m + k]);
                    gh[k] += coef * (rr * tr + ri * ti);
                    gh[m + k] += coef * (rr * ti - ri * tr);
                    gr[k] += coef * (hr * tr + hi * ti);
                    gr[m + k] += coef * (hr * ti - hi * tr);
                    gt[k] += coef * (hr * rr - hi * ri);
                    gt[m + k] += coef * (hi * rr + hr * ri);
                }
            }
            Score::TransE => {
                for k in 0..h.len() {
                    let v = h[k] + r[k] - t[k];
                    let s = if v > 0.0 {
                        1.0
                    } else if v < 0.0 {
                        -1.0
                    } else {
                        0.0
                    };
                    gh[k] -= coef * s;
                    gr[k] -= coef * s;
                    gt[k] += coef * s;
                }
            }
            Score::RotatE => {
                let m = h.len() / 2;
                for k in 0..m {
                    let (hr, hi, tr, ti) = (h[k], h[m + k], t[k], t[m + k]);
                    let (s, c) = r[k].sin_cos();
                    let ur = hr * c - hi * s - tr;
                    let ui = hr * s + hi * c - ti;
                    let n = (ur * ur + ui * ui).sqrt();
                    if n == 0.0 {
                        continue;
                    }
                    let (a, b) = (ur / n, ui / n);
                    gh[k] -= coef * (a * c + b * s);
                    gh[m + k] += coef * (a * s - b * c);
                    gt[k] += coef * a;
                    gt[m + k] += coef * b;
                    gr[k] -= coef * (a * (-hr * s - hi * c) + b * (hr * c - hi * s));
                }
            }
        }
    }

    /// The regulariser of one factor `x` (an entity row or a relation row) and its gradient,
    /// times `w`, added to `g`: N3 `sum |x|^3` (moduli of complex coordinates) or L2 `sum x^2`.
    /// RotatE's phases are not regularised.
    fn add_reg(self, reg: Reg, x: &[f32], w: f32, g: &mut [f32], relation: bool) -> f64 {
        if w == 0.0 || reg == Reg::None || (relation && self == Score::RotatE) {
            return 0.0;
        }
        let mut loss = 0f64;
        match reg {
            Reg::None => {}
            Reg::L2 => {
                for (gi, &xi) in g.iter_mut().zip(x) {
                    loss += f64::from(xi * xi);
                    *gi += 2.0 * w * xi;
                }
            }
            Reg::N3 if self.complex() => {
                let m = x.len() / 2;
                for k in 0..m {
                    let (a, b) = (x[k], x[m + k]);
                    let n = (a * a + b * b).sqrt();
                    loss += f64::from(n * n * n);
                    g[k] += 3.0 * w * n * a;
                    g[m + k] += 3.0 * w * n * b;
                }
            }
            Reg::N3 => {
                for (gi, &xi) in g.iter_mut().zip(x) {
                    loss += f64::from(xi.abs() * xi * xi);
                    *gi += 3.0 * w * xi.abs() * xi;
                }
            }
        }
        loss * f64::from(w)
    }
}

/// How a query scores a candidate entity x: every model's score is one of these in a query
/// q of the known entity and the relation (`Score::query`).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Psi {
    /// `q . x` (DistMult; ComplEx, whose real part of a complex product is a dot product of
    /// the `[re | im]` halves with a sign on one side)
    Dot,
    /// `gamma - ||q - x||_1` (TransE)
    L1,
    /// `gamma - sum_k |q_k - x_k|` over complex coordinates (RotatE)
    Moduli,
}

impl Psi {
    #[inline]
    fn score(self, q: &[f32], x: &[f32], gamma: f32) -> f32 {
        match self {
            Psi::Dot => super::dot(q, x),
            Psi::L1 => gamma - sum8([q, x], |[a, b]| (a - b).abs()),
            Psi::Moduli => {
                let m = q.len() / 2;
                let (qr, qi) = q.split_at(m);
                let (xr, xi) = x[..2 * m].split_at(m);
                gamma
                    - sum8([qr, qi, xr, xi], |[qr, qi, xr, xi]| {
                        let (ur, ui) = (qr - xr, qi - xi);
                        (ur * ur + ui * ui).sqrt()
                    })
            }
        }
    }

    /// Add `c` times the score's gradient to `gq` (the query's) and `gx` (the candidate's).
    #[inline]
    fn grad(self, q: &[f32], x: &[f32], c: f32, gq: &mut [f32], gx: &mut [f32]) {
        match self {
            Psi::Dot => {
                super::axpy(c, x, gq);
                super::axpy(c, q, gx);
            }
            Psi::L1 => {
                // The subgradient c sign(q - x) (at q = x, +c: a subgradient too), branch-free
                // so that it vectorises.
                let n = q.len();
                let (x, gq, gx) = (&x[..n], &mut gq[..n], &mut gx[..n]);
                for k in 0..n {
                    let sg = c * 1f32.copysign(q[k] - x[k]);
                    gq[k] -= sg;
                    gx[k] += sg;
                }
            }
            Psi::Moduli => {
                // c (q_k - x_k) / |q_k - x_k| per complex coordinate (0 where they coincide),
                // branch-free over split halves so that it vectorises.
                let m = q.len() / 2;
                let (qr, qi) = q.split_at(m);
                let (xr, xi) = x[..2 * m].split_at(m);
                let (gqr, gqi) = gq[..2 * m].split_at_mut(m);
                let (gxr, gxi) = gx[..2 * m].split_at_mut(m);
                let (qi, xr, xi) = (&qi[..m], &xr[..m], &xi[..m]);
                let (gqr, gqi, gxr, gxi) =
                    (&mut gqr[..m], &mut gqi[..m], &mut gxr[..m], &mut gxi[..m]);
                for k in 0..m {
                    let (ur, ui) = (qr[k] - xr[k], qi[k] - xi[k]);
                    let n = (ur * ur + ui * ui).sqrt();
                    let s = if n > 0.0 { c / n } else { 0.0 };
                    let (a, b) = (s * ur, s * ui);
                    gqr[k] -= a;
                    gqi[k] -= b;
                    gxr[k] += a;
                    gxi[k] += b;
                }
            }
        }
    }
}

/// `sum_k f([s_0[k], s_1[k], ...])` over the slices `s` (the length of the first), summed in 8
/// independent lanes over whole chunks (a float sum in one accumulator is a serial chain the
/// compiler may not reorder; eight lanes over fixed-size chunks vectorise).
#[inline(always)]
fn sum8<const N: usize>(s: [&[f32]; N], f: impl Fn([f32; N]) -> f32) -> f32 {
    let n = s[0].len();
    let s: [&[f32]; N] = std::array::from_fn(|i| &s[i][..n]);
    let whole = n - n % 8;
    let mut acc = [0f32; 8];
    for base in (0..whole).step_by(8) {
        let c: [&[f32; 8]; N] =
            std::array::from_fn(|i| s[i][base..base + 8].try_into().expect("8 floats"));
        for (l, a) in acc.iter_mut().enumerate() {
            *a += f(std::array::from_fn(|i| c[i][l]));
        }
    }
    let rest: f32 = (whole..n)
        .map(|k| f(std::array::from_fn(|i| s[i][k])))
        .sum();
    acc.iter().sum::<f32>() + rest
}

impl Score {
    fn psi(self) -> Psi {
        match self {
            Score::DistMult | Score::ComplEx => Psi::Dot,
            Score::TransE => Psi::L1,
            Score::RotatE => Psi::Moduli,
        }
    }

    /// The query of the known entity `e` (the head when `tail` is true: candidates are tails;
    /// otherwise the tail) and relation `r`: the score of candidate x is `psi(q, x)`.
    /// DistMult h.r / r.t; ComplEx h*r / [Re, -Im] of r*conj(t); TransE h + r / t - r; RotatE
    /// h*e^(i theta) / t*e^(-i theta).
    #[inline]
    fn query(self, tail: bool, e: &[f32], r: &[f32], q: &mut [f32]) {
        let m = e.len() / 2;
        match (self, tail) {
            (Score::DistMult, _) => {
                for k in 0..e.len() {
                    q[k] = e[k] * r[k];
                }
            }
            (Score::ComplEx, true) => {
                for k in 0..m {
                    let (hr, hi, rr, ri) = (e[k], e[m + k], r[k], r[m + k]);
                    q[k] = hr * rr - hi * ri;
                    q[m + k] = hr * ri + hi * rr;
                }
            }
            (Score::ComplEx, false) => {
                for k in 0..m {
                    let (tr, ti, rr, ri) = (e[k], e[m + k], r[k], r[m + k]);
                    q[k] = rr * tr + ri * ti;
                    q[m + k] = rr * ti - ri * tr;
                }
            }
            (Score::TransE, true) => {
                for k in 0..e.len() {
                    q[k] = e[k] + r[k];
                }
            }
            (Score::TransE, false) => {
                for k in 0..e.len() {
                    q[k] = e[k] - r[k];
                }
            }
            (Score::RotatE, _) => {
                for k in 0..m {
                    let (sn, c) = r[k].sin_cos();
                    let sn = if tail { sn } else { -sn };
                    let (a, b) = (e[k], e[m + k]);
                    q[k] = a * c - b * sn;
                    q[m + k] = a * sn + b * c;
                }
            }
        }
    }

    /// Add the query's gradient `g` back to its entity (`ge`) and relation (`gr`).
    #[inline]
    fn query_grad(
        self,
        tail: bool,
        e: &[f32],
        r: &[f32],
        g: &[f32],
        ge: &mut [f32],
        gr: &mut [f32],
    ) {
        let m = e.len() / 2;
        match (self, tail) {
            (Score::DistMult, _) => {
                for k in 0..e.len() {
                    ge[k] += g[k] * r[k];
                    gr[k] += g[k] * e[k];
                }
            }
            (Score::ComplEx, true) => {
                for k in 0..m {
                    let (hr, hi, rr, ri, a, b) = (e[k], e[m + k], r[k], r[m + k], g[k], g[m + k]);
                    ge[k] += a * rr + b * ri;
                    ge[m + k] += -a * ri + b * rr;
                    gr[k] += a * hr + b * hi;
                    gr[m + k] += -a * hi + b * hr;
                }
            }
            (Score::ComplEx, false) => {
                for k in 0..m {
                    let (tr, ti, rr, ri, a, b) = (e[k], e[m + k], r[k], r[m + k], g[k], g[m + k]);
                    gr[k] += a * tr + b * ti;
                    gr[m + k] += a * ti - b * tr;
                    ge[k] += a * rr - b * ri;
                    ge[m + k] += a * ri + b * rr;
                }
            }
            (Score::TransE, true) => {
                for k in 0..e.len() {
                    ge[k] += g[k];
                    gr[k] += g[k];
                }
            }
            (Score::TransE, false) => {
                for k in 0..e.len() {
                    ge[k] += g[k];
                    gr[k] -= g[k];
                }
            }
            (Score::RotatE, _) => {
                for k in 0..m {
                    let (sn, c) = r[k].sin_cos();
                    let sn = if tail { sn } else { -sn };
                    let (a, b, x, y) = (g[k], g[m + k], e[k], e[m + k]);
                    ge[k] += a * c + b * sn;
                    ge[m + k] += -a * sn + b * c;
                    // d q / d theta = i q (tail) or -i q (head).
                    let (qr, qi) = (x * c - y * sn, x * sn + y * c);
                    let d = -a * qi + b * qr;
                    gr[k] += if tail { d } else { -d };
                }
            }
        }
    }

    /// Scores of every candidate row of `cands` (`dim` floats each) for the query of `e` and
    /// `r` (`tail`: candidates are tails), into `out`.
    pub fn score_all(
        self,
        tail: bool,
        e: &[f32],
        r: &[f32],
        cands: &[f32],
        gamma: f32,
        out: &mut [f32],
    ) {
        let d = e.len();
        let mut q = vec![0f32; d];
        self.query(tail, e, r, &mut q);
        let psi = self.psi();
        for (o, x) in out.iter_mut().zip(cands.chunks_exact(d)) {
            *o = psi.score(&q, x, gamma);
        }
    }
}

/// Loss settings shared by a model and its plans.
#[derive(Clone, Copy, Debug)]
struct Loss {
    score: Score,
    loss: KgLoss,
    reg: Reg,
    reg_weight: f32,
    gamma: f32,
    adversarial: f32,
}

/// The knowledge-graph model: a score function, its loss, and the relation parameters every
/// rank holds (with their Adagrad state).
pub struct Kge {
    loss: Loss,
    /// Negatives per chunk, positives per chunk.
    k: usize,
    chunk: usize,
    uniform: bool,
    entities: u64,
    /// `--negatives-from shard` on more than one rank: negatives are drawn among this rank's
    /// own entities alone.
    shard: bool,
    rel_dim: usize,
    /// The triple file (its names go into the output).
    graph: std::path::PathBuf,
    rel: Arc<Vec<f32>>,
    /// Adagrad's sum of squared gradients per relation value.
    rel_acc: Vec<f32>,
}

impl Kge {
    /// The relation parameters (relation-major, `rel_dim` floats each).
    pub fn relations(&self) -> &[f32] {
        &self.rel
    }

    pub fn rel_dim(&self) -> usize {
        self.rel_dim
    }

    pub fn score(&self) -> Score {
        self.loss.score
    }

    pub fn gamma(&self) -> f32 {
        self.loss.gamma
    }
}

impl Model for Kge {
    type Plan = KgePlan;

    fn new(cfg: &TrainConfig, g: &LocalGraph) -> Result<Self> {
        let score = Score::of(cfg.model).ok_or_else(|| {
            Error::config(format!(
                "--model {:?} is not a knowledge-graph model",
                cfg.model
            ))
        })?;
        let f = TripleFile::open(&cfg.graph)?;
        let (dim, rels) = (cfg.dim, f.num_relations as usize);
        if f.num_entities() != g.num_nodes() {
            return Err(Error::bad_input(
                &cfg.graph,
                "num_nodes differs between the graph load and the triple file",
            ));
        }
        let rel_dim = score.rel_dim(dim);
        // Relations start as the entities do (uniform in [-1/d, 1/d]), the same on every rank;
        // RotatE's phases uniform in [-pi, pi].
        let mut rng = crate::sample::rng_for(cfg.seed, u64::MAX as usize, 7);
        let rel: Vec<f32> = (0..rels * rel_dim)
            .map(|_| {
                let u = rng.random::<f32>() * 2.0 - 1.0;
                if score == Score::RotatE {
                    u * std::f32::consts::PI
                } else {
                    u / dim as f32
                }
            })
            .collect();
        Ok(Kge {
            loss: Loss {
                score,
                loss: cfg.kg_loss,
                reg: cfg.reg,
                reg_weight: cfg.reg_weight,
                gamma: cfg.gamma,
                adversarial: cfg.adversarial_temperature,
            },
            k: cfg.negatives as usize,
            chunk: cfg.shared_negatives.max(1),
            uniform: cfg.negative_sampling == NegSampling::Uniform,
            entities: g.num_nodes(),
            shard: cfg.negatives_from == NegativesFrom::Shard && g.part.ranks() > 1,
            rel_dim,
            graph: cfg.graph.clone(),
            rel_acc: vec![0.0; rel.len()],
            rel: Arc::new(rel),
        })
    }

    fn plan(
        &self,
        work: Work,
        neg: &NegativePool,
        rng: &mut Rng,
        refer: &mut impl FnMut(u64) -> u32,
    ) -> KgePlan {
        let Work::Triples(triples) = work else {
            unreachable!("knowledge-graph models train triples (TrainConfig refuses other work)")
        };
        let chunks = triples.len().div_ceil(self.chunk);
        let mut drawn = vec![0u64; chunks * self.k];
        let local = self.shard
            && if self.uniform {
                neg.fill_local_uniform(rng, &mut drawn)
            } else {
                neg.fill_local(rng, &mut drawn) || neg.fill_local_uniform(rng, &mut drawn)
            };
        if !local {
            if self.uniform || neg.is_empty() {
                for d in drawn.iter_mut() {
                    *d = rng.random_range(0..self.entities);
                }
            } else {
                neg.fill(rng, &mut drawn);
            }
        }
        let negs = drawn.iter().map(|&n| refer(n << 1)).collect();
        let pos = triples
            .iter()
            .map(|x| [refer(x.h << 1), refer(x.t << 1)])
            .collect();
        KgePlan {
            pos,
            rels: triples.iter().map(|x| x.r).collect(),
            weights: triples.iter().map(|x| x.w).collect(),
            negs,
            rel: Arc::clone(&self.rel),
            loss: self.loss,
            k: self.k,
            chunk: self.chunk,
            rel_dim: self.rel_dim,
        }
    }

    fn replicated_len(&self) -> usize {
        self.rel.len()
    }

    /// Relations (`relations`: one row of `rel_dim` floats each), the margin (`gamma`) and
    /// the names of entities and relations (`node_names`, `relation_names`) beside the entity
    /// rows (`embeddings`): what `graphscale eval kg` and h5py users read.
    fn write_output(&self, path: &std::path::Path) -> Result<()> {
        let f = hdf5::File::open_rw(path).map_err(|e| Error::hdf5(path, "open output", e))?;
        let rels = self.rel.len() / self.rel_dim.max(1);
        let a = ndarray::Array2::from_shape_vec((rels, self.rel_dim), self.rel.to_vec())
            .expect("relation-major parameters");
        f.new_dataset_builder()
            .with_data(&a)
            .create("relations")
            .map_err(|e| Error::hdf5(path, "dataset relations", e))?;
        f.new_attr::<f32>()
            .create("gamma")
            .and_then(|at| at.write_scalar(&self.loss.gamma))
            .map_err(|e| Error::hdf5(path, "attribute gamma", e))?;
        let src = TripleFile::open(&self.graph)?;
        if let Some(n) = src.entity_names()? {
            crate::graph::h5::write_names(&f, path, "node_names", &n)?;
        }
        if let Some(n) = src.relation_names()? {
            crate::graph::h5::write_names(&f, path, "relation_names", &n)?;
        }
        crate::graph::h5::flush(&f, path)
    }

    fn ranking(&self) -> Option<Ranking> {
        Some(Ranking {
            score: self.loss.score,
            gamma: self.loss.gamma,
            relations: self.rel.to_vec(),
            rel_dim: self.rel_dim,
        })
    }

    /// The relations and their Adagrad sums: `KGST`, the count n (u64), n + n f32 values.
    fn state(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(12 + 8 * self.rel.len());
        b.extend_from_slice(KG_STATE_MAGIC);
        b.extend_from_slice(&(self.rel.len() as u64).to_le_bytes());
        for x in self.rel.iter().chain(&self.rel_acc) {
            b.extend_from_slice(&x.to_le_bytes());
        }
        b
    }

    fn restore_state(&mut self, b: &[u8]) -> std::result::Result<(), String> {
        let n = self.rel.len();
        let ok = b.len() == 12 + 8 * n
            && &b[..4] == KG_STATE_MAGIC
            && u64::from_le_bytes(b[4..12].try_into().expect("8 bytes")) == n as u64;
        if !ok {
            return Err(format!(
                "the checkpoint's relation parameters do not fit this run ({} bytes, expected {} for {} relation values)",
                b.len(),
                12 + 8 * n,
                n
            ));
        }
        let mut vals = b[12..]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")));
        let rel = Arc::make_mut(&mut self.rel);
        for x in rel.iter_mut().chain(self.rel_acc.iter_mut()) {
            *x = vals.next().expect("length checked");
        }
        Ok(())
    }

    fn apply_replicated(&mut self, grads: &[f32], lr: f32) {
        // Adagrad per value, the same on every rank (the summed gradient is the same).
        let rel = Arc::make_mut(&mut self.rel);
        for ((x, a), &g) in rel.iter_mut().zip(self.rel_acc.iter_mut()).zip(grads) {
            *a += g * g;
            *x -= lr * g / (a.sqrt() + 1e-10);
        }
    }
}

/// A planned batch of triples: per positive its (head, tail) row references, relation and the
/// weight of its loss; per chunk of `chunk` positives `k` negative references.
pub struct KgePlan {
    pos: Vec<[u32; 2]>,
    rels: Vec<u32>,
    weights: Vec<f32>,
    negs: Vec<u32>,
    rel: Arc<Vec<f32>>,
    loss: Loss,
    k: usize,
    chunk: usize,
    rel_dim: usize,
}

impl KgePlan {
    /// Loss and gradients of one chunk into `g` (rows) and `gr` (relations). Per side, the
    /// chunk's b queries (b x d) meet its k negatives (k x d, gathered once) as matrices: for
    /// the dot-product models the scores Q N^T and the gradients C N and C^T Q (C: b x k loss
    /// gradients) are three matrix products; the distance models take the same steps pair by
    /// pair.
    fn chunk_gradients(
        &self,
        c: usize,
        rows: &[f32],
        dim: usize,
        g: &mut [f32],
        gr: &mut [f32],
    ) -> f64 {
        use ndarray::linalg::general_mat_mul;
        use ndarray::{ArrayView2, ArrayViewMut2};
        let l = self.loss;
        let (k, rd) = (self.k, self.rel_dim);
        let psi = l.score.psi();
        let row = |s: u32| &rows[s as usize * dim..(s as usize + 1) * dim];
        let negs = &self.negs[c * k..(c + 1) * k];
        let lo = c * self.chunk;
        let hi = (lo + self.chunk).min(self.pos.len());
        let b = hi - lo;
        let rel = |i: usize| {
            let ri = self.rels[i] as usize;
            &self.rel[ri * rd..(ri + 1) * rd]
        };
        // Skipped negatives are zero rows here and masked out of the loss.
        let mut negm = vec![0f32; k * dim];
        for (dst, &n) in negm.chunks_exact_mut(dim).zip(negs) {
            if n != SKIP {
                dst.copy_from_slice(row(n));
            }
        }
        let (mut q, mut gq) = (vec![0f32; b * dim], vec![0f32; b * dim]);
        let (mut scores, mut coef) = (vec![0f32; b * k], vec![0f32; b * k]);
        let mut gneg = vec![0f32; k * dim];
        // Per positive: its head's and its tail's gradient, and its relation's.
        let (mut gh, mut gt, mut grr) =
            (vec![0f32; b * dim], vec![0f32; b * dim], vec![0f32; b * rd]);
        let mut loss = 0f64;
        // Tails corrupted (the query of h and r scores candidate tails), then heads.
        for tail in [true, false] {
            for (i, qi) in (lo..hi).zip(q.chunks_exact_mut(dim)) {
                let [hs, ts] = self.pos[i];
                l.score
                    .query(tail, row(if tail { hs } else { ts }), rel(i), qi);
            }
            if psi == Psi::Dot {
                let qv = ArrayView2::from_shape((b, dim), &q).expect("b x d");
                let nv = ArrayView2::from_shape((k, dim), &negm).expect("k x d");
                let mut sv = ArrayViewMut2::from_shape((b, k), &mut scores).expect("b x k");
                general_mat_mul(1.0, &qv, &nv.t(), 0.0, &mut sv);
            } else {
                for (qi, si) in q.chunks_exact(dim).zip(scores.chunks_exact_mut(k)) {
                    for (sij, nj) in si.iter_mut().zip(negm.chunks_exact(dim)) {
                        *sij = psi.score(qi, nj, l.gamma);
                    }
                }
            }
            gq.iter_mut().for_each(|x| *x = 0.0);
            for (x, i) in (lo..hi).enumerate() {
                let [hs, ts] = self.pos[i];
                let truth = if tail { ts } else { hs };
                let qi = &q[x * dim..(x + 1) * dim];
                let si = &mut scores[x * k..(x + 1) * k];
                for (sij, &n) in si.iter_mut().zip(negs) {
                    if n == SKIP || n == truth {
                        *sij = f32::NEG_INFINITY;
                    }
                }
                let sp = psi.score(qi, row(truth), l.gamma);
                let ci = &mut coef[x * k..(x + 1) * k];
                let (lv, cp) = side_loss(l, sp, si, ci);
                // The triple's weight scales its side's loss, so all of its gradient.
                let w = self.weights[i];
                ci.iter_mut().for_each(|c| *c *= w);
                let cp = cp * w;
                loss += lv * f64::from(w);
                let gtruth = if tail { &mut gt } else { &mut gh };
                psi.grad(
                    qi,
                    row(truth),
                    cp,
                    &mut gq[x * dim..(x + 1) * dim],
                    &mut gtruth[x * dim..(x + 1) * dim],
                );
            }
            if psi == Psi::Dot {
                let qv = ArrayView2::from_shape((b, dim), &q).expect("b x d");
                let nv = ArrayView2::from_shape((k, dim), &negm).expect("k x d");
                let cv = ArrayView2::from_shape((b, k), &coef).expect("b x k");
                let mut gqv = ArrayViewMut2::from_shape((b, dim), &mut gq).expect("b x d");
                general_mat_mul(1.0, &cv, &nv, 1.0, &mut gqv);
                let mut gnv = ArrayViewMut2::from_shape((k, dim), &mut gneg).expect("k x d");
                general_mat_mul(1.0, &cv.t(), &qv, 0.0, &mut gnv);
            } else {
                gneg.iter_mut().for_each(|x| *x = 0.0);
                for (x, qi) in q.chunks_exact(dim).enumerate() {
                    let gqi = &mut gq[x * dim..(x + 1) * dim];
                    let ci = &coef[x * k..(x + 1) * k];
                    for ((&cij, nj), gnj) in ci
                        .iter()
                        .zip(negm.chunks_exact(dim))
                        .zip(gneg.chunks_exact_mut(dim))
                    {
                        if cij != 0.0 {
                            psi.grad(qi, nj, cij, gqi, gnj);
                        }
                    }
                }
            }
            for (&n, gnj) in negs.iter().zip(gneg.chunks_exact(dim)) {
                if n != SKIP {
                    let dst = &mut g[n as usize * dim..(n as usize + 1) * dim];
                    dst.iter_mut().zip(gnj).for_each(|(a, b)| *a += b);
                }
            }
            for (x, i) in (lo..hi).enumerate() {
                let [hs, ts] = self.pos[i];
                let gknown = if tail { &mut gh } else { &mut gt };
                l.score.query_grad(
                    tail,
                    row(if tail { hs } else { ts }),
                    rel(i),
                    &gq[x * dim..(x + 1) * dim],
                    &mut gknown[x * dim..(x + 1) * dim],
                    &mut grr[x * rd..(x + 1) * rd],
                );
            }
        }
        for (x, i) in (lo..hi).enumerate() {
            let [hs, ts] = self.pos[i];
            let ri = self.rels[i] as usize;
            let (ghx, gtx) = (
                &mut gh[x * dim..(x + 1) * dim],
                &mut gt[x * dim..(x + 1) * dim],
            );
            let grx = &mut grr[x * rd..(x + 1) * rd];
            if l.reg_weight > 0.0 {
                loss += l.score.add_reg(l.reg, row(hs), l.reg_weight, ghx, false);
                loss += l.score.add_reg(l.reg, row(ts), l.reg_weight, gtx, false);
                loss += l.score.add_reg(l.reg, rel(i), l.reg_weight, grx, true);
            }
            for (s, v) in [(hs, &*ghx), (ts, &*gtx)] {
                let dst = &mut g[s as usize * dim..(s as usize + 1) * dim];
                dst.iter_mut().zip(v).for_each(|(a, b)| *a += b);
            }
            let dst = &mut gr[ri * rd..(ri + 1) * rd];
            dst.iter_mut().zip(grx.iter()).for_each(|(a, b)| *a += b);
        }
        loss
    }
}

/// The largest of `init` and `xs` (8 lanes; NEG_INFINITY entries are skipped ones).
fn max8(init: f32, xs: &[f32]) -> f32 {
    let mut lanes = f32x8::splat(init);
    let chunks = xs.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        lanes = lanes.max(f32x8::new(c.try_into().expect("8 lanes")));
    }
    tail.iter()
        .copied()
        .fold(lanes.to_array().into_iter().fold(init, f32::max), f32::max)
}

/// `out[i] = exp(a * (xs[i] - m))` in 8 lanes (a NEG_INFINITY entry, a skipped negative, gives
/// 0); returns their sum. `m` is the largest entry, so nothing overflows.
fn exp_shifted(a: f32, m: f32, xs: &[f32], out: &mut [f32]) -> f32 {
    let (va, vm) = (f32x8::splat(a), f32x8::splat(m));
    let mut sum = f32x8::ZERO;
    let (xc, oc) = (xs.chunks_exact(8), out.chunks_exact_mut(8));
    let (xt, rest) = (xc.remainder(), xc.len() * 8);
    for (x, o) in xc.zip(oc) {
        let e = (va * (f32x8::new(x.try_into().expect("8 lanes")) - vm)).exp();
        o.copy_from_slice(&e.to_array());
        sum += e;
    }
    let mut z = sum.reduce_add();
    for (o, &x) in out[rest..].iter_mut().zip(xt) {
        *o = (a * (x - m)).exp();
        z += *o;
    }
    z
}

/// The loss of one side of a positive with score `sp` against `scores` (NEG_INFINITY:
/// skipped). Writes each negative's loss gradient to `coef`; returns (loss, the positive's).
fn side_loss(l: Loss, sp: f32, scores: &[f32], coef: &mut [f32]) -> (f64, f32) {
    let live = scores.iter().filter(|s| s.is_finite()).count();
    coef.iter_mut().for_each(|c| *c = 0.0);
    if live == 0 {
        return (0.0, 0.0);
    }
    match l.loss {
        KgLoss::Softmax => {
            let m = max8(sp, scores);
            let z = (sp - m).exp() + exp_shifted(1.0, m, scores, coef);
            let inv = 1.0 / z;
            coef.iter_mut().for_each(|c| *c *= inv);
            let pp = (sp - m).exp() * inv;
            (f64::from(m + z.ln() - sp), pp - 1.0)
        }
        KgLoss::Logistic => {
            // Negatives weighted uniformly, or by softmax(alpha * score) (self-adversarial; the
            // weights are constants of the gradient).
            if l.adversarial > 0.0 {
                let m = max8(f32::NEG_INFINITY, scores);
                let inv = 1.0 / exp_shifted(l.adversarial, m, scores, coef);
                coef.iter_mut().for_each(|c| *c *= inv);
            } else {
                for (c, &s) in coef.iter_mut().zip(scores) {
                    if s.is_finite() {
                        *c = 1.0 / live as f32;
                    }
                }
            }
            let mut loss = f64::from(super::softplus_neg(sp));
            for (c, &s) in coef.iter_mut().zip(scores) {
                if *c > 0.0 {
                    loss += f64::from(*c * super::softplus_neg(-s));
                    *c *= super::sigmoid(s);
                }
            }
            (loss, super::sigmoid(sp) - 1.0)
        }
        KgLoss::Margin => {
            let (mut loss, mut cp) = (0f64, 0f32);
            let w = 1.0 / live as f32;
            for (c, &s) in coef.iter_mut().zip(scores) {
                if s.is_finite() && l.gamma - sp + s > 0.0 {
                    loss += f64::from(w * (l.gamma - sp + s));
                    *c = w;
                    cp -= w;
                }
            }
            (loss, cp)
        }
    }
}

impl Plan for KgePlan {
    fn references(&self) -> [&[u32]; 2] {
        [self.pos.as_flattened(), &self.negs]
    }

    fn references_mut(&mut self) -> [&mut [u32]; 2] {
        [self.pos.as_flattened_mut(), &mut self.negs]
    }

    fn examples(&self) -> usize {
        self.pos.len()
    }

    fn loss_terms(&self) -> u64 {
        // Both sides of every positive.
        2 * self.pos.len() as u64
    }

    fn train(&self, _rows: &Cells, _lr: f32) -> f64 {
        unreachable!("knowledge-graph models update through --update batched (TrainConfig)")
    }

    fn gradients(&self, rows: &[f32], dim: usize) -> Grads {
        use rayon::prelude::*;
        let chunks = self.pos.len().div_ceil(self.chunk);
        let (nrow, nrel) = (rows.len(), self.rel.len());
        // Each fold task zeroes and later sums a whole gradient buffer: at most one task per
        // thread (rayon would otherwise split the chunks further and allocate more buffers).
        let per_task = chunks.div_ceil(rayon::current_num_threads()).max(1);
        let (g, gr, loss) = (0..chunks)
            .into_par_iter()
            .with_min_len(per_task)
            .fold(
                || (vec![0f32; nrow], vec![0f32; nrel], 0f64),
                |(mut g, mut gr, loss), c| {
                    let l = self.chunk_gradients(c, rows, dim, &mut g, &mut gr);
                    (g, gr, loss + l)
                },
            )
            .reduce(
                || (Vec::new(), Vec::new(), 0f64),
                |a, b| {
                    if a.0.is_empty() {
                        return b;
                    }
                    if b.0.is_empty() {
                        return a;
                    }
                    let (mut g, mut gr, la) = a;
                    g.iter_mut().zip(&b.0).for_each(|(x, y)| *x += y);
                    gr.iter_mut().zip(&b.1).for_each(|(x, y)| *x += y);
                    (g, gr, la + b.2)
                },
            );
        Grads {
            rows: if g.is_empty() { vec![0f32; nrow] } else { g },
            replicated: if gr.is_empty() { vec![0f32; nrel] } else { gr },
            loss,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rand_vec(rng: &mut Rng, n: usize) -> Vec<f32> {
        (0..n).map(|_| rng.random_range(-0.8f32..0.8)).collect()
    }

    #[test]
    fn lane_softmax_and_adversarial_weights_equal_the_scalar_formulas() {
        let mut rng = crate::sample::rng_for(5, 0, 0);
        // 8-lane chunks and a remainder; skipped negatives (NEG_INFINITY) in both.
        for k in [3, 8, 21] {
            let mut scores: Vec<f32> = rand_vec(&mut rng, k).iter().map(|x| 9.0 * x).collect();
            scores[1] = f32::NEG_INFINITY;
            scores[k - 1] = f32::NEG_INFINITY;
            let sp = 0.3;
            for (loss, adversarial) in [(KgLoss::Softmax, 0.0), (KgLoss::Logistic, 0.5)] {
                let l = Loss {
                    score: Score::DistMult,
                    loss,
                    reg: Reg::None,
                    reg_weight: 0.0,
                    gamma: 0.0,
                    adversarial,
                };
                let mut coef = vec![f32::NAN; k];
                let (value, cp) = side_loss(l, sp, &scores, &mut coef);
                // The scalar formulas, in f64.
                let live = || {
                    scores
                        .iter()
                        .filter(|s| s.is_finite())
                        .map(|&s| f64::from(s))
                };
                let (want, want_cp, w): (f64, f64, Vec<f64>) = if loss == KgLoss::Softmax {
                    let z = f64::from(sp).exp() + live().map(f64::exp).sum::<f64>();
                    let p = |s: f32| {
                        if s.is_finite() {
                            f64::from(s).exp() / z
                        } else {
                            0.0
                        }
                    };
                    let w = scores.iter().map(|&s| p(s)).collect();
                    (z.ln() - f64::from(sp), p(sp) - 1.0, w)
                } else {
                    let a = f64::from(adversarial);
                    let z: f64 = live().map(|s| (a * s).exp()).sum();
                    let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
                    let p: Vec<f64> = scores
                        .iter()
                        .map(|&s| {
                            if s.is_finite() {
                                (a * f64::from(s)).exp() / z
                            } else {
                                0.0
                            }
                        })
                        .collect();
                    let value = -sig(f64::from(sp)).ln()
                        - scores
                            .iter()
                            .zip(&p)
                            .filter(|(s, _)| s.is_finite())
                            .map(|(&s, p)| p * sig(-f64::from(s)).ln())
                            .sum::<f64>();
                    let w = scores
                        .iter()
                        .zip(&p)
                        .map(|(&s, p)| {
                            if s.is_finite() {
                                p * sig(f64::from(s))
                            } else {
                                0.0
                            }
                        })
                        .collect();
                    (value, sig(f64::from(sp)) - 1.0, w)
                };
                let close = |a: f64, b: f64| (a - b).abs() < 1e-5 * (1.0 + b.abs());
                assert!(
                    close(value, want),
                    "{loss:?} k {k}: loss {value}, want {want}"
                );
                assert!(
                    close(f64::from(cp), want_cp),
                    "{loss:?} k {k}: {cp} against {want_cp}"
                );
                for (i, (&c, &w)) in coef.iter().zip(&w).enumerate() {
                    assert!(
                        close(f64::from(c), w),
                        "{loss:?} k {k}: coef {i}: {c}, want {w}"
                    );
                }
            }
        }
    }

    #[test]
    fn every_score_gradient_matches_finite_differences() {
        let mut rng = crate::sample::rng_for(11, 0, 0);
        let d = 6;
        for score in [
            Score::DistMult,
            Score::ComplEx,
            Score::TransE,
            Score::RotatE,
        ] {
            let rd = score.rel_dim(d);
            let (h, r, t) = (
                rand_vec(&mut rng, d),
                rand_vec(&mut rng, rd),
                rand_vec(&mut rng, d),
            );
            let (mut gh, mut gr, mut gt) = (vec![0f32; d], vec![0f32; rd], vec![0f32; d]);
            score.add_grad(&h, &r, &t, 1.0, &mut gh, &mut gr, &mut gt);
            let eps = 1e-3f32;
            let s = |h: &[f32], r: &[f32], t: &[f32]| f64::from(score.score(h, r, t, 3.0));
            for (which, g) in [(0, &gh), (1, &gr), (2, &gt)] {
                for i in 0..g.len() {
                    let mut v = [h.clone(), r.clone(), t.clone()];
                    v[which][i] += eps;
                    let up = s(&v[0], &v[1], &v[2]);
                    v[which][i] -= 2.0 * eps;
                    let down = s(&v[0], &v[1], &v[2]);
                    let fd = (up - down) / (2.0 * f64::from(eps));
                    assert!(
                        (fd - f64::from(g[i])).abs() < 2e-2,
                        "{score:?} factor {which} entry {i}: finite difference {fd}, analytic {}",
                        g[i]
                    );
                }
            }
        }
    }

    #[test]
    fn the_query_form_scores_as_the_model_does_on_both_sides() {
        let mut rng = crate::sample::rng_for(17, 0, 0);
        // 22: whole 8-lane chunks and a remainder in both the real and the complex sums.
        let d = 22;
        for score in [
            Score::DistMult,
            Score::ComplEx,
            Score::TransE,
            Score::RotatE,
        ] {
            let r = rand_vec(&mut rng, score.rel_dim(d));
            let (h, t) = (rand_vec(&mut rng, d), rand_vec(&mut rng, d));
            let want = score.score(&h, &r, &t, 6.0);
            let mut out = [0f32; 1];
            score.score_all(true, &h, &r, &t, 6.0, &mut out);
            assert!(
                (out[0] - want).abs() < 1e-5,
                "{score:?} tails: {} vs {want}",
                out[0]
            );
            score.score_all(false, &t, &r, &h, 6.0, &mut out);
            assert!(
                (out[0] - want).abs() < 1e-5,
                "{score:?} heads: {} vs {want}",
                out[0]
            );
        }
    }

    #[test]
    fn complex_with_zero_imaginary_parts_is_distmult_on_the_real_halves() {
        let mut rng = crate::sample::rng_for(5, 0, 0);
        let m = 4;
        let mut h = rand_vec(&mut rng, 2 * m);
        let mut r = rand_vec(&mut rng, 2 * m);
        let mut t = rand_vec(&mut rng, 2 * m);
        for v in [&mut h, &mut r, &mut t] {
            v[m..].iter_mut().for_each(|x| *x = 0.0);
        }
        let c = Score::ComplEx.score(&h, &r, &t, 0.0);
        let d = Score::DistMult.score(&h[..m], &r[..m], &t[..m], 0.0);
        assert!((c - d).abs() < 1e-6, "{c} vs {d}");
    }

    #[test]
    fn rotate_scores_a_true_rotation_at_gamma() {
        // t = h rotated by theta: distance 0, score gamma; another tail scores lower.
        let m = 3;
        let h = vec![0.3f32, -0.2, 0.5, 0.1, 0.4, -0.3];
        let theta = vec![0.7f32, -1.2, 2.0];
        let mut t = vec![0f32; 2 * m];
        for k in 0..m {
            let (s, c) = theta[k].sin_cos();
            t[k] = h[k] * c - h[m + k] * s;
            t[m + k] = h[k] * s + h[m + k] * c;
        }
        assert!((Score::RotatE.score(&h, &theta, &t, 6.0) - 6.0).abs() < 1e-5);
        assert!(Score::RotatE.score(&h, &theta, &h, 6.0) < 6.0 - 0.1);
    }

    /// The plan's summed loss against finite differences of every row and relation value:
    /// each loss with regularisation, both sides, shared negatives (one equal to a true tail),
    /// triples of different weights.
    /// (Self-adversarial weights are constants of the gradient, so they are left out here.)
    #[test]
    fn plan_gradients_match_finite_differences_of_the_batch_loss() {
        let mut rng = crate::sample::rng_for(3, 0, 0);
        let (d, nrows, nrel) = (18, 6, 2);
        for score in [
            Score::DistMult,
            Score::ComplEx,
            Score::TransE,
            Score::RotatE,
        ] {
            for (loss, reg, adversarial) in [
                (KgLoss::Softmax, Reg::N3, 0.0),
                (KgLoss::Logistic, Reg::L2, 0.0),
                (KgLoss::Margin, Reg::None, 0.0),
            ] {
                let rd = score.rel_dim(d);
                let rows = rand_vec(&mut rng, nrows * d);
                let rel = rand_vec(&mut rng, nrel * rd);
                let mut plan = KgePlan {
                    pos: vec![[0, 1], [2, 3], [1, 4]],
                    rels: vec![0, 1, 1],
                    weights: vec![1.0, 0.4, 2.5],
                    negs: vec![5, 3, 0, 4, 2, SKIP],
                    rel: Arc::new(rel.clone()),
                    loss: Loss {
                        score,
                        loss,
                        reg,
                        reg_weight: 0.05,
                        gamma: 2.0,
                        adversarial,
                    },
                    k: 3,
                    chunk: 2,
                    rel_dim: rd,
                };
                let gr = plan.gradients(&rows, d);
                let eps = 1e-3f32;
                for i in 0..rows.len() + rel.len() {
                    let f = |delta: f32, plan: &mut KgePlan| {
                        let (mut r, mut rl) = (rows.clone(), rel.clone());
                        if i < rows.len() {
                            r[i] += delta;
                        } else {
                            rl[i - rows.len()] += delta;
                        }
                        plan.rel = Arc::new(rl);
                        plan.gradients(&r, d).loss
                    };
                    let fd = (f(eps, &mut plan) - f(-eps, &mut plan)) / (2.0 * f64::from(eps));
                    let an = if i < rows.len() {
                        gr.rows[i]
                    } else {
                        gr.replicated[i - rows.len()]
                    };
                    assert!(
                        (fd - f64::from(an)).abs() < 3e-2 * (1.0 + fd.abs()),
                        "{score:?} {loss:?} {reg:?} adv {adversarial}: value {i}: finite difference {fd}, analytic {an}"
                    );
                }
            }
        }
    }

    /// A triple's weight scales its loss and every gradient it contributes (without
    /// regularisation, which is not weighted): weights w give w times the plan of weight 1.
    #[test]
    fn a_triple_weight_scales_its_loss_and_gradients() {
        let mut rng = crate::sample::rng_for(5, 0, 0);
        let (d, nrows) = (8, 5);
        for score in [Score::DistMult, Score::RotatE] {
            let rd = score.rel_dim(d);
            let rows = rand_vec(&mut rng, nrows * d);
            let plan = |w: f32| KgePlan {
                pos: vec![[0, 1], [2, 3]],
                rels: vec![0, 0],
                weights: vec![w; 2],
                negs: vec![4, 3, 1],
                rel: Arc::new(rand_vec(&mut crate::sample::rng_for(6, 0, 0), rd)),
                loss: Loss {
                    score,
                    loss: KgLoss::Logistic,
                    reg: Reg::None,
                    reg_weight: 0.0,
                    gamma: 2.0,
                    adversarial: 0.5,
                },
                k: 3,
                chunk: 2,
                rel_dim: rd,
            };
            let (one, w) = (plan(1.0).gradients(&rows, d), 2.5f32);
            let heavy = plan(w).gradients(&rows, d);
            assert!(one.loss > 0.0);
            assert!((heavy.loss - f64::from(w) * one.loss).abs() < 1e-5 * one.loss);
            for (a, b) in one
                .rows
                .iter()
                .chain(&one.replicated)
                .zip(heavy.rows.iter().chain(&heavy.replicated))
            {
                assert!(
                    (b - w * a).abs() <= 1e-5 * (1.0 + a.abs()),
                    "{score:?}: {b} against {w} x {a}"
                );
            }
            assert!(one.rows.iter().any(|&g| g != 0.0));
        }
    }
}
