//! Skip-gram with negative sampling (word2vec; DeepWalk, node2vec, LINE). For a positive pair
//! (center c, context x) and negatives n_k: loss = -ln s(u_x . v_c) - sum_k ln s(-u_nk . v_c).
//! LINE first order is the same loss with u and v rows from one matrix.
//! Scores are clamped to [-MAX_SCORE, MAX_SCORE] like word2vec's sigmoid table.

use super::{axpy, dot, sigmoid, softplus_neg};

/// word2vec's MAX_EXP.
pub const MAX_SCORE: f32 = 6.0;

/// Slot marking a skipped negative (it equalled the context).
pub const SKIP: u32 = u32::MAX;

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
