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

/// The node data of a contextual SBM (Deshpande et al. 2018): node v of block b has the
/// features `mu_b + e_v`, `e_v ~ N(0, I_F)`, and the class b; `mu_b`'s entries are drawn
/// `N(0, signal^2 / F)`, so that a class mean lies about `signal` noise deviations from the
/// origin and two means about `signal * sqrt(2)` apart: one node's features alone tell two
/// classes apart with an error of about `Phi(-signal / sqrt(2))` (0.24 at 1), and averaging
/// neighbours of the same block narrows the noise. `train` of the nodes train, as many
/// validate, the rest test. Features are drawn per node from the seed (the same whatever the
/// block of rows written at once).
#[derive(Clone, Copy, Debug)]
pub struct Contextual {
    pub features: usize,
    pub signal: f64,
    pub train: f64,
    pub dtype: super::nodedata::FeatureDtype,
}

/// Add a contextual SBM's features, labels (the blocks) and split to the graph file `path`.
pub fn add_contextual(path: &Path, blocks: &[u64], c: Contextual, seed: u64) -> Result<()> {
    use super::nodedata::{random_split, write_dense_features, write_labels, Labels};
    use rand_distr::{Distribution, StandardNormal};
    if c.features == 0 || c.features > 1 << 16 || !(c.signal >= 0.0 && c.signal.is_finite()) {
        return Err(Error::config(
            "sbm --features: 1 to 65536 columns, and --signal a finite number >= 0",
        ));
    }
    if !(c.train > 0.0 && c.train <= 0.5) {
        return Err(Error::config(
            "sbm --train-fraction: a share in (0, 0.5] (as many nodes validate; the rest test)",
        ));
    }
    let f = hdf5::File::open_rw(path).map_err(|e| Error::hdf5(path, "open for node data", e))?;
    let k = blocks.iter().max().map_or(0, |&b| b + 1) as usize;
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed ^ 0x5eed_fea7);
    let scale = c.signal / (c.features as f64).sqrt();
    let means: Vec<f32> = (0..k * c.features)
        .map(|_| {
            let z: f64 = StandardNormal.sample(&mut rng);
            (scale * z) as f32
        })
        .collect();
    write_dense_features(&f, path, c.features, c.dtype, |v, row| {
        let mut r = Xoshiro256PlusPlus::seed_from_u64(
            seed ^ (v as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
        );
        let mu = &means[blocks[v] as usize * c.features..][..c.features];
        for (x, m) in row.iter_mut().zip(mu) {
            let e: f32 = StandardNormal.sample(&mut r);
            *x = m + e;
        }
    })?;
    let labels = Labels::from_pairs(
        blocks.len() as u64,
        blocks
            .iter()
            .enumerate()
            .map(|(v, &b)| (v as u64, b as u32))
            .collect(),
    );
    let split = random_split(&labels, c.train, c.train, seed);
    write_labels(&f, path, &labels, Some(&split))
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
    /// A contextual SBM's classes are its blocks, its class means lie about `signal * sqrt 2`
    /// apart and its noise has unit variance; the split takes its fractions; f16 stores the
    /// same values rounded.
    #[test]
    fn contextual_sbm_features_follow_their_class() {
        use super::super::nodedata::{read, FeatureDtype, TEST, TRAIN, VALID};
        let d = tempfile::tempdir().unwrap();
        let (n, k, f, signal) = (4000usize, 4u64, 64usize, 2.0);
        let mut got = Vec::new();
        for dtype in [FeatureDtype::F32, FeatureDtype::F16] {
            let path = d.path().join(format!("c{dtype:?}.h5"));
            let blocks = super::sbm(&path, n as u64, k, 5.0, 0.1, 3).unwrap();
            let c = super::Contextual {
                features: f,
                signal,
                train: 0.1,
                dtype,
            };
            super::add_contextual(&path, &blocks, c, 3).unwrap();
            let nd = read(&path).unwrap();
            let (cols, x) = nd.features.unwrap();
            assert_eq!((cols, x.len()), (f, n * f));
            let labels = nd.labels.unwrap();
            assert!((0..n).all(|v| labels.of(v) == [blocks[v] as u32]));
            let split = nd.split.unwrap();
            let count = |c: u8| split.iter().filter(|&&s| s == c).count();
            assert_eq!((count(TRAIN), count(VALID), count(TEST)), (400, 400, 3200));
            let mut mean = vec![vec![0f64; f]; k as usize];
            for v in 0..n {
                for j in 0..f {
                    mean[blocks[v] as usize][j] += f64::from(x[v * f + j]) * k as f64 / n as f64;
                }
            }
            let dist = (0..f)
                .map(|j| (mean[0][j] - mean[1][j]).powi(2))
                .sum::<f64>()
                .sqrt();
            assert!(
                (dist / (signal * 2f64.sqrt()) - 1.0).abs() < 0.35,
                "class means {dist} apart"
            );
            let var = (0..n)
                .map(|v| {
                    (0..f)
                        .map(|j| (f64::from(x[v * f + j]) - mean[blocks[v] as usize][j]).powi(2))
                        .sum::<f64>()
                })
                .sum::<f64>()
                / (n * f) as f64;
            assert!((var - 1.0).abs() < 0.05, "noise variance {var}");
            got.push(x);
        }
        let close = got[0]
            .iter()
            .zip(&got[1])
            .all(|(a, b)| (a - b).abs() <= a.abs() * 1e-3 + 1e-4);
        assert!(close, "f16 holds the f32 values rounded");
    }

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
