//! LINE's edge sampling: a rank draws its own adjacency entries with probability proportional to
//! their weight (one alias table over the local entries, O(1) per draw). Each rank's share of a
//! global batch is proportional to its local weight mass, so the union over ranks samples every
//! edge of the graph proportionally to its weight.

use super::alias::AliasTable;
use super::Rng;
use crate::graph::{LocalGraph, NodeId};

pub struct EdgeSampler {
    table: Option<AliasTable>,
    /// Total weight of the local entries.
    pub mass: f64,
}

impl EdgeSampler {
    pub fn new(g: &LocalGraph) -> EdgeSampler {
        // Every adjacency entry is a directed edge (an undirected edge appears once per side).
        let weights: Vec<f64> = match &g.cum_weights {
            None => vec![1.0; g.targets.len()],
            Some(c) => (0..g.num_local())
                .flat_map(|i| {
                    let (a, b) = (g.offsets[i] as usize, g.offsets[i + 1] as usize);
                    (a..b).map(move |j| f64::from(c[j] - if j == a { 0.0 } else { c[j - 1] }))
                })
                .collect(),
        };
        EdgeSampler {
            mass: weights.iter().sum(),
            table: AliasTable::new(&weights),
        }
    }

    /// One weighted draw of a local edge as (source, target) global ids; None without edges.
    pub fn draw(&self, g: &LocalGraph, rng: &mut Rng) -> Option<(NodeId, NodeId)> {
        let e = self.table.as_ref()?.sample(rng);
        let src = g.offsets.partition_point(|&o| o as usize <= e) - 1;
        Some((g.part.global(g.rank, src), g.targets[e]))
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
