//! GraphSAGE's dense layers against the machine's FMA peak (issue 34: the kernel at >= 40% of
//! it). `cargo bench --bench dense_peak`. One thread, as a rank's step runs them.
//!
//! The peak is measured, not taken from a data sheet: a loop of independent 8-wide fused
//! multiply-adds in registers (12 accumulators hide the FMA latency), the best of 5 runs. The
//! kernel is what `model::sage` calls for every dense product, `model::dense` (the `gemm`
//! crate), beside the baseline it replaced in the same run, ndarray's `general_mat_mul`
//! (matrixmultiply's packed AVX2/FMA sgemm), at the shapes of a default step (512 seeds over 2
//! ranks, fan-out 25 and 10, 128 features, hidden 128, 8 classes) and of layer-wise inference;
//! the median of 15 runs each after a warm-up.

use std::time::Instant;

use graphscale::model::dense;
use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayView2, ArrayViewMut2};

/// GFLOP/s of one core's fused multiply-adds (2 flops per lane), or `None` without AVX2/FMA.
fn fma_peak() -> Option<f64> {
    if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
        return None;
    }
    let iters = 50_000_000u64;
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        // SAFETY: the CPU has AVX2 and FMA (checked above), which is all `fma_loop` needs.
        let sink = unsafe { fma_loop(iters) };
        best = best.min(t.elapsed().as_secs_f64());
        std::hint::black_box(sink);
    }
    Some((iters * 12 * 8 * 2) as f64 / best / 1e9)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma_loop(iters: u64) -> f32 {
    use std::arch::x86_64::*;
    let (a, b) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
    let mut acc = [_mm256_set1_ps(1.0); 12];
    for _ in 0..iters {
        for x in acc.iter_mut() {
            *x = _mm256_fmadd_ps(*x, a, b);
        }
    }
    let mut s = _mm256_setzero_ps();
    for x in acc {
        s = _mm256_add_ps(s, x);
    }
    let mut out = [0f32; 8];
    // SAFETY: `out` holds 8 f32, the width of the unaligned store.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), s) };
    out.iter().sum()
}

/// The median seconds of 15 runs of `f`, after one to warm up.
fn median_secs(mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..15)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[7]
}

/// GFLOP/s of `C (m x n) += A (m x k) B (k x n)` (`tn`: A stored k x m, transposed), by ndarray
/// (the baseline) and by `model::dense` (what GraphSAGE runs).
fn sgemm(m: usize, k: usize, n: usize, tn: bool) -> (f64, f64) {
    let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 13) as f32 * 0.01).collect();
    let b: Vec<f32> = (0..k * n).map(|i| ((i * 3) % 11) as f32 * 0.01).collect();
    let mut c = vec![0f32; m * n];
    let flops = (2 * m * k * n) as f64 / 1e9;
    let base = {
        let av = if tn {
            ArrayView2::from_shape((k, m), &a[..])
                .expect("k x m")
                .reversed_axes()
        } else {
            ArrayView2::from_shape((m, k), &a[..]).expect("m x k")
        };
        let bv = ArrayView2::from_shape((k, n), &b[..]).expect("k x n");
        let mut cv = ArrayViewMut2::from_shape((m, n), &mut c[..]).expect("m x n");
        median_secs(|| general_mat_mul(1.0, &av, &bv, 1.0, &mut cv))
    };
    let ours = if tn {
        // c = a^T b with a stored k x m: GraphSAGE's weight gradient (rows are the sum's index).
        median_secs(|| dense::mul_tn(&mut c, &a, &b, (k, m, n)))
    } else {
        median_secs(|| dense::mul(&mut c, &a, &b, (m, k, n), 1.0))
    };
    std::hint::black_box(&c);
    (flops / base, flops / ours)
}

/// GFLOP/s of the same product with bf16 operands and f32 sums (`model::bf16`, GraphSAGE's
/// `--compute-dtype bf16`), packing included; `None` without AVX-512 BF16 or for `n` it does not
/// take.
fn bf16_gemm(m: usize, k: usize, n: usize, tn: bool) -> Option<f64> {
    use graphscale::model::bf16;
    if !bf16::available() || !bf16::fits(n) {
        return None;
    }
    let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 13) as f32 * 0.01).collect();
    let b: Vec<f32> = (0..k * n).map(|i| ((i * 3) % 11) as f32 * 0.01).collect();
    let mut c = vec![0f32; m * n];
    let mut p = bf16::Packed::default();
    let secs = if tn {
        median_secs(|| bf16::mul_tn(&mut c, (&a, &b, 0.0), (k, m, n), &mut p))
    } else {
        median_secs(|| bf16::mul(&mut c, &a, &b, (m, k, n), &mut p))
    };
    std::hint::black_box(&c);
    Some((2 * m * k * n) as f64 / 1e9 / secs)
}

fn main() {
    let peak = fma_peak();
    match peak {
        Some(p) => println!("FMA peak, one core: {p:.1} GFLOP/s"),
        None => println!("no AVX2/FMA: no peak to compare with"),
    }
    // (what, m, k, n, transposed A): GraphSAGE runs every product in tasks of 256 rows
    // (`model::sage`'s TASK_ROWS, the same arithmetic at any thread count): a task of a step's
    // first layer forward (self and neighbour products), the second layer to the classes, a
    // task's partial weight gradient (A^T dZ: k = the task's rows); and, for scale, a whole
    // step's first layer over its 256 seeds' 6,656 hop-1 rows and its weight gradient.
    let shapes = [
        (
            "task of layer 1 forward (rows x features -> hidden)",
            256,
            128,
            128,
            false,
        ),
        (
            "task of layer 2 forward (seeds x hidden -> classes)",
            256,
            128,
            8,
            false,
        ),
        (
            "task of layer 1 weight gradient (features x rows -> hidden)",
            128,
            256,
            128,
            true,
        ),
        ("whole layer 1 forward", 6656, 128, 128, false),
        ("whole layer 1 weight gradient", 128, 6656, 128, true),
    ];
    for (what, m, k, n, tn) in shapes {
        let (base, ours) = sgemm(m, k, n, tn);
        let share = |g: f64| {
            peak.map_or(String::new(), |p| {
                format!(" ({:.0}% of peak)", 100.0 * g / p)
            })
        };
        println!(
            "{what}: {m} x {k} x {n}: dense {ours:.1} GFLOP/s{}, ndarray {base:.1}{}, {:.2}x",
            share(ours),
            share(base),
            ours / base
        );
        if let Some(g) = bf16_gemm(m, k, n, tn) {
            println!(
                "  bf16 operands, f32 sums: {g:.1} GFLOP/s{}, {:.2}x dense",
                share(g),
                g / ours
            );
        }
    }
}
