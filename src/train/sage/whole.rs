//! `--strategy replicated` for GraphSAGE (the baseline): every rank holds the whole
//! adjacency and every feature row; a step's seeds are dealt over the ranks (every size-th) and
//! nothing but the weights' gradients crosses the network.

use std::path::Path;

use crate::comm::Comm;
use crate::error::Result;
use crate::estimate::SageHeld;
use crate::graph::h5::EdgeFile;
use crate::model::sage::{gather_means, Input, Sage, Work};
use crate::sample::alias::AliasTable;
use crate::sample::neighbors::{pick, whole_block};
use crate::sample::Rng;
use crate::stats::RankMetrics;

use super::{scale_rows, Drawn, Learned, Source, INFER_CHUNK};

/// A graph and its feature rows, whole on this rank.
pub(super) struct Whole {
    rank: usize,
    ranks: usize,
    /// Undirected adjacency as CSR.
    offsets: Vec<u64>,
    targets: Vec<u64>,
    cols: usize,
    x: Vec<f32>,
}

impl Whole {
    /// Read the adjacency beside the feature rows `x` (`cols` wide).
    pub(super) fn load(comm: &Comm, path: &Path, cols: usize, x: Vec<f32>) -> Result<Whole> {
        let ef = EdgeFile::open(path)?;
        let n = ef.num_nodes as usize;
        let edges = ef.read_edges(0, ef.num_edges)?;
        let mut deg = vec![0u64; n + 1];
        for e in &edges {
            deg[e.src as usize + 1] += 1;
            if !ef.directed {
                deg[e.dst as usize + 1] += 1;
            }
        }
        for i in 0..n {
            deg[i + 1] += deg[i];
        }
        let mut fill = deg.clone();
        let mut targets = vec![0u64; deg[n] as usize];
        for e in &edges {
            targets[fill[e.src as usize] as usize] = e.dst;
            fill[e.src as usize] += 1;
            if !ef.directed {
                targets[fill[e.dst as usize] as usize] = e.src;
                fill[e.dst as usize] += 1;
            }
        }
        Ok(Whole {
            rank: comm.rank(),
            ranks: comm.size(),
            offsets: deg,
            targets,
            cols,
            x,
        })
    }

    /// Whether no feature is negative (`--feature-norm auto` then scales the rows).
    pub(super) fn non_negative(&self) -> bool {
        self.x.iter().all(|&v| v >= 0.0)
    }

    /// Scale every row to sum 1.
    pub(super) fn scale(&mut self) {
        scale_rows(&mut self.x, self.cols);
    }

    fn nbrs(&self, v: u64, out: &mut Vec<u64>) {
        let (a, b) = (self.offsets[v as usize], self.offsets[v as usize + 1]);
        out.extend_from_slice(&self.targets[a as usize..b as usize]);
    }
}

impl Source for Whole {
    fn cols(&self) -> usize {
        self.cols
    }

    fn mine(&self, nodes: &[u64]) -> Vec<u64> {
        nodes
            .iter()
            .skip(self.rank)
            .step_by(self.ranks)
            .copied()
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
            .sample(seeds, fanouts, |v, o| self.nbrs(v, o), rng);
        let (f, x, input) = (self.cols, &self.x, &out.blocks.input);
        m.local_rows += input.len() as u64;
        let row = |j: usize| &x[input[j] as usize * f..(input[j] as usize + 1) * f];
        let rows = &mut out.rows;
        if out.gather {
            let add = |j, acc: &mut [f32]| acc.iter_mut().zip(row(j)).for_each(|(a, v)| *a += v);
            let hint = |j| crate::store::prefetch(bytemuck::cast_slice(row(j)));
            gather_means(&out.blocks.blocks[0], f, (add, hint), rows, &mut out.means);
        } else {
            rows.clear();
            for j in 0..input.len() {
                rows.extend_from_slice(row(j));
            }
        }
    }

    fn infer(
        &mut self,
        sage: &Sage,
        work: &mut Work,
        m: &mut RankMetrics,
        learned: Option<&Learned>,
    ) -> (Vec<u64>, Vec<f32>) {
        // Every layer over every node (the baseline computes what it holds), the last one's
        // rows of this rank's share returned.
        let n = self.offsets.len() - 1;
        let mut h = Vec::new();
        let mut out = Vec::new();
        for l in 0..sage.layers() {
            out.clear();
            out.reserve_exact(n * sage.dims[l + 1]);
            let din = sage.dims[l];
            // The first layer reads the feature rows (with the learned rows after them).
            let width = if l == 0 { self.cols } else { din };
            let (mut rows, mut scratch) = (Vec::new(), Vec::new());
            let nodes: Vec<u64> = (0..n as u64).collect();
            for chunk in nodes.chunks(INFER_CHUNK) {
                let (block, input) = whole_block(chunk, |v, p| self.nbrs(v, p));
                let x: &[f32] = if l == 0 { &self.x } else { &h };
                rows.clear();
                for &v in &input {
                    rows.extend_from_slice(&x[v as usize * width..(v as usize + 1) * width]);
                }
                if let Some(lr) = learned.filter(|_| l == 0) {
                    lr.join(&input, self.cols, &mut rows, &mut scratch, m);
                }
                out.extend_from_slice(sage.layer_in(work, l, &block, Input::Rows(&rows)));
            }
            std::mem::swap(&mut h, &mut out);
        }
        let k = *sage.dims.last().expect("layers");
        let mine = self.mine(&(0..n as u64).collect::<Vec<u64>>());
        let scores = mine
            .iter()
            .flat_map(|&v| h[v as usize * k..(v as usize + 1) * k].iter().copied())
            .collect();
        (mine, scores)
    }

    fn hop(
        &mut self,
        dst: &[u64],
        fanout: usize,
        rng: &mut Rng,
        counts: &mut Vec<u32>,
        picked: &mut Vec<u64>,
    ) {
        let mut adj = Vec::new();
        for &v in dst {
            adj.clear();
            self.nbrs(v, &mut adj);
            let before = picked.len();
            pick(&mut adj, fanout, rng, picked);
            counts.push((picked.len() - before) as u32);
        }
    }

    /// Every rank holds every node: its own draws from the whole graph's table.
    fn negative_pool(&mut self, size: usize, rng: &mut Rng) -> Vec<u64> {
        let n = self.offsets.len() - 1;
        let w = (0..n).map(|v| ((self.offsets[v + 1] - self.offsets[v]) as f64).powf(0.75));
        match AliasTable::new(w.collect()) {
            Some(t) => (0..size).map(|_| t.sample(rng) as u64).collect(),
            None => Vec::new(),
        }
    }

    fn partitioner(&self) -> Option<crate::graph::partition::Partitioner> {
        None
    }

    fn held(&self) -> SageHeld {
        let n = self.offsets.len() - 1;
        SageHeld {
            adjacency: 8 * (self.offsets.len() + self.targets.len()) as u64,
            features: 4 * self.x.len() as u64,
            cache: 0,
            layer_rows: n as u64,
            scored: n.div_ceil(self.ranks) as u64,
            hidden_value: 4,
            chunk_inputs: super::largest_chunk(n, |v| self.offsets[v + 1] - self.offsets[v]),
            mean_degree: self.targets.len() as f64 / n.max(1) as f64,
            // The edges read (24 bytes each, half the entries of an undirected graph) and the
            // fill cursors.
            load_transient: 12 * self.targets.len() as u64 + 8 * n as u64,
            learned: 0,
            learned_width: 0,
        }
    }
}
