//! Neighbour sampling for GraphSAGE (issue 34): from a batch of seeds, hop by hop, up to
//! `fanout` neighbours of every node of the frontier, drawn without replacement (all of them
//! when there are fewer), deduplicated per hop into the blocks of `model::sage` (outermost
//! first). `fanouts[0]` is the seeds' hop, as PyG's `num_neighbors=[25, 10]`. The sampler reads
//! adjacency through a closure and does no communication: across ranks the driver answers it
//! from the owners.

use rand::RngExt;
use rustc_hash::FxHashMap;

use super::Rng;

/// One block of a mini-batch (`model::sage` explains the layout).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Block {
    pub num_src: usize,
    pub num_dst: usize,
    /// `num_dst + 1` offsets into `nbrs`.
    pub offsets: Vec<u32>,
    /// Input rows (below `num_src`) of the output nodes' sampled neighbours.
    pub nbrs: Vec<u32>,
}

/// The blocks of `seeds` (distinct) for `fanouts`, and the input nodes of the outermost block
/// (their rows are what the batch reads). `nbrs(v, out)` fills `out` with v's neighbours.
pub fn sample_blocks(
    seeds: &[u64],
    fanouts: &[usize],
    nbrs: impl FnMut(u64, &mut Vec<u64>),
    rng: &mut Rng,
) -> (Vec<Block>, Vec<u64>) {
    let mut b = Blocks::default();
    b.sample(seeds, fanouts, nbrs, rng);
    (b.blocks, b.input)
}

/// The block of `nodes` with every neighbour (layer-wise inference) and its input nodes;
/// `nbrs(v, out)` appends v's neighbours to `out`.
pub fn whole_block(nodes: &[u64], mut nbrs: impl FnMut(u64, &mut Vec<u64>)) -> (Block, Vec<u64>) {
    let (mut blocks, input) =
        sample_blocks_by_hop(nodes, &[usize::MAX], |dst, _, counts, picked| {
            for &v in dst {
                let before = picked.len();
                nbrs(v, picked);
                counts.push((picked.len() - before) as u32);
            }
        });
    (blocks.pop().expect("one hop, one block"), input)
}

/// Up to `fanout` of `adj` drawn without replacement (all of them when there are fewer),
/// appended to `out`: a partial Fisher-Yates shuffle of `adj` (the caller's scratch copy),
/// which allocates nothing.
pub fn pick(adj: &mut [u64], fanout: usize, rng: &mut Rng, out: &mut Vec<u64>) {
    let n = adj.len();
    if n <= fanout {
        out.extend_from_slice(adj);
        return;
    }
    for i in 0..fanout {
        adj.swap(i, rng.random_range(i..n));
    }
    out.extend_from_slice(&adj[..fanout]);
}

/// As [`sample_blocks`], a hop at a time: `hop(dst, fanout, counts, picked)` appends, for every
/// node of the frontier `dst` in order, the number of its sampled neighbours to `counts` and the
/// neighbours themselves to `picked` (across ranks the owners sample theirs: one exchange per hop
/// for the whole frontier).
pub fn sample_blocks_by_hop(
    seeds: &[u64],
    fanouts: &[usize],
    hop: impl FnMut(&[u64], usize, &mut Vec<u32>, &mut Vec<u64>),
) -> (Vec<Block>, Vec<u64>) {
    let mut b = Blocks::default();
    b.sample_by_hop(seeds, fanouts, hop);
    (b.blocks, b.input)
}

/// A mini-batch's blocks (outermost first) and the input nodes of the outermost block, with
/// the scratch that builds them: kept across steps, nothing is allocated per step once they
/// have grown to the largest batch.
#[derive(Default)]
pub struct Blocks {
    pub blocks: Vec<Block>,
    pub input: Vec<u64>,
    index: FxHashMap<u64, u32>,
    counts: Vec<u32>,
    sampled: Vec<u64>,
    dst: Vec<u64>,
    adj: Vec<u64>,
}

impl Blocks {
    /// The blocks of `seeds`, as [`sample_blocks`], replacing the last batch's.
    pub fn sample(
        &mut self,
        seeds: &[u64],
        fanouts: &[usize],
        mut nbrs: impl FnMut(u64, &mut Vec<u64>),
        rng: &mut Rng,
    ) {
        let mut adj = std::mem::take(&mut self.adj);
        self.sample_by_hop(seeds, fanouts, |dst, fanout, counts, picked| {
            for &v in dst {
                adj.clear();
                nbrs(v, &mut adj);
                let before = picked.len();
                pick(&mut adj, fanout, rng, picked);
                counts.push((picked.len() - before) as u32);
            }
        });
        self.adj = adj;
    }

    /// The blocks of `seeds`, as [`sample_blocks_by_hop`], replacing the last batch's.
    pub fn sample_by_hop(
        &mut self,
        seeds: &[u64],
        fanouts: &[usize],
        mut hop: impl FnMut(&[u64], usize, &mut Vec<u32>, &mut Vec<u64>),
    ) {
        let Blocks {
            blocks,
            input,
            index,
            counts,
            sampled,
            dst,
            ..
        } = self;
        let layers = fanouts.len();
        blocks.resize_with(layers, Block::default);
        dst.clear();
        dst.extend_from_slice(seeds);
        for (h, &fanout) in fanouts.iter().enumerate() {
            counts.clear();
            sampled.clear();
            hop(dst, fanout, counts, sampled);
            debug_assert_eq!(counts.len(), dst.len());
            index.clear();
            index.extend(dst.iter().enumerate().map(|(i, &v)| (v, i as u32)));
            // The block's inputs: its outputs, then each new neighbour as first met.
            input.clear();
            input.extend_from_slice(dst);
            let b = &mut blocks[layers - 1 - h];
            b.offsets.clear();
            b.offsets.push(0);
            b.nbrs.clear();
            let mut at = 0;
            for &c in counts.iter() {
                for &u in &sampled[at..at + c as usize] {
                    let i = *index.entry(u).or_insert_with(|| {
                        input.push(u);
                        (input.len() - 1) as u32
                    });
                    b.nbrs.push(i);
                }
                at += c as usize;
                b.offsets.push(b.nbrs.len() as u32);
            }
            (b.num_src, b.num_dst) = (input.len(), dst.len());
            std::mem::swap(dst, input);
        }
        std::mem::swap(dst, input);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// Every sampled neighbour is a neighbour, no node takes more than its hop's fanout (and
    /// all of its neighbours when it has fewer), no neighbour twice, and the blocks chain: a
    /// block's outputs are the first inputs, its inputs the next block's outputs.
    #[test]
    fn blocks_hold_sampled_edges_and_chain() {
        let n = 200u64;
        // A ring with chords: node v's neighbours v+-1, v+-7 and, for even v, 30 more.
        let adj = |v: u64| -> Vec<u64> {
            let mut a = vec![(v + 1) % n, (v + n - 1) % n, (v + 7) % n, (v + n - 7) % n];
            if v.is_multiple_of(2) {
                a.extend((1..=30).map(|k| (v + 11 * k) % n));
            }
            a.sort_unstable();
            a.dedup();
            a
        };
        let seeds = [0u64, 5, 17, 42];
        let fanouts = [10usize, 3];
        let mut rng = Rng::seed_from_u64(3);
        let (blocks, input) =
            sample_blocks(&seeds, &fanouts, |v, out| out.extend(adj(v)), &mut rng);
        assert_eq!(blocks.len(), 2);
        assert_eq!(input.len(), blocks[0].num_src);
        // The innermost block's outputs are the seeds.
        let last = &blocks[1];
        assert_eq!(last.num_dst, seeds.len());
        // Reconstruct each block's node ids from the inputs.
        let mid = &input[..blocks[0].num_dst];
        assert_eq!(&mid[..seeds.len()], &seeds);
        for (b, nodes, fanout) in [
            (&blocks[0], &input[..], fanouts[1]),
            (last, mid, fanouts[0]),
        ] {
            assert_eq!(b.num_src, nodes.len());
            assert_eq!(b.offsets.len(), b.num_dst + 1);
            for i in 0..b.num_dst {
                let v = nodes[i];
                let got: Vec<u64> = b.nbrs[b.offsets[i] as usize..b.offsets[i + 1] as usize]
                    .iter()
                    .map(|&j| nodes[j as usize])
                    .collect();
                let mut distinct = got.clone();
                distinct.sort_unstable();
                distinct.dedup();
                assert_eq!(distinct.len(), got.len(), "node {v}: a neighbour twice");
                assert!(got.iter().all(|u| adj(v).contains(u)), "node {v}: {got:?}");
                assert_eq!(got.len(), adj(v).len().min(fanout), "node {v}");
            }
        }
        let mut distinct = input.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), input.len(), "inputs deduplicated");
        // The same seed, the same blocks.
        let again = sample_blocks(
            &seeds,
            &fanouts,
            |v, out| out.extend(adj(v)),
            &mut Rng::seed_from_u64(3),
        );
        assert_eq!(again, (blocks.clone(), input.clone()));
        // Blocks kept across steps: a larger batch before leaves nothing behind.
        let mut kept = Blocks::default();
        let many: Vec<u64> = (0..60).collect();
        kept.sample(&many, &fanouts, |v, out| out.extend(adj(v)), &mut rng);
        kept.sample(
            &seeds,
            &fanouts,
            |v, out| out.extend(adj(v)),
            &mut Rng::seed_from_u64(3),
        );
        assert_eq!((kept.blocks, kept.input), (blocks, input));
    }

    /// A pick takes `fanout` distinct neighbours, each about equally often.
    #[test]
    fn picks_are_uniform_without_replacement() {
        let mut rng = Rng::seed_from_u64(9);
        let mut seen = [0u32; 20];
        let mut adj: Vec<u64> = (0..20).collect();
        let mut out = Vec::new();
        for _ in 0..20_000 {
            out.clear();
            pick(&mut adj, 5, &mut rng, &mut out);
            let mut d = out.clone();
            d.sort_unstable();
            d.dedup();
            assert_eq!(d.len(), 5);
            out.iter().for_each(|&v| seen[v as usize] += 1);
        }
        // Each of 20 is picked 5,000 times in expectation (sd about 61).
        assert!(
            seen.iter().all(|&c| (4_700..5_300).contains(&c)),
            "{seen:?}"
        );
    }
}
