//! The adjacency of every rank on this node, mapped into this process: the load writes each
//! rank's CSR into node-shared windows ([`Comm::node_window`]) when the trainer will walk across
//! the node's ranks, and each rank then reads the others' in place. A walk then continues across
//! the node's ranks without migrating; only a step to a node owned by another node's rank ships
//! the walker. A CSR loaded privately is copied into windows here (twice its memory).

use std::sync::Arc;

use super::csr::Nbrs;
use super::LocalGraph;

use crate::comm::{Comm, Window};

/// One node rank's CSR as mapped here.
#[derive(Clone, Copy)]
struct Mapped {
    offsets: *const u64,
    nodes: usize,
    /// `entries` u32 (narrow) or u64 targets.
    targets: *const u8,
    narrow: bool,
    entries: usize,
    /// Null for unweighted graphs.
    cum: *const f32,
}

/// The CSRs of this node's ranks. Immutable once built: every rank copied its CSR before the
/// barrier in [`NodeGraph::new`] and nobody writes the windows again.
pub struct NodeGraph {
    /// Indexed by world rank; `None` for ranks of other nodes.
    peers: Vec<Option<Mapped>>,
    // Keeps the mapped memory alive (declared last: dropped after the pointers' last use).
    _windows: [Arc<Window>; 3],
}

// SAFETY: the pointers are read-only views into windows owned by `_windows`, whose memory is
// never written after construction; sharing them between threads is sharing immutable data.
unsafe impl Send for NodeGraph {}
// SAFETY: as above.
unsafe impl Sync for NodeGraph {}

impl NodeGraph {
    /// Collective: map the node's other ranks' CSRs. A CSR the load wrote into node-shared
    /// windows ([`LocalGraph::windows`]) is mapped as it is; otherwise this rank's is copied
    /// into new windows first (twice its adjacency's memory). `None` (on every rank alike) when
    /// windows are not node-shared: one rank on every node, or the in-process transport.
    pub fn new(comm: &Comm, g: &LocalGraph) -> Option<NodeGraph> {
        // Whether the load shared the CSR is the same on every rank.
        let windows = match &g.windows {
            Some(w) => w.0.clone(),
            None => Self::copy(comm, g)?,
        };
        let spans: Vec<_> = windows.iter().map(|w| w.node_span()).collect();
        let part = |w: usize, rank: usize| {
            spans[w].as_ref().and_then(|s| {
                s.parts
                    .iter()
                    .find(|p| p.0 == rank)
                    .map(|&(_, at, len)| (at.cast_const(), len))
            })
        };
        let mut peers = vec![None; comm.size()];
        for &(rank, at, len) in &spans[0].as_ref()?.parts {
            let (targets, tlen) = part(1, rank).expect("every node rank has targets");
            let cum = match part(2, rank) {
                Some((c, clen)) if g.weighted && clen > 0 => c.cast::<f32>(),
                _ => std::ptr::null(),
            };
            let offsets = at.cast_const().cast::<u64>();
            // An empty part may be null or unaligned: slices of length 0 need neither data nor
            // a null pointer, so point them at a dangling, aligned address.
            let width = g.targets.width();
            let targets = if tlen == 0 {
                std::ptr::NonNull::<u64>::dangling()
                    .as_ptr()
                    .cast_const()
                    .cast::<u8>()
            } else {
                targets
            };
            if len < 8 {
                continue;
            }
            assert!(
                offsets.is_aligned()
                    && (targets as usize).is_multiple_of(width)
                    && cum.is_aligned(),
                "node-shared adjacency is not aligned"
            );
            peers[rank] = Some(Mapped {
                offsets,
                nodes: len / 8 - 1,
                targets,
                narrow: width == 4,
                entries: tlen / width,
                cum,
            });
        }
        Some(NodeGraph {
            peers,
            _windows: windows,
        })
    }

    /// Collective: copy this rank's CSR into new node-shared windows; `None` when windows are
    /// not node-shared.
    fn copy(comm: &Comm, g: &LocalGraph) -> Option<[Arc<Window>; 3]> {
        let cum = g.cum_weights.as_deref().unwrap_or(&[]);
        // Whether windows are node-shared is the same on every rank: ask the first one.
        let first = comm.node_window(g.offsets.len() * 8);
        first.node_span()?;
        let mut windows = [
            first,
            comm.node_window(g.targets.as_bytes().len()),
            comm.node_window(cum.len() * 4),
        ];
        windows[0].with_local_mut(|b| b.copy_from_slice(bytemuck::cast_slice(&g.offsets[..])));
        windows[1].with_local_mut(|b| b.copy_from_slice(g.targets.as_bytes()));
        windows[2].with_local_mut(|b| b.copy_from_slice(bytemuck::cast_slice(cum)));
        // Every rank has copied its CSR: from here on the windows are only read.
        comm.barrier();
        Some(windows.map(Arc::new))
    }

    /// Whether `rank`'s adjacency is mapped here (it is on this node).
    #[inline]
    pub fn has(&self, rank: usize) -> bool {
        self.peers[rank].is_some()
    }

    /// Hint the CPU to fetch where `rank`'s node `local` keeps its neighbour range.
    #[inline]
    pub fn prefetch(&self, rank: usize, local: usize) {
        #[cfg(target_arch = "x86_64")]
        if let Some(m) = self.peers[rank] {
            if local < m.nodes {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
                // SAFETY: a prefetch never faults and changes nothing; the address is inside
                // the mapped offsets (`local < nodes`).
                unsafe { _mm_prefetch::<_MM_HINT_T0>(m.offsets.add(local).cast()) };
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (rank, local);
    }

    /// The neighbours of `rank`'s local node `local` (sorted) and, for weighted graphs, their
    /// inclusive prefix sums of weights; `None` when `rank` is on another node.
    #[inline]
    pub fn adjacency(&self, rank: usize, local: usize) -> Option<(Nbrs<'_>, Option<&[f32]>)> {
        let m = self.peers[rank]?;
        assert!(
            local < m.nodes,
            "node {local} of rank {rank} is out of range"
        );
        // SAFETY: `offsets` holds `nodes + 1` values (checked index above), written before the
        // barrier in `new` and never after; the memory lives as long as `self`.
        let (a, b) = unsafe {
            (
                *m.offsets.add(local) as usize,
                *m.offsets.add(local + 1) as usize,
            )
        };
        assert!(a <= b && b <= m.entries, "corrupt adjacency of rank {rank}");
        // SAFETY: `a..b` lies within the `entries` targets (checked) of the width they were
        // copied in, aligned (checked in `new`), immutable as above.
        let nb = unsafe {
            if m.narrow {
                Nbrs::Narrow(std::slice::from_raw_parts(
                    m.targets.cast::<u32>().add(a),
                    b - a,
                ))
            } else {
                Nbrs::Wide(std::slice::from_raw_parts(
                    m.targets.cast::<u64>().add(a),
                    b - a,
                ))
            }
        };
        let cum = (!m.cum.is_null()).then(|| {
            // SAFETY: weighted graphs have one prefix sum per target, mapped and immutable.
            unsafe { std::slice::from_raw_parts(m.cum.add(a), b - a) }
        });
        Some((nb, cum))
    }
}
