//! Graphs graphscale makes itself, for the demo, tests and benchmarks: planted partitions with
//! known communities (SBM), Graph500 R-MAT power-law graphs, and tiny shapes with known answers.

use std::io::Write;
use std::path::Path;

use rand::{RngExt, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

use super::h5::EdgeWriter;
use super::{Edge, NodeId};
use crate::error::{Error, Result};

/// Planted partition: `nodes` split into `blocks` equal blocks; `nodes * avg_degree / 2`
/// undirected edges, each inside its block with probability `1 - mix`, else to a uniform node.
/// Returns the block of each node.
pub fn sbm(
    out: &Path,
    nodes: u64,
    blocks: u64,
    avg_degree: f64,
    mix: f64,
    seed: u64,
) -> Result<Vec<u64>> {
    if nodes < 2 || blocks == 0 || blocks > nodes {
        return Err(Error::config(
            "sbm needs --nodes >= 2 and 1 <= --blocks <= --nodes",
        ));
    }
    if !(0.0..=1.0).contains(&mix) || avg_degree.is_nan() || avg_degree <= 0.0 {
        return Err(Error::config(
            "sbm needs 0 <= --mix <= 1 and --avg-degree > 0",
        ));
    }
    let block_of = |v: u64| v * blocks / nodes;
    let block_start = |b: u64| (b * nodes).div_ceil(blocks);
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let m = (nodes as f64 * avg_degree / 2.0).round() as u64;
    let mut w = EdgeWriter::create(out, false)?;
    while w.edges() < m {
        let u = rng.random_range(0..nodes);
        let v = if rng.random::<f64>() < mix {
            rng.random_range(0..nodes)
        } else {
            let b = block_of(u);
            rng.random_range(block_start(b)..block_start(b + 1))
        };
        if u != v {
            w.push(Edge {
                src: u,
                dst: v,
                weight: 1.0,
            })?;
        }
    }
    w.finish(Some(nodes), false, None)?;
    Ok((0..nodes).map(block_of).collect())
}

/// Graph500 R-MAT (a=0.57, b=c=0.19): `2^scale` nodes, `edge_factor * 2^scale` undirected edges,
/// ids scrambled by a bijection so that hubs are not the low ids. Self-loops are dropped.
pub fn rmat(out: &Path, scale: u32, edge_factor: u64, seed: u64) -> Result<u64> {
    if !(1..=40).contains(&scale) || edge_factor == 0 {
        return Err(Error::config(
            "rmat needs 1 <= --scale <= 40 and --edge-factor >= 1",
        ));
    }
    let n = 1u64 << scale;
    let mask = n - 1;
    // A bijection on [0, 2^scale): xor-shifts and multiplications by odd constants modulo
    // 2^scale each are bijections. The shifts move high bits into low ones, so the hubs (ids
    // with many zero bits) do not share residues modulo the rank count.
    let half = scale.div_ceil(2);
    let scramble = |v: u64| {
        let mut x = v;
        x ^= x >> half;
        x = x.wrapping_mul(0x9E37_79B9_7F4A_7C15) & mask;
        x ^= x >> half;
        x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9) & mask;
        x ^ (x >> half)
    };
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let m = edge_factor * n;
    let mut w = EdgeWriter::create(out, false)?;
    for _ in 0..m {
        let (mut u, mut v) = (0u64, 0u64);
        for _ in 0..scale {
            let r: f64 = rng.random();
            let (bu, bv) = if r < 0.57 {
                (0, 0)
            } else if r < 0.76 {
                (0, 1)
            } else if r < 0.95 {
                (1, 0)
            } else {
                (1, 1)
            };
            u = (u << 1) | bu;
            v = (v << 1) | bv;
        }
        let (u, v) = (scramble(u), scramble(v));
        if u != v {
            w.push(Edge {
                src: u,
                dst: v,
                weight: 1.0,
            })?;
        }
    }
    Ok(w.finish(Some(n), false, None)?.1)
}

/// Tiny shapes with known structure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Shape {
    /// 0-1-2-...-(n-1)-0
    Ring,
    /// node 0 joined to every other node
    Star,
    /// two cliques of n/2 nodes joined by one edge
    TwoCliques,
}

pub fn shape_edges(shape: Shape, n: u64) -> Vec<Edge> {
    let e = |s: NodeId, d: NodeId| Edge {
        src: s,
        dst: d,
        weight: 1.0,
    };
    match shape {
        Shape::Ring => (0..n).map(|i| e(i, (i + 1) % n)).collect(),
        Shape::Star => (1..n).map(|i| e(0, i)).collect(),
        Shape::TwoCliques => {
            let h = n / 2;
            let mut v = Vec::new();
            for (lo, hi) in [(0, h), (h, n)] {
                for i in lo..hi {
                    for j in i + 1..hi {
                        v.push(e(i, j));
                    }
                }
            }
            v.push(e(0, h));
            v
        }
    }
}

/// Labels as `node<TAB>label` lines.
pub fn write_labels(path: &Path, labels: &[u64]) -> Result<()> {
    let f = std::fs::File::create(path).map_err(|e| Error::io(path, e))?;
    let mut w = std::io::BufWriter::new(f);
    for (i, l) in labels.iter().enumerate() {
        writeln!(w, "{i}\t{l}").map_err(|e| Error::io(path, e))?;
    }
    w.flush().map_err(|e| Error::io(path, e))
}

#[cfg(test)]
mod tests {
    #[test]
    fn rmat_ids_are_a_permutation_that_spreads_hubs() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("r.h5");
        super::rmat(&path, 10, 8, 1).unwrap();
        let f = hdf5::File::open(&path).unwrap();
        let src: Vec<u64> = f.dataset("src").unwrap().read_raw().unwrap();
        let dst: Vec<u64> = f.dataset("dst").unwrap().read_raw().unwrap();
        assert!(src.iter().chain(&dst).all(|&v| v < 1024));
        // degree mass per residue class mod 4 is balanced within 50% (ids that kept their low bits
        // put every hub on residue 0: 2.3x the mean at 4 ranks for scale 20)
        let mut mass = [0u64; 4];
        for &v in src.iter().chain(&dst) {
            mass[(v % 4) as usize] += 1;
        }
        let (lo, hi) = (
            *mass.iter().min().unwrap() as f64,
            *mass.iter().max().unwrap() as f64,
        );
        assert!(hi / lo < 1.5, "{mass:?}");
    }
}
