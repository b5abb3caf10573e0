//! Dense products of row-major `f32` matrices (GraphSAGE's layers, the dot-product KG models'
//! scores and gradients): the `gemm` crate (faer's kernels, AVX-512 or AVX2/FMA chosen at run
//! time) where it measured faster than matrixmultiply (ndarray's), matrixmultiply where it did
//! not (`cargo bench --bench dense_peak` runs both).

use gemm::{gemm, Parallelism};

/// A matrix for [`gemm_f32`]: its first value and its (column, row) strides.
type Strided<T> = (T, isize, isize);

/// `dst (m x n) = beta dst + lhs (m x k) rhs (k x n)` through `gemm`, on this thread; `beta` 0
/// ignores what `dst` held.
///
/// # Safety
/// Every element the strides reach (rows below m, columns below n or k) lies within the
/// allocation its pointer comes from, and `dst` overlaps neither input.
unsafe fn gemm_f32(
    (m, k, n): (usize, usize, usize),
    dst: Strided<*mut f32>,
    lhs: Strided<*const f32>,
    rhs: Strided<*const f32>,
    beta: f32,
) {
    // SAFETY: the caller's contract is gemm's.
    unsafe {
        gemm(
            m,
            n,
            k,
            dst.0,
            dst.1,
            dst.2,
            beta != 0.0,
            lhs.0,
            lhs.1,
            lhs.2,
            rhs.0,
            rhs.1,
            rhs.2,
            beta,
            1.0,
            false,
            false,
            false,
            Parallelism::None,
        );
    }
}

/// `c (m x n) = beta c + a (m x k) b (k x n)`; `beta` 0 ignores what `c` held.
pub fn mul(c: &mut [f32], a: &[f32], b: &[f32], (m, k, n): (usize, usize, usize), beta: f32) {
    assert!(
        a.len() >= m * k && b.len() >= k * n && c.len() >= m * n,
        "mul: shapes"
    );
    if m == 0 || n == 0 {
        return;
    }
    // SAFETY: `c` holds m x n values at row stride n, `a` m x k at row stride k and `b` k x n at
    // row stride n (asserted above); `c` is borrowed mutably, so it overlaps neither input.
    unsafe {
        gemm_f32(
            (m, k, n),
            (c.as_mut_ptr(), 1, n as isize),
            (a.as_ptr(), 1, k as isize),
            (b.as_ptr(), 1, n as isize),
            beta,
        );
    }
}

/// `c (k x n) = a^T b`, `a` (m x k), `b` (m x n). Through matrixmultiply, which ran this shape
/// (a task's 256 rows summed into 128 x 128) at 1.05x `gemm`'s.
pub fn mul_tn(c: &mut [f32], a: &[f32], b: &[f32], (m, k, n): (usize, usize, usize)) {
    assert!(
        a.len() >= m * k && b.len() >= m * n && c.len() >= k * n,
        "mul_tn: shapes"
    );
    // SAFETY: `c` holds k x n values at row stride n; a^T's element (i, j) is `a[j * k + i]`
    // (row stride 1, column stride k) within a's m x k; `b` holds m x n at row stride n; `c`
    // is borrowed mutably, so it overlaps neither input. With beta 0 `c` is only written.
    unsafe {
        matrixmultiply::sgemm(
            k,
            m,
            n,
            1.0,
            a.as_ptr(),
            1,
            k as isize,
            b.as_ptr(),
            n as isize,
            1,
            0.0,
            c.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}

/// `c (m x k) = beta c + a b^T`, `a` (m x n), `b` (k x n); `beta` 0 ignores what `c` held.
pub fn mul_nt(c: &mut [f32], a: &[f32], b: &[f32], (m, n, k): (usize, usize, usize), beta: f32) {
    assert!(
        a.len() >= m * n && b.len() >= k * n && c.len() >= m * k,
        "mul_nt: shapes"
    );
    if m == 0 || k == 0 {
        return;
    }
    // SAFETY: `c` holds m x k values at row stride k, `a` m x n at row stride n; b^T's element
    // (i, j) is `b[j * n + i]` (column stride n, row stride 1) within b's k x n; `c` is borrowed
    // mutably, so it overlaps neither input.
    unsafe {
        gemm_f32(
            (m, n, k),
            (c.as_mut_ptr(), 1, k as isize),
            (a.as_ptr(), 1, n as isize),
            (b.as_ptr(), n as isize, 1),
            beta,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        let mut c = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|l| a[i * k + l] * b[l * n + j]).sum();
            }
        }
        c
    }

    fn transpose(a: &[f32], r: usize, c: usize) -> Vec<f32> {
        (0..c * r).map(|x| a[(x % r) * c + x / r]).collect()
    }

    fn close(x: &[f32], y: &[f32]) {
        assert_eq!(x.len(), y.len());
        for (a, b) in x.iter().zip(y) {
            assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{a} against {b}");
        }
    }

    #[test]
    fn products_match_the_definition_at_odd_shapes() {
        for &(m, k, n) in &[
            (1, 1, 1),
            (7, 5, 3),
            (33, 130, 17),
            (256, 128, 8),
            (3, 0, 4),
        ] {
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
            let b: Vec<f32> = (0..k * n)
                .map(|i| ((i * 5) % 11) as f32 * 0.5 - 2.0)
                .collect();
            let want = naive(&a, &b, m, k, n);
            // c = a b, then c = 2 c + a b (beta 2), then c += a b via b^T.
            let mut c = vec![f32::NAN; m * n];
            mul(&mut c, &a, &b, (m, k, n), 0.0);
            close(&c, &want);
            mul(&mut c, &a, &b, (m, k, n), 2.0);
            close(&c, &want.iter().map(|x| 3.0 * x).collect::<Vec<_>>());
            let mut d = want.clone();
            mul_nt(&mut d, &a, &transpose(&b, k, n), (m, k, n), 1.0);
            let mut e0 = vec![f32::NAN; m * n];
            mul_nt(&mut e0, &a, &transpose(&b, k, n), (m, k, n), 0.0);
            close(&e0, &want);
            close(&d, &want.iter().map(|x| 2.0 * x).collect::<Vec<_>>());
            // a^T c over the rows: (k x m) (m x n) with a stored m x k.
            let at = transpose(&a, m, k);
            let mut e = vec![f32::NAN; k * n];
            let c1 = naive(&a, &b, m, k, n);
            mul_tn(&mut e, &a, &c1, (m, k, n));
            close(&e, &naive(&at, &c1, k, m, n));
        }
    }
}
