//! A rank's storage partition: the rows of the nodes it owns for each embedding matrix, in the
//! storage dtype, exposed in a [`Window`] for one-sided reads, plus the optimizer state, which
//! only the owner touches. Math is always f32; rows convert on the way in and out.

use crate::model::cells::Shared;

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use crate::comm::{Comm, Window};
use crate::config::{Dtype, Optimizer, WireDtype};

/// Convert one stored row to f32.
#[inline]
pub fn decode_row(dtype: Dtype, bytes: &[u8], out: &mut [f32]) {
    match dtype {
        Dtype::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        Dtype::F16 => decode_half(bytes, out, f16::ZERO, f16::from_bits, |h, o| {
            h.convert_to_f32_slice(o)
        }),
        Dtype::Bf16 => decode_half(bytes, out, bf16::ZERO, bf16::from_bits, |h, o| {
            h.convert_to_f32_slice(o)
        }),
    }
}

/// Ask the CPU to bring `bytes` (a row about to be read) into its caches: one prefetch per
/// cache line. Changes nothing else; a no-op off x86_64.
#[inline]
pub fn prefetch(bytes: &[u8]) {
    prefetch_range(bytes.as_ptr(), bytes.len());
}

/// [`prefetch`] of the `len` bytes at `p`, for memory no slice may cover (rows other threads
/// update through atomics).
#[inline]
pub fn prefetch_range(p: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    for off in (0..len).step_by(64) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: a prefetch is a hint that never faults, whatever the address, and changes no
        // value (SSE, which provides it, is part of the x86-64 baseline); `wrapping_add`
        // computes the address without dereferencing it.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off).cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, len);
}

/// Add one stored row, converted to f32, to `acc` (a sum of rows read where they are stored).
#[inline]
pub fn add_row(dtype: Dtype, bytes: &[u8], acc: &mut [f32]) {
    match dtype {
        Dtype::F32 => {
            for (a, c) in acc.iter_mut().zip(bytes.chunks_exact(4)) {
                *a += f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        Dtype::F16 => add_f16(bytes, acc),
        Dtype::Bf16 => {
            let mut tmp = [0f32; CONVERT];
            for (a, b) in acc
                .chunks_mut(CONVERT)
                .zip(bytes.chunks(CONVERT * dtype.size()))
            {
                let t = &mut tmp[..a.len()];
                decode_row(dtype, b, t);
                a.iter_mut().zip(t.iter()).for_each(|(a, x)| *a += x);
            }
        }
    }
}

/// `acc += ` an f16 row, converted eight values at a time by F16C where the build has it (one
/// pass: a feature row's mean reads each row once, so the conversion must not cost a pass of
/// its own), the rest value by value.
#[inline]
fn add_f16(bytes: &[u8], acc: &mut [f32]) {
    let n = acc.len().min(bytes.len() / 2);
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx",
        target_feature = "f16c"
    ))]
    let done = {
        use std::arch::x86_64::*;
        let done = n / 8 * 8;
        for i in (0..done).step_by(8) {
            // SAFETY: i + 8 <= n, so the 16 bytes from byte 2i lie within `bytes` and the 8
            // values from i within `acc`; the loads and the store are unaligned; AVX and F16C
            // are enabled for this build (the cfg above).
            unsafe {
                let h = _mm_loadu_si128(bytes.as_ptr().add(2 * i).cast());
                let p = acc.as_mut_ptr().add(i);
                _mm256_storeu_ps(p, _mm256_add_ps(_mm256_loadu_ps(p), _mm256_cvtph_ps(h)));
            }
        }
        done
    };
    #[cfg(not(all(
        target_arch = "x86_64",
        target_feature = "avx",
        target_feature = "f16c"
    )))]
    let done = 0;
    for (i, a) in acc.iter_mut().enumerate().take(n).skip(done) {
        *a += f16::from_bits(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])).to_f32();
    }
}

/// 2-byte values to f32 through a small aligned buffer, so that `half` converts whole slices
/// (F16C instructions eight values at a time where the CPU has them).
#[inline]
fn decode_half<H: Copy>(
    bytes: &[u8],
    out: &mut [f32],
    zero: H,
    from_bits: impl Fn(u16) -> H,
    convert: impl Fn(&[H], &mut [f32]),
) {
    let mut tmp = [zero; CONVERT];
    for (o, b) in out.chunks_mut(CONVERT).zip(bytes.chunks(2 * CONVERT)) {
        let t = &mut tmp[..o.len()];
        for (h, c) in t.iter_mut().zip(b.chunks_exact(2)) {
            *h = from_bits(u16::from_le_bytes([c[0], c[1]]));
        }
        convert(t, o);
    }
}

/// f32 to 2-byte values, as [`decode_half`].
#[inline]
fn encode_half<H: Copy>(
    row: &[f32],
    bytes: &mut [u8],
    zero: H,
    to_bits: impl Fn(H) -> u16,
    convert: impl Fn(&mut [H], &[f32]),
) {
    let mut tmp = [zero; CONVERT];
    for (x, b) in row.chunks(CONVERT).zip(bytes.chunks_mut(2 * CONVERT)) {
        let t = &mut tmp[..x.len()];
        convert(t, x);
        for (h, c) in t.iter().zip(b.chunks_exact_mut(2)) {
            c.copy_from_slice(&to_bits(*h).to_le_bytes());
        }
    }
}

/// Values converted at a time by [`decode_row`] and [`encode_row`].
const CONVERT: usize = 64;

/// Store one f32 row in the storage dtype (round to nearest).
#[inline]
pub fn encode_row(dtype: Dtype, row: &[f32], bytes: &mut [u8]) {
    match dtype {
        Dtype::F32 => {
            for (x, c) in row.iter().zip(bytes.chunks_exact_mut(4)) {
                c.copy_from_slice(&x.to_le_bytes());
            }
        }
        Dtype::F16 => encode_half(row, bytes, f16::ZERO, f16::to_bits, |h, x| {
            h.convert_from_f32_slice(x)
        }),
        Dtype::Bf16 => encode_half(row, bytes, bf16::ZERO, bf16::to_bits, |h, x| {
            h.convert_from_f32_slice(x)
        }),
    }
}

/// Put one f32 row on the wire in `wire`'s precision (`wire.row_bytes(row.len())` bytes). For
/// int8, the row's scale (its largest magnitude / 127, f32) comes first, then one signed byte
/// per value: rounded to nearest when `dither` is `None` (rows read by copies: the copy keeps
/// the value it read as its base, so the rounding never reaches the owner's row), else
/// stochastically from the counter-based stream `dither` (deltas: unbiased, so that rounding
/// does not drift the owner's row; deterministic for a given seed).
pub fn encode_wire(wire: WireDtype, row: &[f32], bytes: &mut [u8], dither: Option<u64>) {
    let dtype = match wire {
        WireDtype::F32 => Dtype::F32,
        WireDtype::F16 => Dtype::F16,
        WireDtype::Bf16 => Dtype::Bf16,
        WireDtype::Int8 => {
            // The largest magnitude by the bits (their order is the values' for magnitudes; an
            // integer maximum vectorises): infinity or NaN make the scale f32::MAX.
            let top = row
                .iter()
                .map(|x| x.to_bits() & 0x7FFF_FFFF)
                .max()
                .unwrap_or(0);
            let top = f32::from_bits(top);
            let top = if top.is_finite() { top } else { f32::MAX };
            let scale = top / 127.0;
            bytes[..4].copy_from_slice(&scale.to_le_bytes());
            let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
            let out = &mut bytes[4..4 + row.len()];
            // Two straight loops without a dependency from one value to the next, so that
            // they compile to vector code (a serial generator per value was 13% of a rank's
            // CPU time at 8 simulated nodes).
            match dither {
                None => {
                    for (x, b) in row.iter().zip(out.iter_mut()) {
                        *b = to_int8(x * inv + 0.5);
                    }
                }
                Some(d) => {
                    let key = dither_key(d);
                    for ((i, x), b) in row.iter().enumerate().zip(out.iter_mut()) {
                        *b = to_int8(x * inv + dither_uniform(key, i as u32));
                    }
                }
            }
            return;
        }
    };
    encode_row(dtype, row, bytes)
}

/// `floor(v)` as a signed byte in [-127, 127] (NaN gives 0), stored as its bits. Adding 1.5 x
/// 2^23 leaves an integer of magnitude below 2^22 in the low bits of the sum's mantissa, in two's
/// complement: that vectorises, where a float-to-byte cast (saturating) is done value by value.
#[inline(always)]
fn to_int8(v: f32) -> u8 {
    (v.floor().clamp(-127.0, 127.0) + 12_582_912.0).to_bits() as u8
}

/// The 32-bit key of a dither stream: all 64 bits of `d` mixed (splitmix64's finaliser).
fn dither_key(d: u64) -> u32 {
    let mut z = d.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) as u32
}

/// Value `i` of stream `key`: a uniform in [0, 1) with 24 bits, from a counter-based hash
/// (Wellons' lowbias32 of key + i x golden ratio), so that every value is computed on its own.
#[inline(always)]
fn dither_uniform(key: u32, i: u32) -> f32 {
    let mut h = key.wrapping_add(i.wrapping_mul(0x9E37_79B9));
    h ^= h >> 16;
    h = h.wrapping_mul(0x7FEB_352D);
    h ^= h >> 15;
    h = h.wrapping_mul(0x846C_A68B);
    h ^= h >> 16;
    (h >> 8) as f32 * (1.0 / (1u32 << 24) as f32)
}

/// A row from the wire, as [`encode_wire`] put it.
pub fn decode_wire(wire: WireDtype, bytes: &[u8], out: &mut [f32]) {
    let dtype = match wire {
        WireDtype::F32 => Dtype::F32,
        WireDtype::F16 => Dtype::F16,
        WireDtype::Bf16 => Dtype::Bf16,
        WireDtype::Int8 => {
            let scale = f32::from_le_bytes(bytes[..4].try_into().expect("4 bytes"));
            for (o, &b) in out.iter_mut().zip(&bytes[4..]) {
                *o = f32::from(b as i8) * scale;
            }
            return;
        }
    };
    decode_row(dtype, bytes, out)
}

/// Hyper-parameters of the owner-side update.
#[derive(Clone, Copy, Debug)]
pub struct OptParams {
    pub kind: Optimizer,
    pub momentum: f32,
    pub beta2: f32,
    pub eps: f32,
}

impl OptParams {
    pub fn new(kind: Optimizer, momentum: f32) -> Self {
        OptParams {
            kind,
            momentum,
            beta2: 0.999,
            eps: 1e-8,
        }
    }
}

/// Apply one optimizer step to `w` with gradient `g` (loss gradient, not yet scaled by lr).
/// `state` is this row's slice of optimizer state (`Optimizer::state_per_row` values).
#[inline]
pub fn apply_update(p: &OptParams, lr: f32, w: &mut [f32], g: &[f32], state: &mut [f32]) {
    match p.kind {
        Optimizer::Sgd => {
            for (w, g) in w.iter_mut().zip(g) {
                *w -= lr * g;
            }
        }
        Optimizer::Momentum => {
            for ((w, g), m) in w.iter_mut().zip(g).zip(state.iter_mut()) {
                *m = p.momentum * *m + g;
                *w -= lr * *m;
            }
        }
        Optimizer::Adagrad => {
            // Row-wise Adagrad (PyTorch-BigGraph): one accumulator of the mean squared gradient.
            let mean_sq = g.iter().map(|x| x * x).sum::<f32>() / g.len() as f32;
            state[0] += mean_sq;
            let scale = lr / (state[0].sqrt() + p.eps);
            for (w, g) in w.iter_mut().zip(g) {
                *w -= scale * g;
            }
        }
        Optimizer::Adam => {
            // Sparse ("lazy") Adam: moments and bias correction advance only when the row is
            // updated; state = [m (dim), v (dim), steps].
            let d = w.len();
            let (m, rest) = state.split_at_mut(d);
            let (v, t) = rest.split_at_mut(d);
            t[0] += 1.0;
            let (b1, b2) = (p.momentum, p.beta2);
            let c1 = 1.0 - b1.powf(t[0]);
            let c2 = 1.0 - b2.powf(t[0]);
            for i in 0..d {
                m[i] = b1 * m[i] + (1.0 - b1) * g[i];
                v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
                w[i] -= lr * (m[i] / c1) / ((v[i] / c2).sqrt() + p.eps);
            }
        }
    }
}

/// A shard's rows seen as atomic cells of their storage type, handed to pool tasks that update
/// rows in place (HOGWILD): relaxed loads and stores, so two threads updating one row may lose
/// part of an update (as in word2vec) but never tear a value, and there is no data race.
#[derive(Clone, Copy)]
pub struct SharedRows {
    ptr: *const u8,
    /// Values (not bytes).
    len: usize,
    dtype: Dtype,
}

// SAFETY: the cells are atomics, which are Sync; the pointer itself is plain data.
unsafe impl Send for SharedRows {}
// SAFETY: as above.
unsafe impl Sync for SharedRows {}

impl SharedRows {
    /// `len` values of `dtype` at `ptr`, or `None` if `ptr` is not aligned for them.
    fn new(ptr: *const u8, len: usize, dtype: Dtype) -> Option<SharedRows> {
        (len == 0 || ptr.align_offset(dtype.size()) == 0).then_some(SharedRows { ptr, len, dtype })
    }

    /// The number of values.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The cells (row r is `cells.row(r, dim)`).
    ///
    /// # Safety
    /// The shard these came from must outlive the returned view, and no `&mut` access to its
    /// window may happen meanwhile (the trainer waits for every in-place task before it applies,
    /// snapshots, writes or drops rows).
    pub unsafe fn cells<'a>(self) -> Shared<'a> {
        if self.len == 0 {
            return Shared::F32(&[]);
        }
        // SAFETY: `ptr` came from the window's live allocation of `len` values of `dtype`, is
        // aligned for them (checked in `new`), AtomicU32 and AtomicU16 have the layout of u32
        // and u16, and the caller guarantees the allocation outlives `'a` with no `&mut` alias.
        unsafe {
            match self.dtype {
                Dtype::F32 => Shared::F32(std::slice::from_raw_parts(self.ptr.cast(), self.len)),
                Dtype::F16 => Shared::F16(std::slice::from_raw_parts(self.ptr.cast(), self.len)),
                Dtype::Bf16 => Shared::Bf16(std::slice::from_raw_parts(self.ptr.cast(), self.len)),
            }
        }
    }
}

/// One embedding matrix's rows owned by this rank.
pub struct Shard {
    pub window: Window,
    pub dtype: Dtype,
    pub dim: usize,
    pub rows: usize,
    pub state: Vec<f32>,
    pub state_per_row: usize,
}

/// The rows a rank's pool updates in place (HOGWILD): its own, and with a node-shared window
/// those of every rank on its node, as one array of cells of their storage type.
#[derive(Clone)]
pub struct InPlaceRows {
    pub cells: SharedRows,
    /// Per world rank, the first row of its rows in `cells`; `None` for a rank on another node
    /// (its rows are fetched, updated in a copy and pushed back as deltas).
    pub first_row: Vec<Option<u32>>,
}

impl InPlaceRows {
    /// Whether every rank's rows are in `cells` (a job on one node).
    pub fn all(&self) -> bool {
        self.first_row.iter().all(Option::is_some)
    }
}

impl Shard {
    /// Collective: allocate the window (every rank, same order) and the optimizer state. With
    /// `node_shared`, the node's ranks share their windows ([`Comm::node_window`]).
    pub fn new(
        comm: &Comm,
        rows: usize,
        dim: usize,
        dtype: Dtype,
        opt: Optimizer,
        node_shared: bool,
    ) -> Shard {
        let bytes = rows * dim * dtype.size();
        let window = if node_shared {
            comm.node_window(bytes)
        } else {
            comm.window(bytes)
        };
        Shard::over(window, rows, dim, dtype, opt)
    }

    /// A shard of `rows` rows in `window`, with zeroed optimizer state.
    fn over(window: Window, rows: usize, dim: usize, dtype: Dtype, opt: Optimizer) -> Shard {
        let spr = opt.state_per_row(dim);
        Shard {
            window,
            dtype,
            dim,
            rows,
            state: vec![0.0; rows * spr],
            state_per_row: spr,
        }
    }

    /// Collective: as [`Shard::new`] with private windows, the rows in a memory-mapped file at
    /// `path` (`--mmap-rows`; [`Comm::window_over_map`]).
    pub fn mapped(
        comm: &Comm,
        rows: usize,
        dim: usize,
        dtype: Dtype,
        opt: Optimizer,
        path: &std::path::Path,
    ) -> crate::Result<Shard> {
        let bytes = rows * dim * dtype.size();
        // Every rank agrees on its file before the collective window over them.
        let map = crate::spmd::agree(comm, comm.map_window_file(path, bytes))?;
        let window = comm.window_over_map(map, bytes);
        Ok(Shard::over(window, rows, dim, dtype, opt))
    }

    pub fn row_bytes(&self) -> usize {
        self.dim * self.dtype.size()
    }

    /// Fill every row with `f(row, out)`.
    pub fn init(&mut self, f: impl Fn(usize, &mut [f32])) {
        let (dtype, dim, rb) = (self.dtype, self.dim, self.row_bytes());
        self.window.with_local_mut(|bytes| {
            let mut buf = vec![0f32; dim];
            for (r, chunk) in bytes.chunks_exact_mut(rb).enumerate() {
                f(r, &mut buf);
                encode_row(dtype, &buf, chunk);
            }
        });
    }

    /// Copy local rows out as f32 (row-major).
    pub fn read_local(&self, rows: impl Iterator<Item = usize>, out: &mut Vec<f32>) {
        let (dtype, dim, rb) = (self.dtype, self.dim, self.row_bytes());
        self.window.with_local(|bytes| {
            for r in rows {
                let start = out.len();
                out.resize(start + dim, 0.0);
                decode_row(dtype, &bytes[r * rb..(r + 1) * rb], &mut out[start..]);
            }
        });
    }

    /// Apply a batch's gradient rows on `pool` (rows in parallel). Several gradients for one row
    /// (from several ranks) are summed first: one optimizer step per row and batch.
    pub fn apply_par(
        &mut self,
        pool: &rayon::ThreadPool,
        p: &OptParams,
        lr: f32,
        mut ups: Vec<(u32, &[f32])>,
    ) {
        use rayon::prelude::*;
        ups.sort_by_key(|u| u.0);
        let (dtype, dim, rb, spr) = (self.dtype, self.dim, self.row_bytes(), self.state_per_row);
        // Sum the gradients of repeated rows into `sums`; single ones are used in place.
        let mut groups: Vec<(u32, usize, usize)> = Vec::with_capacity(ups.len());
        let mut sums: Vec<f32> = Vec::new();
        let mut i = 0;
        while i < ups.len() {
            let mut j = i + 1;
            while j < ups.len() && ups[j].0 == ups[i].0 {
                j += 1;
            }
            if j - i == 1 {
                groups.push((ups[i].0, i, usize::MAX));
            } else {
                let at = sums.len();
                sums.resize(at + dim, 0.0);
                for (_, g) in &ups[i..j] {
                    for (a, b) in sums[at..].iter_mut().zip(*g) {
                        *a += b;
                    }
                }
                groups.push((ups[i].0, i, at));
            }
            i = j;
        }
        let state = &mut self.state;
        self.window.with_local_mut(|bytes| {
            // Carve disjoint row and state slices in row order, then update them in parallel.
            let mut work: Vec<(&mut [u8], &mut [f32], &[f32])> = Vec::with_capacity(groups.len());
            let (mut rest_b, mut rest_s): (&mut [u8], &mut [f32]) = (bytes, state.as_mut_slice());
            let mut pos = 0usize;
            for &(r, k, at) in &groups {
                let r = r as usize;
                let (_, tail) = std::mem::take(&mut rest_b).split_at_mut((r - pos) * rb);
                let (row, tail) = tail.split_at_mut(rb);
                rest_b = tail;
                let (_, tail) = std::mem::take(&mut rest_s).split_at_mut((r - pos) * spr);
                let (st, tail) = tail.split_at_mut(spr);
                rest_s = tail;
                pos = r + 1;
                let g = if at == usize::MAX {
                    ups[k].1
                } else {
                    &sums[at..at + dim]
                };
                work.push((row, st, g));
            }
            pool.install(|| {
                work.par_iter_mut().with_min_len(64).for_each_init(
                    || vec![0f32; dim],
                    |w, (row, st, g)| {
                        decode_row(dtype, row, w);
                        apply_update(p, lr, w, g, st);
                        encode_row(dtype, w, row);
                    },
                );
            });
        });
    }

    /// The rows as cells of their storage type for in-place (HOGWILD) updates by pool tasks,
    /// or `None` when the window is not aligned for them. Valid while `self` lives and nothing
    /// else borrows its window; see [`SharedRows::cells`].
    pub fn shared_rows(&mut self) -> Option<SharedRows> {
        let size = self.dtype.size();
        let (ptr, len) = self
            .window
            .with_local_mut(|b| (b.as_mut_ptr().cast_const(), b.len() / size));
        SharedRows::new(ptr, len, self.dtype)
    }

    /// The rows this rank updates in place: with `node` the node-shared span (`None` when the
    /// window has none or its layout does not fit whole rows), else its own. Valid as
    /// [`Shard::shared_rows`].
    pub fn in_place_rows(&mut self, me: usize, ranks: usize, node: bool) -> Option<InPlaceRows> {
        let rb = self.row_bytes();
        let mut first_row = vec![None; ranks];
        if !node {
            first_row[me] = Some(0);
            return self
                .shared_rows()
                .map(|cells| InPlaceRows { cells, first_row });
        }
        let span = self.window.node_span()?;
        let (base, len) = span.mapping?;
        let fits = len / rb <= u32::MAX as usize
            && span.parts.iter().all(|&(r, at, n)| {
                n == 0 || (at as usize - base as usize).is_multiple_of(rb) && r < ranks
            });
        if !fits {
            return None;
        }
        let cells = SharedRows::new(base.cast_const(), len / self.dtype.size(), self.dtype)?;
        for &(r, at, n) in &span.parts {
            first_row[r] = Some(if n == 0 {
                0
            } else {
                ((at as usize - base as usize) / rb) as u32
            });
        }
        Some(InPlaceRows { cells, first_row })
    }

    /// Apply gradient rows: each update is (local row, its gradient).
    pub fn apply<'g>(
        &mut self,
        p: &OptParams,
        lr: f32,
        updates: impl IntoIterator<Item = (u32, &'g [f32])>,
    ) {
        let (dtype, dim, rb, spr) = (self.dtype, self.dim, self.row_bytes(), self.state_per_row);
        let state = &mut self.state;
        self.window.with_local_mut(|bytes| {
            let mut w = vec![0f32; dim];
            for (r, g) in updates {
                let r = r as usize;
                let row = &mut bytes[r * rb..(r + 1) * rb];
                decode_row(dtype, row, &mut w);
                apply_update(p, lr, &mut w, g, &mut state[r * spr..(r + 1) * spr]);
                encode_row(dtype, &w, row);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adding_a_stored_row_adds_its_decoded_values() {
        for dtype in [Dtype::F32, Dtype::F16, Dtype::Bf16] {
            for n in [1, 7, 8, 9, 20, 128] {
                let row: Vec<f32> = (0..n).map(|i| (i as f32 - 4.5) * 0.37).collect();
                let mut bytes = vec![0u8; n * dtype.size()];
                encode_row(dtype, &row, &mut bytes);
                let mut decoded = vec![0f32; n];
                decode_row(dtype, &bytes, &mut decoded);
                let mut acc: Vec<f32> = (0..n).map(|i| i as f32).collect();
                add_row(dtype, &bytes, &mut acc);
                for (i, (a, d)) in acc.iter().zip(&decoded).enumerate() {
                    assert_eq!(*a, i as f32 + d, "{dtype:?}, {n} values, value {i}");
                }
            }
        }
    }

    #[test]
    fn int8_wire_rounds_rows_to_the_nearest_step_and_deltas_without_bias() {
        let dim = 128;
        let row: Vec<f32> = (0..dim)
            .map(|i| ((i * 53 % 97) as f32 - 48.0) * 0.013)
            .collect();
        let top = row.iter().fold(0f32, |a, x| a.max(x.abs()));
        let mut b = vec![0u8; WireDtype::Int8.row_bytes(dim)];
        assert_eq!(b.len(), dim + 4);
        let mut out = vec![0f32; dim];
        encode_wire(WireDtype::Int8, &row, &mut b, None);
        decode_wire(WireDtype::Int8, &b, &mut out);
        for (x, y) in row.iter().zip(&out) {
            assert!((x - y).abs() <= top / 254.0 * 1.001, "{x} -> {y}");
        }
        // The largest value survives (no clamping of the top), a zero row stays zero.
        let i = row.iter().position(|x| x.abs() == top).unwrap();
        assert!((out[i] - row[i]).abs() < 1e-6);
        encode_wire(WireDtype::Int8, &[0.0; 128], &mut b, Some(1));
        decode_wire(WireDtype::Int8, &b, &mut out);
        assert!(out.iter().all(|&x| x == 0.0));
        // Dithered: every value within one step, and the mean over many draws is the value
        // (a value a third of a step lands on the upper step a third of the time).
        let mut mean = vec![0f64; dim];
        let draws = 4000;
        for d in 0..draws {
            encode_wire(WireDtype::Int8, &row, &mut b, Some(d));
            decode_wire(WireDtype::Int8, &b, &mut out);
            for ((m, x), y) in mean.iter_mut().zip(&row).zip(&out) {
                assert!((x - y).abs() <= top / 127.0 * 1.001);
                *m += f64::from(*y) / draws as f64;
            }
        }
        let step = f64::from(top) / 127.0;
        for (m, x) in mean.iter().zip(&row) {
            assert!((m - f64::from(*x)).abs() < 0.05 * step, "{m} vs {x}");
        }
        // The same seed gives the same bytes; the other precisions are the storage codecs.
        let mut b2 = b.clone();
        encode_wire(WireDtype::Int8, &row, &mut b2, Some(draws - 1));
        assert_eq!(b, b2);
        // Another seed gives another rounding (streams of nearby seeds are not one stream).
        encode_wire(WireDtype::Int8, &row, &mut b2, Some(draws - 2));
        assert_ne!(b, b2);
        // Every step from -127 to 127 comes back exactly, either way of rounding.
        let steps: Vec<f32> = (-127..=127).map(|k| k as f32 * 0.5).collect();
        let mut b = vec![0u8; WireDtype::Int8.row_bytes(steps.len())];
        let mut out = vec![0f32; steps.len()];
        for dither in [None, Some(5)] {
            encode_wire(WireDtype::Int8, &steps, &mut b, dither);
            decode_wire(WireDtype::Int8, &b, &mut out);
            assert_eq!(out, steps, "{dither:?}");
        }
        // A non-finite value makes the scale f32::MAX, never NaN: a NaN decodes as 0 and the
        // finite values beside it as finite ones.
        let mut bad = steps.clone();
        bad[3] = f32::INFINITY;
        bad[4] = f32::NAN;
        encode_wire(WireDtype::Int8, &bad, &mut b, Some(1));
        decode_wire(WireDtype::Int8, &b, &mut out);
        assert_eq!(out[4], 0.0);
        assert!(out.iter().enumerate().all(|(i, x)| i == 3 || x.is_finite()));
        let mut out = vec![0f32; dim];
        let mut h = vec![0u8; WireDtype::F16.row_bytes(dim)];
        encode_wire(WireDtype::F16, &row, &mut h, Some(3));
        decode_wire(WireDtype::F16, &h, &mut out);
        let mut want = vec![0f32; dim];
        decode_row(Dtype::F16, &h, &mut want);
        assert_eq!(out, want);
    }

    #[test]
    fn parallel_apply_equals_sequential_and_sums_repeated_rows() {
        crate::comm::local::run(1, std::time::Duration::from_secs(30), |comm| {
            check_parallel_apply(&comm)
        });
    }

    fn check_parallel_apply(comm: &crate::comm::Comm) {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .expect("pool");
        let opt = OptParams::new(Optimizer::Adagrad, 0.9);
        let (rows, dim) = (300, 8);
        let grads: Vec<f32> = (0..400 * dim)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.01)
            .collect();
        // Rows 0..300 once each, and rows 5, 17, 250 a second time (another rank's gradient).
        let mut ups: Vec<(u32, &[f32])> = (0..rows as u32)
            .rev()
            .map(|r| (r, &grads[r as usize * dim..(r as usize + 1) * dim]))
            .collect();
        for (k, r) in [5u32, 17, 250].into_iter().enumerate() {
            ups.push((r, &grads[(300 + k) * dim..(301 + k) * dim]));
        }
        let mut a = Shard::new(comm, rows, dim, Dtype::F16, Optimizer::Adagrad, false);
        let mut b = Shard::new(comm, rows, dim, Dtype::F16, Optimizer::Adagrad, false);
        let init = |r: usize, out: &mut [f32]| {
            out.iter_mut()
                .enumerate()
                .for_each(|(j, x)| *x = (r * 3 + j) as f32 * 0.001)
        };
        a.init(init);
        b.init(init);
        a.apply_par(&pool, &opt, 0.1, ups.clone());
        // Sequential reference: the two gradients of a repeated row summed, one step per row.
        let mut summed: Vec<(u32, Vec<f32>)> = Vec::new();
        for (r, g) in &ups {
            match summed.iter_mut().find(|(x, _)| x == r) {
                Some((_, s)) => s.iter_mut().zip(*g).for_each(|(a, b)| *a += b),
                None => summed.push((*r, g.to_vec())),
            }
        }
        b.apply(&opt, 0.1, summed.iter().map(|(r, g)| (*r, g.as_slice())));
        let (mut ra, mut rb) = (Vec::new(), Vec::new());
        a.read_local(0..rows, &mut ra);
        b.read_local(0..rows, &mut rb);
        assert_eq!(ra, rb);
        assert_eq!(a.state, b.state);
    }

    #[test]
    fn dtypes_round_trip_within_their_precision() {
        let row: Vec<f32> = (0..16).map(|i| (i as f32 - 8.0) * 0.0137).collect();
        for (dt, tol) in [(Dtype::F32, 0.0), (Dtype::F16, 1e-3), (Dtype::Bf16, 1e-2)] {
            let mut b = vec![0u8; 16 * dt.size()];
            let mut back = vec![0f32; 16];
            encode_row(dt, &row, &mut b);
            decode_row(dt, &b, &mut back);
            for (a, c) in row.iter().zip(&back) {
                assert!(
                    (a - c).abs() <= tol * a.abs().max(1e-3) + 1e-7,
                    "{dt:?}: {a} vs {c}"
                );
            }
        }
    }

    #[test]
    fn optimizer_steps_match_hand_computed_values() {
        let g = [0.5f32, -1.0];
        let mk = |k| OptParams::new(k, 0.9);
        // SGD: w - lr g
        let mut w = [1.0f32, 1.0];
        apply_update(&mk(Optimizer::Sgd), 0.1, &mut w, &g, &mut []);
        assert_eq!(w, [0.95, 1.1]);
        // Momentum, two steps: m1 = g, m2 = 0.9 g + g = 1.9 g
        let (mut w, mut m) = ([1.0f32, 1.0], [0.0f32; 2]);
        apply_update(&mk(Optimizer::Momentum), 0.1, &mut w, &g, &mut m);
        apply_update(&mk(Optimizer::Momentum), 0.1, &mut w, &g, &mut m);
        assert!((w[0] - (1.0 - 0.1 * 0.5 * 2.9)).abs() < 1e-6);
        assert!((m[1] - (-1.9)).abs() < 1e-6);
        // Row-wise Adagrad: acc = mean(g^2) = 0.625; w -= lr g / sqrt(acc)
        let (mut w, mut a) = ([1.0f32, 1.0], [0.0f32]);
        apply_update(&mk(Optimizer::Adagrad), 0.1, &mut w, &g, &mut a);
        assert!((a[0] - 0.625).abs() < 1e-7);
        assert!((w[0] - (1.0 - 0.1 * 0.5 / 0.625f32.sqrt())).abs() < 1e-6);
        // Adam, first step: update = lr * sign(g) (bias-corrected m/sqrt(v) = g/|g|)
        let (mut w, mut s) = ([1.0f32, 1.0], [0.0f32; 5]);
        apply_update(&mk(Optimizer::Adam), 0.1, &mut w, &g, &mut s);
        assert!(
            (w[0] - 0.9).abs() < 1e-5 && (w[1] - 1.1).abs() < 1e-5,
            "{w:?}"
        );
        assert_eq!(s[4], 1.0);
    }
}
