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

mod score;

use score::Psi;
pub use score::{Ranking, Score};

use super::kernels::{exp_shifted, max8};
use super::{Cells, Grads, Model, Plan, Work, SKIP};
use crate::config::{KgLoss, NegSampling, NegativesFrom, Reg, TrainConfig};
use crate::error::{Error, Result};
use crate::graph::triples::TripleFile;
use crate::graph::LocalGraph;
use crate::sample::negatives::NegativePool;
use crate::sample::Rng;

/// The first bytes of a knowledge-graph model's checkpointed state.
const KG_STATE_MAGIC: &[u8; 4] = b"KGST";

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
                loss: cfg.kg.kg_loss,
                reg: cfg.kg.reg,
                reg_weight: cfg.kg.reg_weight,
                gamma: cfg.kg.gamma,
                adversarial: cfg.kg.adversarial_temperature,
            },
            k: cfg.negatives as usize,
            chunk: cfg.shared_negatives.max(1),
            uniform: cfg.kg.negative_sampling == NegSampling::Uniform,
            entities: g.num_nodes(),
            shard: cfg.kg.negatives_from == NegativesFrom::Shard && g.part.ranks() > 1,
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
        let l = self.loss;
        let (k, rd) = (self.k, self.rel_dim);
        let psi = l.score.psi();
        let row = |s: u32| &rows[s as usize * dim..(s as usize + 1) * dim];
        let negs = &self.negs[c * k..(c + 1) * k];
        let lo = c * self.chunk;
        let hi = (lo + self.chunk).min(self.pos.len());
        let b = hi - lo;
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
                    .query(tail, row(if tail { hs } else { ts }), self.rel_of(i), qi);
            }
            score_negatives(psi, l.gamma, &q, &negm, dim, &mut scores);
            gq.iter_mut().for_each(|x| *x = 0.0);
            let gtruth = if tail { &mut gt } else { &mut gh };
            let side = Side {
                tail,
                lo,
                negs,
                q: &q,
            };
            loss += self.positive_losses(&side, rows, dim, &mut scores, &mut coef, &mut gq, gtruth);
            negative_gradients(psi, &q, &negm, &coef, dim, &mut gq, &mut gneg);
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
                    self.rel_of(i),
                    &gq[x * dim..(x + 1) * dim],
                    &mut gknown[x * dim..(x + 1) * dim],
                    &mut grr[x * rd..(x + 1) * rd],
                );
            }
        }
        loss + self.add_chunk(lo..hi, rows, dim, [&mut gh, &mut gt, &mut grr], g, gr)
    }

    /// The relation vector of positive `i`.
    fn rel_of(&self, i: usize) -> &[f32] {
        let (ri, rd) = (self.rels[i] as usize, self.rel_dim);
        &self.rel[ri * rd..(ri + 1) * rd]
    }

    /// One side of a chunk's positives: the loss of each against its negatives' `scores`
    /// (skipped negatives and the truth itself masked), weighted by its triple's weight; the
    /// loss gradients per negative into `coef` and the truth's into `gq` and `gtruth`.
    #[allow(clippy::too_many_arguments)]
    fn positive_losses(
        &self,
        side: &Side,
        rows: &[f32],
        dim: usize,
        scores: &mut [f32],
        coef: &mut [f32],
        gq: &mut [f32],
        gtruth: &mut [f32],
    ) -> f64 {
        let (l, k) = (self.loss, self.k);
        let psi = l.score.psi();
        let row = |s: u32| &rows[s as usize * dim..(s as usize + 1) * dim];
        let b = side.q.len() / dim;
        let mut loss = 0f64;
        for (x, i) in (side.lo..side.lo + b).enumerate() {
            let [hs, ts] = self.pos[i];
            let truth = if side.tail { ts } else { hs };
            let qi = &side.q[x * dim..(x + 1) * dim];
            let si = &mut scores[x * k..(x + 1) * k];
            for (sij, &n) in si.iter_mut().zip(side.negs) {
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
            psi.grad(
                qi,
                row(truth),
                cp,
                &mut gq[x * dim..(x + 1) * dim],
                &mut gtruth[x * dim..(x + 1) * dim],
            );
        }
        loss
    }

    /// The chunk's positives' gradients (`[heads, tails, relations]`, one row per positive)
    /// with their regularisation added into the batch's `g` (rows) and `gr` (relations);
    /// returns the regularisation's loss.
    fn add_chunk(
        &self,
        span: std::ops::Range<usize>,
        rows: &[f32],
        dim: usize,
        [gh, gt, grr]: [&mut Vec<f32>; 3],
        g: &mut [f32],
        gr: &mut [f32],
    ) -> f64 {
        let (l, rd) = (self.loss, self.rel_dim);
        let row = |s: u32| &rows[s as usize * dim..(s as usize + 1) * dim];
        let mut loss = 0f64;
        for (x, i) in span.enumerate() {
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
                loss += l
                    .score
                    .add_reg(l.reg, self.rel_of(i), l.reg_weight, grx, true);
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

/// One side of a chunk (tails corrupted or heads): its first positive, its negatives and its
/// queries (b x d).
struct Side<'a> {
    tail: bool,
    lo: usize,
    negs: &'a [u32],
    q: &'a [f32],
}

/// The chunk's `b` queries (b x d) scored against its `k` negatives (k x d) into `scores`
/// (b x k): one matrix product for the dot-product models, pair by pair for the distances.
fn score_negatives(psi: Psi, gamma: f32, q: &[f32], negm: &[f32], dim: usize, scores: &mut [f32]) {
    let (b, k) = (q.len() / dim, negm.len() / dim);
    if psi == Psi::Dot {
        crate::model::dense::mul_nt(scores, q, negm, (b, dim, k), 0.0);
    } else {
        for (qi, si) in q.chunks_exact(dim).zip(scores.chunks_exact_mut(k)) {
            for (sij, nj) in si.iter_mut().zip(negm.chunks_exact(dim)) {
                *sij = psi.score(qi, nj, gamma);
            }
        }
    }
}

/// The gradients through the negatives' scores, given their loss gradients `coef` (b x k):
/// `gq += C N` and `gneg = C^T Q` (matrix products for the dot-product models).
fn negative_gradients(
    psi: Psi,
    q: &[f32],
    negm: &[f32],
    coef: &[f32],
    dim: usize,
    gq: &mut [f32],
    gneg: &mut [f32],
) {
    let (b, k) = (q.len() / dim, negm.len() / dim);
    if psi == Psi::Dot {
        crate::model::dense::mul(gq, coef, negm, (b, k, dim), 1.0);
        crate::model::dense::mul_tn(gneg, coef, q, (b, k, dim));
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
