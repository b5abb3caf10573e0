//! The distributed load holds no more than its result (issue 18): the heap's peak while a rank
//! loads a graph stays within 1.2x the CSR it ends with. The loader before this bound kept
//! every routed entry (24 bytes, in a growing vector) next to the CSR being built: 6-9x.
//!
//! A counting global allocator sees the Rust heap only (HDF5's own buffers are C allocations,
//! bounded by its chunk cache), so this binary holds this one test.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use graphscale::comm::local;
use graphscale::graph::csr;
use graphscale::graph::generate;
use graphscale::graph::partition::Scheme;

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call forwards to the system allocator with the caller's layout; the counters
// only observe sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc` is forwarded unchanged.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Relaxed) + layout.size();
            PEAK.fetch_max(now, Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

#[test]
fn the_load_peaks_within_1_2x_of_the_csr_it_builds() {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("rmat.h5");
    // 2^15 nodes, 2^19 edges: a CSR of about 4 MB per rank, large against the fixed costs.
    generate::rmat(&path, 15, 16, 7).unwrap();
    // Two ranks on one node, privately and with the CSR written into node-shared windows (the
    // in-process windows are heap memory too, so the allocator sees them).
    for (ranks, share) in [(1usize, false), (2, false), (2, true)] {
        // Rounds of 2^12 edges: each round's buffers are small against the CSR, as the default
        // round (2^20 edges) is against a graph of hundreds of millions of edges.
        let out = local::run(ranks, Duration::from_secs(120), |c| {
            c.barrier();
            let before = LIVE.load(Relaxed);
            if c.rank() == 0 {
                PEAK.store(before, Relaxed);
            }
            c.barrier();
            let g = csr::load(&c, &path, Scheme::Striped, 1 << 12, |_| Ok(share)).unwrap();
            assert_eq!(g.windows.is_some(), share);
            c.barrier();
            (g.bytes(), g.local_entries(), before)
        });
        let csr_bytes: u64 = out.iter().map(|o| o.0).sum();
        let entries: u64 = out.iter().map(|o| o.1).sum();
        let grown = (PEAK.load(Relaxed) - out[0].2) as f64;
        let ratio = grown / csr_bytes as f64;
        eprintln!(
            "{ranks} ranks, shared {share}: {entries} entries, CSR {csr_bytes} B, heap peak during the load {grown} B ({ratio:.3}x)"
        );
        assert!(entries > 900_000, "the graph has its edges: {entries}");
        assert_eq!(csr_bytes, entries * 4 + (1 << 15) * 8 + ranks as u64 * 8);
        assert!(
            ratio <= 1.2,
            "{ranks} ranks, shared {share}: the load's heap grew by {ratio:.3}x the CSR it built"
        );
    }
}
