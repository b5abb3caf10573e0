//! Models as stateless functions over slices: given the batch's rows (f32, one buffer of unique
//! rows) and index lists, compute the loss and add the loss gradient of every row into `grads`.
//! The solver loop (`train`) owns fetching, pushing and applying.

pub mod sgns;

/// `sum(a[i] * b[i])` with eight independent accumulators so that it vectorises.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// `y += alpha * x`
#[inline]
pub fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += alpha * x;
    }
}

#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `-ln(sigmoid(x))`, stable for large |x|.
#[inline]
pub fn softplus_neg(x: f32) -> f32 {
    if x > 0.0 {
        (-x).exp().ln_1p()
    } else {
        -x + x.exp().ln_1p()
    }
}
