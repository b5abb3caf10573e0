//! The models' dense f32 kernels, in one place: skip-gram's blocks (dot products of one row
//! against up to 6 rows, their fused update, and combinations of rows) with an AVX2/FMA path
//! (chosen at compile time, `target_feature`) and a portable one that gives the same values up
//! to rounding order; and the knowledge-graph losses' lane-wise sums, maxima and exponentials
//! (8 lanes through `wide`, which picks the instruction set). The algorithms that use them are
//! `sgns` and `kge`; the 16-bit rows' conversions, moves of shared rows, are in `cells`.

use wide::f32x8;

/// `$go!(N)` for the literal N from 1 to 6 equal to `$n` (6 for anything larger): the const
/// width of a block kernel chosen at run time.
macro_rules! with_width {
    ($n:expr, $go:ident) => {
        match $n {
            1 => $go!(1),
            2 => $go!(2),
            3 => $go!(3),
            4 => $go!(4),
            5 => $go!(5),
            _ => $go!(6),
        }
    };
}
pub(super) use with_width;

/// `s[t] = v . u_t` for the rows `u_t` of `u` (rows of `v.len()`), in blocks of up to 6 rows
/// so that `v` is read once per block.
#[inline(always)]
pub(super) fn dots_dyn(v: &[f32], u: &[f32], s: &mut [f32]) {
    let d = v.len();
    for b0 in (0..s.len()).step_by(6) {
        let n = (s.len() - b0).min(6);
        let (u, s) = (&u[b0 * d..], &mut s[b0..b0 + n]);
        macro_rules! go {
            ($n:literal) => {
                dots::<$n>(v, std::array::from_fn(|t| &u[t * d..][..d]), s)
            };
        }
        with_width!(n, go)
    }
}

/// Most targets per block for [`fused`]: it holds two registers per target, and x86-64 has 16.
pub(super) const FUSED_TARGETS: usize = 6;

/// For each column block of 8: with the `T` target rows `u` (rows of `d`) and their changes in
/// registers, every input row `v_i` (ring slot `slots[i]` of `v`) is read once, gives
/// `du_t += G[i, t] v_i` from its value before the block, and is written back as
/// `v_i + sum_t G[i, t] u_t`. `gb` holds `G[i, t]` broadcast to 8 lanes at `(i T + t) 8`. The
/// two-phase path reads every target row once per 6 inputs and every input row once per 6
/// targets, and loads and stores the sums in between.
#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
#[inline(always)]
pub(super) fn fused<const T: usize>(
    v: &mut [f32],
    slots: &[usize],
    u: &[f32],
    gb: &[f32],
    du: &mut [f32],
) {
    use std::arch::x86_64::*;
    let d = u.len() / T.max(1);
    assert!(
        d.is_multiple_of(8)
            && u.len() == T * d
            && du.len() == T * d
            && gb.len() == slots.len() * T * 8
    );
    assert!(slots.iter().all(|&s| (s + 1) * d <= v.len()));
    // SAFETY: AVX2 and FMA are enabled for this build (cfg above). Every access is 8 floats at
    // offset c < d (multiples of 8) inside a row of d floats: row t of `u` or `du` (T rows,
    // asserted), ring slot s of `v` (asserted in bounds), or entry (i T + t) of `gb` (i < m,
    // t < T: in bounds, asserted). `v` and `du` are unique borrows and nothing else aliases
    // them; unaligned loads and stores need no alignment.
    unsafe {
        for c in (0..d).step_by(8) {
            let ut: [__m256; T] =
                std::array::from_fn(|t| _mm256_loadu_ps(u.as_ptr().add(t * d + c)));
            let mut dt = [_mm256_setzero_ps(); T];
            for (i, &s) in slots.iter().enumerate() {
                let p = v.as_mut_ptr().add(s * d + c);
                let x = _mm256_loadu_ps(p);
                let g = gb.as_ptr().add(i * T * 8);
                let mut a = x;
                for t in 0..T {
                    let gt = _mm256_loadu_ps(g.add(t * 8));
                    a = _mm256_fmadd_ps(gt, ut[t], a);
                    dt[t] = _mm256_fmadd_ps(gt, x, dt[t]);
                }
                _mm256_storeu_ps(p, a);
            }
            for (t, x) in dt.iter().enumerate() {
                _mm256_storeu_ps(du.as_mut_ptr().add(t * d + c), *x);
            }
        }
    }
}

/// [`fused`] for row-wise Adagrad: the same sweep, but input row `i`'s change
/// `sum_t G[i, t] u_t` goes to row `i` of `dv` (rows of `d`) and `v` is left as it was, so that
/// each row's step can be scaled by its own accumulator afterwards.
#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
#[inline(always)]
pub(super) fn fused_grads<const T: usize>(
    v: &[f32],
    slots: &[usize],
    u: &[f32],
    gb: &[f32],
    du: &mut [f32],
    dv: &mut [f32],
) {
    use std::arch::x86_64::*;
    let d = u.len() / T.max(1);
    assert!(
        d.is_multiple_of(8)
            && u.len() == T * d
            && du.len() == T * d
            && dv.len() >= slots.len() * d
            && gb.len() == slots.len() * T * 8
    );
    assert!(slots.iter().all(|&s| (s + 1) * d <= v.len()));
    // SAFETY: AVX2 and FMA are enabled for this build (cfg above). Every access is 8 floats at
    // offset c < d (multiples of 8) inside a row of d floats: row t of `u` or `du` (T rows,
    // asserted), ring slot s of `v` (asserted in bounds), row i < m of `dv` (asserted), or
    // entry (i T + t) of `gb` (asserted). `du` and `dv` are unique borrows; unaligned loads and
    // stores need no alignment.
    unsafe {
        for c in (0..d).step_by(8) {
            let ut: [__m256; T] =
                std::array::from_fn(|t| _mm256_loadu_ps(u.as_ptr().add(t * d + c)));
            let mut dt = [_mm256_setzero_ps(); T];
            for (i, &s) in slots.iter().enumerate() {
                let x = _mm256_loadu_ps(v.as_ptr().add(s * d + c));
                let g = gb.as_ptr().add(i * T * 8);
                let mut a = _mm256_setzero_ps();
                for t in 0..T {
                    let gt = _mm256_loadu_ps(g.add(t * 8));
                    a = _mm256_fmadd_ps(gt, ut[t], a);
                    dt[t] = _mm256_fmadd_ps(gt, x, dt[t]);
                }
                _mm256_storeu_ps(dv.as_mut_ptr().add(i * d + c), a);
            }
            for (t, x) in dt.iter().enumerate() {
                _mm256_storeu_ps(du.as_mut_ptr().add(t * d + c), *x);
            }
        }
    }
}

/// Rows `a` and `b` (distinct) of `v` (rows of `d`), both mutable.
pub(super) fn two_rows_mut(
    v: &mut [f32],
    a: usize,
    b: usize,
    d: usize,
) -> (&mut [f32], &mut [f32]) {
    assert_ne!(a, b, "two distinct ring slots");
    if a < b {
        let (x, y) = v.split_at_mut(b * d);
        (&mut x[a * d..][..d], &mut y[..d])
    } else {
        let (x, y) = v.split_at_mut(a * d);
        (&mut y[..d], &mut x[b * d..][..d])
    }
}

/// [`dots_dyn`] for two inputs at once: `s0[t] = v0 . u_t`, `s1[t] = v1 . u_t`.
#[inline(always)]
pub(super) fn dots2_dyn(v0: &[f32], v1: &[f32], u: &[f32], s0: &mut [f32], s1: &mut [f32]) {
    let d = v0.len();
    for b0 in (0..s0.len()).step_by(6) {
        let n = (s0.len() - b0).min(6);
        let u = &u[b0 * d..];
        let (s0, s1) = (&mut s0[b0..b0 + n], &mut s1[b0..b0 + n]);
        macro_rules! go {
            ($n:literal) => {
                dots2::<$n>(v0, v1, std::array::from_fn(|t| &u[t * d..][..d]), s0, s1)
            };
        }
        with_width!(n, go)
    }
}

/// `out += sum_j g[j] rows(j)` for `g.len()` (1 to 6) rows of `out.len()`.
#[inline(always)]
pub(super) fn combine_dyn<'a>(g: &[f32], rows: impl Fn(usize) -> &'a [f32], out: &mut [f32]) {
    macro_rules! go {
        ($n:literal) => {
            combine::<$n>(
                std::array::from_fn(|j| g[j]),
                std::array::from_fn(&rows),
                out,
            )
        };
    }
    with_width!(g.len(), go)
}

/// [`combine_dyn`] into two outputs: `out0 += sum_j g0[j] rows(j)`, `out1 += sum_j g1[j]
/// rows(j)`.
#[inline(always)]
pub(super) fn combine2_dyn<'a>(
    g0: &[f32],
    g1: &[f32],
    rows: impl Fn(usize) -> &'a [f32],
    out0: &mut [f32],
    out1: &mut [f32],
) {
    macro_rules! go {
        ($n:literal) => {
            combine2::<$n>(
                std::array::from_fn(|j| g0[j]),
                std::array::from_fn(|j| g1[j]),
                std::array::from_fn(&rows),
                out0,
                out1,
            )
        };
    }
    with_width!(g0.len(), go)
}

/// `1 / (1 + e^-x)` for |x| <= `MAX_SCORE`, with Cephes' `expf` (range reduction by ln 2 and a
/// degree-6 polynomial; relative error ~1e-7): branch-free, so a loop of it vectorises.
#[inline(always)]
pub(super) fn sigmoid_fast(x: f32) -> f32 {
    const SHIFT: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
    let z = -x;
    // n = round(z log2(e)) (|z| < 2^22), as a float and, from the sum's low mantissa bits, as
    // an integer (no float-to-int conversion, which would not vectorise); r = z - n ln 2.
    let k = z * std::f32::consts::LOG2_E + SHIFT;
    let n = k - SHIFT;
    let two_n = f32::from_bits(
        (k.to_bits().wrapping_sub(SHIFT.to_bits()))
            .wrapping_add(127)
            .wrapping_shl(23),
    );
    let r = fmadd(n, 2.121_944_4e-4, fmadd(n, -0.693_359_4, z));
    let mut p = 1.987_569_1e-4;
    for c in [
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        0.166_666_65,
        0.5,
    ] {
        p = fmadd(p, r, c);
    }
    let e = fmadd(p, r * r, r + 1.0) * two_n;
    1.0 / (1.0 + e)
}

/// `a * b + c`: fused where the build targets FMA, else a multiply and an add (a fused
/// multiply-add in software would be far slower).
#[inline(always)]
pub(super) fn fmadd(a: f32, b: f32, c: f32) -> f32 {
    #[cfg(target_feature = "fma")]
    {
        a.mul_add(b, c)
    }
    #[cfg(not(target_feature = "fma"))]
    {
        a * b + c
    }
}

/// The sum of the 8 lanes of `a`.
#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
#[inline(always)]
pub(super) fn hsum(a: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    // SAFETY: AVX is enabled for this build (cfg above); these operate on registers only.
    unsafe {
        let h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
        let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)))
    }
}

/// `s[t] = v . rows[t]` (all of `v.len()`), reading `v` once.
#[inline(always)]
pub(super) fn dots<const N: usize>(v: &[f32], rows: [&[f32]; N], s: &mut [f32]) {
    let d = v.len();
    assert!(rows.iter().all(|r| r.len() == d) && s.len() == N);
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    if d.is_multiple_of(8) {
        use std::arch::x86_64::*;
        // SAFETY: AVX2 and FMA are enabled for this build (cfg above). Every load reads 8
        // floats at offset c < d, c a multiple of 8 and d too, from `v` or a row, each of
        // length d (asserted): all reads are in bounds; unaligned loads need no alignment.
        unsafe {
            let mut acc = [_mm256_setzero_ps(); N];
            for c in (0..d).step_by(8) {
                let x = _mm256_loadu_ps(v.as_ptr().add(c));
                for (a, r) in acc.iter_mut().zip(&rows) {
                    *a = _mm256_fmadd_ps(x, _mm256_loadu_ps(r.as_ptr().add(c)), *a);
                }
            }
            for (o, a) in s.iter_mut().zip(acc) {
                *o = hsum(a);
            }
        }
        return;
    }
    let mut acc = [[0f32; 8]; N];
    let full = d / 8 * 8;
    for c in (0..full).step_by(8) {
        for (a, r) in acc.iter_mut().zip(&rows) {
            for l in 0..8 {
                a[l] = fmadd(v[c + l], r[c + l], a[l]);
            }
        }
    }
    for ((o, a), r) in s.iter_mut().zip(&acc).zip(&rows) {
        *o = a.iter().sum::<f32>()
            + v[full..]
                .iter()
                .zip(&r[full..])
                .map(|(x, y)| x * y)
                .sum::<f32>();
    }
}

/// `s0[t] = v0 . rows[t]` and `s1[t] = v1 . rows[t]`: each row read once for both.
#[inline(always)]
pub(super) fn dots2<const N: usize>(
    v0: &[f32],
    v1: &[f32],
    rows: [&[f32]; N],
    s0: &mut [f32],
    s1: &mut [f32],
) {
    let d = v0.len();
    assert!(v1.len() == d && rows.iter().all(|r| r.len() == d) && s0.len() == N && s1.len() == N);
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    if d.is_multiple_of(8) {
        use std::arch::x86_64::*;
        // SAFETY: as in `dots`: AVX2 and FMA are enabled for this build, and every load reads
        // 8 floats at offset c < d (multiples of 8) of a slice of length d (asserted).
        unsafe {
            let mut a0 = [_mm256_setzero_ps(); N];
            let mut a1 = [_mm256_setzero_ps(); N];
            for c in (0..d).step_by(8) {
                let x0 = _mm256_loadu_ps(v0.as_ptr().add(c));
                let x1 = _mm256_loadu_ps(v1.as_ptr().add(c));
                for t in 0..N {
                    let y = _mm256_loadu_ps(rows[t].as_ptr().add(c));
                    a0[t] = _mm256_fmadd_ps(x0, y, a0[t]);
                    a1[t] = _mm256_fmadd_ps(x1, y, a1[t]);
                }
            }
            for (o, a) in s0.iter_mut().zip(a0).chain(s1.iter_mut().zip(a1)) {
                *o = hsum(a);
            }
        }
        return;
    }
    dots(v0, rows, s0);
    dots(v1, rows, s1);
}

/// `out0 += sum_t g0[t] rows[t]`, `out1 += sum_t g1[t] rows[t]`: each row read once for both.
#[inline(always)]
pub(super) fn combine2<const N: usize>(
    g0: [f32; N],
    g1: [f32; N],
    rows: [&[f32]; N],
    out0: &mut [f32],
    out1: &mut [f32],
) {
    let d = out0.len();
    assert!(out1.len() == d && rows.iter().all(|r| r.len() == d));
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    if d.is_multiple_of(8) {
        use std::arch::x86_64::*;
        // SAFETY: as in `combine`: AVX2 and FMA are enabled for this build; every access is 8
        // floats at offset c < d (multiples of 8) of a slice of length d (asserted); the two
        // outputs are distinct unique borrows, so nothing aliases them.
        unsafe {
            let (h0, h1) = (g0.map(|x| _mm256_set1_ps(x)), g1.map(|x| _mm256_set1_ps(x)));
            for c in (0..d).step_by(8) {
                let (o0, o1) = (out0.as_mut_ptr().add(c), out1.as_mut_ptr().add(c));
                let (mut a0, mut a1) = (_mm256_loadu_ps(o0), _mm256_loadu_ps(o1));
                for t in 0..N {
                    let y = _mm256_loadu_ps(rows[t].as_ptr().add(c));
                    a0 = _mm256_fmadd_ps(h0[t], y, a0);
                    a1 = _mm256_fmadd_ps(h1[t], y, a1);
                }
                _mm256_storeu_ps(o0, a0);
                _mm256_storeu_ps(o1, a1);
            }
        }
        return;
    }
    combine(g0, rows, out0);
    combine(g1, rows, out1);
}

/// `out += sum_t g[t] rows[t]` (all of `out.len()`), reading and writing `out` once.
#[inline(always)]
pub(super) fn combine<const N: usize>(g: [f32; N], rows: [&[f32]; N], out: &mut [f32]) {
    let d = out.len();
    assert!(rows.iter().all(|r| r.len() == d));
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    if d.is_multiple_of(8) {
        use std::arch::x86_64::*;
        // SAFETY: AVX2 and FMA are enabled for this build (cfg above). Every load and store
        // touches 8 floats at offset c < d, c a multiple of 8 and d too, of `out` or a row,
        // each of length d (asserted); `out` is a unique borrow, so no row aliases it.
        unsafe {
            let gs = g.map(|x| _mm256_set1_ps(x));
            for c in (0..d).step_by(8) {
                let o = out.as_mut_ptr().add(c);
                let mut a = _mm256_loadu_ps(o);
                for (gt, r) in gs.iter().zip(&rows) {
                    a = _mm256_fmadd_ps(*gt, _mm256_loadu_ps(r.as_ptr().add(c)), a);
                }
                _mm256_storeu_ps(o, a);
            }
        }
        return;
    }
    for (c, o) in out.iter_mut().enumerate() {
        for (gt, r) in g.iter().zip(&rows) {
            *o = fmadd(*gt, r[c], *o);
        }
    }
}

/// `sum_k f([s_0[k], s_1[k], ...])` over the slices `s` (the length of the first), summed in 8
/// independent lanes over whole chunks (a float sum in one accumulator is a serial chain the
/// compiler may not reorder; eight lanes over fixed-size chunks vectorise).
#[inline(always)]
pub(super) fn sum8<const N: usize>(s: [&[f32]; N], f: impl Fn([f32; N]) -> f32) -> f32 {
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

/// The largest of `init` and `xs` (8 lanes; NEG_INFINITY entries are skipped ones).
pub(super) fn max8(init: f32, xs: &[f32]) -> f32 {
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
pub(super) fn exp_shifted(a: f32, m: f32, xs: &[f32], out: &mut [f32]) -> f32 {
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
