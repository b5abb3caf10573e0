//! How skip-gram's kernels step beyond word2vec's plain sgd: the [`Step`] they are handed,
//! implicit steps at the small budgets' learning rates ([`implicit_steps`]), and row-wise
//! Adagrad in place ([`Block::update_adagrad`]).

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
use super::{fused_grads, with_width, FUSED_TARGETS};
use super::{Block, Shared};
use crate::model::cells::add_to;
use crate::model::{adagrad_factor, axpy, dot, Accumulators};
use std::sync::atomic::AtomicU32;

/// How a kernel steps: the learning rate, whether its steps are implicit
/// ([`implicit_steps`]), and with row-wise Adagrad the rows' accumulators.
#[derive(Clone, Copy)]
pub struct Step<'a> {
    pub lr: f32,
    pub implicit: bool,
    pub acc: Option<Accumulators<'a>>,
}

impl<'a> Step<'a> {
    pub fn new(lr: f32, implicit: bool, acc: Option<Accumulators<'a>>) -> Self {
        Step { lr, implicit, acc }
    }

    /// Plain sgd at `lr`, explicit steps (word2vec's).
    pub fn sgd(lr: f32) -> Self {
        Step::new(lr, false, None)
    }
}

/// Whether sgd in place takes implicit (proximal) steps: for learning rates above word2vec's
/// 0.025, the small budgets' defaults (`config::budget_lr`). An explicit step of skip-gram
/// overshoots once `lr` times the rows' squared norms nears 2: the token kernel, whose target
/// takes a window's inputs at once, diverged at 0.5 on a planted partition of 2^20 nodes (the
/// pair kernel at 1.0); divided by `1 + lr x curvature` it trains at 0.5-2. At 0.025 the
/// explicit step is word2vec's, and BlogCatalog's tuned runs keep it (implicit steps there:
/// Micro-F1 37.8 against 38.2, one run each).
pub fn implicit_steps(lr: f32) -> bool {
    lr > crate::config::WORD2VEC_LR
}

impl Block {
    /// Row-wise Adagrad's [`Block::update`]: the same coefficients without the learning rate
    /// give each target's and each input's gradient from the values before the block; each
    /// row then steps by `lr / sqrt(acc)` times its own gradient, `acc` its accumulator with
    /// the gradient's mean square added (a target's in `target`'s second item, an input's in
    /// its ring slot until it is evicted). A target repeated in the block is one row with one
    /// gradient: its columns are summed into its first occurrence.
    pub(super) fn update_adagrad<'r>(
        &mut self,
        m: usize,
        nt: usize,
        lr: f32,
        with_loss: bool,
        target: impl Fn(u32) -> (Shared<'r>, &'r AtomicU32),
    ) -> f64 {
        let loss = self.coefficients(m, nt, 1.0, with_loss, false);
        let d = self.dim;
        self.merge_repeated_targets(m, nt);
        let (tref, coef, repeat) = (&self.tref[..nt], &self.coef[..m * nt], &self.repeat);
        let (slots, u) = (&self.slots[..m], &self.u[..nt * d]);
        let (du, dv) = (&mut self.du[..nt * d], &mut self.dv[..m * d]);
        let mut done = false;
        #[cfg(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma"
        ))]
        if d.is_multiple_of(8) && (1..=FUSED_TARGETS).contains(&nt) {
            for (g, &c) in self.gb.chunks_exact_mut(8).zip(coef.iter()) {
                g.fill(c);
            }
            let gb = &self.gb[..m * nt * 8];
            macro_rules! go {
                ($n:literal) => {
                    fused_grads::<$n>(&self.v, slots, u, gb, du, dv)
                };
            }
            with_width!(nt, go);
            done = true;
        }
        if !done {
            du.fill(0.0);
            dv.fill(0.0);
            for (i, &s) in slots.iter().enumerate() {
                let vi = &self.v[s * d..][..d];
                let dvi = &mut dv[i * d..][..d];
                for t in 0..nt {
                    let g = coef[i * nt + t];
                    axpy(g, vi, &mut du[t * d..][..d]);
                    axpy(g, &u[t * d..][..d], dvi);
                }
            }
        }
        for (t, &(r, _)) in tref.iter().enumerate() {
            if !repeat[t] {
                let (row, acc) = target(r);
                let g = &mut du[t * d..][..d];
                let f = adagrad_factor(acc, dot(g, g) / d as f32, lr);
                g.iter_mut().for_each(|x| *x *= f);
                add_to(row, g);
            }
        }
        for (i, &s) in slots.iter().enumerate() {
            let g = &dv[i * d..][..d];
            self.acc[s] += dot(g, g) / d as f32;
            let f = if self.acc[s] > 0.0 {
                lr / self.acc[s].sqrt()
            } else {
                0.0
            };
            axpy(f, g, &mut self.v[s * d..][..d]);
        }
        loss
    }
}
