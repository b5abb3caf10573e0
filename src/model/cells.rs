//! Shared rows: a matrix's rows as relaxed-atomic f32 cells that pool threads read and update
//! concurrently (HOGWILD), with whole-row copies in and out of private buffers.

use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering::Relaxed;

/// Hint the CPU to bring `cells` into cache (no effect on values; a no-op off x86-64).
#[inline]
pub fn prefetch(cells: &[AtomicU32]) {
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
pub fn load(cells: &[AtomicU32], out: &mut [f32]) {
    debug_assert_eq!(cells.len(), out.len());
    let done = vector_copy(cells.as_ptr().cast(), out.as_mut_ptr().cast(), out.len());
    for (o, c) in out[done..].iter_mut().zip(&cells[done..]) {
        *o = f32::from_bits(c.load(Relaxed));
    }
}

/// Copy `v` into a shared row (same length), as [`load`].
#[inline]
pub fn store(cells: &[AtomicU32], v: &[f32]) {
    debug_assert_eq!(cells.len(), v.len());
    let done = vector_copy(v.as_ptr().cast(), cells.as_ptr().cast_mut().cast(), v.len());
    for (c, x) in cells[done..].iter().zip(&v[done..]) {
        c.store(x.to_bits(), Relaxed);
    }
}

/// Add `delta` to a shared row (same length), eight values at a time as [`vector_copy`] (each
/// value is loaded, added to and stored with plain moves, so a racing update may be lost, as in
/// word2vec's HOGWILD), then word by word with relaxed atomics.
#[inline]
pub fn add_to(cells: &[AtomicU32], delta: &[f32]) {
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
