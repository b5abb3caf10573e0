//! Dense products with bf16 operands and f32 sums (GraphSAGE's `--compute-dtype bf16`): AVX-512
//! BF16's `vdpbf16ps` multiplies two pairs of bf16 values per f32 lane and adds both products to
//! the lane, twice the multiply-adds per instruction of an f32 FMA. The operands are rounded to
//! bf16 (to nearest, ties to even) as they are packed; every sum stays in f32, as mixed-precision
//! training does (PyTorch's `autocast(dtype=bfloat16)`). No maintained crate runs this
//! instruction for matrix products (`gemm`'s f16 path widens to f32 and multiplies there), so the
//! kernel is here: a register tile of 8 rows x 32 columns, 16 accumulators.
//!
//! The instruction sums along pairs of the inner index, so both operands are packed in pairs: the
//! left one as `u32` words holding its values at inner indices `2p` (low half) and `2p + 1` (high
//! half), the right one as rows of such words, `[p][column]`. Odd inner lengths pad with a zero.

/// Whether this CPU runs the bf16 products (AVX-512 F and BF16).
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether [`mul`] and [`mul_tn`] take a product whose output rows are `n` wide: whole vectors
/// of 16 columns.
pub fn fits(n: usize) -> bool {
    n > 0 && n.is_multiple_of(16)
}

/// The packed operands of a product, kept across calls (no allocation once grown).
#[derive(Default)]
pub struct Packed {
    lhs: Vec<u32>,
    rhs: Vec<u32>,
}

/// `c (m x n) += a (m x k) b (k x n)`, the products of bf16 roundings of `a` and `b`, summed in
/// f32. `n` must [`fit`](fits) and the CPU must have the instructions ([`available`]).
pub fn mul(c: &mut [f32], a: &[f32], b: &[f32], (m, k, n): (usize, usize, usize), p: &mut Packed) {
    assert!(
        a.len() >= m * k && b.len() >= k * n && c.len() >= m * n,
        "bf16::mul: shapes"
    );
    assert!(fits(n) && available(), "bf16::mul: n {n} or the CPU");
    let pairs = k.div_ceil(2);
    // The left operand: each row's values in pairs along k.
    let lhs = words(&mut p.lhs, m * pairs);
    for (row, out) in a[..m * k].chunks_exact(k).zip(lhs.chunks_exact_mut(pairs)) {
        pack_row(row, out);
    }
    pairs_of_rows(&b[..k * n], k, n, &mut p.rhs);
    // SAFETY: `c` holds m rows of n values; the left operand m rows of `pairs` words (row stride
    // `pairs`, pair stride 1); the right one `pairs` rows of n words; n is a multiple of 16 and
    // the CPU has AVX-512 F and BF16 (asserted above).
    unsafe {
        product(
            c.as_mut_ptr(),
            (p.lhs.as_ptr(), pairs as isize, 1),
            &p.rhs,
            (m, n, pairs),
            true,
        );
    }
}

/// `c (k x n) = beta c + a^T b` (`beta` 0 or 1; 0 ignores what `c` held), `a` (m x k), `b`
/// (m x n): the sum over the m rows, of bf16 roundings of `a` and `b`, in f32. `n` must
/// [`fit`](fits) and the CPU must have the instructions ([`available`]).
pub fn mul_tn(
    c: &mut [f32],
    (a, b, beta): (&[f32], &[f32], f32),
    (m, k, n): (usize, usize, usize),
    p: &mut Packed,
) {
    assert!(beta == 0.0 || beta == 1.0, "bf16::mul_tn: beta {beta}");
    assert!(
        a.len() >= m * k && b.len() >= m * n && c.len() >= k * n,
        "bf16::mul_tn: shapes"
    );
    assert!(fits(n) && available(), "bf16::mul_tn: n {n} or the CPU");
    let pairs = m.div_ceil(2);
    pairs_of_rows(&a[..m * k], m, k, &mut p.lhs);
    pairs_of_rows(&b[..m * n], m, n, &mut p.rhs);
    // SAFETY: `c` holds k rows of n values; the left operand's element (row r, pair q) is word
    // `q * k + r` of `pairs` rows of k words (row stride 1, pair stride k); the right one `pairs`
    // rows of n words; n is a multiple of 16 and the CPU has AVX-512 F and BF16 (asserted above).
    unsafe {
        product(
            c.as_mut_ptr(),
            (p.lhs.as_ptr(), 1, k as isize),
            &p.rhs,
            (k, n, pairs),
            beta == 1.0,
        );
    }
}

/// `x` rounded to bf16: its top 16 bits after rounding to nearest, ties to even (NaN stays NaN).
pub fn round(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// One row's values in pairs: word `p` holds values `2p` (low half) and `2p + 1` (high half; 0
/// past the end).
fn pack_row(row: &[f32], out: &mut [u32]) {
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: the CPU has AVX-512 F and BF16 (checked); `out` holds row.len() / 2 rounded up
        // words, as the caller sized it.
        unsafe { x86::pack_row(row, out) };
        return;
    }
    for (w, pair) in out.iter_mut().zip(row.chunks(2)) {
        let hi = pair.get(1).map_or(0, |&x| round(x));
        *w = u32::from(round(pair[0])) | u32::from(hi) << 16;
    }
}

/// The first `n` words of `v`, grown (never shrunk) to hold them: packing overwrites every one.
fn words(v: &mut Vec<u32>, n: usize) -> &mut [u32] {
    if v.len() < n {
        v.resize(n, 0);
    }
    &mut v[..n]
}

/// `x` (`rows` x `cols`) as pairs of rows: `out[q * cols + j]` holds `x[2q][j]` (low half) and
/// `x[2q + 1][j]` (high half; 0 past the last row).
fn pairs_of_rows(x: &[f32], rows: usize, cols: usize, out: &mut Vec<u32>) {
    let pairs = rows.div_ceil(2);
    for (q, dst) in words(out, pairs * cols).chunks_exact_mut(cols).enumerate() {
        let lo = &x[2 * q * cols..(2 * q + 1) * cols];
        let hi = (2 * q + 1 < rows).then(|| &x[(2 * q + 1) * cols..(2 * q + 2) * cols]);
        #[cfg(target_arch = "x86_64")]
        if available() && cols.is_multiple_of(16) {
            // SAFETY: the CPU has AVX-512 F and BF16 (checked); `lo`, `hi` and `dst` hold `cols`
            // values each, a multiple of 16.
            unsafe { x86::interleave(lo, hi, dst) };
            continue;
        }
        for (j, w) in dst.iter_mut().enumerate() {
            let h = hi.map_or(0, |h| round(h[j]));
            *w = u32::from(round(lo[j])) | u32::from(h) << 16;
        }
    }
}

/// `c (m x n) += l r` (`c = l r` unless `add`) over `pairs` pairs of the inner index: `l`'s word
/// for (row i, pair q) at `l + i * row_stride + q * pair_stride`, `r` as `pairs` rows of n words.
///
/// # Safety
/// The CPU has AVX-512 F and BF16; n is a multiple of 16; `c` holds m x n values and the strides
/// reach only words of `l`'s allocation; `r` holds `pairs * n` words.
unsafe fn product(
    c: *mut f32,
    l: (*const u32, isize, isize),
    r: &[u32],
    (m, n, pairs): (usize, usize, usize),
    add: bool,
) {
    debug_assert!(r.len() >= pairs * n);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller's contract is the kernel's.
    unsafe {
        x86::product(c, l, r.as_ptr(), (m, n, pairs), add);
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (c, l, r, m, n, pairs, add);
        unreachable!("bf16 products need x86-64 (`available` is false elsewhere)");
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Rows per register tile.
    const MR: usize = 8;

    /// 16 f32 as 16 bf16 (rounded to nearest even) in the low halves of 16 words.
    #[target_feature(enable = "avx512f,avx512bf16")]
    fn half_words(x: __m512) -> __m512i {
        // SAFETY: both types are 256 bits of plain data; the 16 bf16 values widen to 16 words.
        let h = unsafe { std::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(x)) };
        _mm512_cvtepu16_epi32(h)
    }

    /// As `super::pack_row`.
    ///
    /// # Safety
    /// The CPU has AVX-512 F and BF16; `out` holds `row.len().div_ceil(2)` words.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub unsafe fn pack_row(row: &[f32], out: &mut [u32]) {
        let whole = row.len() / 32;
        for i in 0..whole {
            // SAFETY: values 32i..32i+32 of `row` and words 16i..16i+16 of `out` exist.
            unsafe {
                let lo = _mm512_loadu_ps(row.as_ptr().add(32 * i));
                let hi = _mm512_loadu_ps(row.as_ptr().add(32 * i + 16));
                // 32 bf16 in memory order: `lo`'s 16 then `hi`'s, as 16 pairs.
                let v = _mm512_cvtne2ps_pbh(hi, lo);
                let v = std::mem::transmute::<__m512bh, __m512i>(v);
                _mm512_storeu_si512(out.as_mut_ptr().add(16 * i).cast(), v);
            }
        }
        for (w, pair) in out[16 * whole..]
            .iter_mut()
            .zip(row[32 * whole..].chunks(2))
        {
            let hi = pair.get(1).map_or(0, |&x| super::round(x));
            *w = u32::from(super::round(pair[0])) | u32::from(hi) << 16;
        }
    }

    /// Words `dst[j] = bf16(lo[j]) | bf16(hi[j]) << 16` (`hi` absent: 0).
    ///
    /// # Safety
    /// The CPU has AVX-512 F and BF16; `lo`, `hi` and `dst` hold the same length, a multiple of
    /// 16.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub unsafe fn interleave(lo: &[f32], hi: Option<&[f32]>, dst: &mut [u32]) {
        for i in 0..dst.len() / 16 {
            // SAFETY: values 16i..16i+16 of each slice exist (same lengths, multiples of 16).
            unsafe {
                let l = half_words(_mm512_loadu_ps(lo.as_ptr().add(16 * i)));
                let h = match hi {
                    Some(h) => half_words(_mm512_loadu_ps(h.as_ptr().add(16 * i))),
                    None => _mm512_setzero_si512(),
                };
                let w = _mm512_or_si512(l, _mm512_slli_epi32::<16>(h));
                _mm512_storeu_si512(dst.as_mut_ptr().add(16 * i).cast(), w);
            }
        }
    }

    /// As `super::product`.
    ///
    /// # Safety
    /// As `super::product`.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub unsafe fn product(
        c: *mut f32,
        l: (*const u32, isize, isize),
        r: *const u32,
        (m, n, pairs): (usize, usize, usize),
        add: bool,
    ) {
        let mut j = 0;
        while j < n {
            let wide = n - j >= 32;
            let mut i = 0;
            while i < m {
                let rows = (m - i).min(MR);
                // SAFETY: rows i..i+rows of `c` and `l` and columns j..j+16 (or +32) of `c` and
                // `r` lie within them (the caller's contract; n - j >= 16 as n is a multiple of
                // 16).
                unsafe {
                    let ct = c.add(i * n + j);
                    let lt = (l.0.offset(i as isize * l.1), l.1, l.2);
                    let (rt, s) = (r.add(j), (n, pairs, add));
                    match (rows, wide) {
                        (MR, true) => tile::<MR, 2>(ct, lt, rt, s),
                        (MR, false) => tile::<MR, 1>(ct, lt, rt, s),
                        (_, true) => tile_rows::<2>(rows, ct, lt, rt, s),
                        (_, false) => tile_rows::<1>(rows, ct, lt, rt, s),
                    }
                }
                i += rows;
            }
            j += if wide { 32 } else { 16 };
        }
    }

    /// The last rows (fewer than a tile), one at a time.
    ///
    /// # Safety
    /// As [`tile`], for `rows` rows.
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn tile_rows<const V: usize>(
        rows: usize,
        c: *mut f32,
        l: (*const u32, isize, isize),
        r: *const u32,
        s: (usize, usize, bool),
    ) {
        let n = s.0;
        for i in 0..rows {
            // SAFETY: row i of the tile is within the caller's rows.
            unsafe {
                tile::<1, V>(c.add(i * n), (l.0.offset(i as isize * l.1), l.1, l.2), r, s);
            }
        }
    }

    /// One register tile: `R` rows x `V` vectors of 16 columns of `c` (row stride n) set to the
    /// sum over `pairs` of `l`'s word (row, pair) times `r`'s words (pair, columns), plus what
    /// it held if `add`.
    ///
    /// # Safety
    /// The CPU has AVX-512 F and BF16; the tile's `R` rows and `16 V` columns of `c` (row stride
    /// n), `l`'s words for its rows and `pairs` pairs, and `r`'s `pairs` rows (stride n) of `16 V`
    /// words lie within their allocations.
    #[target_feature(enable = "avx512f,avx512bf16")]
    #[inline]
    unsafe fn tile<const R: usize, const V: usize>(
        c: *mut f32,
        (l, ls, lp): (*const u32, isize, isize),
        r: *const u32,
        (n, pairs, add): (usize, usize, bool),
    ) {
        let mut acc = [[_mm512_setzero_ps(); V]; R];
        // SAFETY: every address is within the tile the caller vouches for.
        unsafe {
            for (i, row) in acc.iter_mut().enumerate().filter(|_| add) {
                for (v, a) in row.iter_mut().enumerate() {
                    *a = _mm512_loadu_ps(c.add(i * n + 16 * v));
                }
            }
            for q in 0..pairs {
                let mut b = [_mm512_setzero_si512(); V];
                for (v, x) in b.iter_mut().enumerate() {
                    *x = _mm512_loadu_si512(r.add(q * n + 16 * v).cast());
                }
                for (i, row) in acc.iter_mut().enumerate() {
                    let w = *l.offset(i as isize * ls + q as isize * lp);
                    let a: __m512bh = std::mem::transmute(_mm512_set1_epi32(w as i32));
                    for (x, bv) in row.iter_mut().zip(&b) {
                        *x = _mm512_dpbf16_ps(*x, a, std::mem::transmute::<__m512i, __m512bh>(*bv));
                    }
                }
            }
            for (i, row) in acc.iter().enumerate() {
                for (v, a) in row.iter().enumerate() {
                    _mm512_storeu_ps(c.add(i * n + 16 * v), *a);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bf(x: f32) -> f32 {
        f32::from_bits(u32::from(round(x)) << 16)
    }

    /// The product of the bf16 roundings, summed in f64.
    fn reference(a: &[f32], b: &[f32], (m, k, n): (usize, usize, usize)) -> Vec<f32> {
        let mut c = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let s: f64 = (0..k)
                    .map(|l| f64::from(bf(a[i * k + l])) * f64::from(bf(b[l * n + j])))
                    .sum();
                c[i * n + j] = s as f32;
            }
        }
        c
    }

    fn values(len: usize, seed: u32) -> Vec<f32> {
        (0..len)
            .map(|i| {
                let h = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8;
                (h % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    fn close(x: &[f32], y: &[f32], k: usize) {
        assert_eq!(x.len(), y.len());
        // f32 sums of k exact products (bf16 x bf16 fits f32): rounding only.
        let tol = 1e-6 * k as f32;
        for (a, b) in x.iter().zip(y) {
            assert!((a - b).abs() <= tol * (1.0 + b.abs()), "{a} against {b}");
        }
    }

    #[test]
    fn rounding_is_to_nearest_even() {
        assert_eq!(round(1.0), 0x3f80);
        // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: to the even one, 1.
        assert_eq!(round(1.0 + 1.0 / 256.0), 0x3f80);
        // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6: to the even one.
        assert_eq!(round(1.0 + 3.0 / 256.0), 0x3f82);
        assert_eq!(round(-2.5), 0xc020);
        assert!(f32::from_bits(u32::from(round(f32::NAN)) << 16).is_nan());
        assert_eq!(bf(1e-3), f32::from_bits(0x3a83_0000));
    }

    #[test]
    fn packing_rounds_as_the_scalar_rule() {
        let row = values(70, 3);
        let mut vec = vec![0u32; 35];
        pack_row(&row, &mut vec);
        for (p, w) in vec.iter().enumerate() {
            assert_eq!(*w & 0xffff, u32::from(round(row[2 * p])));
            assert_eq!(*w >> 16, u32::from(round(row[2 * p + 1])));
        }
        let row = values(80, 4);
        let mut pairs = Vec::new();
        pairs_of_rows(&row, 5, 16, &mut pairs);
        assert_eq!(pairs.len(), 3 * 16);
        assert_eq!(pairs[2 * 16 + 3] >> 16, 0, "the padded row is zero");
        assert_eq!(pairs[16 + 3] & 0xffff, u32::from(round(row[2 * 16 + 3])));
        assert_eq!(pairs[16 + 3] >> 16, u32::from(round(row[3 * 16 + 3])));
    }

    #[test]
    fn products_match_the_rounded_reference() {
        if !available() {
            eprintln!("no AVX-512 BF16 here: the products are not run");
            return;
        }
        let mut p = Packed::default();
        // Tiles whole and partial: rows 8 and not, columns 32 and 16, odd inner lengths.
        for (m, k, n) in [
            (8, 2, 32),
            (19, 37, 48),
            (1, 128, 16),
            (256, 128, 128),
            (5, 1, 16),
        ] {
            let (a, b) = (values(m * k, 1), values(k * n, 2));
            let mut c = values(m * n, 3);
            let mut want = reference(&a, &b, (m, k, n));
            want.iter_mut().zip(&c).for_each(|(w, c0)| *w += c0);
            mul(&mut c, &a, &b, (m, k, n), &mut p);
            close(&c, &want, k);
            // a^T b with a (m x k) stored as given: the sum over m.
            let at: Vec<f32> = (0..k * m).map(|x| a[(x % m) * k + x / m]).collect();
            let d = values(m * n, 4);
            // beta 0 ignores what the output held; beta 1 adds to it.
            let mut g = vec![f32::NAN; k * n];
            mul_tn(&mut g, (&a, &d, 0.0), (m, k, n), &mut p);
            let want = reference(&at, &d, (k, m, n));
            close(&g, &want, m);
            mul_tn(&mut g, (&a, &d, 1.0), (m, k, n), &mut p);
            let twice: Vec<f32> = want.iter().map(|w| 2.0 * w).collect();
            close(&g, &twice, 2 * m);
        }
    }
}
