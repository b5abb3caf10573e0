//! Each rank's share of the topology: the CSR of the nodes it owns (out-edges; both directions
//! for undirected graphs), built by a distributed load in which every rank reads one contiguous
//! hyperslab of the edge datasets and sends each edge to its owner. Memory per rank is
//! O((V + E) / N): no rank holds the whole graph.
//!
//! The load holds no more than the result: a first pass over the file counts every owned node's
//! degree, the arrays are then allocated at their final size, and a second pass places each
//! entry where it belongs. Targets take 4 bytes when every node id fits in 32 bits (any graph
//! of fewer than 2^32 nodes, a billion-node graph included), 8 otherwise; each exchange round
//! moves at most `chunk_edges` edges per rank.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use super::h5::EdgeFile;
use super::partition::{Partitioner, Scheme};
use super::{Edge, NodeId};
use crate::comm::{Comm, Window};
use crate::error::{Error, Result};
use crate::spmd::agree;

/// Edges read per rank per exchange round during the load (bounds the load's memory).
pub const LOAD_CHUNK_EDGES: u64 = 1 << 20;

/// One array of a CSR: owned, or the bytes this rank holds in a node-shared window, which the
/// node's other ranks map and read (the load writes straight into it: no second copy).
pub struct Store<T> {
    ptr: std::ptr::NonNull<T>,
    len: usize,
    _keep: Keep<T>,
}

/// What keeps a [`Store`]'s memory alive (held, never read).
#[allow(dead_code)]
enum Keep<T> {
    Vec(Vec<T>),
    Window(Arc<Window>),
}

// SAFETY: a `Store` owns its values (a vector, or its rank's part of a window kept alive by the
// `Arc`); `&Store` gives shared reads and `&mut Store` exclusive writes, as for a `Vec<T>`.
// Other ranks of the node read the window's bytes only after the barrier that follows the
// load, when nothing writes them again.
unsafe impl<T: Send + Sync> Send for Store<T> {}
// SAFETY: as above.
unsafe impl<T: Send + Sync> Sync for Store<T> {}

impl<T: bytemuck::Pod> Store<T> {
    pub fn from_vec(mut v: Vec<T>) -> Store<T> {
        let ptr = std::ptr::NonNull::new(v.as_mut_ptr()).expect("a vector's pointer is not null");
        Store {
            ptr,
            len: v.len(),
            _keep: Keep::Vec(v),
        }
    }

    /// `len` zero values in this rank's part of `w` (allocated for exactly them); `None` when
    /// the window is not node-shared.
    fn in_window(w: Arc<Window>, rank: usize, len: usize) -> Option<Store<T>> {
        let span = w.node_span()?;
        let &(_, at, bytes) = span.parts.iter().find(|p| p.0 == rank)?;
        assert_eq!(
            bytes,
            len * std::mem::size_of::<T>(),
            "window of the wrong size"
        );
        let ptr = if len == 0 {
            std::ptr::NonNull::dangling()
        } else {
            assert!(
                at.cast::<T>().is_aligned(),
                "node-shared adjacency is not aligned"
            );
            std::ptr::NonNull::new(at.cast::<T>()).expect("a mapped part is not null")
        };
        let mut s = Store {
            ptr,
            len,
            _keep: Keep::Window(w),
        };
        s.fill(T::zeroed());
        Some(s)
    }
}

impl<T> std::ops::Deref for Store<T> {
    type Target = [T];

    #[inline]
    fn deref(&self) -> &[T] {
        // SAFETY: `ptr` holds `len` initialised values (a vector's, or zeroed window bytes of a
        // plain-old-data type), aligned, alive as long as `_keep`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> std::ops::DerefMut for Store<T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`; `&mut self` is the only access this process has, and other
        // ranks read the window's bytes only after the load's barrier.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

/// Adjacency targets, 4 bytes each when every node id of the graph fits, else 8.
pub enum Targets {
    Narrow(Store<u32>),
    Wide(Store<u64>),
}

impl Targets {
    /// `len` zero targets in the width `num_nodes` needs.
    pub fn zeros(num_nodes: u64, len: usize) -> Targets {
        use crate::comm::huge_vec;
        if Targets::narrow(num_nodes) {
            Targets::Narrow(Store::from_vec(huge_vec(len)))
        } else {
            Targets::Wide(Store::from_vec(huge_vec(len)))
        }
    }

    /// As [`Targets::zeros`], in this rank's part of a node-shared window.
    fn in_window(num_nodes: u64, w: Arc<Window>, rank: usize, len: usize) -> Option<Targets> {
        Some(if Targets::narrow(num_nodes) {
            Targets::Narrow(Store::in_window(w, rank, len)?)
        } else {
            Targets::Wide(Store::in_window(w, rank, len)?)
        })
    }

    /// Whether ids of a graph of `num_nodes` nodes are stored in 4 bytes.
    pub fn narrow(num_nodes: u64) -> bool {
        num_nodes <= u64::from(u32::MAX)
    }

    pub fn len(&self) -> usize {
        match self {
            Targets::Narrow(t) => t.len(),
            Targets::Wide(t) => t.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes per target.
    pub fn width(&self) -> usize {
        match self {
            Targets::Narrow(_) => 4,
            Targets::Wide(_) => 8,
        }
    }

    /// The targets as bytes (native order), for a node-shared copy.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            Targets::Narrow(t) => bytemuck::cast_slice(&t[..]),
            Targets::Wide(t) => bytemuck::cast_slice(&t[..]),
        }
    }

    #[inline]
    pub fn slice(&self, r: Range<usize>) -> Nbrs<'_> {
        match self {
            Targets::Narrow(t) => Nbrs::Narrow(&t[r]),
            Targets::Wide(t) => Nbrs::Wide(&t[r]),
        }
    }

    #[inline]
    pub fn get(&self, i: usize) -> NodeId {
        match self {
            Targets::Narrow(t) => u64::from(t[i]),
            Targets::Wide(t) => t[i],
        }
    }

    #[inline]
    fn set(&mut self, i: usize, v: NodeId) {
        match self {
            // The width was chosen so that every id fits.
            Targets::Narrow(t) => t[i] = v as u32,
            Targets::Wide(t) => t[i] = v,
        }
    }

    /// Sort `r` and permute `weights[r]` alike (weights may be empty: unweighted; they are
    /// finite and non-negative, so their bits order as their values).
    fn sort_range(&mut self, r: Range<usize>, weights: &mut [f32], scratch: &mut Vec<(u64, f32)>) {
        if weights.is_empty() {
            match self {
                Targets::Narrow(t) => t[r].sort_unstable(),
                Targets::Wide(t) => t[r].sort_unstable(),
            }
            return;
        }
        scratch.clear();
        scratch.extend(r.clone().map(|j| (self.get(j), weights[j])));
        // Duplicate edges in weight order too: the CSR does not depend on arrival order.
        scratch.sort_unstable_by_key(|&(d, w)| (d, w.to_bits()));
        for (j, &(d, w)) in r.zip(scratch.iter()) {
            self.set(j, d);
            weights[j] = w;
        }
    }
}

/// One node's neighbours (sorted), in the width of the graph's [`Targets`].
#[derive(Clone, Copy, Debug)]
pub enum Nbrs<'a> {
    Narrow(&'a [u32]),
    Wide(&'a [u64]),
}

impl<'a> Nbrs<'a> {
    #[inline]
    pub fn len(&self) -> usize {
        match self {
            Nbrs::Narrow(t) => t.len(),
            Nbrs::Wide(t) => t.len(),
        }
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    #[inline]
    pub fn get(&self, i: usize) -> NodeId {
        match self {
            Nbrs::Narrow(t) => u64::from(t[i]),
            Nbrs::Wide(t) => t[i],
        }
    }

    /// Whether `v` is a neighbour (binary search).
    #[inline]
    pub fn contains(&self, v: NodeId) -> bool {
        match self {
            Nbrs::Narrow(t) => u32::try_from(v).is_ok_and(|v| t.binary_search(&v).is_ok()),
            Nbrs::Wide(t) => t.binary_search(&v).is_ok(),
        }
    }

    /// The address of neighbour `i` (for a prefetch hint); `i < len()`.
    #[inline]
    pub fn addr(&self, i: usize) -> *const u8 {
        match self {
            Nbrs::Narrow(t) => std::ptr::from_ref(&t[i]).cast(),
            Nbrs::Wide(t) => std::ptr::from_ref(&t[i]).cast(),
        }
    }

    /// Hint the CPU to fetch the neighbours' first `max_bytes` (a list shorter than that whole).
    #[inline]
    pub fn prefetch(&self, max_bytes: usize) {
        let width = match self {
            Nbrs::Narrow(_) => 4,
            Nbrs::Wide(_) => 8,
        };
        if !self.is_empty() {
            crate::store::prefetch_range(self.addr(0), (self.len() * width).min(max_bytes));
        }
    }

    pub fn iter(self) -> impl ExactSizeIterator<Item = NodeId> + 'a {
        (0..self.len()).map(move |i| self.get(i))
    }

    pub fn to_vec(self) -> Vec<NodeId> {
        self.iter().collect()
    }
}

pub struct LocalGraph {
    pub rank: usize,
    pub part: Partitioner,
    /// Edges in the file (an undirected edge counts once).
    pub file_edges: u64,
    pub directed: bool,
    pub weighted: bool,
    /// `offsets[i]..offsets[i+1]` indexes the neighbours of local node `i`.
    pub offsets: Store<u64>,
    /// Neighbour ids, sorted within each node (binary search for node2vec).
    pub targets: Targets,
    /// For weighted graphs: per-node inclusive prefix sums of the edge weights.
    pub cum_weights: Option<Store<f32>>,
    /// When the load wrote the arrays into node-shared windows (offsets, targets, prefix sums
    /// of weights): the windows, which [`crate::graph::node::NodeGraph`] maps for the node's
    /// other ranks.
    pub windows: Option<CsrWindows>,
}

/// The node-shared windows a CSR was loaded into: offsets, targets, prefix sums of weights.
#[derive(Clone)]
pub struct CsrWindows(pub [Arc<Window>; 3]);

// SAFETY: the windows' memory is written only by the load, before the barrier that ends it, and
// only read afterwards, by any thread; the handles are not used to communicate again. They are
// freed where the graph is dropped, on the thread that loaded it (the rank's main thread).
unsafe impl Send for CsrWindows {}
// SAFETY: as above: shared access is read-only.
unsafe impl Sync for CsrWindows {}

impl LocalGraph {
    pub fn num_nodes(&self) -> u64 {
        self.part.num_nodes()
    }

    pub fn num_local(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Adjacency entries held here.
    pub fn local_entries(&self) -> u64 {
        self.targets.len() as u64
    }

    /// Bytes of the CSR (offsets, targets, prefix sums of weights).
    pub fn bytes(&self) -> u64 {
        (self.offsets.len() * 8
            + self.targets.len() * self.targets.width()
            + self.cum_weights.as_ref().map_or(0, |c| c.len()) * 4) as u64
    }

    #[inline]
    fn range(&self, local: usize) -> Range<usize> {
        self.offsets[local] as usize..self.offsets[local + 1] as usize
    }

    #[inline]
    pub fn neighbors(&self, local: usize) -> Nbrs<'_> {
        self.targets.slice(self.range(local))
    }

    #[inline]
    pub fn degree(&self, local: usize) -> usize {
        (self.offsets[local + 1] - self.offsets[local]) as usize
    }

    /// Inclusive prefix sums of the weights of `local`'s edges (weighted graphs).
    #[inline]
    pub fn cum_weights(&self, local: usize) -> Option<&[f32]> {
        self.cum_weights.as_ref().map(|c| &c[self.range(local)])
    }

    /// Total weight of `local`'s edges (its degree when unweighted).
    pub fn weighted_degree(&self, local: usize) -> f64 {
        match self.cum_weights(local) {
            Some(c) => c.last().map_or(0.0, |&x| f64::from(x)),
            None => self.degree(local) as f64,
        }
    }

    /// Is there an edge `local -> v`? (binary search in the sorted adjacency)
    #[inline]
    pub fn has_edge(&self, local: usize, v: NodeId) -> bool {
        self.neighbors(local).contains(v)
    }

    /// Build from the (src, dst, weight) entries this rank owns (`src` owned here).
    pub fn from_entries(
        rank: usize,
        part: Partitioner,
        entries: &[Edge],
        file_edges: u64,
        directed: bool,
        weighted: bool,
    ) -> LocalGraph {
        let mut b = Builder::new(rank, part, weighted);
        for e in entries {
            debug_assert_eq!(b.part.owner(e.src), rank);
            b.count(b.part.local_index(e.src));
        }
        assert!(b.prefix().is_some(), "a node of 2^32 entries or more");
        b.allocate(None);
        for e in entries {
            b.place(b.part.local_index(e.src), e.dst, e.weight);
        }
        b.finish(file_edges, directed)
    }
}

/// Builds a rank's CSR in the memory of the result: degrees are counted first, the arrays are
/// allocated at their final size (owned, or in node-shared windows), and entries are then
/// placed (in any order) and sorted.
struct Builder {
    rank: usize,
    part: Partitioner,
    weighted: bool,
    /// Degrees (at `i + 1`) until `prefix`, then offsets (in the window from `allocate`).
    offsets: Store<u64>,
    /// Entries of each node placed so far (while placing; 4 bytes per node, as degrees below
    /// 2^32 need).
    fill: Vec<u32>,
    targets: Targets,
    /// Raw weights while placing, prefix sums after `finish` (empty when unweighted).
    weights: Store<f32>,
    windows: Option<CsrWindows>,
}

impl Builder {
    fn new(rank: usize, part: Partitioner, weighted: bool) -> Builder {
        let n = part.num_local(rank);
        Builder {
            rank,
            weighted,
            offsets: Store::from_vec(crate::comm::huge_vec(n + 1)),
            fill: Vec::new(),
            targets: Targets::zeros(part.num_nodes(), 0),
            weights: Store::from_vec(Vec::new()),
            windows: None,
            part,
        }
    }

    #[inline]
    fn count(&mut self, local: usize) {
        self.offsets[local + 1] += 1;
    }

    /// Turn the degrees into offsets; false (offsets unchanged) when a node has 2^32 entries or
    /// more. Returns the bytes the CSR will take.
    fn prefix(&mut self) -> Option<u64> {
        if self.offsets.iter().any(|&d| d > u64::from(u32::MAX)) {
            return None;
        }
        for i in 1..self.offsets.len() {
            self.offsets[i] += self.offsets[i - 1];
        }
        let entries = self.entries() as u64;
        let width = if Targets::narrow(self.part.num_nodes()) {
            4
        } else {
            8
        };
        Some(
            self.offsets.len() as u64 * 8
                + entries * width
                + if self.weighted { entries * 4 } else { 0 },
        )
    }

    fn entries(&self) -> usize {
        *self.offsets.last().expect("offsets") as usize
    }

    /// Allocate the targets (and weights) at their final size: in `windows` (offsets, targets,
    /// weights; each allocated for exactly this rank's bytes) when given and node-shared.
    fn allocate(&mut self, windows: Option<CsrWindows>) {
        let entries = self.entries();
        let weights = if self.weighted { entries } else { 0 };
        self.fill = vec![0; self.offsets.len() - 1];
        let shared = windows.as_ref().and_then(|CsrWindows(w)| {
            let n = self.offsets.len();
            let mut o = Store::in_window(w[0].clone(), self.rank, n)?;
            o.copy_from_slice(&self.offsets);
            let t = Targets::in_window(self.part.num_nodes(), w[1].clone(), self.rank, entries)?;
            Some((o, t, Store::in_window(w[2].clone(), self.rank, weights)?))
        });
        match shared {
            Some((o, t, w)) => {
                self.offsets = o;
                self.targets = t;
                self.weights = w;
                self.windows = windows;
            }
            None => {
                self.targets = Targets::zeros(self.part.num_nodes(), entries);
                self.weights = Store::from_vec(vec![0.0; weights]);
            }
        }
    }

    /// Place one entry of `local`; false when the node has more entries than were counted.
    #[inline]
    fn place(&mut self, local: usize, dst: NodeId, weight: f32) -> bool {
        let at = self.offsets[local] + u64::from(self.fill[local]);
        if at >= self.offsets[local + 1] {
            return false;
        }
        self.targets.set(at as usize, dst);
        if self.weighted {
            self.weights[at as usize] = weight;
        }
        self.fill[local] += 1;
        true
    }

    /// Whether every counted entry was placed.
    fn complete(&self) -> bool {
        self.fill
            .iter()
            .zip(self.offsets.windows(2))
            .all(|(&f, o)| u64::from(f) == o[1] - o[0])
    }

    fn finish(mut self, file_edges: u64, directed: bool) -> LocalGraph {
        debug_assert!(self.complete(), "every counted entry is placed");
        self.fill = Vec::new();
        let mut scratch = Vec::new();
        for i in 0..self.offsets.len() - 1 {
            let r = self.offsets[i] as usize..self.offsets[i + 1] as usize;
            self.targets
                .sort_range(r.clone(), &mut self.weights, &mut scratch);
            let mut acc = 0f32;
            for w in &mut self.weights[if self.weighted { r } else { 0..0 }] {
                acc += *w;
                *w = acc;
            }
        }
        if let Some(CsrWindows(w)) = &self.windows {
            for w in w {
                w.sync();
            }
        }
        LocalGraph {
            rank: self.rank,
            part: self.part,
            file_edges,
            directed,
            weighted: self.weighted,
            offsets: self.offsets,
            targets: self.targets,
            cum_weights: self.weighted.then_some(self.weights),
            windows: self.windows,
        }
    }
}

const RECORD: usize = 20;

fn pack(e: &Edge, out: &mut Vec<u8>) {
    out.extend_from_slice(&e.src.to_le_bytes());
    out.extend_from_slice(&e.dst.to_le_bytes());
    out.extend_from_slice(&e.weight.to_le_bytes());
}

fn unpack(b: &[u8]) -> impl Iterator<Item = Edge> + '_ {
    b.chunks_exact(RECORD).map(|r| Edge {
        src: u64::from_le_bytes(r[0..8].try_into().expect("8 bytes")),
        dst: u64::from_le_bytes(r[8..16].try_into().expect("8 bytes")),
        weight: f32::from_le_bytes(r[16..20].try_into().expect("4 bytes")),
    })
}

/// Send each edge (and its reverse, for undirected graphs) to the owner of its source.
pub fn route_edges(comm: &Comm, part: &Partitioner, edges: &[Edge], directed: bool) -> Vec<Edge> {
    let mut send = vec![Vec::new(); comm.size()];
    for e in edges {
        pack(e, &mut send[part.owner(e.src)]);
        if !directed && e.src != e.dst {
            let r = Edge {
                src: e.dst,
                dst: e.src,
                weight: e.weight,
            };
            pack(&r, &mut send[part.owner(r.src)]);
        }
    }
    let recv = comm.all_to_all_v(send);
    recv.iter().flat_map(|b| unpack(b)).collect()
}

/// The hyperslab of edges `rank` reads: `[start, end)`.
pub fn slice_of(num_edges: u64, rank: usize, ranks: usize) -> (u64, u64) {
    let (r, n) = (rank as u64, ranks as u64);
    let at = |r: u64| r * (num_edges / n) + r.min(num_edges % n);
    (at(r), at(r + 1))
}

/// How one adjacency entry travels during the load: its source as the owner's local index and
/// its target, each in 4 bytes when they fit, and its weight (weighted graphs).
#[derive(Clone, Copy)]
struct Wire {
    local: usize,
    target: usize,
    weight: usize,
}

impl Wire {
    fn new(part: &Partitioner, ranks: usize, weighted: bool) -> Wire {
        let most_local = (0..ranks).map(|r| part.num_local(r)).max().unwrap_or(0);
        let width = |fits: bool| if fits { 4 } else { 8 };
        Wire {
            local: width(most_local as u64 <= u64::from(u32::MAX)),
            target: width(Targets::narrow(part.num_nodes())),
            weight: if weighted { 4 } else { 0 },
        }
    }

    fn put(width: usize, v: u64, out: &mut Vec<u8>) {
        if width == 4 {
            out.extend_from_slice(&(v as u32).to_le_bytes());
        } else {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }

    fn get(width: usize, b: &[u8]) -> u64 {
        if width == 4 {
            u64::from(u32::from_le_bytes(b[..4].try_into().expect("4 bytes")))
        } else {
            u64::from_le_bytes(b[..8].try_into().expect("8 bytes"))
        }
    }
}

/// Collective: one pass over this rank's hyperslab in rounds of `chunk` edges, every entry
/// (an undirected edge's two) sent to the owner of its source; `at` receives each entry that
/// arrives here as (local source, target, weight). With `counting`, targets and weights stay
/// home (only the sources travel). Returns false on every rank if `at` refused an entry.
#[allow(clippy::too_many_arguments)]
fn stream_entries(
    comm: &Comm,
    file: &EdgeFile,
    part: &Partitioner,
    range: (u64, u64),
    chunk: u64,
    wire: Wire,
    counting: bool,
    mut at: impl FnMut(usize, NodeId, f32) -> bool,
) -> Result<bool> {
    let (start, end) = range;
    let rounds = comm.max_u64((end - start).div_ceil(chunk));
    let rec = wire.local
        + if counting {
            0
        } else {
            wire.target + wire.weight
        };
    let mut ok = true;
    for round in 0..rounds {
        let a = (start + round * chunk).min(end);
        let b = (a + chunk).min(end);
        let edges = agree(
            comm,
            if a < b {
                file.read_edges(a, b)
            } else {
                Ok(Vec::new())
            },
        )?;
        let mut send = vec![Vec::new(); comm.size()];
        let mut push = |src: NodeId, dst: NodeId, w: f32| {
            let (owner, local) = part.locate(src);
            let out = &mut send[owner];
            Wire::put(wire.local, local as u64, out);
            if !counting {
                Wire::put(wire.target, dst, out);
                if wire.weight > 0 {
                    out.extend_from_slice(&w.to_le_bytes());
                }
            }
        };
        for e in &edges {
            push(e.src, e.dst, e.weight);
            if !file.directed && e.src != e.dst {
                push(e.dst, e.src, e.weight);
            }
        }
        drop(edges);
        let recv = comm.all_to_all_v(send);
        for r in recv.iter().flat_map(|b| b.chunks_exact(rec)) {
            let local = Wire::get(wire.local, r) as usize;
            let (dst, w) = if counting {
                (0, 1.0)
            } else {
                let t = &r[wire.local..];
                let w = if wire.weight > 0 {
                    f32::from_le_bytes(t[wire.target..wire.target + 4].try_into().expect("4 bytes"))
                } else {
                    1.0
                };
                (Wire::get(wire.target, t), w)
            };
            ok &= at(local, dst, w);
        }
    }
    Ok(comm.all_reduce_u64(&[u64::from(!ok)], crate::comm::ReduceOp::Max)[0] == 0)
}

/// Collective: load `path` partitioned over all ranks of `comm`, reading it twice (degrees,
/// then entries) so that no rank holds more than its final CSR and one round's buffers.
/// `counted(bytes)` (collective, the same answer on every rank) is told this rank's CSR size
/// once the degrees are counted, before the entries are read: an error ends the load (a memory
/// budget), `true` asks for the CSR in node-shared windows ([`LocalGraph::windows`]), which the
/// node's ranks map when they walk across each other's nodes.
pub fn load(
    comm: &Comm,
    path: &Path,
    scheme: Scheme,
    chunk_edges: u64,
    counted: impl FnOnce(u64) -> Result<bool>,
) -> Result<LocalGraph> {
    let file = agree(comm, EdgeFile::open(path))?;
    let part = Partitioner::new(scheme, file.num_nodes, comm.size());
    let fp = part.fingerprint();
    let same = comm.all_reduce_u64(&[fp, !fp], crate::comm::ReduceOp::Max);
    agree(
        comm,
        if same[0] == fp && same[1] == !fp {
            Ok(())
        } else {
            Err(Error::Mismatch(format!(
                "{}: ranks disagree on the partition (fingerprint {fp:016x}); do all ranks see the same file?",
                path.display()
            )))
        },
    )?;
    let range = slice_of(file.num_edges, comm.rank(), comm.size());
    let chunk = chunk_edges.max(1);
    let wire = Wire::new(&part, comm.size(), file.weighted);
    let mut b = Builder::new(comm.rank(), part.clone(), file.weighted);
    let n = b.offsets.len() - 1;
    let in_range = stream_entries(comm, &file, &part, range, chunk, wire, true, |l, _, _| {
        l < n && {
            b.count(l);
            true
        }
    })?;
    let bytes = agree(
        comm,
        b.prefix().ok_or_else(|| {
            Error::bad_input(
                path,
                "a node has 2^32 adjacency entries or more, which this build does not hold",
            )
        }),
    )?;
    let windows = agree(comm, counted(bytes))?.then(|| {
        let (entries, narrow) = (b.entries(), Targets::narrow(part.num_nodes()));
        let weights = if file.weighted { entries * 4 } else { 0 };
        let w = [
            comm.node_window((n + 1) * 8),
            comm.node_window(entries * if narrow { 4 } else { 8 }),
            comm.node_window(weights),
        ];
        // The same on every rank: windows are node-shared, or none is.
        w[0].node_span()
            .is_some()
            .then(|| CsrWindows(w.map(Arc::new)))
    });
    b.allocate(windows.flatten());
    let placed = in_range
        && stream_entries(comm, &file, &part, range, chunk, wire, false, |l, d, w| {
            l < n && b.place(l, d, w)
        })?;
    let complete = comm.all_reduce_u64(&[u64::from(!b.complete())], crate::comm::ReduceOp::Max);
    if !placed || complete[0] != 0 {
        return Err(Error::bad_input(
            path,
            "the edge datasets changed between the load's two passes, or a rank received an entry of a node it does not own: is another job writing the file?",
        ));
    }
    let g = b.finish(file.num_edges, file.directed);
    if g.windows.is_some() {
        // Every rank of the node has written its part before any reads another's.
        comm.barrier();
    }
    log::debug!(
        "rank {}: {} nodes, {} adjacency entries ({} bytes)",
        comm.rank(),
        g.num_local(),
        g.local_entries(),
        g.bytes()
    );
    Ok(g)
}

/// Collective: a fingerprint of the graph's content (every adjacency entry and its weight), the
/// same for any number of ranks. Checkpoints carry it so that a resume on another graph is refused.
pub fn digest(comm: &Comm, g: &LocalGraph) -> u64 {
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut sum = 0u64;
    for i in 0..g.num_local() {
        let src = g.part.global(g.rank, i);
        let cw = g.cum_weights(i);
        for (j, dst) in g.neighbors(i).iter().enumerate() {
            let w = cw.map_or(0, |c| {
                u64::from((c[j] - if j == 0 { 0.0 } else { c[j - 1] }).to_bits())
            });
            // 24 bits per entry: the sum cannot overflow below 2^40 entries.
            sum += mix(mix(src ^ mix(dst)) ^ w) & 0xFF_FFFF;
        }
    }
    let total = comm.sum_u64(sum);
    mix(total ^ mix(g.num_nodes()) ^ u64::from(g.directed))
}

/// Whole-graph statistics, computed collectively.
#[derive(Debug, serde::Serialize)]
pub struct GraphStats {
    pub num_nodes: u64,
    pub file_edges: u64,
    pub adjacency_entries: u64,
    pub directed: bool,
    pub weighted: bool,
    pub min_degree: u64,
    pub max_degree: u64,
    pub mean_degree: f64,
    pub isolated_nodes: u64,
    pub ranks: usize,
    pub max_rank_nodes: u64,
    pub mean_rank_nodes: f64,
    pub max_rank_entries: u64,
    pub mean_rank_entries: f64,
    pub partition_fingerprint: String,
}

pub fn stats(comm: &Comm, g: &LocalGraph) -> GraphStats {
    use crate::comm::ReduceOp::{Max, Min, Sum};
    let n = g.num_local();
    let degs = (0..n).map(|i| g.degree(i) as u64);
    let (mn, mx) = degs
        .clone()
        .fold((u64::MAX, 0), |(a, b), d| (a.min(d), b.max(d)));
    let isolated = degs.filter(|&d| d == 0).count() as u64;
    let sums = comm.all_reduce_u64(&[g.local_entries(), isolated, n as u64], Sum);
    let maxs = comm.all_reduce_u64(&[mx, n as u64, g.local_entries()], Max);
    let mins = comm.all_reduce_u64(&[mn], Min);
    let ranks = comm.size();
    GraphStats {
        num_nodes: g.num_nodes(),
        file_edges: g.file_edges,
        adjacency_entries: sums[0],
        directed: g.directed,
        weighted: g.weighted,
        min_degree: mins[0],
        max_degree: maxs[0],
        mean_degree: sums[0] as f64 / g.num_nodes() as f64,
        isolated_nodes: sums[1],
        ranks,
        max_rank_nodes: maxs[1],
        mean_rank_nodes: sums[2] as f64 / ranks as f64,
        max_rank_entries: maxs[2],
        mean_rank_entries: sums[0] as f64 / ranks as f64,
        partition_fingerprint: format!("{:016x}", g.part.fingerprint()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::local;
    use proptest::prelude::*;
    use std::collections::BTreeMap;
    use std::time::Duration;

    fn adjacency(graphs: &[LocalGraph]) -> BTreeMap<NodeId, Vec<NodeId>> {
        let mut m = BTreeMap::new();
        for g in graphs {
            for i in 0..g.num_local() {
                m.insert(g.part.global(g.rank, i), g.neighbors(i).to_vec());
            }
        }
        m
    }

    fn build(edges: &[Edge], n: u64, ranks: usize, directed: bool) -> Vec<LocalGraph> {
        local::run(ranks, Duration::from_secs(30), |c| {
            let part = Partitioner::new(Scheme::Striped, n, c.size());
            let (a, b) = slice_of(edges.len() as u64, c.rank(), c.size());
            let mine = &edges[a as usize..b as usize];
            let entries = route_edges(&c, &part, mine, directed);
            LocalGraph::from_entries(
                c.rank(),
                part,
                &entries,
                edges.len() as u64,
                directed,
                false,
            )
        })
    }

    proptest! {
        #[test]
        fn n_rank_build_holds_the_one_rank_graph(
            raw in prop::collection::vec((0u64..40, 0u64..40), 1..200),
            ranks in 2usize..5,
            directed in any::<bool>(),
        ) {
            let edges: Vec<Edge> = raw.iter().map(|&(s, d)| Edge { src: s, dst: d, weight: 1.0 }).collect();
            let one = adjacency(&build(&edges, 40, 1, directed));
            let many = adjacency(&build(&edges, 40, ranks, directed));
            prop_assert_eq!(&one, &many);
            // every record arrives exactly once: entries = edges (+ reverses of non-loops)
            let loops = edges.iter().filter(|e| e.src == e.dst).count();
            let expect = if directed { edges.len() } else { 2 * edges.len() - loops };
            prop_assert_eq!(one.values().map(Vec::len).sum::<usize>(), expect);
        }
    }

    /// Every rank's CSR, weights as (target, weight) per node, keyed by global node.
    fn weighted_adjacency<'a>(
        graphs: impl IntoIterator<Item = &'a LocalGraph>,
    ) -> BTreeMap<NodeId, Vec<(NodeId, u32)>> {
        let mut m = BTreeMap::new();
        for g in graphs {
            for i in 0..g.num_local() {
                let cum = g.cum_weights(i).unwrap_or(&[]);
                let v = g
                    .neighbors(i)
                    .iter()
                    .enumerate()
                    .map(|(j, d)| {
                        let w = if j == 0 { cum[0] } else { cum[j] - cum[j - 1] };
                        (d, w.to_bits())
                    })
                    .collect();
                m.insert(g.part.global(g.rank, i), v);
            }
        }
        m
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]
        /// The two-pass load (rounds of a few edges, any rank count, both partitions) holds
        /// what one rank builds from the whole edge list in memory, weights included.
        #[test]
        fn the_two_pass_load_holds_the_in_memory_graph(
            raw in prop::collection::vec((0u64..30, 0u64..30, 1u32..8), 1..120),
            ranks in 1usize..5,
            chunk in 1u64..9,
            directed in any::<bool>(),
            block in any::<bool>(),
            share in any::<bool>(),
        ) {
            let edges: Vec<Edge> = raw
                .iter()
                .map(|&(s, d, w)| Edge { src: s, dst: d, weight: w as f32 * 0.5 })
                .collect();
            let d = tempfile::tempdir().unwrap();
            let path = d.path().join("g.h5");
            crate::graph::h5::write_edges(&path, &edges, 30, directed, true).unwrap();
            let mut entries = Vec::new();
            for e in &edges {
                entries.push(*e);
                if !directed && e.src != e.dst {
                    entries.push(Edge { src: e.dst, dst: e.src, weight: e.weight });
                }
            }
            let part = Partitioner::new(Scheme::Striped, 30, 1);
            let want = LocalGraph::from_entries(0, part, &entries, edges.len() as u64, directed, true);
            let scheme = if block { Scheme::Block } else { Scheme::Striped };
            // Ranks in nodes of two; with `share` the CSR goes straight into node-shared
            // windows, which the node's other rank maps.
            let got = local::run_nodes(ranks, 2, Duration::from_secs(30), |c| {
                let g = load(&c, &path, scheme, chunk, |_| Ok(share)).unwrap();
                let mapped = crate::graph::node::NodeGraph::new(&c, &g).map(|ng| {
                    let mut m = BTreeMap::new();
                    for r in (0..c.size()).filter(|&r| ng.has(r)) {
                        for i in 0..g.part.num_local(r) {
                            let (nb, _) = ng.adjacency(r, i).unwrap();
                            m.insert(g.part.global(r, i), nb.to_vec());
                        }
                    }
                    m
                });
                (g, mapped)
            });
            let want_adj = weighted_adjacency([&want]);
            prop_assert_eq!(weighted_adjacency(got.iter().map(|(g, _)| g)), want_adj.clone());
            for (g, mapped) in &got {
                prop_assert_eq!(g.windows.is_some(), share);
                prop_assert_eq!(g.targets.width(), 4);
                prop_assert_eq!(g.file_edges, edges.len() as u64);
                prop_assert_eq!(g.bytes(), (g.offsets.len() * 8 + g.targets.len() * 8) as u64);
                // Every rank of the node maps its node's CSRs as their owners hold them.
                let mapped = mapped.as_ref().expect("in-process nodes share windows");
                for (v, nb) in mapped {
                    let own: Vec<NodeId> = want_adj[v].iter().map(|&(d, _)| d).collect();
                    prop_assert_eq!(nb, &own);
                }
            }
        }
    }

    #[test]
    fn ids_beyond_32_bits_are_stored_wide() {
        let far = 1u64 << 33;
        let edges = [(0, far - 1), (far - 1, 5), (0, 5)].map(|(s, d)| Edge {
            src: s,
            dst: d,
            weight: 1.0,
        });
        let part = Partitioner::new(Scheme::Block, far, 1 << 12);
        let mine: Vec<Edge> = edges
            .iter()
            .filter(|e| part.owner(e.src) == 0)
            .copied()
            .collect();
        let g = LocalGraph::from_entries(0, part, &mine, 3, true, false);
        assert_eq!(g.targets.width(), 8);
        assert_eq!(g.neighbors(0).to_vec(), [5, far - 1]);
        assert!(g.has_edge(0, far - 1) && !g.has_edge(0, far - 2));
    }

    #[test]
    fn undirected_csr_has_both_directions_sorted() {
        let edges = [(0, 2), (1, 0), (2, 1), (0, 3)].map(|(s, d)| Edge {
            src: s,
            dst: d,
            weight: 1.0,
        });
        let g = &build(&edges, 4, 1, false)[0];
        assert_eq!(g.neighbors(0).to_vec(), [1, 2, 3]);
        assert_eq!(g.neighbors(3).to_vec(), [0]);
        assert!(g.has_edge(2, 1) && !g.has_edge(3, 2));
    }
}
