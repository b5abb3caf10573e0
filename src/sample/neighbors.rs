//! Neighbour sampling for GraphSAGE (issue 34): from a batch of seeds, hop by hop, up to
//! `fanout` neighbours of every node of the frontier, drawn without replacement (all of them
//! when there are fewer), deduplicated per hop into the blocks of `model::sage` (outermost
//! first). `fanouts[0]` is the seeds' hop, as PyG's `num_neighbors=[25, 10]`. The sampler reads
//! adjacency through a closure and does no communication: across ranks the driver answers it
//! from the owners.

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
    mut nbrs: impl FnMut(u64, &mut Vec<u64>),
    rng: &mut Rng,
) -> (Vec<Block>, Vec<u64>) {
    let mut adj = Vec::new();
    sample_blocks_by_hop(seeds, fanouts, |dst, fanout, counts, picked| {
        for &v in dst {
            adj.clear();
            nbrs(v, &mut adj);
            let before = picked.len();
            pick(&adj, fanout, rng, picked);
            counts.push((picked.len() - before) as u32);
        }
    })
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
/// appended to `out`.
pub fn pick(adj: &[u64], fanout: usize, rng: &mut Rng, out: &mut Vec<u64>) {
    if adj.len() <= fanout {
        out.extend_from_slice(adj);
    } else {
        out.extend(
            rand::seq::index::sample(rng, adj.len(), fanout)
                .iter()
                .map(|i| adj[i]),
        );
    }
}

/// As [`sample_blocks`], a hop at a time: `hop(dst, fanout, counts, picked)` appends, for every
/// node of the frontier `dst` in order, the number of its sampled neighbours to `counts` and the
/// neighbours themselves to `picked` (across ranks the owners sample theirs: one exchange per hop
/// for the whole frontier).
pub fn sample_blocks_by_hop(
    seeds: &[u64],
    fanouts: &[usize],
    mut hop: impl FnMut(&[u64], usize, &mut Vec<u32>, &mut Vec<u64>),
) -> (Vec<Block>, Vec<u64>) {
    let mut dst: Vec<u64> = seeds.to_vec();
    let mut blocks = Vec::with_capacity(fanouts.len());
    let (mut counts, mut sampled) = (Vec::new(), Vec::new());
    for &fanout in fanouts {
        counts.clear();
        sampled.clear();
        hop(&dst, fanout, &mut counts, &mut sampled);
        debug_assert_eq!(counts.len(), dst.len());
        let mut index: FxHashMap<u64, u32> = dst
            .iter()
            .enumerate()
            .map(|(i, &v)| (v, i as u32))
            .collect();
        let mut src = dst.clone();
        let mut offsets = Vec::with_capacity(dst.len() + 1);
        offsets.push(0u32);
        let mut picked = Vec::with_capacity(sampled.len());
        let mut at = 0;
        for &c in &counts {
            for &u in &sampled[at..at + c as usize] {
                let i = *index.entry(u).or_insert_with(|| {
                    src.push(u);
                    (src.len() - 1) as u32
                });
                picked.push(i);
            }
            at += c as usize;
            offsets.push(picked.len() as u32);
        }
        blocks.push(Block {
            num_src: src.len(),
            num_dst: dst.len(),
            offsets,
            nbrs: picked,
        });
        dst = src;
    }
    blocks.reverse();
    (blocks, dst)
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
        assert_eq!(again, (blocks, input));
    }
}
