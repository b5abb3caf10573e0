//! GraphSAGE the graphscale way (`--strategy sharded`, the default): every rank owns its nodes'
//! adjacency (the walks' partitioned CSR) and feature rows (an RMA window, f32 or f16 as the
//! file stores them). A step's seeds are the rank's own training nodes of the global step. Hop
//! by hop, the frontier's nodes of other ranks go to their owners in one exchange, which sample
//! their neighbours and answer (frontiers are deduplicated per hop by the sampler); the input
//! rows of other ranks are read one-sidedly (`MPI_Get`), except those of the read-only cache of
//! remote feature rows, which never goes stale.

use rustc_hash::FxHashMap;

use crate::comm::{decode_u64, encode_u64, Comm, ReduceOp, Window};
use crate::config::{Dtype, FeatureNorm};
use crate::error::Result;
use crate::estimate::SageHeld;
use crate::graph::csr::{self, LocalGraph};
use crate::graph::h5::EdgeFile;
use crate::graph::node::NodeGraph;
use crate::graph::nodedata::{read_owned_rows, READ_ROWS};
use crate::graph::partition::Partitioner;
use crate::model::sage::{gather_means, Aggregator, Input, Sage, Work};
use crate::sample::neighbors::{pick, whole_block, Block};
use crate::sample::Rng;
use crate::spmd::agree;
use crate::stats::RankMetrics;
use crate::store::{add_row, decode_row, encode_row};
use crate::train::job::shm_fits;

use super::{Drawn, Learned, Source, INFER_CHUNK};

/// The default cache of remote feature rows holds this share of the rank's own rows: own
/// and cached rows then take about `1 / ranks + 1 / (8 ranks)` of the replicated baseline's
/// feature memory.
const CACHE_SHARE: usize = 8;

/// A read-only cache of remote feature rows: rows are admitted as they are first read until it
/// is full, then kept (sampling reaches a node in proportion to its degree, so the rows met
/// first are mostly the hubs'). Features never change: no copy is ever stale.
pub(super) struct FeatureCache {
    slot_of: FxHashMap<u64, u32>,
    /// The rows as their owners store them (f32 or f16).
    rows: Vec<u8>,
    capacity: usize,
}

/// This rank's nodes, their feature rows, and the way to everyone else's.
pub(super) struct Sharded<'a> {
    comm: &'a Comm,
    g: LocalGraph,
    cols: usize,
    dtype: Dtype,
    window: Window,
    /// The feature rows of the ranks on this node, read in place (a node-shared window), and
    /// whether the windows are node-shared (layer-wise inference's hidden rows too).
    node: NodeRows,
    shared: bool,
    /// The adjacency of the node's other ranks (node-shared), and whether it covers every
    /// rank (a hop then exchanges nothing).
    adjacency: Option<NodeGraph>,
    alone: bool,
    cache: FeatureCache,
    /// Scratch: one node's neighbours; where a step's input rows are.
    adj: Vec<u64>,
    located: Located,
}

impl<'a> Sharded<'a> {
    /// Collective: load this rank's adjacency and feature rows, scaled as `norm` says.
    /// Returns the source and whether the rows were scaled to sum 1.
    pub(super) fn load(
        comm: &'a Comm,
        at: &super::Placement,
        (cols, half): (usize, bool),
        norm: FeatureNorm,
    ) -> Result<(Sharded<'a>, bool)> {
        let dtype = if half { Dtype::F16 } else { Dtype::F32 };
        let rb = cols * dtype.size();
        // The ranks of a node share their adjacency, feature rows and layer-wise inference's
        // hidden rows where /dev/shm holds them: a rank samples its node's nodes and reads
        // their rows in place.
        let nodes = agree(comm, EdgeFile::open(&at.graph))?.num_nodes;
        let mine = Partitioner::new(at.partition, nodes, comm.size()).num_local(comm.rank());
        let mut share = false;
        let g = csr::load(
            comm,
            &at.graph,
            at.partition,
            csr::LOAD_CHUNK_EDGES,
            |csr| {
                let rows = mine * (rb + at.hidden_cols * dtype.size());
                share = at.node_memory && shm_fits(comm, csr + rows as u64);
                Ok(share)
            },
        )?;
        let rows = g.num_local();
        let adjacency = if share {
            NodeGraph::new(comm, &g)
        } else {
            None
        };
        let mut window = if share {
            comm.node_window(rows * rb)
        } else {
            comm.window(rows * rb)
        };
        let n = g.num_nodes() as usize;
        let mut negative = false;
        // Without features (`--input learned`) there is nothing to read.
        let read = window.with_local_mut(|bytes| {
            if cols == 0 {
                return Ok(());
            }
            let mut x = vec![0f32; cols];
            read_owned_rows(
                comm,
                (&at.graph, "features"),
                &g.part,
                (cols, dtype),
                |r, row| {
                    x.copy_from_slice(row);
                    negative |= x.iter().any(|&v| v < 0.0);
                    if norm == FeatureNorm::Row {
                        super::scale_rows(&mut x, cols);
                    }
                    encode_row(dtype, &x, &mut bytes[r * rb..(r + 1) * rb]);
                },
            )
        });
        agree(comm, read)?;
        let negative = comm.all_reduce_u64(&[u64::from(negative)], ReduceOp::Max)[0] != 0;
        let scaled =
            cols > 0 && (norm == FeatureNorm::Row || (norm == FeatureNorm::Auto && !negative));
        if norm == FeatureNorm::Auto && scaled {
            window.with_local_mut(|bytes| {
                let mut row = vec![0f32; cols];
                for chunk in bytes.chunks_exact_mut(rb.max(1)) {
                    decode_row(dtype, chunk, &mut row);
                    super::scale_rows(&mut row, cols);
                    encode_row(dtype, &row, chunk);
                }
            });
        }
        window.sync();
        comm.barrier();
        let node = NodeRows::of(&window, comm);
        // Whether a hop asks other ranks at all (the same answer on every rank).
        let alone = comm.size() == 1
            || comm.all_reduce_u64(
                &[u64::from(adjacency.as_ref().is_some_and(|a| {
                    (0..comm.size()).all(|r| r == comm.rank() || a.has(r))
                }))],
                ReduceOp::Min,
            )[0] == 1;
        // Rows off this node only: none when every rank shares it.
        let capacity = at
            .cache_rows
            .unwrap_or(rows / CACHE_SHARE)
            .min(n.saturating_sub(rows + node.rows(&g.part)));
        let source = Sharded {
            comm,
            g,
            cols,
            dtype,
            window,
            node,
            shared: share,
            adjacency,
            alone,
            // Reserved whole: pages are touched as rows arrive, and growth never copies.
            cache: FeatureCache {
                slot_of: FxHashMap::with_capacity_and_hasher(capacity, Default::default()),
                rows: Vec::with_capacity(capacity * rb),
                capacity,
            },
            adj: Vec::new(),
            located: Located::default(),
        };
        Ok((source, scaled))
    }

    /// Up to `fanout` sampled neighbours of this rank's node `v`, appended to `out`.
    fn sample_own(&mut self, v: u64, fanout: usize, rng: &mut Rng, out: &mut Vec<u64>) {
        self.adj.clear();
        let l = self.g.part.local_index(v);
        self.adj.extend(self.g.neighbors(l).iter());
        pick(&mut self.adj, fanout, rng, out);
    }

    /// Before sampling node `i` of `nodes` ([`Sharded::hop`]): nodes are scattered over memory,
    /// so a node's neighbour range is asked for `2 AHEAD` nodes before its sampling and its
    /// neighbours `AHEAD` before (on this node; another node's are sampled by their owner).
    fn ask_ahead(&self, nodes: &[u64], i: usize) {
        const AHEAD: usize = 8;
        if let Some(&w) = nodes.get(i + 2 * AHEAD) {
            self.hint(w, false);
        }
        if let Some(&w) = nodes.get(i + AHEAD) {
            self.hint(w, true);
        }
    }

    /// Hint the CPU to fetch node `v`'s neighbour range (its neighbours, with `nbrs`: the
    /// range itself was asked for earlier).
    fn hint(&self, v: u64, nbrs: bool) {
        let (me, o) = (self.comm.rank(), self.g.part.owner(v));
        let local = self.g.part.local_index(v);
        let node = self.adjacency.as_ref();
        if !nbrs {
            crate::sample::walk::prefetch_adjacency(&self.g, node, me, o, local);
        } else if o == me {
            self.g.neighbors(local).prefetch(256);
        } else if let Some((nb, _)) = node.and_then(|a| a.adjacency(o, local)) {
            nb.prefetch(256);
        }
    }

    /// As [`Sharded::sample_own`] for a node of rank `owner` on this node (its adjacency
    /// mapped here); false, sampling nothing, when `owner` is on another node.
    fn sample_on_node(
        &mut self,
        (owner, v): (usize, u64),
        fanout: usize,
        rng: &mut Rng,
        out: &mut Vec<u64>,
    ) -> bool {
        let local = self.g.part.local_index(v);
        let Some((nb, _)) = self
            .adjacency
            .as_ref()
            .and_then(|a| a.adjacency(owner, local))
        else {
            return false;
        };
        self.adj.clear();
        self.adj.extend(nb.iter());
        pick(&mut self.adj, fanout, rng, out);
        true
    }
}

/// Rows of `width` values stored as `dtype` in `window` by their owners under `part`.
pub(super) struct Rows<'w> {
    pub(super) comm: &'w Comm,
    pub(super) part: &'w crate::graph::partition::Partitioner,
    pub(super) window: &'w Window,
    /// `window`'s rows of the node's other ranks.
    pub(super) node: &'w NodeRows,
    pub(super) dtype: Dtype,
    pub(super) width: usize,
}

/// Where a row of a step's input is ([`Rows::locate`]): the kind in the top two bits, the index
/// (own row, cache slot, row read from its owner, or owner and row on this node) below.
const OWN: u64 = 0;
const CACHED: u64 = 1 << 62;
const FETCHED: u64 = 2 << 62;
const NODE: u64 = 3 << 62;
const INDEX: u64 = (1 << 62) - 1;

/// The rows of the other ranks of this rank's node, mapped in this process by a node-shared
/// window (`Comm::node_window`): read in place, neither copied nor cached. Empty for a private
/// window or a rank alone on its node.
#[derive(Default)]
pub(super) struct NodeRows {
    /// Per world rank: its bytes, if it shares this node (this rank's own are not here).
    parts: Vec<Option<(*const u8, usize)>>,
}

// SAFETY: the pointers are read-only views of node-shared memory whose rows no one writes
// while they are read (`NodeRows::part`); any thread may read them.
unsafe impl Send for NodeRows {}
// SAFETY: as for `Send`: shared access only reads.
unsafe impl Sync for NodeRows {}

impl NodeRows {
    /// The node's parts of `window`. Valid while `window` lives: its holder keeps both and
    /// drops this first (or with it).
    pub(super) fn of(window: &Window, comm: &Comm) -> NodeRows {
        let mut parts = vec![None; comm.size()];
        for (rank, base, len) in window.node_span().map_or(Vec::new(), |s| s.parts) {
            if rank != comm.rank() && len > 0 {
                parts[rank] = Some((base.cast_const(), len));
            }
        }
        NodeRows { parts }
    }

    /// Rank `owner`'s bytes, if it shares this node.
    fn part(&self, owner: usize) -> Option<&[u8]> {
        let (base, len) = self.parts.get(owner).copied().flatten()?;
        // SAFETY: `base` maps `len` bytes of `owner`'s part of a node-shared window that
        // outlives `self` (`NodeRows::of`). Those rows are written before a barrier (the
        // features at load, a hidden layer before its window is read) and only read after
        // it, so no write races these reads.
        Some(unsafe { std::slice::from_raw_parts(base, len) })
    }

    /// The bytes of a `NODE` row (`located` as [`Rows::locate`] puts it), `rb` long.
    fn row(&self, located: u64, rb: usize) -> &[u8] {
        let (owner, row) = ((located & INDEX) >> 32, (located & 0xffff_ffff) as usize);
        let part = self.part(owner as usize).expect("located on this node");
        &part[row * rb..(row + 1) * rb]
    }

    /// How many of `part`'s nodes are this node's other ranks'.
    fn rows(&self, part: &crate::graph::partition::Partitioner) -> usize {
        (0..self.parts.len())
            .filter(|&r| self.parts[r].is_some())
            .map(|r| part.num_local(r))
            .sum()
    }
}

/// A step's scratch for reading rows where they are: per input row where it is, and the rows
/// read from their owners.
#[derive(Default)]
pub(super) struct Located {
    at: Vec<u64>,
    fetched: Vec<u8>,
    /// Per input row the address of its bytes, wherever they are (the gather's rows).
    addr: Vec<usize>,
}

impl Rows<'_> {
    /// The rows of `input` (f32, in order) into `out`: this rank's from its window, those in
    /// `cache` from it, the rest read one-sidedly from their owners (and cached while the cache
    /// has room).
    pub(super) fn read(
        &self,
        input: &[u64],
        cache: Option<&mut FeatureCache>,
        m: &mut RankMetrics,
        out: &mut Vec<f32>,
    ) {
        let (f, dtype) = (self.width, self.dtype);
        let rb = f * dtype.size();
        out.clear();
        if f == 0 {
            return;
        }
        out.resize(input.len() * f, 0.0);
        let mut at = Vec::new();
        let remote = self.locate(input, cache.as_deref(), m, &mut at);
        self.window.with_local(|bytes| {
            for (i, &l) in at.iter().enumerate() {
                let r = (l & INDEX) as usize * rb;
                let src = match l & !INDEX {
                    OWN => &bytes[r..r + rb],
                    CACHED => &cache.as_ref().expect("a hit has a cache").rows[r..r + rb],
                    NODE => self.node.row(l, rb),
                    _ => continue,
                };
                decode_row(dtype, src, &mut out[i * f..(i + 1) * f]);
            }
        });
        let mut buf = Vec::new();
        self.fetch(&remote, input, cache, m, &mut buf);
        for (&(i, _), row) in remote.iter().flatten().zip(buf.chunks_exact(rb)) {
            let i = i as usize;
            decode_row(dtype, row, &mut out[i * f..(i + 1) * f]);
        }
    }

    /// The outermost block `b`'s own rows and neighbours' means ([`gather_means`]) read where
    /// the rows are: this rank's window, the cache, or a buffer of the rows read from their
    /// owners (the reads and cache admissions of [`Rows::read`], without copying every input
    /// row into one matrix first).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn gather(
        &self,
        b: &Block,
        input: &[u64],
        mut cache: Option<&mut FeatureCache>,
        m: &mut RankMetrics,
        scratch: &mut Located,
        own: &mut Vec<f32>,
        mean: &mut Vec<f32>,
    ) {
        let (f, dtype) = (self.width, self.dtype);
        let rb = f * dtype.size();
        let Located { at, fetched, addr } = scratch;
        let remote = self.locate(input, cache.as_deref(), m, at);
        self.fetch(&remote, input, cache.as_deref_mut(), m, fetched);
        let (cached, node) = (cache.as_deref(), self.node);
        self.window.with_local(|bytes| {
            // Where each row is, resolved once: the means then read a row (and ask for one
            // ahead) without a branch on its kind per reference.
            addr.clear();
            addr.extend(at.iter().map(|&a| {
                let (l, r) = (a & !INDEX, (a & INDEX) as usize * rb);
                let row = match l {
                    OWN => &bytes[r..r + rb],
                    CACHED => &cached.expect("a hit has a cache").rows[r..r + rb],
                    NODE => node.row(a, rb),
                    _ => &fetched[r..r + rb],
                };
                row.as_ptr() as usize
            }));
            let addr = &addr[..];
            // SAFETY: `addr[j]` is the start of `rb` bytes of the window, the cache, the fetched
            // rows or a node part, all borrowed unchanged for this closure (nothing writes
            // them while the means read).
            let src = |j: usize| unsafe { std::slice::from_raw_parts(addr[j] as *const u8, rb) };
            let add = |j: usize, acc: &mut [f32]| add_row(dtype, src(j), acc);
            let hint = |j: usize| crate::store::prefetch_range(addr[j] as *const u8, rb);
            gather_means(b, f, (add, hint), own, mean);
        });
    }

    /// Where each row of `input` is, into `at`; returns per owner the rows to read from it
    /// (input index, row), in the order of their `FETCHED` indices.
    fn locate(
        &self,
        input: &[u64],
        cache: Option<&FeatureCache>,
        m: &mut RankMetrics,
        at: &mut Vec<u64>,
    ) -> Vec<Vec<(u32, u32)>> {
        let me = self.comm.rank();
        let mut remote: Vec<Vec<(u32, u32)>> = vec![Vec::new(); self.comm.size()];
        let mut fetched = 0u64;
        at.clear();
        at.extend(input.iter().enumerate().map(|(i, &v)| {
            let (o, r) = self.part.locate(v);
            if o == me {
                m.local_rows += 1;
                OWN | r as u64
            } else if self.node.part(o).is_some() {
                m.node_rows += 1;
                NODE | (o as u64) << 32 | r as u64
            } else if let Some(&s) = cache.and_then(|c| c.slot_of.get(&v)) {
                m.cache_hits += 1;
                CACHED | u64::from(s)
            } else {
                remote[o].push((i as u32, r as u32));
                fetched += 1;
                FETCHED | (fetched - 1)
            }
        }));
        // The reads go owner by owner: number the fetched rows in that order.
        for (k, &(i, _)) in remote.iter().flatten().enumerate() {
            at[i as usize] = FETCHED | k as u64;
        }
        remote
    }

    /// Read the `remote` rows one-sidedly into `buf`, owner by owner (their `FETCHED` order),
    /// and admit them to the cache while it has room.
    fn fetch(
        &self,
        remote: &[Vec<(u32, u32)>],
        input: &[u64],
        cache: Option<&mut FeatureCache>,
        m: &mut RankMetrics,
        buf: &mut Vec<u8>,
    ) {
        let rb = self.width * self.dtype.size();
        let count = self
            .window
            .get_ordered(self.comm.watchdog(), remote, rb, 4096, buf);
        if let Some(c) = cache {
            for (&(i, _), row) in remote.iter().flatten().zip(buf.chunks_exact(rb)) {
                if c.slot_of.len() >= c.capacity {
                    break;
                }
                c.slot_of.insert(input[i as usize], c.slot_of.len() as u32);
                c.rows.extend_from_slice(row);
            }
        }
        m.cache_misses += count as u64;
        m.fetch_bytes += (count * rb) as u64;
        m.one_sided_bytes += (count * rb) as u64;
    }
}

impl Sharded<'_> {
    /// Collective: every own node's output rows with every neighbour, layer by layer over the
    /// whole graph (each layer's rows of all nodes once, instead of a tree of rows per node):
    /// a layer's input rows of other ranks are read one-sidedly, from the feature window for
    /// the first layer and from a window of the previous layer's rows after it. Only the own
    /// nodes' adjacency is needed: no sampling exchange.
    fn layerwise(
        &mut self,
        sage: &Sage,
        work: &mut Work,
        m: &mut RankMetrics,
        learned: Option<&Learned>,
    ) -> (Vec<u64>, Vec<f32>) {
        let (me, own) = (self.comm.rank(), self.g.num_local());
        let nodes: Vec<u64> = (0..own).map(|r| self.g.part.global(me, r)).collect();
        // The previous layer's window, with its rows of the node's other ranks.
        let (mut hidden, mut out, mut rows) = (None::<(Window, NodeRows)>, Vec::new(), Vec::new());
        let (mut scratch, mut means) = (Vec::new(), Vec::new());
        for l in 0..sage.layers() {
            let (dout, last) = (sage.dims[l + 1], l + 1 == sage.layers());
            // A hidden layer's rows go straight into the window the next layer reads
            // (collective), in the features' type (f16 features: f16 hidden rows, half the
            // memory and bytes); the last layer's, the scores, into `out`.
            let hb = dout * self.dtype.size();
            let mut next = (!last).then(|| match self.shared {
                true => self.comm.node_window(own * hb),
                false => self.comm.window(own * hb),
            });
            if last {
                out.reserve_exact(own * dout);
            }
            for (c, chunk) in nodes.chunks(INFER_CHUNK).enumerate() {
                let g = &self.g;
                let (block, input) = whole_block(chunk, |v, p| {
                    p.extend(g.neighbors(g.part.local_index(v)).iter());
                });
                // Mean or GCN over rows without a gradient: gathered where they are.
                let gather = sage.aggregator != Aggregator::Pool && (l > 0 || learned.is_none());
                let reader = Rows {
                    comm: self.comm,
                    part: &self.g.part,
                    window: hidden.as_ref().map_or(&self.window, |h| &h.0),
                    node: hidden.as_ref().map_or(&self.node, |h| &h.1),
                    dtype: self.dtype,
                    width: if l == 0 { self.cols } else { sage.dims[l] },
                };
                let cache = (l == 0).then_some(&mut self.cache);
                let z = if gather {
                    let at = &mut self.located;
                    reader.gather(&block, &input, cache, m, at, &mut rows, &mut means);
                    let x = Input::Means {
                        own: &rows,
                        mean: &means,
                    };
                    sage.layer_in(work, l, &block, x)
                } else {
                    reader.read(&input, cache, m, &mut rows);
                    if let (0, Some(lr)) = (l, learned) {
                        lr.join(&input, self.cols, &mut rows, &mut scratch, m);
                    }
                    sage.layer_in(work, l, &block, Input::Rows(&rows))
                };
                match &mut next {
                    None => out.extend_from_slice(z),
                    Some(w) => w.with_local_mut(|bytes| {
                        let at = c * INFER_CHUNK * hb;
                        let rows = bytes[at..at + z.len() / dout * hb].chunks_exact_mut(hb);
                        for (b, x) in rows.zip(z.chunks_exact(dout)) {
                            encode_row(self.dtype, x, b);
                        }
                    }),
                }
            }
            if let Some(w) = next {
                w.sync();
                self.comm.barrier();
                // The previous layer's window goes once every rank has read it (the barrier
                // above: every rank has finished this layer's reads).
                let node = NodeRows::of(&w, self.comm);
                hidden = Some((w, node));
            }
        }
        self.comm.barrier();
        (nodes, out)
    }
}

impl Source for Sharded<'_> {
    fn cols(&self) -> usize {
        self.cols
    }

    fn mine(&self, nodes: &[u64]) -> Vec<u64> {
        let me = self.comm.rank();
        nodes
            .iter()
            .copied()
            .filter(|&v| self.g.part.owner(v) == me)
            .collect()
    }

    fn batch(
        &mut self,
        seeds: &[u64],
        fanouts: &[usize],
        rng: &mut Rng,
        m: &mut RankMetrics,
        out: &mut Drawn,
    ) {
        out.blocks
            .sample_by_hop(seeds, fanouts, |dst, fanout, c, p| {
                self.hop(dst, fanout, rng, c, p)
            });
        let reader = Rows {
            comm: self.comm,
            part: &self.g.part,
            window: &self.window,
            node: &self.node,
            dtype: self.dtype,
            width: self.cols,
        };
        let (input, cache) = (&out.blocks.input, Some(&mut self.cache));
        if out.gather {
            let (b, own, mean) = (&out.blocks.blocks[0], &mut out.rows, &mut out.means);
            reader.gather(b, input, cache, m, &mut self.located, own, mean);
        } else {
            reader.read(input, cache, m, &mut out.rows);
        }
    }

    fn infer(
        &mut self,
        sage: &Sage,
        work: &mut Work,
        m: &mut RankMetrics,
        learned: Option<&Learned>,
    ) -> (Vec<u64>, Vec<f32>) {
        self.layerwise(sage, work, m, learned)
    }

    /// One exchange of ids and answers per hop, also for a rank without a frontier.
    fn hop(
        &mut self,
        dst: &[u64],
        fanout: usize,
        rng: &mut Rng,
        counts: &mut Vec<u32>,
        picked: &mut Vec<u64>,
    ) {
        let (me, ranks) = (self.comm.rank(), self.comm.size());
        if self.alone {
            // Every node's adjacency is here: this rank's own or its node's.
            for (i, &v) in dst.iter().enumerate() {
                self.ask_ahead(dst, i);
                let (o, before) = (self.g.part.owner(v), picked.len());
                if o == me || !self.sample_on_node((o, v), fanout, rng, picked) {
                    self.sample_own(v, fanout, rng, picked);
                }
                counts.push((picked.len() - before) as u32);
            }
            return;
        }
        let mut ask: Vec<Vec<u64>> = vec![Vec::new(); ranks];
        let on_node = |o: usize| self.adjacency.as_ref().is_some_and(|a| a.has(o));
        for &v in dst {
            let o = self.g.part.owner(v);
            if o != me && !on_node(o) {
                ask[o].push(v);
            }
        }
        let send: Vec<Vec<u8>> = ask.iter().map(|a| encode_u64(a)).collect();
        let asked = self.comm.all_to_all_v(send);
        // Answer: per asked node its count, then every sampled neighbour.
        let mut reply = Vec::with_capacity(ranks);
        let mut got = Vec::new();
        for bytes in &asked {
            let ids = decode_u64(bytes);
            let mut n = Vec::with_capacity(ids.len());
            got.clear();
            for (i, &v) in ids.iter().enumerate() {
                self.ask_ahead(&ids, i);
                let before = got.len();
                self.sample_own(v, fanout, rng, &mut got);
                n.push((got.len() - before) as u64);
            }
            n.extend_from_slice(&got);
            reply.push(encode_u64(&n));
        }
        let answers: Vec<Vec<u64>> = self
            .comm
            .all_to_all_v(reply)
            .iter()
            .map(|b| decode_u64(b))
            .collect();
        // Per owner: the next answer's index, and where its neighbours start.
        let mut next: Vec<(usize, usize)> = ask.iter().map(|a| (0, a.len())).collect();
        for (i, &v) in dst.iter().enumerate() {
            self.ask_ahead(dst, i);
            let o = self.g.part.owner(v);
            let before = picked.len();
            if o == me {
                self.sample_own(v, fanout, rng, picked);
            } else if !self.sample_on_node((o, v), fanout, rng, picked) {
                let (i, at) = &mut next[o];
                let c = answers[o][*i] as usize;
                picked.extend_from_slice(&answers[o][*at..*at + c]);
                (*i, *at) = (*i + 1, *at + c);
            }
            counts.push((picked.len() - before) as u32);
        }
    }

    fn negative_pool(&mut self, size: usize, rng: &mut Rng) -> Vec<u64> {
        super::unsup::pool_of_shards(self.comm, &self.g, size, rng)
    }

    fn partitioner(&self) -> Option<crate::graph::partition::Partitioner> {
        Some(self.g.part.clone())
    }

    fn held(&self) -> SageHeld {
        let (own, rb) = (
            self.g.num_local() as u64,
            (self.cols * self.dtype.size()) as u64,
        );
        let g = &self.g;
        SageHeld {
            adjacency: g.bytes(),
            features: own * rb,
            // The rows and their index (a hash entry of 16 bytes, at most half the buckets
            // empty).
            cache: self.cache.capacity as u64 * (rb + 32),
            layer_rows: own,
            scored: own,
            hidden_value: self.dtype.size() as u64,
            chunk_inputs: super::largest_chunk(g.num_local(), |l| g.degree(l) as u64),
            mean_degree: g.local_entries() as f64 / g.num_local().max(1) as f64,
            // A round of the load (the edges read and exchanged) or of reading feature rows
            // (a slab: HDF5's rows, their f32 copy, the rows sent and received).
            load_transient: (80 * csr::LOAD_CHUNK_EDGES.min(g.file_edges)).max(
                READ_ROWS.min((g.num_nodes() as usize).div_ceil(self.comm.size())) as u64 * rb
                    / self.dtype.size() as u64
                    * (self.dtype.size() as u64 + 12),
            ),
            learned: 0,
            learned_width: 0,
        }
    }
}
