//! Each rank's share of the topology: the CSR of the nodes it owns (out-edges; both directions
//! for undirected graphs), built by a distributed load in which every rank reads one contiguous
//! hyperslab of the edge datasets and sends each edge to its owner. Memory per rank is
//! O((V + E) / N): no rank holds the whole graph.

use std::path::Path;

use super::h5::EdgeFile;
use super::partition::{Partitioner, Scheme};
use super::{Edge, NodeId};
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::spmd::agree;

/// Edges read per rank per exchange round during the load (bounds the load's memory).
pub const LOAD_CHUNK_EDGES: u64 = 1 << 22;

const RECORD: usize = 20;

pub struct LocalGraph {
    pub rank: usize,
    pub part: Partitioner,
    /// Edges in the file (an undirected edge counts once).
    pub file_edges: u64,
    pub directed: bool,
    pub weighted: bool,
    /// `offsets[i]..offsets[i+1]` indexes the neighbours of local node `i`.
    pub offsets: Vec<u64>,
    /// Neighbour ids, sorted within each node (binary search for node2vec).
    pub targets: Vec<NodeId>,
    /// For weighted graphs: per-node inclusive prefix sums of the edge weights.
    pub cum_weights: Option<Vec<f32>>,
}

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

    #[inline]
    fn range(&self, local: usize) -> std::ops::Range<usize> {
        self.offsets[local] as usize..self.offsets[local + 1] as usize
    }

    #[inline]
    pub fn neighbors(&self, local: usize) -> &[NodeId] {
        &self.targets[self.range(local)]
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
        self.neighbors(local).binary_search(&v).is_ok()
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
        let n = part.num_local(rank);
        let mut offsets = vec![0u64; n + 1];
        for e in entries {
            debug_assert_eq!(part.owner(e.src), rank);
            offsets[part.local_index(e.src) + 1] += 1;
        }
        for i in 0..n {
            offsets[i + 1] += offsets[i];
        }
        let mut fill = offsets.clone();
        let mut adj = vec![(0u64, 0f32); entries.len()];
        for e in entries {
            let l = part.local_index(e.src);
            adj[fill[l] as usize] = (e.dst, e.weight);
            fill[l] += 1;
        }
        for i in 0..n {
            adj[offsets[i] as usize..offsets[i + 1] as usize].sort_unstable_by_key(|&(d, _)| d);
        }
        let targets = adj.iter().map(|&(d, _)| d).collect();
        let cum_weights = weighted.then(|| {
            let mut c = vec![0f32; adj.len()];
            for i in 0..n {
                let mut acc = 0f32;
                for j in offsets[i] as usize..offsets[i + 1] as usize {
                    acc += adj[j].1;
                    c[j] = acc;
                }
            }
            c
        });
        LocalGraph {
            rank,
            part,
            file_edges,
            directed,
            weighted,
            offsets,
            targets,
            cum_weights,
        }
    }
}

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

/// Collective: load `path` partitioned over all ranks of `comm`.
pub fn load(comm: &Comm, path: &Path, scheme: Scheme, chunk_edges: u64) -> Result<LocalGraph> {
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
    let (start, end) = slice_of(file.num_edges, comm.rank(), comm.size());
    let chunk = chunk_edges.max(1);
    let rounds = comm.max_u64((end - start).div_ceil(chunk));
    let mut entries = Vec::new();
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
        entries.extend(route_edges(comm, &part, &edges, file.directed));
    }
    let g = LocalGraph::from_entries(
        comm.rank(),
        part,
        &entries,
        file.num_edges,
        file.directed,
        file.weighted,
    );
    log::debug!(
        "rank {}: {} nodes, {} adjacency entries",
        comm.rank(),
        g.num_local(),
        g.local_entries()
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
        for (j, &dst) in g.neighbors(i).iter().enumerate() {
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

    #[test]
    fn undirected_csr_has_both_directions_sorted() {
        let edges = [(0, 2), (1, 0), (2, 1), (0, 3)].map(|(s, d)| Edge {
            src: s,
            dst: d,
            weight: 1.0,
        });
        let g = &build(&edges, 4, 1, false)[0];
        assert_eq!(g.neighbors(0), &[1, 2, 3]);
        assert_eq!(g.neighbors(3), &[0]);
        assert!(g.has_edge(2, 1) && !g.has_edge(3, 2));
    }
}
