//! Random walks over the partitioned graph with walker migration. A walker always stands on a
//! node its current rank owns: it emits its skip-gram pairs there (so the center row of half of
//! them is local), picks the next node from the local adjacency, and is shipped to the next node's
//! owner in one aggregated exchange per superstep.
//!
//! Skip-gram pairs follow word2vec exactly, streamed: each kept token draws its reduced window
//! `w - b`, `b ~ U[0, w)`; a pair (i, j) at distance d is emitted with center j when d <= win(j)
//! and with center i when d <= win(i). Walkers carry the last `window` kept tokens and their
//! reduced windows. Frequent nodes are subsampled as word2vec does (`keep` per node).
//!
//! node2vec uses KnightKing's rejection sampling: propose x from the current node's neighbours,
//! accept with probability a(t, x) / max(1/p, 1, 1/q). Only when the outcome depends on whether x
//! is a neighbour of the previous node t, and t lives on another rank, is a query sent to t's owner.

use rand::{Rng as _, RngExt};

use super::Rng;
use crate::comm::Comm;
use crate::graph::{LocalGraph, NodeId};

const NONE: u64 = u64::MAX;

#[derive(Clone, Debug, PartialEq)]
pub struct Walker {
    pub id: u64,
    pub prev: u64,
    pub cur: u64,
    /// Nodes visited so far, `cur` included.
    pub step: u32,
    /// `cur` has been visited (pairs emitted); only the move is pending.
    pub visited: bool,
    /// Last kept tokens: (node, reduced window), oldest first.
    pub hist: Vec<(u64, u32)>,
}

impl Walker {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.id.to_le_bytes());
        out.extend_from_slice(&self.prev.to_le_bytes());
        out.extend_from_slice(&self.cur.to_le_bytes());
        out.extend_from_slice(&self.step.to_le_bytes());
        out.push(u8::from(self.visited));
        out.push(self.hist.len() as u8);
        for &(n, w) in &self.hist {
            out.extend_from_slice(&n.to_le_bytes());
            out.push(w as u8);
        }
    }

    fn decode(b: &[u8]) -> (Walker, usize) {
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        let step = u32::from_le_bytes(b[24..28].try_into().expect("4 bytes"));
        let visited = b[28] != 0;
        let n = b[29] as usize;
        let hist = (0..n)
            .map(|k| (u64_at(30 + 9 * k), u32::from(b[38 + 9 * k])))
            .collect();
        let w = Walker {
            id: u64_at(0),
            prev: u64_at(8),
            cur: u64_at(16),
            step,
            visited,
            hist,
        };
        (w, 30 + 9 * n)
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
}

pub struct WalkEngine {
    params: WalkParams,
    walkers: Vec<Walker>,
    /// Local start nodes in a fixed random order.
    order: Vec<u32>,
    next_start: u64,
    total_starts: u64,
    keep: Vec<f32>,
    rank: usize,
}

impl WalkEngine {
    /// `subsample` is word2vec's `sample` (0 disables). Collective (global degree sum).
    pub fn new(
        comm: &Comm,
        g: &LocalGraph,
        params: WalkParams,
        subsample: f64,
        rng: &mut Rng,
    ) -> Self {
        let n = g.num_local();
        let mut order: Vec<u32> = (0..n as u32).collect();
        for i in (1..n).rev() {
            order.swap(i, rng.random_range(0..=i));
        }
        // Token frequency of node v in the walk corpus: a 1/L share from being a start node plus,
        // for the remaining steps, the stationary probability deg(v) / sum(deg).
        let sum_deg = comm.sum_u64(g.local_entries()).max(1) as f64;
        let nn = g.num_nodes() as f64;
        let l = f64::from(params.walk_length);
        let keep = (0..n)
            .map(|i| {
                if subsample <= 0.0 {
                    return 1.0;
                }
                let f = 1.0 / (l * nn) + (l - 1.0) / l * g.degree(i) as f64 / sum_deg;
                (((f / subsample).sqrt() + 1.0) * subsample / f).min(1.0) as f32
            })
            .collect();
        WalkEngine {
            total_starts: u64::from(params.walks_per_node) * n as u64,
            params,
            walkers: Vec::new(),
            order,
            next_start: 0,
            keep,
            rank: g.rank,
        }
    }

    /// Walks not yet started or still walking on this rank.
    pub fn pending(&self) -> u64 {
        self.total_starts - self.next_start + self.walkers.len() as u64
    }

    /// Restart the start cursor for another epoch.
    pub fn new_epoch(&mut self) {
        self.next_start = 0;
    }

    /// One superstep (collective): visit, move, exchange. Pairs (center, context) go to `pairs`.
    pub fn superstep(
        &mut self,
        comm: &Comm,
        g: &LocalGraph,
        rng: &mut Rng,
        pairs: &mut Vec<(NodeId, NodeId)>,
    ) -> StepOut {
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
                hist: Vec::new(),
            });
            self.next_start += 1;
        }
        let mut out = StepOut::default();
        let mut send = vec![Vec::new(); comm.size()];
        let mut asks: Vec<(usize, Walker, u64)> = Vec::new();
        let walkers = std::mem::take(&mut self.walkers);
        for mut w in walkers {
            let local = g.part.local_index(w.cur);
            if !w.visited {
                self.visit(&mut w, local, rng, pairs);
                out.tokens += 1;
            }
            if w.step >= self.params.walk_length || g.degree(local) == 0 {
                out.finished += 1;
                continue;
            }
            match self.propose(g, &w, local, rng) {
                Move::Go(x) => self.advance(g, w, x, &mut send),
                Move::Retry => self.walkers.push(w),
                Move::Ask(x) => asks.push((g.part.owner(w.prev), w, x)),
            }
        }
        if let Some((p, q)) = self.params.node2vec {
            // Every rank takes part in the query round, with or without queries of its own.
            let answers = resolve_queries(comm, g, &asks);
            for ((_, w, x), yes) in asks.into_iter().zip(answers) {
                let a_max = (1.0 / p).max(1.0).max(1.0 / q);
                let a = if yes { 1.0 } else { 1.0 / q };
                if rng.random::<f32>() * a_max < a {
                    self.advance(g, w, x, &mut send);
                } else {
                    self.walkers.push(w);
                }
            }
        }
        for b in comm.all_to_all_v(send) {
            let mut o = 0;
            while o < b.len() {
                let (w, used) = Walker::decode(&b[o..]);
                o += used;
                self.walkers.push(w);
            }
        }
        out.active = self.walkers.len();
        out
    }

    fn visit(&self, w: &mut Walker, local: usize, rng: &mut Rng, pairs: &mut Vec<(u64, u64)>) {
        w.visited = true;
        let keep = self.keep[local];
        if keep < 1.0 && rng.random::<f32>() >= keep {
            return;
        }
        let win = self.params.window - rng.random_range(0..self.params.window);
        let k = w.hist.len();
        for (i, &(node, wi)) in w.hist.iter().enumerate() {
            let d = (k - i) as u32;
            if d <= win {
                pairs.push((w.cur, node));
            }
            if d <= wi {
                pairs.push((node, w.cur));
            }
        }
        if w.hist.len() == self.params.window as usize {
            w.hist.remove(0);
        }
        w.hist.push((w.cur, win));
    }

    fn propose(&self, g: &LocalGraph, w: &Walker, local: usize, rng: &mut Rng) -> Move {
        let Some((p, q)) = self.params.node2vec else {
            return Move::Go(pick_neighbor(g, local, rng));
        };
        let (ip, iq) = (1.0 / p, 1.0 / q);
        let a_max = ip.max(1.0).max(iq);
        if w.prev == NONE {
            return Move::Go(pick_neighbor(g, local, rng));
        }
        for _ in 0..64 {
            let x = pick_neighbor(g, local, rng);
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
            if g.part.owner(w.prev) == self.rank {
                let yes = g.has_edge(g.part.local_index(w.prev), x);
                if u < if yes { 1.0 } else { iq } {
                    return Move::Go(x);
                }
                continue;
            }
            return Move::Ask(x);
        }
        Move::Retry
    }

    fn advance(&self, g: &LocalGraph, mut w: Walker, x: u64, send: &mut [Vec<u8>]) {
        w.prev = w.cur;
        w.cur = x;
        w.step += 1;
        w.visited = false;
        w.encode(&mut send[g.part.owner(x)]);
    }
}

enum Move {
    Go(u64),
    Retry,
    Ask(u64),
}

#[inline]
fn pick_neighbor(g: &LocalGraph, local: usize, rng: &mut Rng) -> u64 {
    let nb = g.neighbors(local);
    match g.cum_weights(local) {
        None => nb[(((rng.next_u64() >> 32) * nb.len() as u64) >> 32) as usize],
        Some(c) => {
            let total = *c.last().expect("non-empty adjacency");
            let r = rng.random::<f32>() * total;
            nb[c.partition_point(|&x| x <= r).min(nb.len() - 1)]
        }
    }
}

/// Collective: ask the owners of the previous nodes whether `x` is their neighbour.
fn resolve_queries(comm: &Comm, g: &LocalGraph, asks: &[(usize, Walker, u64)]) -> Vec<bool> {
    let mut send = vec![Vec::new(); comm.size()];
    for (owner, w, x) in asks {
        send[*owner].extend_from_slice(&w.prev.to_le_bytes());
        send[*owner].extend_from_slice(&x.to_le_bytes());
    }
    let queries = comm.all_to_all_v(send);
    let replies = queries
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
        .collect();
    let answers = comm.all_to_all_v(replies);
    let mut cursor = vec![0usize; comm.size()];
    asks.iter()
        .map(|(owner, _, _)| {
            let a = answers[*owner][cursor[*owner]] != 0;
            cursor[*owner] += 1;
            a
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walkers_survive_the_wire() {
        let w = Walker {
            id: 7,
            prev: NONE,
            cur: 42,
            step: 3,
            visited: true,
            hist: vec![(1, 10), (99, 3)],
        };
        let mut b = Vec::new();
        w.encode(&mut b);
        w.encode(&mut b);
        let (a, used) = Walker::decode(&b);
        assert_eq!(a, w);
        assert_eq!(Walker::decode(&b[used..]).0, w);
    }
}
