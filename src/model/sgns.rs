//! Skip-gram with negative sampling (word2vec; DeepWalk, node2vec, LINE). For a positive pair
//! (center c, context x) and negatives n_k: loss = -ln s(u_x . v_c) - sum_k ln s(-u_nk . v_c).
//! LINE first order is the same loss with u and v rows from one matrix.
//! Scores are clamped to [-MAX_SCORE, MAX_SCORE] like word2vec's sigmoid table.

use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering::Relaxed;

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

/// Marks a reference to a fetched (remote) row in [`sgd_in_place`]: `REMOTE | slot`.
pub const REMOTE: u32 = 1 << 31;

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
    centers: &[AtomicU32],
    targets: &[AtomicU32],
    remote: &[AtomicU32],
    dim: usize,
    pairs: &[[u32; 2]],
    negs: &[u32],
    k: usize,
    lr: f32,
) -> f64 {
    use rayon::prelude::*;
    const CHUNK: usize = 256;
    const PREFETCH: usize = 2;
    let row = |center: bool, r: u32| {
        let (m, r) = if r & REMOTE != 0 {
            (remote, (r & !REMOTE) as usize)
        } else if center {
            (centers, r as usize)
        } else {
            (targets, r as usize)
        };
        &m[r * dim..(r + 1) * dim]
    };
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
                        let g = (1.0 / (1.0 + e) - label) * lr;
                        axpy(g, ut, gc);
                        axpy(-g, vc, ut);
                        store(trow, ut);
                    }
                    // Reload: the center may also have been a target of this pair (LINE first
                    // order, or a negative equal to the center).
                    load(crow, vc);
                    axpy(-1.0, gc, vc);
                    store(crow, vc);
                }
                loss
            },
        )
        .sum()
}

/// Hint the CPU to bring `cells` into cache (no effect on values; a no-op off x86-64).
#[inline]
fn prefetch(cells: &[AtomicU32]) {
    #[cfg(target_arch = "x86_64")]
    for line in cells.chunks(16) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: a prefetch is a hint that never faults and changes no value; the address is
        // that of a live row (SSE, which provides it, is part of the x86-64 baseline).
        unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = cells;
}

/// Copy a shared row into `out` (same length): vector moves, then single relaxed loads.
#[inline]
fn load(cells: &[AtomicU32], out: &mut [f32]) {
    debug_assert_eq!(cells.len(), out.len());
    let done = vector_copy(cells.as_ptr().cast(), out.as_mut_ptr().cast(), out.len());
    for (o, c) in out[done..].iter_mut().zip(&cells[done..]) {
        *o = f32::from_bits(c.load(Relaxed));
    }
}

/// Copy `v` into a shared row (same length), as [`load`].
#[inline]
fn store(cells: &[AtomicU32], v: &[f32]) {
    debug_assert_eq!(cells.len(), v.len());
    let done = vector_copy(v.as_ptr().cast(), cells.as_ptr().cast_mut().cast(), v.len());
    for (c, x) in cells[done..].iter().zip(&v[done..]) {
        c.store(x.to_bits(), Relaxed);
    }
}

/// Copy a leading part of `n` 4-byte values from `src` to `dst` with 32-byte AVX moves; returns
/// how many were copied (0 without AVX: the caller's relaxed atomics then copy everything). One
/// side is a shared row that other threads read and write concurrently: word-by-word relaxed
/// atomics compile to one scalar move per value, a third of the kernel's time (`cargo bench
/// --bench kernels -- skipgram_in_place`). Inline assembly is outside Rust's memory model; these
/// moves are the relaxed 4-byte loads and stores of the atomic path, done eight at a time. The
/// other side is a private buffer.
#[inline]
fn vector_copy(src: *const u32, dst: *mut u32, n: usize) -> usize {
    #[cfg(all(target_arch = "x86_64", target_feature = "avx"))]
    {
        let blocks = n / 8;
        if blocks > 0 {
            // SAFETY: callers pass `src` and `dst` from slices of `n` values that do not
            // overlap (a shared row and a thread's private buffer), so both are valid for
            // `blocks * 8` values. The values are 4-byte aligned and never cross a cache line,
            // so x86 moves each of them whole: a racing update of the shared row may be lost
            // (as in word2vec's HOGWILD) but no value is torn. The block touches no stack, and
            // its registers are declared.
            unsafe {
                std::arch::asm!(
                    "2:",
                    "vmovups {x}, ymmword ptr [{s}]",
                    "vmovups ymmword ptr [{d}], {x}",
                    "add {s}, 32",
                    "add {d}, 32",
                    "dec {b}",
                    "jnz 2b",
                    s = inout(reg) src => _,
                    d = inout(reg) dst => _,
                    b = inout(reg) blocks => _,
                    x = out(ymm_reg) _,
                    options(nostack),
                );
            }
        }
        blocks * 8
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx")))]
    {
        let _ = (src, dst, n);
        0
    }
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

#[cfg(test)]
mod in_place_tests {
    use super::*;
    use rand::RngExt;

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
        let loss =
            pool.install(|| sgd_in_place(&centers, &targets, &remote, dim, &pairs, &negs, k, lr));
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

    #[test]
    fn a_nan_row_makes_the_loss_nan() {
        let dim = 4;
        let mut c = vec![0.1f32; 3 * dim];
        c[dim + 2] = f32::NAN;
        let t = vec![0.2f32; 3 * dim];
        let (centers, targets) = (cells(&c), cells(&t));
        // Pair 1 (not a loss-sampled pair) has the NaN center.
        let pairs = [[0u32, 1], [1, 2]];
        let loss = sgd_in_place(&centers, &targets, &[], dim, &pairs, &[], 0, 0.1);
        assert!(loss.is_nan(), "{loss}");
    }
}
