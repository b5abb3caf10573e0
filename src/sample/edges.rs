//! LINE's edge sampling: a rank draws its own adjacency entries with probability proportional to
//! their weight (one alias table over the local entries, O(1) per draw). Each rank's share of a
//! global batch is proportional to its local weight mass, so the union over ranks samples every
//! edge of the graph proportionally to its weight.

use super::alias::AliasTable;
use super::Rng;
use crate::graph::{LocalGraph, NodeId};
use rand::Rng as _;

pub struct EdgeSampler {
    /// Weighted graphs: one alias table over the local entries. Unweighted graphs draw an entry
    /// uniformly and need no table (what an alias table of equal weights draws, for the same
    /// random number, without its 8 bytes per entry).
    table: Option<AliasTable>,
    entries: u64,
    /// For every `2^BUCKET_SHIFT`-th entry, the local node whose range holds it: a draw's
    /// source is then searched among the few nodes of its bucket, not all offsets (a binary
    /// search over a large graph's offsets is ~26 cache misses per draw).
    buckets: Vec<usize>,
    /// Total weight of the local entries.
    pub mass: f64,
}

/// Entries per bucket of [`EdgeSampler`]'s source index (8 bytes per 256 entries).
const BUCKET_SHIFT: u32 = 8;

/// The bucket index of `offsets`: for each bucket, the node holding its first entry.
fn bucket_index(offsets: &[u64]) -> Vec<usize> {
    let entries = *offsets.last().unwrap_or(&0);
    if entries == 0 {
        return Vec::new();
    }
    let mut out = Vec::with_capacity((entries >> BUCKET_SHIFT) as usize + 1);
    let mut v = 0;
    for b in 0..=((entries - 1) >> BUCKET_SHIFT) {
        let e = b << BUCKET_SHIFT;
        while offsets[v + 1] <= e {
            v += 1;
        }
        out.push(v);
    }
    out
}

impl EdgeSampler {
    pub fn new(g: &LocalGraph) -> EdgeSampler {
        let entries = g.local_entries();
        let Some(c) = &g.cum_weights else {
            return EdgeSampler {
                table: None,
                entries,
                buckets: bucket_index(&g.offsets),
                mass: entries as f64,
            };
        };
        // Every adjacency entry is a directed edge (an undirected edge appears once per side).
        let weights: Vec<f64> = (0..g.num_local())
            .flat_map(|i| {
                let (a, b) = (g.offsets[i] as usize, g.offsets[i + 1] as usize);
                (a..b).map(move |j| f64::from(c[j] - if j == a { 0.0 } else { c[j - 1] }))
            })
            .collect();
        let mass = weights.iter().sum();
        let table = AliasTable::new(weights);
        EdgeSampler {
            buckets: bucket_index(&g.offsets),
            mass,
            // No entry of positive weight: nothing to draw.
            entries: if table.is_some() { entries } else { 0 },
            table,
        }
    }

    /// One weighted draw of a local edge as (source, target) global ids; None without edges.
    pub fn draw(&self, g: &LocalGraph, rng: &mut Rng) -> Option<(NodeId, NodeId)> {
        if self.entries == 0 {
            return None;
        }
        let e = match &self.table {
            Some(t) => t.sample(rng),
            None => {
                let (r, n) = (rng.next_u64(), self.entries);
                if n <= u64::from(u32::MAX) {
                    (((r >> 32) * n) >> 32) as usize
                } else {
                    ((u128::from(r) * u128::from(n)) >> 64) as usize
                }
            }
        };
        let src = self.source(&g.offsets, e);
        Some((g.part.global(g.rank, src), g.targets.get(e)))
    }

    /// The local node whose range of `offsets` holds entry `e` (`e` < entries).
    #[inline]
    fn source(&self, offsets: &[u64], e: usize) -> usize {
        let b = e >> BUCKET_SHIFT;
        let lo = self.buckets[b];
        // The bucket's last entry lies in `hi`'s range, so `offsets[hi + 1]` > e.
        let hi = self
            .buckets
            .get(b + 1)
            .copied()
            .unwrap_or(offsets.len() - 2);
        lo + offsets[lo + 1..=hi].partition_point(|&o| o as usize <= e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::partition::{Partitioner, Scheme};
    use crate::graph::Edge;
    use crate::sample::rng_for;
    use std::collections::HashMap;

    #[test]
    fn edges_are_drawn_proportionally_to_weight() {
        let raw = [
            (0, 1, 1.0),
            (0, 2, 3.0),
            (1, 2, 0.5),
            (2, 3, 6.0),
            (3, 0, 2.0),
            (4, 4, 1.5),
        ];
        let entries: Vec<Edge> = raw
            .iter()
            .flat_map(|&(s, d, w)| {
                let mut v = vec![Edge {
                    src: s,
                    dst: d,
                    weight: w,
                }];
                if s != d {
                    v.push(Edge {
                        src: d,
                        dst: s,
                        weight: w,
                    });
                }
                v
            })
            .collect();
        let part = Partitioner::new(Scheme::Striped, 5, 1);
        let g = LocalGraph::from_entries(0, part, &entries, raw.len() as u64, false, true);
        let s = EdgeSampler::new(&g);
        let total: f64 = entries.iter().map(|e| f64::from(e.weight)).sum();
        assert!((s.mass - total).abs() < 1e-9);
        let mut rng = rng_for(3, 0, 0);
        let draws = 200_000;
        let mut seen: HashMap<(u64, u64), f64> = HashMap::new();
        for _ in 0..draws {
            *seen
                .entry(s.draw(&g, &mut rng).expect("edges"))
                .or_default() += 1.0;
        }
        let mut stat = 0.0;
        for e in &entries {
            let expect = draws as f64 * f64::from(e.weight) / total;
            let got = seen.remove(&(e.src, e.dst)).unwrap_or(0.0);
            stat += (got - expect).powi(2) / expect;
        }
        assert!(seen.is_empty(), "drew entries that are not edges: {seen:?}");
        // 10 entries, 9 degrees of freedom: P(chi2 > 27.9) = 0.001.
        assert!(stat < 27.9, "chi-square {stat:.2}");
    }

    proptest::proptest! {
        /// The bucketed search finds every entry's source as a binary search over all offsets
        /// does, isolated nodes and degrees across bucket bounds included.
        #[test]
        fn the_bucketed_source_is_the_owner_of_the_entry(
            degrees in proptest::collection::vec(
                proptest::prop_oneof![proptest::strategy::Just(0u64), 0u64..5, 200u64..700],
                1..60,
            ),
        ) {
            let mut offsets = vec![0u64];
            for d in &degrees {
                offsets.push(offsets.last().unwrap() + d);
            }
            let entries = *offsets.last().unwrap() as usize;
            let s = EdgeSampler {
                table: None,
                entries: entries as u64,
                buckets: bucket_index(&offsets),
                mass: entries as f64,
            };
            for e in 0..entries {
                let want = offsets.partition_point(|&o| o as usize <= e) - 1;
                proptest::prop_assert_eq!(s.source(&offsets, e), want, "entry {}", e);
            }
        }
    }

    #[test]
    fn a_rank_without_edges_draws_nothing() {
        let part = Partitioner::new(Scheme::Striped, 3, 1);
        let g = LocalGraph::from_entries(0, part, &[], 0, false, false);
        let s = EdgeSampler::new(&g);
        assert_eq!(s.mass, 0.0);
        assert!(s.draw(&g, &mut rng_for(1, 0, 0)).is_none());
    }
}
