//! Random walks over the partitioned graph with walker migration. A walker always stands on a
//! node its current rank owns (with `node_walks`, a node of any rank on its machine, whose
//! adjacency is mapped here: `graph::node`): it picks the next node from that adjacency and is
//! shipped to the next node's owner in one aggregated exchange per superstep when the owner is
//! elsewhere, carrying its tokens not yet trained.
//!
//! Skip-gram pairs follow word2vec exactly, streamed: each kept token draws its reduced window
//! `w - b`, `b ~ U[0, w)`; a token b is predicted (output row) from every input token a at
//! distance d <= win(b) on either side. A walker carries its kept tokens (up to `CARRY`, across
//! ranks) and then emits them as a segment led by the `window` tokens before them (context,
//! already trained); a segment's pairs are those with at least one token new
//! (`Segments::pairs`). Frequent nodes are subsampled as word2vec does (`keep` per node).
//!
//! node2vec uses KnightKing's rejection sampling: propose x from the current node's neighbours,
//! accept with probability a(t, x) / max(1/p, 1, 1/q). Only when the outcome depends on whether x
//! is a neighbour of the previous node t, and t lives on another rank, is a query sent to t's owner.
//!
//! The engine does no communication: a superstep returns the walkers that leave
//! ([`WalkEngine::superstep_local`]) and, for node2vec, the queries for other ranks
//! ([`WalkEngine::queries`]); the driver moves them, the owners answer ([`WalkEngine::answer`]),
//! and the engine takes the answers ([`WalkEngine::resolve`]) and the walkers that arrived
//! ([`WalkEngine::deliver`]). [`WalkEngine::superstep`] runs the whole round over an all-to-all
//! the driver passes in.

use rand::{Rng as _, RngExt};

use super::Rng;
use crate::graph::csr::Nbrs;
use crate::graph::node::NodeGraph;
use crate::graph::{LocalGraph, NodeId};

const NONE: u64 = u64::MAX;

/// A walker carries up to this many kept tokens before they are emitted (and at its end), across
/// ranks: a walk then trains in long segments even when it changes rank every step or two (each
/// segment's first `window` tokens are context, trained before), and a walk of up to this length
/// trains whole, as word2vec trains a sentence. With `--window` at most 64 a walker record holds
/// at most 192 tokens (its count is one byte). BlogCatalog 10 x 80 at 4 ranks: 1.54M pairs/s at
/// 64, 1.62M at 128, 0.70M when every superstep emitted its tokens (docs/performance.md).
pub const CARRY: usize = 128;

#[derive(Clone, Debug, PartialEq)]
pub struct Walker {
    pub id: u64,
    pub prev: u64,
    pub cur: u64,
    /// Nodes visited so far, `cur` included.
    pub step: u32,
    /// `cur` has been visited (pairs emitted); only the move is pending.
    pub visited: bool,
    /// Kept tokens (node, reduced window), oldest first: `trained` already emitted (the last
    /// `window` of them, the context of what follows), then the tokens not yet emitted.
    pub hist: Vec<(u64, u32)>,
    pub trained: u32,
}

impl Walker {
    /// The checkpoint record: every id in 8 bytes.
    fn encode(&self, out: &mut Vec<u8>) {
        self.encode_ids(out, Ids::Wide);
    }

    /// The record in `ids`' width: `Ids::Narrow` (4-byte node ids, for graphs of fewer than
    /// 2^32 nodes) on the wire, where a walker crosses with its waiting tokens.
    fn encode_ids(&self, out: &mut Vec<u8>, ids: Ids) {
        let iw = ids.width();
        let node = |out: &mut [u8], v: u64| match ids {
            Ids::Wide => out.copy_from_slice(&v.to_le_bytes()),
            // NONE (no previous node) keeps its meaning as u32::MAX.
            Ids::Narrow => out.copy_from_slice(&(v as u32).to_le_bytes()),
        };
        // The record's size first, then its fields in place: one reservation, no per-byte
        // growth checks (walkers crossing with their tokens were 2% of a rank's CPU time at 2
        // simulated nodes).
        let (at, len) = (out.len(), Walker::record_len(self.hist.len(), ids));
        out.resize(at + len, 0);
        let rec = &mut out[at..];
        rec[..8].copy_from_slice(&self.id.to_le_bytes());
        node(&mut rec[8..8 + iw], self.prev);
        node(&mut rec[8 + iw..8 + 2 * iw], self.cur);
        let h = 8 + 2 * iw;
        rec[h..h + 4].copy_from_slice(&self.step.to_le_bytes());
        rec[h + 4] = u8::from(self.visited);
        rec[h + 5] = self.hist.len() as u8;
        rec[h + 6] = self.trained as u8;
        for (t, &(n, w)) in rec[h + 7..].chunks_exact_mut(iw + 1).zip(&self.hist) {
            node(&mut t[..iw], n);
            t[iw] = w as u8;
        }
    }

    /// Bytes of a record of `tokens` tokens with node ids of width `ids`.
    fn record_len(tokens: usize, ids: Ids) -> usize {
        let iw = ids.width();
        8 + 2 * iw + 7 + (iw + 1) * tokens
    }

    /// Move to `x` (not yet visited).
    fn step_to(&mut self, x: u64) {
        self.prev = self.cur;
        self.cur = x;
        self.step += 1;
        self.visited = false;
    }

    /// Decode bytes from a file: None unless they are a well-formed walker within the limits.
    fn try_decode(b: &[u8], num_nodes: u64, window: u32) -> Option<(Walker, usize)> {
        let n = *b.get(29)? as usize;
        let trained = *b.get(30)? as usize;
        let len = Walker::record_len(n, Ids::Wide);
        if b.len() < len || trained > n.min(window as usize) || n - trained > CARRY || b[28] > 1 {
            return None;
        }
        let (w, used) = Walker::decode(&b[..len]);
        let ok = w.cur < num_nodes
            && (w.prev < num_nodes || w.prev == NONE)
            && w.hist.iter().all(|&(v, r)| v < num_nodes && r <= window);
        ok.then_some((w, used))
    }

    fn decode(b: &[u8]) -> (Walker, usize) {
        Walker::decode_ids(b, Ids::Wide)
    }

    /// Decode a record of `encode_ids(.., ids)`; returns the walker and the bytes used.
    fn decode_ids(b: &[u8], ids: Ids) -> (Walker, usize) {
        Walker::decode_into(b, ids, Vec::new())
    }

    /// [`Walker::decode_ids`] into `hist`'s allocation (cleared), reserved for the tokens the
    /// walker may take before it emits them, so that it never grows.
    fn decode_into(b: &[u8], ids: Ids, mut hist: Vec<(u64, u32)>) -> (Walker, usize) {
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        let iw = ids.width();
        let node_at = |t: &[u8]| match ids {
            Ids::Wide => u64::from_le_bytes(t[..8].try_into().expect("8 bytes")),
            Ids::Narrow => match u32::from_le_bytes(t[..4].try_into().expect("4 bytes")) {
                u32::MAX => NONE,
                v => u64::from(v),
            },
        };
        let at = 8 + 2 * iw;
        let step = u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
        let visited = b[at + 4] != 0;
        let n = b[at + 5] as usize;
        let h = at + 7;
        let end = h + (iw + 1) * n;
        hist.clear();
        hist.reserve(n + CARRY);
        hist.extend(
            b[h..end]
                .chunks_exact(iw + 1)
                .map(|t| (node_at(t), u32::from(t[iw]))),
        );
        let w = Walker {
            id: u64_at(0),
            prev: node_at(&b[8..]),
            cur: node_at(&b[8 + iw..]),
            step,
            visited,
            hist,
            trained: u32::from(b[at + 6]),
        };
        (w, end)
    }
}

/// The width of node ids in a walker record.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Ids {
    /// 8 bytes (checkpoints, graphs of 2^32 nodes or more).
    Wide,
    /// 4 bytes, u32::MAX for "none".
    Narrow,
}

impl Ids {
    fn width(self) -> usize {
        match self {
            Ids::Wide => 8,
            Ids::Narrow => 4,
        }
    }

    /// Narrow ids when every node id and "none" fit in a u32.
    fn for_nodes(num_nodes: u64) -> Ids {
        if num_nodes < u64::from(u32::MAX) {
            Ids::Narrow
        } else {
            Ids::Wide
        }
    }
}

/// What a superstep produced on this rank.
#[derive(Default, Debug)]
pub struct StepOut {
    /// Walkers still walking on this rank after the exchange.
    pub active: usize,
    /// Tokens (node visits) processed here this superstep.
    pub tokens: u64,
    pub finished: u64,
}

#[derive(Clone, Debug)]
pub struct WalkParams {
    pub walk_length: u32,
    pub window: u32,
    pub walks_per_node: u32,
    pub node2vec: Option<(f32, f32)>,
    /// Walkers kept in flight per rank.
    pub in_flight: usize,
    /// Steps a walker may take in one superstep while it stays on this rank (>= 1). Several
    /// steps emit a walk's pairs back to back, as word2vec trains a sentence: the rows of a
    /// window are still in cache for the next token.
    pub local_steps: u32,
    /// Walk on across the ranks of this node (their adjacency mapped here, `NodeGraph`)
    /// instead of migrating to them; only steps to other nodes ship the walker.
    pub node_walks: bool,
}

/// A superstep's walk output: segments of walks (a walker's `CARRY` waiting tokens, or its last
/// ones when it ends), each led by the walk's `window` tokens before it (context, emitted in an
/// earlier segment). Token b of a segment is predicted from the inputs a with
/// |a - b| <= win(b), a != b, where a or b is new: word2vec's sentence, cut at rank crossings.
#[derive(Clone, Debug, Default)]
pub struct Segments {
    /// (node, reduced window) of every segment's tokens, segment after segment.
    pub tokens: Vec<(NodeId, u32)>,
    /// Per segment: (index of its first token in `tokens`, number of history tokens leading it).
    pub segs: Vec<(u32, u32)>,
}

impl Segments {
    pub fn clear(&mut self) {
        self.tokens.clear();
        self.segs.clear();
    }

    /// Segment `s` as (its tokens, number of leading history tokens).
    pub fn segment(&self, s: usize) -> (&[(NodeId, u32)], usize) {
        let (lo, h) = self.segs[s];
        let hi = self
            .segs
            .get(s + 1)
            .map_or(self.tokens.len(), |&(n, _)| n as usize);
        (&self.tokens[lo as usize..hi], h as usize)
    }

    /// Every skip-gram pair (input, output) of every segment, grouped by output token.
    pub fn pairs(&self, out: &mut Vec<(NodeId, NodeId)>) {
        for s in 0..self.segs.len() {
            let (t, h) = self.segment(s);
            for (b, &(nb, wb)) in t.iter().enumerate() {
                let (lo, hi) = group_inputs(t.len(), h, b, wb);
                out.extend((lo..hi).filter(|&a| a != b).map(|a| (t[a].0, nb)));
            }
        }
    }
}

/// The inputs of output token `b` (reduced window `w`) in a segment of `n` tokens led by `h`
/// history tokens: positions `lo..hi` except `b` itself. A history output only takes new inputs.
#[inline]
pub fn group_inputs(n: usize, h: usize, b: usize, w: u32) -> (usize, usize) {
    let w = w as usize;
    let lo = b.saturating_sub(w);
    let hi = (b + w + 1).min(n);
    if b < h {
        (lo.max(h), hi.max(h))
    } else {
        (lo, hi)
    }
}

/// word2vec's subsampling of frequent tokens with the frequency of node v estimated from its
/// degree: a 1/L share from being a start node plus, for the remaining steps, the stationary
/// probability deg(v) / sum(deg).
#[derive(Clone, Copy, Debug)]
struct Keep {
    subsample: f64,
    sum_deg: f64,
    nodes: f64,
    length: f64,
}

impl Keep {
    fn of(&self, degree: usize) -> f32 {
        if self.subsample <= 0.0 {
            return 1.0;
        }
        let (l, s) = (self.length, self.subsample);
        let f = 1.0 / (l * self.nodes) + (l - 1.0) / l * degree as f64 / self.sum_deg;
        (((f / s).sqrt() + 1.0) * s / f).min(1.0) as f32
    }
}

pub struct WalkEngine {
    params: WalkParams,
    walkers: Vec<Walker>,
    /// Walkers shipped by `superstep_local` and not yet delivered anywhere.
    in_transit: u64,
    /// Walker steps that moved to another rank (crossings), over the engine's life.
    pub crossed: u64,
    /// Local start nodes in a fixed random order.
    order: Vec<u32>,
    next_start: u64,
    total_starts: u64,
    /// Subsampling keep probability of each local node (`Keep::of` its degree).
    keep: Vec<f32>,
    keep_rule: Keep,
    rank: usize,
    ranks: usize,
    /// Width of node ids in walker records on the wire.
    ids: Ids,
    /// With `node_walks`: the adjacency of this node's ranks.
    node: Option<NodeGraph>,
    /// node2vec walkers waiting for an answer from another rank: (the previous node's owner,
    /// the walker, the proposed node, its uniform draw).
    asks: Vec<(usize, Walker, u64, f32)>,
    /// Token buffers of walkers that left or ended, for the walkers that arrive or start.
    spare: Vec<Vec<(u64, u32)>>,
    /// Test hook: every visit as (walker id, step, node).
    pub trace: Option<Vec<(u64, u32, u64)>>,
}

impl WalkEngine {
    /// `subsample` is word2vec's `sample` (0 disables); `sum_deg` is the graph's degree sum
    /// over every rank, and `node` the node-shared adjacency when `params.node_walks` (the
    /// driver gathers both: [`NodeGraph::new`]).
    pub fn new(
        g: &LocalGraph,
        params: WalkParams,
        subsample: f64,
        sum_deg: u64,
        node: Option<NodeGraph>,
        rng: &mut Rng,
    ) -> Self {
        let n = g.num_local();
        let mut order: Vec<u32> = (0..n as u32).collect();
        for i in (1..n).rev() {
            order.swap(i, rng.random_range(0..=i));
        }
        let keep_rule = Keep {
            subsample,
            sum_deg: sum_deg.max(1) as f64,
            nodes: g.num_nodes() as f64,
            length: f64::from(params.walk_length),
        };
        let keep = (0..n).map(|i| keep_rule.of(g.degree(i))).collect();
        let node = node.filter(|_| params.node_walks);
        WalkEngine {
            keep_rule,
            node,
            total_starts: u64::from(params.walks_per_node) * n as u64,
            params,
            walkers: Vec::new(),
            in_transit: 0,
            crossed: 0,
            order,
            next_start: 0,
            keep,
            rank: g.rank,
            ranks: g.part.ranks(),
            ids: Ids::for_nodes(g.num_nodes()),
            asks: Vec::new(),
            spare: Vec::new(),
            trace: None,
        }
    }

    /// Walks not yet started or still walking on this rank.
    pub fn pending(&self) -> u64 {
        self.total_starts - self.next_start + self.walkers.len() as u64 + self.in_transit
    }

    /// This rank's start cursor and its total starts per epoch.
    pub fn cursor(&self) -> (u64, u64) {
        (self.next_start, self.total_starts)
    }

    /// Walkers in `b`, bytes of walkers as `superstep_local` encodes them for another rank of a
    /// graph of `num_nodes` nodes (counted without decoding).
    pub fn count_encoded(b: &[u8], num_nodes: u64) -> u64 {
        let iw = Ids::for_nodes(num_nodes).width();
        let (mut o, mut n) = (0, 0);
        while o + 8 + 2 * iw + 7 <= b.len() {
            let hist = b[o + 8 + 2 * iw + 5] as usize;
            o += 8 + 2 * iw + 7 + hist * (iw + 1);
            n += 1;
        }
        n
    }

    /// The walkers in flight, encoded (for a checkpoint).
    pub fn encode_walkers(&self) -> Vec<u8> {
        self.encode_walkers_with(std::iter::empty())
    }

    /// [`WalkEngine::encode_walkers`] and the walkers in `arrived` (buffers as
    /// [`WalkEngine::deliver`] takes them) not yet delivered: a checkpoint holds them, while the
    /// run goes on to deliver them when it would have without the checkpoint.
    pub fn encode_walkers_with<'b>(&self, arrived: impl Iterator<Item = &'b [u8]>) -> Vec<u8> {
        let mut b = Vec::new();
        for w in &self.walkers {
            w.encode(&mut b);
        }
        for buf in arrived {
            let mut o = 0;
            while o < buf.len() {
                let (w, used) = Walker::decode_ids(&buf[o..], self.ids);
                o += used;
                w.encode(&mut b);
            }
        }
        b
    }

    /// Continue an epoch from a checkpoint: `next_start` starts taken, these walkers in flight
    /// (each standing on a node this rank owns).
    pub fn resume(&mut self, next_start: u64, walkers: &[u8]) {
        self.next_start = next_start.min(self.total_starts);
        let mut o = 0;
        while o < walkers.len() {
            let (w, used) = Walker::decode(&walkers[o..]);
            o += used;
            self.walkers.push(w);
        }
    }

    /// Split encoded walkers (from a checkpoint file) by the owner of their current node,
    /// checking every field against the graph and the window first.
    pub fn route_walkers(
        bytes: &[u8],
        part: &crate::graph::partition::Partitioner,
        window: u32,
    ) -> Result<Vec<Vec<u8>>, String> {
        let mut out = vec![Vec::new(); part.ranks()];
        let mut o = 0;
        while o < bytes.len() {
            let (w, used) = Walker::try_decode(&bytes[o..], part.num_nodes(), window)
                .ok_or_else(|| format!("malformed walker record at byte {o}"))?;
            o += used;
            w.encode(&mut out[part.owner(w.cur)]);
        }
        Ok(out)
    }

    /// Restart the start cursor for another epoch.
    pub fn new_epoch(&mut self) {
        self.next_start = 0;
    }

    /// One superstep: visit, move, answer node2vec's queries and deliver the walkers that
    /// cross, over `all_to_all` (the driver's collective: per destination rank a buffer out,
    /// per source rank a buffer in; every rank calls it in the same order). The walks'
    /// segments go to `out_segs`.
    pub fn superstep(
        &mut self,
        g: &LocalGraph,
        rng: &mut Rng,
        out_segs: &mut Segments,
        mut all_to_all: impl FnMut(Vec<Vec<u8>>) -> Vec<Vec<u8>>,
    ) -> StepOut {
        let (mut out, mut send) = self.superstep_local(g, rng, out_segs);
        if let Some(q) = self.queries() {
            let asked = all_to_all(q);
            let answers = all_to_all(Self::answer(g, &asked));
            self.resolve(g, &answers, &mut send);
        }
        let recv = all_to_all(send);
        self.deliver(recv.iter().map(Vec::as_slice));
        out.active = self.walkers.len();
        out
    }

    /// node2vec's queries of the last `superstep_local`, per rank that owns a walker's
    /// previous node (16 bytes each: that node and the proposal), or `None` for DeepWalk.
    /// Every node2vec rank takes part in the query round, with or without queries of its own.
    pub fn queries(&self) -> Option<Vec<Vec<u8>>> {
        self.params.node2vec?;
        let mut send = vec![Vec::new(); self.ranks];
        for (owner, w, x, _) in &self.asks {
            send[*owner].extend_from_slice(&w.prev.to_le_bytes());
            send[*owner].extend_from_slice(&x.to_le_bytes());
        }
        Some(send)
    }

    /// The owner's side: per querying rank, one byte per query, 1 when the proposal is a
    /// neighbour of the previous node.
    pub fn answer(g: &LocalGraph, queries: &[Vec<u8>]) -> Vec<Vec<u8>> {
        queries
            .iter()
            .map(|b| {
                b.chunks_exact(16)
                    .map(|c| {
                        let t = u64::from_le_bytes(c[..8].try_into().expect("8 bytes"));
                        let x = u64::from_le_bytes(c[8..].try_into().expect("8 bytes"));
                        u8::from(g.has_edge(g.part.local_index(t), x))
                    })
                    .collect()
            })
            .collect()
    }

    /// Take the answers to [`WalkEngine::queries`] (per owner, in query order): a walker whose
    /// proposal is accepted moves (into `send` when it crosses), the others try again next
    /// superstep.
    pub fn resolve(&mut self, g: &LocalGraph, answers: &[Vec<u8>], send: &mut [Vec<u8>]) {
        let Some((_, q)) = self.params.node2vec else {
            return;
        };
        let mut cursor = vec![0usize; answers.len()];
        for (owner, w, x, u) in std::mem::take(&mut self.asks) {
            let yes = answers[owner][cursor[owner]] != 0;
            cursor[owner] += 1;
            // The proposal's own uniform decides: it fell between 1 and 1/q, and the answer
            // says which of the two a(t, x) is.
            let a = if yes { 1.0 } else { 1.0 / q };
            if u < a {
                let o = advance(g, w, x, send, self.ids, &mut self.spare);
                self.in_transit += 1;
                self.crossed += u64::from(o != self.rank);
            } else {
                self.walkers.push(w);
            }
        }
    }

    /// Walkers that arrived from other ranks (the buffers of `superstep_local`'s exchange).
    pub fn deliver<'b>(&mut self, bufs: impl Iterator<Item = &'b [u8]>) {
        for b in bufs {
            let mut o = 0;
            while o < b.len() {
                let hist = self.spare.pop().unwrap_or_default();
                let (w, used) = Walker::decode_into(&b[o..], self.ids, hist);
                o += used;
                self.walkers.push(w);
            }
        }
        self.in_transit = 0;
    }

    /// [`WalkEngine::superstep`] without its exchanges: returns the encoded walkers to ship,
    /// per destination rank, for the caller to send (with other data of the step) and hand to
    /// the receivers' [`WalkEngine::deliver`]. Until then they count as pending. node2vec
    /// walkers that wait for an answer are held for [`WalkEngine::queries`] and
    /// [`WalkEngine::resolve`], which add the accepted ones to the same buffers.
    pub fn superstep_local(
        &mut self,
        g: &LocalGraph,
        rng: &mut Rng,
        out_segs: &mut Segments,
    ) -> (StepOut, Vec<Vec<u8>>) {
        let n = g.num_local() as u64;
        while self.walkers.len() < self.params.in_flight && self.next_start < self.total_starts {
            let s = self.next_start;
            let local = self.order[(s % n) as usize] as usize;
            self.walkers.push(Walker {
                id: (s << 16) | self.rank as u64,
                prev: NONE,
                cur: g.part.global(self.rank, local),
                step: 1,
                visited: false,
                hist: self.spare.pop().unwrap_or_default(),
                trained: 0,
            });
            self.next_start += 1;
        }
        let mut out = StepOut::default();
        let mut send = vec![Vec::new(); self.ranks];
        let mut asks = std::mem::take(&mut self.asks);
        asks.clear();
        let mut queue = std::mem::take(&mut self.walkers).into_iter();
        let node = self.node.as_ref();
        let budget0 = self.params.local_steps.max(1);
        // Walkers advance in LANES interleaved lanes, one step per turn, so that the cache
        // misses of their steps overlap: a step's next node has its adjacency and keep
        // probability prefetched, and a DeepWalk step picks the neighbour's index one turn and
        // reads it the next, with the entry prefetched in between.
        let mut lanes: Vec<Lane> = Vec::with_capacity(LANES);
        loop {
            while lanes.len() < LANES {
                match queue.next() {
                    Some(w) => lanes.push(Lane {
                        w,
                        budget: budget0,
                        pick: None,
                    }),
                    None => break,
                }
            }
            if lanes.is_empty() {
                break;
            }
            let mut i = 0;
            while i < lanes.len() {
                let lane = &mut lanes[i];
                let w = &mut lane.w;
                let (owner, local) = g.part.locate(w.cur);
                let (nb, cum) = adjacency(g, node, self.rank, owner, local)
                    .expect("a walker stands on a node of this node's ranks");
                let go = if let Some(at) = lane.pick.take() {
                    Some(nb.get(at))
                } else {
                    if !w.visited {
                        if let Some(t) = &mut self.trace {
                            t.push((w.id, w.step, w.cur));
                        }
                        let keep = if owner == self.rank {
                            self.keep[local]
                        } else {
                            self.keep_rule.of(nb.len())
                        };
                        visit(&self.params, w, keep, rng, out_segs);
                        out.tokens += 1;
                    }
                    if w.step >= self.params.walk_length || nb.is_empty() {
                        emit(&self.params, w, out_segs);
                        out.finished += 1;
                        recycle(&mut self.spare, lanes.swap_remove(i).w.hist);
                        continue;
                    }
                    if self.params.node2vec.is_none() && cum.is_none() {
                        // DeepWalk: the index now, the neighbour next turn.
                        let at = (((rng.next_u64() >> 32) * nb.len() as u64) >> 32) as usize;
                        prefetch_addr(nb.addr(at));
                        lane.pick = Some(at);
                        i += 1;
                        continue;
                    }
                    match propose(&self.params, g, node, self.rank, w, (nb, cum), rng) {
                        Move::Go(x) => Some(x),
                        Move::Retry => {
                            let l = lanes.swap_remove(i);
                            self.walkers.push(l.w);
                            continue;
                        }
                        Move::Ask(x, u) => {
                            let l = lanes.swap_remove(i);
                            asks.push((g.part.owner(l.w.prev), l.w, x, u));
                            continue;
                        }
                    }
                };
                let x = go.expect("a move");
                lane.budget -= 1;
                let (xo, xl) = g.part.locate(x);
                let here = xo == self.rank || node.is_some_and(|n| n.has(xo));
                if lane.budget > 0 && here {
                    w.step_to(x);
                    if xo == self.rank {
                        prefetch(&self.keep[xl]);
                    }
                    prefetch_adjacency(g, node, self.rank, xo, xl);
                    i += 1;
                } else {
                    let l = lanes.swap_remove(i);
                    let o = advance(g, l.w, x, &mut send, self.ids, &mut self.spare);
                    self.in_transit += 1;
                    self.crossed += u64::from(o != self.rank);
                }
            }
        }
        self.asks = asks;
        (out, send)
    }
}

/// Walkers stepped in turn by `superstep` (enough to overlap a step's cache misses).
const LANES: usize = 16;

/// A walker in one of `superstep`'s lanes: its remaining steps this superstep, and the
/// neighbour index a DeepWalk step drew last turn (its entry prefetched).
struct Lane {
    w: Walker,
    budget: u32,
    pick: Option<usize>,
}

/// Hint the CPU to bring `x` into cache (no effect on values; a no-op off x86-64).
#[inline]
fn prefetch<T>(x: &T) {
    prefetch_addr(std::ptr::from_ref(x).cast());
}

/// Hint the CPU to bring the bytes at `p` into cache.
#[inline]
fn prefetch_addr(p: *const u8) {
    crate::store::prefetch_range(p, 1);
}

/// Prefetch where `owner`'s node `local` keeps its neighbour range.
#[inline]
pub(crate) fn prefetch_adjacency(
    g: &LocalGraph,
    node: Option<&NodeGraph>,
    me: usize,
    owner: usize,
    local: usize,
) {
    if owner == me {
        prefetch(&g.offsets[local]);
    } else if let Some(n) = node {
        n.prefetch(owner, local);
    }
}

/// Visit `w.cur`: unless subsampled away (`keep`, its keep probability), add it to the walker's
/// tokens; emit them once `CARRY` wait.
fn visit(p: &WalkParams, w: &mut Walker, keep: f32, rng: &mut Rng, out: &mut Segments) {
    w.visited = true;
    if keep < 1.0 && rng.random::<f32>() >= keep {
        return;
    }
    let win = p.window - rng.random_range(0..p.window);
    w.hist.push((w.cur, win));
    if w.hist.len() - w.trained as usize >= CARRY {
        emit(p, w, out);
    }
}

/// Emit the walker's waiting tokens as a segment led by its trained context, and keep the
/// last `window` tokens as the context of what follows.
fn emit(p: &WalkParams, w: &mut Walker, out: &mut Segments) {
    if w.hist.len() == w.trained as usize {
        return;
    }
    out.segs.push((out.tokens.len() as u32, w.trained));
    out.tokens.extend_from_slice(&w.hist);
    let drop = w.hist.len().saturating_sub(p.window as usize);
    w.hist.drain(..drop);
    w.trained = w.hist.len() as u32;
}

/// The neighbours (and weight prefix sums) of `owner`'s local node `local`: from this rank's
/// CSR, or mapped from another rank of the node; `None` for a rank of another node.
#[inline]
fn adjacency<'a>(
    g: &'a LocalGraph,
    node: Option<&'a NodeGraph>,
    me: usize,
    owner: usize,
    local: usize,
) -> Option<Adjacency<'a>> {
    if owner == me {
        return Some((g.neighbors(local), g.cum_weights(local)));
    }
    node?.adjacency(owner, local)
}

type Adjacency<'a> = (Nbrs<'a>, Option<&'a [f32]>);

fn propose(
    p: &WalkParams,
    g: &LocalGraph,
    node: Option<&NodeGraph>,
    me: usize,
    w: &Walker,
    adj: Adjacency,
    rng: &mut Rng,
) -> Move {
    let Some((p, q)) = p.node2vec else {
        return Move::Go(pick_neighbor(adj, rng));
    };
    let (ip, iq) = (1.0 / p, 1.0 / q);
    let a_max = ip.max(1.0).max(iq);
    if w.prev == NONE {
        return Move::Go(pick_neighbor(adj, rng));
    }
    let (po, pl) = g.part.locate(w.prev);
    let prev = adjacency(g, node, me, po, pl);
    for _ in 0..64 {
        let x = pick_neighbor(adj, rng);
        let u = rng.random::<f32>() * a_max;
        if x == w.prev {
            if u < ip {
                return Move::Go(x);
            }
            continue;
        }
        // a(t, x) is 1 or 1/q: below both accepts, above both rejects, without asking.
        if u < 1.0f32.min(iq) {
            return Move::Go(x);
        }
        if u >= 1.0f32.max(iq) {
            continue;
        }
        if let Some((t_nb, _)) = prev {
            let yes = t_nb.contains(x);
            if u < if yes { 1.0 } else { iq } {
                return Move::Go(x);
            }
            continue;
        }
        return Move::Ask(x, u);
    }
    Move::Retry
}

/// Ship `w`, stepped to `x`, to the owner of `x` (its token buffer goes to `spare`); returns
/// that owner.
fn advance(
    g: &LocalGraph,
    mut w: Walker,
    x: u64,
    send: &mut [Vec<u8>],
    ids: Ids,
    spare: &mut Vec<Vec<(u64, u32)>>,
) -> usize {
    w.step_to(x);
    let o = g.part.owner(x);
    w.encode_ids(&mut send[o], ids);
    recycle(spare, w.hist);
    o
}

/// Keep a walker's token buffer, emptied, for a walker that arrives or starts.
fn recycle(spare: &mut Vec<Vec<(u64, u32)>>, mut hist: Vec<(u64, u32)>) {
    hist.clear();
    spare.push(hist);
}

enum Move {
    Go(u64),
    Retry,
    /// Needs to know whether x is a neighbour of the previous node; carries the uniform draw.
    Ask(u64, f32),
}

#[inline]
fn pick_neighbor((nb, cum): Adjacency, rng: &mut Rng) -> u64 {
    match cum {
        None => nb.get((((rng.next_u64() >> 32) * nb.len() as u64) >> 32) as usize),
        Some(c) => {
            let total = *c.last().expect("non-empty adjacency");
            let r = rng.random::<f32>() * total;
            nb.get(c.partition_point(|&x| x <= r).min(nb.len() - 1))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::comm::local;
    use crate::graph::csr::{route_edges, slice_of};
    use crate::graph::partition::{Partitioner, Scheme};
    use crate::graph::Edge;
    use crate::sample::rng_for;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, HashSet};
    use std::time::Duration;

    /// Walk a graph on `ranks` in-process ranks; returns every walk as its node sequence.
    /// With `params.node_walks`, the ranks form nodes of `per_node` ranks.
    fn walks(edges: &[Edge], n: u64, ranks: usize, params: WalkParams, seed: u64) -> Vec<Vec<u64>> {
        walks_and_tokens(edges, n, (ranks, ranks), params, seed).0
    }

    /// [`walks`], and every token the ranks' segments emitted as new (not context), checking
    /// each segment's shape on the way.
    fn walks_and_tokens(
        edges: &[Edge],
        n: u64,
        (ranks, per_node): (usize, usize),
        params: WalkParams,
        seed: u64,
    ) -> (Vec<Vec<u64>>, Vec<u64>) {
        let window = params.window as usize;
        let traces = local::run_nodes(ranks, per_node, Duration::from_secs(60), |c| {
            let part = Partitioner::new(Scheme::Striped, n, c.size());
            let (a, b) = slice_of(edges.len() as u64, c.rank(), c.size());
            let entries = route_edges(&c, &part, &edges[a as usize..b as usize], false);
            let g = LocalGraph::from_entries(
                c.rank(),
                part,
                &entries,
                edges.len() as u64,
                false,
                false,
            );
            let mut rng = rng_for(seed, c.rank(), 3);
            let sum_deg = c.sum_u64(g.local_entries());
            let node = params.node_walks.then(|| NodeGraph::new(&c, &g)).flatten();
            let mut e = WalkEngine::new(&g, params.clone(), 0.0, sum_deg, node, &mut rng);
            e.trace = Some(Vec::new());
            let mut segs = Segments::default();
            let mut emitted = Vec::new();
            loop {
                segs.clear();
                e.superstep(&g, &mut rng, &mut segs, |s| c.all_to_all_v(s));
                for s in 0..segs.segs.len() {
                    let (t, h) = segs.segment(s);
                    assert!(h <= window && t.len() > h && t.len() - h <= CARRY);
                    emitted.extend(t[h..].iter().map(|&(v, _)| v));
                }
                if c.sum_u64(e.pending()) == 0 {
                    break;
                }
            }
            (e.trace.take().expect("trace on"), emitted)
        });
        let mut by_walk: BTreeMap<u64, Vec<(u32, u64)>> = BTreeMap::new();
        let mut emitted = Vec::new();
        for (trace, mut em) in traces {
            emitted.append(&mut em);
            for (id, step, node) in trace {
                by_walk.entry(id).or_default().push((step, node));
            }
        }
        let walks = by_walk
            .into_values()
            .map(|mut v| {
                v.sort_unstable();
                v.into_iter().map(|(_, node)| node).collect()
            })
            .collect();
        (walks, emitted)
    }

    /// word2vec's pairs of a whole sentence: (input a, output b) for |a - b| <= win(b), a != b.
    fn sentence_pairs(t: &[(u64, u32)]) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        for (b, &(nb, w)) in t.iter().enumerate() {
            for (a, &(na, _)) in t.iter().enumerate() {
                if a != b && a.abs_diff(b) <= w as usize {
                    out.push((na, nb));
                }
            }
        }
        out.sort_unstable();
        out
    }

    proptest! {
        /// A sentence cut into segments anywhere (each led by the last `window` tokens before
        /// it) yields exactly the whole sentence's pairs, each once.
        #[test]
        fn segments_cut_anywhere_yield_the_sentence_pairs(
            window in 1u32..6,
            raw in prop::collection::vec((0u64..7, 0u32..6), 1..40),
            cuts in prop::collection::vec(0usize..40, 0..6),
        ) {
            let t: Vec<(u64, u32)> = raw.iter().map(|&(n, b)| (n, window - b % window)).collect();
            let mut cuts: Vec<usize> = cuts.into_iter().filter(|&c| c > 0 && c < t.len()).collect();
            cuts.push(0);
            cuts.push(t.len());
            cuts.sort_unstable();
            cuts.dedup();
            let mut segs = Segments::default();
            for c in cuts.windows(2) {
                let h = c[0].min(window as usize);
                segs.segs.push((segs.tokens.len() as u32, h as u32));
                segs.tokens.extend_from_slice(&t[c[0] - h..c[1]]);
            }
            let mut got = Vec::new();
            segs.pairs(&mut got);
            got.sort_unstable();
            prop_assert_eq!(got, sentence_pairs(&t));
        }
    }

    fn edge_set(edges: &[Edge]) -> HashSet<(u64, u64)> {
        edges
            .iter()
            .flat_map(|e| [(e.src, e.dst), (e.dst, e.src)])
            .collect()
    }

    fn params(
        walk_length: u32,
        walks_per_node: u32,
        node2vec: Option<(f32, f32)>,
        local_steps: u32,
    ) -> WalkParams {
        WalkParams {
            walk_length,
            window: 3,
            walks_per_node,
            node2vec,
            in_flight: 64,
            local_steps,
            node_walks: false,
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        #[test]
        fn walks_follow_edges_and_have_full_length(
            raw in prop::collection::vec((0u64..30, 0u64..30), 1..120),
            ranks in 1usize..4,
            pq in prop::option::of((0.25f32..4.0, 0.25f32..4.0)),
            seed in any::<u64>(),
            local_steps in 1u32..8,
            per_node in 0usize..4,
        ) {
            let edges: Vec<Edge> = raw.iter().map(|&(s, d)| Edge { src: s, dst: d, weight: 1.0 }).collect();
            let set = edge_set(&edges);
            // per_node > 0: walks continue across the ranks of a node (node-shared adjacency)
            // and migrate between nodes.
            let p = WalkParams { node_walks: per_node > 0, ..params(6, 2, pq, local_steps) };
            let (ws, mut emitted) = walks_and_tokens(&edges, 30, (ranks, per_node.max(1)), p, seed);
            // Every visit is emitted as a new token exactly once, on some rank (walkers carry
            // their tokens across ranks and emit the rest when they end).
            let mut visited: Vec<u64> = ws.iter().flatten().copied().collect();
            visited.sort_unstable();
            emitted.sort_unstable();
            prop_assert_eq!(emitted, visited);
            // Every node starts walks_per_node walks, each visits walk_length nodes unless it
            // reaches a node without edges, and every step follows an edge.
            prop_assert_eq!(ws.len(), 60);
            for w in &ws {
                let isolated = !set.iter().any(|&(a, _)| a == w[0]);
                prop_assert_eq!(w.len(), if isolated { 1 } else { 6 });
                for s in w.windows(2) {
                    prop_assert!(set.contains(&(s[0], s[1])), "step {:?} is not an edge", s);
                }
            }
        }
    }

    #[test]
    fn long_walks_emit_every_token_once_across_carry_limits() {
        // Walks of 300 steps pass the carry limit twice; 3 ranks, node2vec with retries.
        let edges: Vec<Edge> = (0..40u64)
            .flat_map(|v| [(v, (v + 1) % 40), (v, (v * 7 + 3) % 40)])
            .map(|(src, dst)| Edge {
                src,
                dst,
                weight: 1.0,
            })
            .collect();
        for (pq, per_node) in [(None, 0), (Some((0.5, 2.0)), 0), (Some((0.5, 2.0)), 2)] {
            let p = WalkParams {
                node_walks: per_node > 0,
                ..params(300, 1, pq, 5)
            };
            let (ws, mut emitted) = walks_and_tokens(&edges, 40, (3, per_node.max(1)), p, 11);
            assert!(ws.iter().all(|w| w.len() == 300));
            let mut visited: Vec<u64> = ws.iter().flatten().copied().collect();
            visited.sort_unstable();
            emitted.sort_unstable();
            assert_eq!(emitted, visited);
        }
    }

    /// Chi-square of observed second-order transitions against node2vec's exact distribution
    /// P(x | t, v) proportional to 1/p (x = t), 1 (x adjacent to t), 1/q (otherwise). Returns the
    /// statistic and its degrees of freedom, over contexts (t, v) seen at least 200 times.
    fn node2vec_chi_square(
        ws: &[Vec<u64>],
        set: &HashSet<(u64, u64)>,
        p: f64,
        q: f64,
    ) -> (f64, f64) {
        let mut seen: BTreeMap<(u64, u64), BTreeMap<u64, f64>> = BTreeMap::new();
        for w in ws {
            for s in w.windows(3) {
                *seen
                    .entry((s[0], s[1]))
                    .or_default()
                    .entry(s[2])
                    .or_default() += 1.0;
            }
        }
        let (mut stat, mut dof) = (0.0, 0.0);
        for ((t, v), counts) in seen {
            let total: f64 = counts.values().sum();
            if total < 200.0 {
                continue;
            }
            let nbrs: Vec<u64> = set
                .iter()
                .filter(|&&(a, _)| a == v)
                .map(|&(_, b)| b)
                .collect();
            let alpha = |x: u64| {
                if x == t {
                    1.0 / p
                } else if set.contains(&(t, x)) {
                    1.0
                } else {
                    1.0 / q
                }
            };
            let z: f64 = nbrs.iter().map(|&x| alpha(x)).sum();
            for &x in &nbrs {
                let expect = total * alpha(x) / z;
                let got = counts.get(&x).copied().unwrap_or(0.0);
                stat += (got - expect).powi(2) / expect;
            }
            dof += (nbrs.len() - 1) as f64;
        }
        (stat, dof)
    }

    /// A small graph with triangles, a square and a tail (every kind of second-order move).
    fn mixed_graph() -> Vec<Edge> {
        [
            (0, 1),
            (1, 2),
            (2, 0),
            (2, 3),
            (3, 4),
            (4, 5),
            (5, 2),
            (5, 6),
            (6, 7),
            (1, 3),
            (7, 0),
        ]
        .map(|(s, d)| Edge {
            src: s,
            dst: d,
            weight: 1.0,
        })
        .to_vec()
    }

    #[test]
    fn node2vec_steps_follow_the_second_order_distribution_across_ranks() {
        let edges = mixed_graph();
        let set = edge_set(&edges);
        for (p, q, ranks, local_steps, per_node) in [
            (0.25, 4.0, 1, 1, 0),
            (0.25, 4.0, 1, 40, 0),
            (0.25, 4.0, 3, 1, 0),
            (4.0, 0.25, 3, 40, 0),
            (1.0, 1.0, 3, 1, 0),
            (0.25, 4.0, 3, 40, 2),
            (4.0, 0.25, 4, 40, 2),
        ] {
            // 3 ranks: previous nodes often live elsewhere, so the query round is exercised;
            // 40 local steps: walkers also move on without an exchange while they stay local;
            // per_node 2: previous nodes on the node are tested in place, others queried.
            let params = WalkParams {
                node_walks: per_node > 0,
                ..params(40, 400, Some((p, q)), local_steps)
            };
            let (ws, _) = walks_and_tokens(&edges, 8, (ranks, per_node.max(1)), params, 11);
            let (stat, dof) = node2vec_chi_square(&ws, &set, f64::from(p), f64::from(q));
            assert!(dof > 10.0, "too few contexts: {dof}");
            // Far above this (mean dof, sd sqrt(2 dof)) means the sampler is biased.
            let bound = dof + 5.0 * (2.0 * dof).sqrt();
            assert!(
                stat < bound,
                "p={p} q={q} ranks={ranks} per node {per_node}: chi-square {stat:.1} over {dof} dof"
            );
        }
    }

    #[test]
    fn deepwalk_steps_are_uniform_over_the_neighbours() {
        // First-order walks (the lanes' two-turn picks): x given (t, v) is uniform over v's
        // neighbours, on one rank, across ranks, and across the ranks of a node.
        let edges = mixed_graph();
        let set = edge_set(&edges);
        for (ranks, local_steps, per_node) in [(1, 40, 0), (3, 1, 0), (3, 40, 0), (4, 40, 2)] {
            let params = WalkParams {
                node_walks: per_node > 0,
                ..params(40, 400, None, local_steps)
            };
            let (ws, _) = walks_and_tokens(&edges, 8, (ranks, per_node.max(1)), params, 13);
            let (stat, dof) = node2vec_chi_square(&ws, &set, 1.0, 1.0);
            assert!(dof > 10.0, "too few contexts: {dof}");
            assert!(
                stat < dof + 5.0 * (2.0 * dof).sqrt(),
                "ranks={ranks} per node {per_node}: chi-square {stat:.1} over {dof} dof"
            );
        }
    }

    #[test]
    fn node2vec_with_p_q_one_has_the_deepwalk_step_distribution() {
        // With p = q = 1 every neighbour of v is equally likely whatever t was.
        let edges = mixed_graph();
        let set = edge_set(&edges);
        let ws = walks(&edges, 8, 2, params(40, 400, Some((1.0, 1.0)), 3), 5);
        let (stat, dof) = node2vec_chi_square(&ws, &set, 1.0, 1.0);
        assert!(
            stat < dof + 5.0 * (2.0 * dof).sqrt(),
            "chi-square {stat:.1} over {dof} dof"
        );
        // And a strongly biased setting is detected by the same statistic (the test can fail).
        let biased = walks(&edges, 8, 2, params(40, 400, Some((0.25, 4.0)), 3), 5);
        let (stat, dof) = node2vec_chi_square(&biased, &set, 1.0, 1.0);
        assert!(
            stat > dof + 5.0 * (2.0 * dof).sqrt(),
            "bias not visible: {stat:.1} over {dof}"
        );
    }

    proptest! {
        /// Walker records from a file: any bytes are decoded or refused, never a panic, and
        /// what is accepted stands on the graph.
        #[test]
        fn walker_records_from_files_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            let part = Partitioner::new(Scheme::Striped, 50, 3);
            if let Ok(parts) = WalkEngine::route_walkers(&bytes, &part, 5) {
                for (r, b) in parts.iter().enumerate() {
                    let mut o = 0;
                    while o < b.len() {
                        let (w, used) = Walker::decode(&b[o..]);
                        prop_assert!(w.cur < 50 && part.owner(w.cur) == r);
                        prop_assert!(w.trained as usize <= 5 && w.hist.len() <= 5 + CARRY);
                        o += used;
                    }
                }
            }
        }
    }

    #[test]
    fn walkers_survive_the_wire() {
        let w = Walker {
            id: 7,
            prev: NONE,
            cur: 42,
            step: 3,
            visited: true,
            hist: vec![(1, 10), (99, 3), (5, 1)],
            trained: 2,
        };
        let mut b = Vec::new();
        w.encode(&mut b);
        w.encode(&mut b);
        let (a, used) = Walker::decode(&b);
        assert_eq!(a, w);
        assert_eq!(Walker::decode(&b[used..]).0, w);
        // On the wire, narrow ids: half the bytes per id, and "no previous node" survives.
        let mut narrow = Vec::new();
        w.encode_ids(&mut narrow, Ids::Narrow);
        w.encode_ids(&mut narrow, Ids::Narrow);
        assert_eq!(narrow.len(), 2 * (23 + 5 * 3));
        let (a, used) = Walker::decode_ids(&narrow, Ids::Narrow);
        assert_eq!((a, used), (w.clone(), narrow.len() / 2));
        let moved = Walker { prev: 41, ..w };
        let mut b = Vec::new();
        moved.encode_ids(&mut b, Ids::Narrow);
        assert_eq!(Walker::decode_ids(&b, Ids::Narrow).0, moved);
        assert_eq!(Ids::for_nodes(1 << 31), Ids::Narrow);
        assert_eq!(Ids::for_nodes(1 << 32), Ids::Wide);
    }
}

#[cfg(test)]
mod count_tests {
    use super::*;

    /// Walkers are counted from their encoding without decoding, at both id widths.
    #[test]
    fn encoded_walkers_are_counted() {
        for (nodes, ids) in [(1000u64, Ids::Narrow), (1u64 << 33, Ids::Wide)] {
            let mut b = Vec::new();
            for k in 0..5u64 {
                let w = Walker {
                    id: k,
                    prev: NONE,
                    cur: k + 1,
                    step: 3,
                    visited: false,
                    hist: (0..k).map(|j| (j, 1)).collect(),
                    trained: 0,
                };
                w.encode_ids(&mut b, ids);
            }
            assert_eq!(WalkEngine::count_encoded(&b, nodes), 5);
            assert_eq!(WalkEngine::count_encoded(&[], nodes), 0);
        }
    }
}
