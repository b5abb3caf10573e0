//! The kernels' steps beyond word2vec's: implicit steps at large learning rates, and row-wise
//! Adagrad in place.

use super::*;
use crate::model::Accumulators;
use rand::RngExt;
use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering::Relaxed;

fn cells(v: &[f32]) -> Vec<AtomicU32> {
    v.iter().map(|x| AtomicU32::new(x.to_bits())).collect()
}

fn values(c: &[AtomicU32]) -> Vec<f32> {
    c.iter().map(|x| f32::from_bits(x.load(Relaxed))).collect()
}

fn one_thread() -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap()
}

/// Random walk segments of `len` tokens over `nrows` rows (the same row in both matrices), with
/// their dynamic windows and `k` negatives per group, as `plan_segments` lays them out.
fn random_segment(
    rng: &mut crate::sample::Rng,
    nrows: u32,
    len: usize,
    window: u32,
    k: usize,
) -> (Vec<[u32; 2]>, Vec<u32>, Vec<u32>) {
    use crate::sample::walk::group_inputs;
    let refs: Vec<[u32; 2]> = (0..len)
        .map(|_| {
            let n = rng.random_range(0..nrows);
            [n, n]
        })
        .collect();
    let wins: Vec<u32> = (0..len).map(|_| 1 + rng.random_range(0..window)).collect();
    let mut negs = Vec::new();
    for (b, &win) in wins.iter().enumerate() {
        let (lo, hi) = group_inputs(len, 0, b, win);
        if group_size(lo, hi, b) > 0 {
            negs.extend((0..k).map(|_| rng.random_range(0..nrows)));
        }
    }
    (refs, wins, negs)
}

/// The token kernel at learning rate 4 on a small dense problem: its implicit steps keep every
/// row finite and bounded, where word2vec's explicit steps at that rate blow the rows up (the
/// divergence the large defaults of small budgets would hit).
#[test]
fn implicit_steps_stay_bounded_where_explicit_ones_diverge() {
    let (dim, k, window, nrows, len) = (16usize, 5usize, 5u32, 64u32, 40usize);
    let largest = |implicit: bool| -> f32 {
        let mut rng = crate::sample::rng_for(3, 0, 0);
        let init: Vec<f32> = (0..nrows as usize * dim)
            .map(|_| rng.random_range(-0.3f32..0.3))
            .collect();
        let (centers, targets) = (cells(&init), cells(&vec![0.0; init.len()]));
        let pool = one_thread();
        for _ in 0..300 {
            let (refs, wins, negs) = random_segment(&mut rng, nrows, len, window, k);
            let rows = SegmentRows {
                refs: &refs,
                wins: &wins,
                segs: &[(0, 0)],
                negs: &negs,
                first_group: &[0],
            };
            pool.install(|| {
                sgd_segments(
                    Shared::F32(&centers),
                    Shared::F32(&targets),
                    Shared::F32(&[]),
                    dim,
                    &rows,
                    k,
                    window,
                    Step::new(4.0, implicit, None),
                )
            });
        }
        values(&centers)
            .into_iter()
            .chain(values(&targets))
            .map(|x| {
                if x.is_finite() {
                    x.abs()
                } else {
                    f32::INFINITY
                }
            })
            .fold(0.0, f32::max)
    };
    let (implicit, explicit) = (largest(true), largest(false));
    assert!(implicit < 20.0, "implicit steps: largest value {implicit}");
    assert!(
        explicit > 10.0 * implicit,
        "explicit steps: largest value {explicit} (implicit {implicit})"
    );
}

/// Row-wise Adagrad's first step on a fresh row moves every entry by `lr` in root mean square,
/// whatever the gradient's scale: a row that has seen nothing learns at once. Pair kernel: the
/// context, the negative and the center each take one step; their accumulators hold their
/// gradients' mean squares.
#[test]
fn adagrad_first_pair_step_moves_each_row_by_lr() {
    let dim = 8;
    let lr = 0.1f32;
    let mut rng = crate::sample::rng_for(5, 0, 0);
    // Tiny rows: plain sgd would move them by about lr x 1e-3.
    let c: Vec<f32> = (0..2 * dim)
        .map(|_| rng.random_range(-1e-3f32..1e-3))
        .collect();
    let t: Vec<f32> = (0..3 * dim)
        .map(|_| rng.random_range(-1e-3f32..1e-3))
        .collect();
    let (centers, targets) = (cells(&c), cells(&t));
    let (acc_c, acc_t) = (cells(&[0.0; 2]), cells(&[0.0; 3]));
    let acc = Accumulators {
        matrices: [&acc_c, &acc_t],
        remote: &[],
    };
    // Center 1, context 0, negative 2.
    one_thread().install(|| {
        sgd_in_place(
            Shared::F32(&centers),
            Shared::F32(&targets),
            Shared::F32(&[]),
            dim,
            &[[1, 0]],
            &[2],
            1,
            Step::new(lr, false, Some(acc)),
        )
    });
    let rms_change = |now: &[f32], before: &[f32]| -> f32 {
        (now.iter()
            .zip(before)
            .map(|(a, b)| (a - b) * (a - b))
            .sum::<f32>()
            / now.len() as f32)
            .sqrt()
    };
    let (cv, tv) = (values(&centers), values(&targets));
    for (name, now, before) in [
        ("center", &cv[dim..2 * dim], &c[dim..2 * dim]),
        ("context", &tv[..dim], &t[..dim]),
        ("negative", &tv[2 * dim..], &t[2 * dim..]),
    ] {
        let r = rms_change(now, before);
        assert!(
            (r - lr).abs() < 1e-3 * lr,
            "{name}: rms change {r}, lr {lr}"
        );
    }
    // Untouched rows keep their values and accumulators.
    assert_eq!(&cv[..dim], &c[..dim]);
    assert_eq!(&tv[dim..2 * dim], &t[dim..2 * dim]);
    let (ac, at) = (values(&acc_c), values(&acc_t));
    assert_eq!((ac[0], at[1]), (0.0, 0.0));
    assert!(ac[1] > 0.0 && at[0] > 0.0 && at[2] > 0.0, "{ac:?} {at:?}");
}

/// The token kernel's Adagrad: one segment of two tokens with window 1 is two blocks, each
/// input and target row touched once; every touched row moves by `lr` in root mean square on
/// its first step. Run again from the same values, the same gradients meet accumulators that
/// already hold them once: each row moves by `lr / sqrt 2`.
#[test]
fn adagrad_token_steps_move_each_row_by_lr_then_by_lr_over_root_2() {
    let (dim, k, lr) = (8usize, 1usize, 0.05f32);
    let mut rng = crate::sample::rng_for(6, 0, 0);
    let c: Vec<f32> = (0..4 * dim)
        .map(|_| rng.random_range(-1e-2f32..1e-2))
        .collect();
    let t: Vec<f32> = (0..4 * dim)
        .map(|_| rng.random_range(-1e-2f32..1e-2))
        .collect();
    let (centers, targets) = (cells(&c), cells(&t));
    let (acc_c, acc_t) = (cells(&[0.0; 4]), cells(&[0.0; 4]));
    // Token 0: input row 0, output row 1; token 1: input row 2, output row 3. Negatives: output
    // row 0 for the first group, output row 2 for the second.
    let refs = [[0u32, 1], [2, 3]];
    let wins = [1u32, 1];
    let negs = [0u32, 2];
    let run = || {
        let rows = SegmentRows {
            refs: &refs,
            wins: &wins,
            segs: &[(0, 0)],
            negs: &negs,
            first_group: &[0],
        };
        let acc = Accumulators {
            matrices: [&acc_c, &acc_t],
            remote: &[],
        };
        one_thread().install(|| {
            sgd_segments(
                Shared::F32(&centers),
                Shared::F32(&targets),
                Shared::F32(&[]),
                dim,
                &rows,
                k,
                1,
                Step::new(lr, false, Some(acc)),
            )
        });
    };
    let rms = |a: &[f32], b: &[f32]| -> Vec<f32> {
        a.chunks(dim)
            .zip(b.chunks(dim))
            .map(|(x, y)| {
                (x.iter().zip(y).map(|(p, q)| (p - q) * (p - q)).sum::<f32>() / dim as f32).sqrt()
            })
            .collect()
    };
    run();
    let (c1, t1) = (values(&centers), values(&targets));
    let first: Vec<f32> = [rms(&c1, &c)[0], rms(&c1, &c)[2]]
        .into_iter()
        .chain(rms(&t1, &t))
        .collect();
    for (i, r) in first.iter().enumerate() {
        assert!(
            (r - lr).abs() < 2e-3 * lr,
            "row {i}: rms change {r}, lr {lr}"
        );
    }
    for (cell, x) in centers.iter().zip(&c).chain(targets.iter().zip(&t)) {
        cell.store(x.to_bits(), Relaxed);
    }
    run();
    let (c2, t2) = (values(&centers), values(&targets));
    let second: Vec<f32> = [rms(&c2, &c)[0], rms(&c2, &c)[2]]
        .into_iter()
        .chain(rms(&t2, &t))
        .collect();
    let want = lr / 2f32.sqrt();
    for (i, r) in second.iter().enumerate() {
        assert!(
            (r - want).abs() < 2e-3 * lr,
            "row {i}: second step {r}, want {want}"
        );
    }
    assert_eq!((c1.len(), t1.len()), (c2.len(), t2.len()));
}
