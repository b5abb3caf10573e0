//! The score functions of the knowledge-graph models (DistMult, ComplEx, TransE, RotatE):
//! scores, their gradients, the queries of one known entity and a relation, and the
//! regularisers, on rows of `dim` values (complex vectors as halves `[re | im]`).

use crate::config::{Model as Kind, Reg};
use crate::model::kernels::sum8;
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
            Kind::Deepwalk | Kind::Node2vec | Kind::Line | Kind::Sage => None,
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
    pub(super) fn complex(self) -> bool {
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
    pub(super) fn add_reg(self, reg: Reg, x: &[f32], w: f32, g: &mut [f32], relation: bool) -> f64 {
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
pub(super) enum Psi {
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
    pub(super) fn score(self, q: &[f32], x: &[f32], gamma: f32) -> f32 {
        match self {
            Psi::Dot => crate::model::dot(q, x),
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
    pub(super) fn grad(self, q: &[f32], x: &[f32], c: f32, gq: &mut [f32], gx: &mut [f32]) {
        match self {
            Psi::Dot => {
                crate::model::axpy(c, x, gq);
                crate::model::axpy(c, q, gx);
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

impl Score {
    pub(super) fn psi(self) -> Psi {
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
    pub(super) fn query(self, tail: bool, e: &[f32], r: &[f32], q: &mut [f32]) {
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
    pub(super) fn query_grad(
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
