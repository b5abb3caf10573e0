//! Shared rows: a matrix's rows as relaxed-atomic cells that pool threads read and update
//! concurrently (HOGWILD), with whole-row copies in and out of private f32 buffers. Rows are
//! stored as f32, or as f16 or bf16 (`--dtype`), converted on every copy: the kernels compute
//! in f32 and round once per store, as the batched path's owners do.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicU16, AtomicU32};

use half::{bf16, f16};

use crate::config::Dtype;

/// Values of shared rows in their storage type: one row, or a whole matrix (row r is
/// [`Shared::row`]`(r, dim)`).
#[derive(Clone, Copy, Debug)]
pub enum Shared<'a> {
    F32(&'a [AtomicU32]),
    F16(&'a [AtomicU16]),
    Bf16(&'a [AtomicU16]),
}

impl<'a> Shared<'a> {
    /// The number of values.
    #[inline]
    pub fn len(self) -> usize {
        match self {
            Shared::F32(c) => c.len(),
            Shared::F16(c) | Shared::Bf16(c) => c.len(),
        }
    }

    #[inline]
    pub fn is_empty(self) -> bool {
        self.len() == 0
    }

    /// The storage type.
    pub fn dtype(self) -> Dtype {
        match self {
            Shared::F32(_) => Dtype::F32,
            Shared::F16(_) => Dtype::F16,
            Shared::Bf16(_) => Dtype::Bf16,
        }
    }

    /// Values `at..at + n`.
    #[inline(always)]
    pub fn slice(self, at: usize, n: usize) -> Shared<'a> {
        match self {
            Shared::F32(c) => Shared::F32(&c[at..at + n]),
            Shared::F16(c) => Shared::F16(&c[at..at + n]),
            Shared::Bf16(c) => Shared::Bf16(&c[at..at + n]),
        }
    }

    /// Row `r` of a matrix of rows of `dim` values.
    #[inline(always)]
    pub fn row(self, r: usize, dim: usize) -> Shared<'a> {
        self.slice(r * dim, dim)
    }

    /// The first byte and the byte length.
    #[inline(always)]
    fn bytes(self) -> (*const u8, usize) {
        match self {
            Shared::F32(c) => (c.as_ptr().cast(), c.len() * 4),
            Shared::F16(c) | Shared::Bf16(c) => (c.as_ptr().cast(), c.len() * 2),
        }
    }
}

/// Hint the CPU to bring `cells` into cache (no effect on values; a no-op off x86-64).
#[inline]
pub fn prefetch(cells: Shared) {
    let (p, n) = cells.bytes();
    crate::store::prefetch_range(p, n);
}

/// Copy a shared row into `out` (same length): vector moves and conversions, then single
/// relaxed loads.
#[inline]
pub fn load(cells: Shared, out: &mut [f32]) {
    debug_assert_eq!(cells.len(), out.len());
    match cells {
        Shared::F32(c) => {
            let done = vector_copy(c.as_ptr().cast(), out.as_mut_ptr().cast(), out.len());
            for (o, c) in out[done..].iter_mut().zip(&c[done..]) {
                *o = f32::from_bits(c.load(Relaxed));
            }
        }
        Shared::F16(c) => {
            let done = half_load(Half::F16, c, out);
            for (o, c) in out[done..].iter_mut().zip(&c[done..]) {
                *o = f16::from_bits(c.load(Relaxed)).to_f32();
            }
        }
        Shared::Bf16(c) => {
            let done = half_load(Half::Bf16, c, out);
            for (o, c) in out[done..].iter_mut().zip(&c[done..]) {
                *o = bf16::from_bits(c.load(Relaxed)).to_f32();
            }
        }
    }
}

/// Copy `v` into a shared row (same length), as [`load`]; 16-bit rows round to nearest even.
#[inline]
pub fn store(cells: Shared, v: &[f32]) {
    debug_assert_eq!(cells.len(), v.len());
    match cells {
        Shared::F32(c) => {
            let done = vector_copy(v.as_ptr().cast(), c.as_ptr().cast_mut().cast(), v.len());
            for (c, x) in c[done..].iter().zip(&v[done..]) {
                c.store(x.to_bits(), Relaxed);
            }
        }
        Shared::F16(c) => {
            let done = half_update(Half::F16, false, c, v);
            for (c, x) in c[done..].iter().zip(&v[done..]) {
                c.store(f16::from_f32(*x).to_bits(), Relaxed);
            }
        }
        Shared::Bf16(c) => {
            let done = half_update(Half::Bf16, false, c, v);
            for (c, x) in c[done..].iter().zip(&v[done..]) {
                c.store(bf16::from_f32(*x).to_bits(), Relaxed);
            }
        }
    }
}

/// Add `delta` to a shared row (same length), eight values at a time as [`vector_copy`] (each
/// value is loaded, added to and stored with plain moves, so a racing update may be lost, as in
/// word2vec's HOGWILD), then value by value with relaxed atomics. 16-bit rows add in f32 and
/// round the sum to nearest even.
#[inline]
pub fn add_to(cells: Shared, delta: &[f32]) {
    debug_assert_eq!(cells.len(), delta.len());
    match cells {
        Shared::F32(c) => add_to_f32(c, delta),
        Shared::F16(c) => {
            let done = half_update(Half::F16, true, c, delta);
            for (c, x) in c[done..].iter().zip(&delta[done..]) {
                let sum = f16::from_bits(c.load(Relaxed)).to_f32() + x;
                c.store(f16::from_f32(sum).to_bits(), Relaxed);
            }
        }
        Shared::Bf16(c) => {
            let done = half_update(Half::Bf16, true, c, delta);
            for (c, x) in c[done..].iter().zip(&delta[done..]) {
                let sum = bf16::from_bits(c.load(Relaxed)).to_f32() + x;
                c.store(bf16::from_f32(sum).to_bits(), Relaxed);
            }
        }
    }
}

#[inline]
fn add_to_f32(cells: &[AtomicU32], delta: &[f32]) {
    debug_assert_eq!(cells.len(), delta.len());
    let mut done = 0;
    #[cfg(all(target_arch = "x86_64", target_feature = "avx"))]
    {
        let blocks = delta.len().min(cells.len()) / 8;
        if blocks > 0 {
            // SAFETY: `cells` and `delta` are distinct slices (a shared row and a private
            // buffer) of at least `blocks * 8` values. Each shared value is 4-byte aligned and
            // within one cache line, so x86 loads and stores it whole: a racing update may be
            // lost but no value is torn, as in `vector_copy`. No stack; registers declared.
            unsafe {
                std::arch::asm!(
                    "2:",
                    "vmovups {x}, ymmword ptr [{s}]",
                    "vaddps {x}, {x}, ymmword ptr [{d}]",
                    "vmovups ymmword ptr [{s}], {x}",
                    "add {s}, 32",
                    "add {d}, 32",
                    "dec {b}",
                    "jnz 2b",
                    s = inout(reg) cells.as_ptr() => _,
                    d = inout(reg) delta.as_ptr() => _,
                    b = inout(reg) blocks => _,
                    x = out(ymm_reg) _,
                    options(nostack),
                );
            }
            done = blocks * 8;
        }
    }
    for (c, x) in cells[done..].iter().zip(&delta[done..]) {
        c.store((f32::from_bits(c.load(Relaxed)) + x).to_bits(), Relaxed);
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
pub fn vector_copy(src: *const u32, dst: *mut u32, n: usize) -> usize {
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

/// The 16-bit storage types.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Half {
    F16,
    Bf16,
}

/// Convert a leading part of the 16-bit row `c` into `out`, eight values at a time (F16C's
/// `vcvtph2ps` for f16, a shift for bf16); returns how many (0 without AVX2 and F16C: the
/// caller converts the rest value by value). The moves read 2-byte aligned values whole, as
/// [`vector_copy`] reads 4-byte ones.
#[inline]
fn half_load(kind: Half, c: &[AtomicU16], out: &mut [f32]) -> usize {
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "f16c"
    ))]
    {
        let blocks = c.len().min(out.len()) / 8;
        if blocks == 0 {
            return 0;
        }
        // SAFETY: `c` (a shared row) and `out` (a private buffer) do not overlap and hold at
        // least `blocks * 8` values each. Each 2-byte value is aligned and within one cache
        // line, so x86 reads it whole: a racing update may be missed but no value is torn (the
        // relaxed 2-byte loads of the atomic path, eight at a time). No stack; registers
        // declared.
        unsafe {
            match kind {
                Half::F16 => std::arch::asm!(
                    "2:",
                    "vcvtph2ps {x}, xmmword ptr [{s}]",
                    "vmovups ymmword ptr [{d}], {x}",
                    "add {s}, 16",
                    "add {d}, 32",
                    "dec {b}",
                    "jnz 2b",
                    s = inout(reg) c.as_ptr() => _,
                    d = inout(reg) out.as_mut_ptr() => _,
                    b = inout(reg) blocks => _,
                    x = out(ymm_reg) _,
                    options(nostack),
                ),
                Half::Bf16 => std::arch::asm!(
                    "2:",
                    "vpmovzxwd {x}, xmmword ptr [{s}]",
                    "vpslld {x}, {x}, 16",
                    "vmovups ymmword ptr [{d}], {x}",
                    "add {s}, 16",
                    "add {d}, 32",
                    "dec {b}",
                    "jnz 2b",
                    s = inout(reg) c.as_ptr() => _,
                    d = inout(reg) out.as_mut_ptr() => _,
                    b = inout(reg) blocks => _,
                    x = out(ymm_reg) _,
                    options(nostack),
                ),
            }
        }
        blocks * 8
    }
    #[cfg(not(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "f16c"
    )))]
    {
        let _ = (kind, c, out);
        0
    }
}

/// Write `v` (or with `add`, the row plus `v`, summed in f32) into a leading part of the 16-bit
/// row `c`, rounded to nearest even, eight values at a time; returns how many (0 without AVX2
/// and F16C). As [`half_load`], each value is read and written whole; a racing update may be
/// lost, as in [`add_to`].
#[inline]
fn half_update(kind: Half, add: bool, c: &[AtomicU16], v: &[f32]) -> usize {
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "f16c"
    ))]
    {
        use std::arch::x86_64::_mm256_set1_epi32;
        let blocks = c.len().min(v.len()) / 8;
        if blocks == 0 {
            return 0;
        }
        let s = c.as_ptr();
        let d = v.as_ptr();
        // SAFETY: as in `half_load`: a shared row and a private buffer that do not overlap,
        // `blocks * 8` values each, each 2-byte value aligned and moved whole. The constants
        // are built with AVX2, which this block is compiled for. No stack; registers declared.
        unsafe {
            let (one, bias) = (_mm256_set1_epi32(1), _mm256_set1_epi32(0x7fff));
            match (kind, add) {
                (Half::F16, false) => std::arch::asm!(
                    "2:",
                    "vmovups {x}, ymmword ptr [{d}]",
                    "vcvtps2ph xmmword ptr [{s}], {x}, 0",
                    "add {s}, 16",
                    "add {d}, 32",
                    "dec {b}",
                    "jnz 2b",
                    s = inout(reg) s => _,
                    d = inout(reg) d => _,
                    b = inout(reg) blocks => _,
                    x = out(ymm_reg) _,
                    options(nostack),
                ),
                (Half::F16, true) => std::arch::asm!(
                    "2:",
                    "vcvtph2ps {x}, xmmword ptr [{s}]",
                    "vaddps {x}, {x}, ymmword ptr [{d}]",
                    "vcvtps2ph xmmword ptr [{s}], {x}, 0",
                    "add {s}, 16",
                    "add {d}, 32",
                    "dec {b}",
                    "jnz 2b",
                    s = inout(reg) s => _,
                    d = inout(reg) d => _,
                    b = inout(reg) blocks => _,
                    x = out(ymm_reg) _,
                    options(nostack),
                ),
                // bf16: the f32 bits plus 0x7fff plus the kept part's lowest bit, shifted
                // down by 16 (round to nearest even), packed to 16 bits.
                (Half::Bf16, false) => std::arch::asm!(
                    "2:",
                    "vmovdqu {x}, ymmword ptr [{d}]",
                    "vpsrld {t}, {x}, 16",
                    "vpand {t}, {t}, {one}",
                    "vpaddd {x}, {x}, {t}",
                    "vpaddd {x}, {x}, {bias}",
                    "vpsrld {x}, {x}, 16",
                    "vextracti128 {t:x}, {x}, 1",
                    "vpackusdw {x:x}, {x:x}, {t:x}",
                    "vmovdqu xmmword ptr [{s}], {x:x}",
                    "add {s}, 16",
                    "add {d}, 32",
                    "dec {b}",
                    "jnz 2b",
                    s = inout(reg) s => _,
                    d = inout(reg) d => _,
                    b = inout(reg) blocks => _,
                    one = in(ymm_reg) one,
                    bias = in(ymm_reg) bias,
                    x = out(ymm_reg) _,
                    t = out(ymm_reg) _,
                    options(nostack),
                ),
                (Half::Bf16, true) => std::arch::asm!(
                    "2:",
                    "vpmovzxwd {x}, xmmword ptr [{s}]",
                    "vpslld {x}, {x}, 16",
                    "vaddps {x}, {x}, ymmword ptr [{d}]",
                    "vpsrld {t}, {x}, 16",
                    "vpand {t}, {t}, {one}",
                    "vpaddd {x}, {x}, {t}",
                    "vpaddd {x}, {x}, {bias}",
                    "vpsrld {x}, {x}, 16",
                    "vextracti128 {t:x}, {x}, 1",
                    "vpackusdw {x:x}, {x:x}, {t:x}",
                    "vmovdqu xmmword ptr [{s}], {x:x}",
                    "add {s}, 16",
                    "add {d}, 32",
                    "dec {b}",
                    "jnz 2b",
                    s = inout(reg) s => _,
                    d = inout(reg) d => _,
                    b = inout(reg) blocks => _,
                    one = in(ymm_reg) one,
                    bias = in(ymm_reg) bias,
                    x = out(ymm_reg) _,
                    t = out(ymm_reg) _,
                    options(nostack),
                ),
            }
        }
        blocks * 8
    }
    #[cfg(not(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "f16c"
    )))]
    {
        let _ = (kind, add, c, v);
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::RngExt;

    fn values(rng: &mut crate::sample::Rng, n: usize) -> Vec<f32> {
        // Magnitudes from f16's subnormals to beyond its range, both signs, and a few halfway
        // cases (ties round to even).
        (0..n)
            .map(|i| match i % 5 {
                0 => rng.random_range(-1.0f32..1.0),
                1 => rng.random_range(-1e-6f32..1e-6),
                2 => rng.random_range(-7e4f32..7e4),
                // Halfway between two normal f16 values (the 13th dropped bit), and between two
                // bf16 values (the 16th).
                3 => {
                    let h = f16::from_bits(rng.random_range(0x0400u16..0x7bff)).to_f32();
                    f32::from_bits(h.to_bits() | 0x1000)
                }
                _ => f32::from_bits((u32::from(rng.random_range(0u16..0x7f00)) << 16) | 0x8000),
            })
            .collect()
    }

    /// What the scalar conversions of `half` give: the reference for every storage type.
    fn reference(dtype: Dtype, x: f32) -> f32 {
        match dtype {
            Dtype::F32 => x,
            Dtype::F16 => f16::from_f32(x).to_f32(),
            Dtype::Bf16 => bf16::from_f32(x).to_f32(),
        }
    }

    #[test]
    fn rows_round_trip_and_add_as_half_converts_them_at_every_length() {
        let mut rng = crate::sample::rng_for(11, 0, 0);
        for dtype in [Dtype::F32, Dtype::F16, Dtype::Bf16] {
            for n in 0..41 {
                let (v, d) = (values(&mut rng, n), values(&mut rng, n));
                let wide: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
                let narrow: Vec<AtomicU16> = (0..n).map(|_| AtomicU16::new(0)).collect();
                let cells = match dtype {
                    Dtype::F32 => Shared::F32(&wide),
                    Dtype::F16 => Shared::F16(&narrow),
                    Dtype::Bf16 => Shared::Bf16(&narrow),
                };
                assert_eq!((cells.len(), cells.dtype()), (n, dtype));
                store(cells, &v);
                let mut got = vec![f32::NAN; n];
                load(cells, &mut got);
                let want: Vec<f32> = v.iter().map(|&x| reference(dtype, x)).collect();
                assert_eq!(
                    got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    "{dtype:?} store/load of {n} values"
                );
                add_to(cells, &d);
                load(cells, &mut got);
                let want: Vec<f32> = want
                    .iter()
                    .zip(&d)
                    .map(|(&x, &y)| reference(dtype, x + y))
                    .collect();
                assert_eq!(
                    got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    "{dtype:?} add_to of {n} values"
                );
            }
        }
    }

    #[test]
    fn rows_of_a_matrix_are_its_slices() {
        let cells: Vec<AtomicU16> = (0..12).map(AtomicU16::new).collect();
        let m = Shared::F16(&cells);
        let Shared::F16(r) = m.row(2, 4) else {
            panic!("a row keeps its type")
        };
        assert_eq!(
            r.iter().map(|c| c.load(Relaxed)).collect::<Vec<_>>(),
            [8, 9, 10, 11]
        );
        prefetch(m.row(1, 4));
    }
}
