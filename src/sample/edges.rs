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
    /// Total weight of the local entries.
    pub mass: f64,
}

impl EdgeSampler {
    pub fn new(g: &LocalGraph) -> EdgeSampler {
        let entries = g.local_entries();
        let Some(c) = &g.cum_weights else {
            return EdgeSampler {
                table: None,
                entries,
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
        let table = AliasTable::new(&weights);
        EdgeSampler {
            mass: weights.iter().sum(),
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
        let src = g.offsets.partition_point(|&o| o as usize <= e) - 1;
        Some((g.part.global(g.rank, src), g.targets.get(e)))
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

    #[test]
    fn a_rank_without_edges_draws_nothing() {
        let part = Partitioner::new(Scheme::Striped, 3, 1);
        let g = LocalGraph::from_entries(0, part, &[], 0, false, false);
        let s = EdgeSampler::new(&g);
        assert_eq!(s.mass, 0.0);
        assert!(s.draw(&g, &mut rng_for(1, 0, 0)).is_none());
    }
}
