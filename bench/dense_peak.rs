//! GraphSAGE's dense layers against the machine's FMA peak (issue 34: the kernel at >= 40% of
//! it). `cargo bench --bench dense_peak`. One thread, as a rank's step runs them.
//!
//! The peak is measured, not taken from a data sheet: a loop of independent 8-wide fused
//! multiply-adds in registers (12 accumulators hide the FMA latency), the best of 5 runs. The
//! kernel is what `model::sage` calls for every dense product, ndarray's `general_mat_mul`
//! (matrixmultiply's packed AVX2/FMA sgemm), at the shapes of a default step (512 seeds over 2
//! ranks, fan-out 25 and 10, 128 features, hidden 128, 8 classes) and of layer-wise inference;
//! the median of 7 runs each.

use std::time::Instant;

use ndarray::linalg::general_mat_mul;
use ndarray::Array2;

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

/// GFLOP/s of `C (m x n) += A (m x k) B (k x n)`, the median of 7 runs.
fn sgemm(m: usize, k: usize, n: usize) -> f64 {
    let a = Array2::from_shape_fn((m, k), |(i, j)| ((i * 7 + j) % 13) as f32 * 0.01);
    let b = Array2::from_shape_fn((k, n), |(i, j)| ((i * 3 + j) % 11) as f32 * 0.01);
    let mut c = Array2::<f32>::zeros((m, n));
    let mut t: Vec<f64> = (0..7)
        .map(|_| {
            let s = Instant::now();
            general_mat_mul(1.0, &a, &b, 1.0, &mut c);
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    std::hint::black_box(&c);
    (2 * m * k * n) as f64 / t[3] / 1e9
}

fn main() {
    let peak = fma_peak();
    match peak {
        Some(p) => println!("FMA peak, one core: {p:.1} GFLOP/s"),
        None => println!("no AVX2/FMA: no peak to compare with"),
    }
    // (what, m, k, n): a step's first layer forward over its 256 seeds' 6,656 hop-1 rows
    // (self and neighbour products), its second layer to the classes, the first layer's weight
    // gradient (A^T dZ: k = rows), and a 4,096-node chunk of layer-wise inference.
    let shapes = [
        (
            "step, layer 1 forward (rows x features -> hidden)",
            6656,
            128,
            128,
        ),
        (
            "step, layer 2 forward (seeds x hidden -> classes)",
            256,
            128,
            8,
        ),
        (
            "step, layer 1 weight gradient (features x rows -> hidden)",
            128,
            6656,
            128,
        ),
        (
            "inference chunk, layer 1 (4096 x features -> hidden)",
            4096,
            128,
            128,
        ),
    ];
    for (what, m, k, n) in shapes {
        let g = sgemm(m, k, n);
        let share = peak.map_or(String::new(), |p| {
            format!(", {:.0}% of peak", 100.0 * g / p)
        });
        println!("{what}: {m} x {k} x {n}: {g:.1} GFLOP/s{share}");
    }
}
