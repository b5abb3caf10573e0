//! Link prediction: `split` holds out a fraction of the edges (never one whose removal would
//! disconnect the graph: a random spanning forest is kept first), and `eval linkpred` scores
//! held-out edges against sampled non-edges: ROC-AUC, and MRR / Hits@k of each true edge ranked
//! among corrupted ones. Scores are the dot product of the two embeddings, or (`hadamard`)
//! node2vec's edge features `e_u * e_v` with a logistic regression fitted on half the test pairs
//! and evaluated on the other half.
//!
//! `split` runs on one process. `eval linkpred` with the dot score runs on any number of ranks
//! (each reads its stripe of the embeddings and fetches the rows its share of the pairs needs);
//! the Hadamard score fits one model on all training pairs and runs on one process.

use std::path::Path;

use rand::RngExt;
use rayon::prelude::*;
use rustc_hash::FxHashSet;

use crate::comm::{decode_u64, encode_u64, Comm};
use crate::error::{Error, Result};
use crate::eval::fit_binary;
use crate::graph::h5::{write_edges, EdgeFile, EdgeWriter};
use crate::graph::partition::{Partitioner, Scheme};
use crate::sample::rng_for;

/// Edges read per chunk while splitting.
const CHUNK: u64 = 1 << 22;

#[derive(Debug, serde::Serialize)]
pub struct SplitSummary {
    pub edges: u64,
    pub train_edges: u64,
    pub test_edges: u64,
    /// Edges that could not be held out without disconnecting the graph or leaking a duplicate.
    pub protected_edges: u64,
}

fn canon(a: u64, b: u64, directed: bool) -> (u64, u64) {
    if directed || a <= b {
        (a, b)
    } else {
        (b, a)
    }
}

fn find(parent: &mut [u64], mut x: u64) -> u64 {
    while parent[x as usize] != x {
        let p = parent[parent[x as usize] as usize];
        parent[x as usize] = p;
        x = p;
    }
    x
}

/// Hold out `fraction` of the edges of `graph` into `test` (with as many sampled non-edges in
/// `neg_src`/`neg_dst`); the rest go to `train`.
pub fn split(
    graph: &Path,
    fraction: f64,
    seed: u64,
    train: &Path,
    test: &Path,
) -> Result<SplitSummary> {
    if !(fraction > 0.0 && fraction < 1.0) {
        return Err(Error::config(format!(
            "--test-fraction {fraction} must be in (0, 1)"
        )));
    }
    let f = EdgeFile::open(graph)?;
    let mut edges = Vec::with_capacity(f.num_edges as usize);
    let mut a = 0;
    while a < f.num_edges {
        let b = (a + CHUNK).min(f.num_edges);
        edges.extend(f.read_edges(a, b)?);
        a = b;
    }
    let n = f.num_nodes;
    let mut rng = rng_for(seed, 0, 7);
    let mut order: Vec<usize> = (0..edges.len()).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.random_range(0..=i));
    }
    // Pairs that occur more than once are never held out (a copy would stay in training).
    let mut seen = FxHashSet::default();
    let mut repeated = FxHashSet::default();
    for e in &edges {
        let k = canon(e.src, e.dst, f.directed);
        if !seen.insert(k) {
            repeated.insert(k);
        }
    }
    // A random spanning forest stays in training: removing any other edge keeps every
    // component connected.
    let mut parent: Vec<u64> = (0..n).collect();
    let mut candidates = Vec::new();
    for &i in &order {
        let e = &edges[i];
        let (ra, rb) = (find(&mut parent, e.src), find(&mut parent, e.dst));
        if ra != rb {
            parent[ra as usize] = rb;
        } else if e.src != e.dst && !repeated.contains(&canon(e.src, e.dst, f.directed)) {
            candidates.push(i);
        }
    }
    let want = (fraction * edges.len() as f64).round() as usize;
    let take = want.min(candidates.len());
    if take < want {
        eprintln!(
            "graphscale: only {take} of the requested {want} edges can be held out without disconnecting the graph"
        );
    }
    if take == 0 {
        return Err(Error::bad_input(
            graph,
            "no edge can be held out without disconnecting the graph (a forest has no spare edges)",
        ));
    }
    let mut held = vec![false; edges.len()];
    for &i in &candidates[..take] {
        held[i] = true;
    }
    let mut w = EdgeWriter::create(train, f.weighted)?;
    let mut pos = Vec::with_capacity(take);
    for (i, e) in edges.iter().enumerate() {
        if held[i] {
            pos.push(*e);
        } else {
            w.push(*e)?;
        }
    }
    let (_, train_edges) = w.finish(Some(n), f.directed, None)?;
    // As many non-edges (of the whole graph), uniformly drawn.
    if n < 2 {
        return Err(Error::bad_input(graph, "fewer than 2 nodes"));
    }
    let mut neg = Vec::with_capacity(take);
    let mut tries = 0u64;
    while neg.len() < take {
        tries += 1;
        if tries > 100 * take as u64 + 1000 {
            return Err(Error::bad_input(
                graph,
                "the graph is too dense to sample non-edges",
            ));
        }
        let (u, v) = (rng.random_range(0..n), rng.random_range(0..n));
        if u != v && !seen.contains(&canon(u, v, f.directed)) {
            neg.push((u, v));
        }
    }
    write_edges(test, &pos, n, f.directed, false)?;
    let out = hdf5::File::open_rw(test).map_err(|e| Error::hdf5(test, "reopen", e))?;
    let err = |e| Error::hdf5(test, "write negatives", e);
    let ns: Vec<u64> = neg.iter().map(|p| p.0).collect();
    let nd: Vec<u64> = neg.iter().map(|p| p.1).collect();
    out.new_dataset_builder()
        .with_data(&ns)
        .create("neg_src")
        .map_err(err)?;
    out.new_dataset_builder()
        .with_data(&nd)
        .create("neg_dst")
        .map_err(err)?;
    crate::graph::h5::flush(&out, test)?;
    Ok(SplitSummary {
        edges: edges.len() as u64,
        train_edges,
        test_edges: take as u64,
        protected_edges: (edges.len() - candidates.len()) as u64,
    })
}

/// A test set: held-out edges and non-edges.
pub struct TestSet {
    pub pos: Vec<(u64, u64)>,
    pub neg: Vec<(u64, u64)>,
}

/// Read a test file written by `split`, checking every id against the embedding's rows.
pub fn read_test(path: &Path, rows: usize) -> Result<TestSet> {
    let f = EdgeFile::open(path)?;
    if f.num_nodes != rows as u64 {
        return Err(Error::Mismatch(format!(
            "{}: the test edges are over {} nodes but the embeddings have {rows} rows; use the embeddings trained on this split's training graph",
            path.display(),
            f.num_nodes
        )));
    }
    let pos: Vec<(u64, u64)> = f
        .read_edges(0, f.num_edges)?
        .into_iter()
        .map(|e| (e.src, e.dst))
        .collect();
    let h = crate::graph::h5::open_h5(path)?;
    let read = |name: &str| -> Result<Vec<u64>> {
        h.dataset(name)
            .and_then(|d| d.read_raw::<u64>())
            .map_err(|_| {
                Error::bad_input(
                    path,
                    format!("missing or unreadable dataset '{name}' (u64): write test files with `graphscale split`"),
                )
            })
    };
    let (ns, nd) = (read("neg_src")?, read("neg_dst")?);
    if ns.len() != nd.len() {
        return Err(Error::bad_input(
            path,
            "'neg_src' and 'neg_dst' differ in length",
        ));
    }
    if let Some((i, _)) = ns
        .iter()
        .chain(&nd)
        .enumerate()
        .find(|(_, &v)| v >= rows as u64)
    {
        return Err(Error::bad_input(
            path,
            format!(
                "negative pair {} names a node outside the {rows} rows",
                i % ns.len().max(1)
            ),
        ));
    }
    if pos.is_empty() || ns.is_empty() {
        return Err(Error::bad_input(path, "no test edges or no negatives"));
    }
    Ok(TestSet {
        pos,
        neg: ns.into_iter().zip(nd).collect(),
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Score {
    Dot,
    Hadamard,
}

#[derive(Debug, Default, serde::Serialize)]
pub struct LinkResult {
    pub auc: f64,
    pub mrr: f64,
    #[serde(rename = "hits@1")]
    pub hits1: f64,
    #[serde(rename = "hits@3")]
    pub hits3: f64,
    #[serde(rename = "hits@10")]
    pub hits10: f64,
    pub positives: usize,
    pub negatives: usize,
}

/// ROC-AUC by the rank-sum (Mann-Whitney) statistic, ties counted half.
pub fn roc_auc(pos: &[f64], neg: &[f64]) -> f64 {
    let mut all: Vec<(f64, bool)> = pos
        .iter()
        .map(|&s| (s, true))
        .chain(neg.iter().map(|&s| (s, false)))
        .collect();
    all.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut rank_sum = 0.0;
    let mut i = 0;
    while i < all.len() {
        let mut j = i;
        while j < all.len() && all[j].0 == all[i].0 {
            j += 1;
        }
        let mid = (i + j + 1) as f64 / 2.0; // mean of ranks i+1 ..= j
        rank_sum += mid * all[i..j].iter().filter(|x| x.1).count() as f64;
        i = j;
    }
    let (p, q) = (pos.len() as f64, neg.len() as f64);
    (rank_sum - p * (p + 1.0) / 2.0) / (p * q)
}

/// Evaluate: AUC of positives against the stored negatives; MRR and Hits@k of each positive
/// (u, v) against `corrupt` draws of pairs (u, w), w uniform over the nodes other than u and v
/// (unfiltered).
pub fn link_prediction(
    emb: &[f32],
    dim: usize,
    t: &TestSet,
    score: Score,
    corrupt: usize,
    seed: u64,
) -> LinkResult {
    let rows = emb.len() / dim;
    let row = |v: u64| &emb[v as usize * dim..(v as usize + 1) * dim];
    // Hadamard: fit on the even-indexed pairs, evaluate on the odd ones.
    let (pos, neg, model) = match score {
        Score::Dot => (t.pos.clone(), t.neg.clone(), None),
        Score::Hadamard => {
            let mut x = Vec::new();
            let mut y = Vec::new();
            for (k, &(a, b)) in t.pos.iter().chain(&t.neg).enumerate() {
                let is_pos = k < t.pos.len();
                let idx = if is_pos { k } else { k - t.pos.len() };
                if idx % 2 == 0 {
                    x.extend(row(a).iter().zip(row(b)).map(|(p, q)| p * q));
                    y.push(if is_pos { 1.0 } else { -1.0 });
                }
            }
            let w = fit_binary(&x, dim, &y, 1.0);
            let odd = |v: &[(u64, u64)]| v.iter().skip(1).step_by(2).copied().collect::<Vec<_>>();
            (odd(&t.pos), odd(&t.neg), Some(w))
        }
    };
    let share = score_share(
        &row,
        rows as u64,
        &TestSet { pos, neg },
        model.as_deref(),
        corrupt,
        seed,
        (0, 1),
    );
    share.result()
}

/// Scores of one rank's share of a test set: the pairs whose index is `part.0` modulo `part.1`.
struct Share {
    /// (index, score) of positives and of negatives; (index, rank) of positives.
    pos: Vec<(u64, f64)>,
    neg: Vec<(u64, f64)>,
    ranks: Vec<(u64, f64)>,
}

/// The corrupted tails drawn for positive `i` (some may equal its head or tail: skipped).
fn corruptions(seed: u64, i: usize, rows: u64, corrupt: usize) -> impl Iterator<Item = u64> {
    let mut rng = rng_for(seed, 0, 1000 + i as u64);
    (0..corrupt).map(move |_| rng.random_range(0..rows))
}

fn score_share<'r>(
    row: &(impl Fn(u64) -> &'r [f32] + Sync),
    rows: u64,
    t: &TestSet,
    model: Option<&[f64]>,
    corrupt: usize,
    seed: u64,
    part: (usize, usize),
) -> Share {
    let s = |a: u64, b: u64| -> f64 {
        let (x, y) = (row(a), row(b));
        match model {
            None => x
                .iter()
                .zip(y)
                .map(|(&p, &q)| f64::from(p) * f64::from(q))
                .sum(),
            Some(w) => {
                x.iter()
                    .zip(y)
                    .zip(w)
                    .map(|((&p, &q), &wi)| f64::from(p * q) * wi)
                    .sum::<f64>()
                    + w[x.len()]
            }
        }
    };
    let mine = |v: &[(u64, u64)]| -> Vec<(usize, (u64, u64))> {
        v.iter()
            .copied()
            .enumerate()
            .skip(part.0)
            .step_by(part.1)
            .collect()
    };
    let (pos, neg) = (mine(&t.pos), mine(&t.neg));
    let ps: Vec<(u64, f64)> = pos
        .par_iter()
        .map(|&(i, (a, b))| (i as u64, s(a, b)))
        .collect();
    let ns: Vec<(u64, f64)> = neg
        .par_iter()
        .map(|&(i, (a, b))| (i as u64, s(a, b)))
        .collect();
    let ranks = pos
        .par_iter()
        .zip(&ps)
        .map(|(&(i, (a, b)), &(_, truth))| {
            let (mut greater, mut equal) = (0usize, 0usize);
            for w in corruptions(seed, i, rows, corrupt) {
                if w == b || w == a {
                    continue;
                }
                let x = s(a, w);
                if x > truth {
                    greater += 1;
                } else if x == truth {
                    equal += 1;
                }
            }
            (i as u64, 1.0 + greater as f64 + equal as f64 / 2.0)
        })
        .collect();
    Share {
        pos: ps,
        neg: ns,
        ranks,
    }
}

impl Share {
    /// The metrics of a share that holds every index (one rank, or all shares merged).
    fn result(mut self) -> LinkResult {
        for v in [&mut self.pos, &mut self.neg, &mut self.ranks] {
            v.sort_by_key(|x| x.0);
        }
        let vals = |v: &[(u64, f64)]| v.iter().map(|x| x.1).collect::<Vec<f64>>();
        let (ps, ns, ranks) = (vals(&self.pos), vals(&self.neg), vals(&self.ranks));
        let m = ranks.len() as f64;
        let hits = |k: f64| ranks.iter().filter(|&&r| r <= k).count() as f64 / m;
        LinkResult {
            auc: roc_auc(&ps, &ns),
            mrr: ranks.iter().map(|r| 1.0 / r).sum::<f64>() / m,
            hits1: hits(1.0),
            hits3: hits(3.0),
            hits10: hits(10.0),
            positives: ps.len(),
            negatives: ns.len(),
        }
    }
}

/// Collective: link prediction (dot score) distributed over the ranks of `comm`. Each rank reads
/// only its stripe of the embedding rows (`row v` on rank `v mod R`) into a window, scores the
/// test pairs whose index is its rank modulo R, and fetches the other rows those pairs and their
/// corruptions need one-sidedly. The scores are all-gathered, so the metrics are exactly those
/// of [`link_prediction`] on one process.
pub fn link_prediction_distributed(
    comm: &Comm,
    embeddings: &Path,
    test: &Path,
    corrupt: usize,
    seed: u64,
) -> Result<LinkResult> {
    let (rank, ranks) = (comm.rank(), comm.size());
    let (rows, dim, mine) = crate::embeddings::read_embeddings_striped(comm, embeddings)?;
    let t = crate::spmd::agree(comm, read_test(test, rows))?;
    let part = Partitioner::new(Scheme::Striped, rows as u64, ranks);
    let rb = dim * 4;
    let mut window = comm.window(mine.len() * 4);
    window.with_local_mut(|b| {
        for (chunk, x) in b.chunks_exact_mut(4).zip(&mine) {
            chunk.copy_from_slice(&x.to_le_bytes());
        }
    });
    // Every stripe is in place before anyone reads one.
    comm.barrier();
    // Rows this rank's pairs need: endpoints and corrupted tails.
    let mut need: FxHashSet<u64> = FxHashSet::default();
    for (i, &(a, b)) in t.pos.iter().enumerate().skip(rank).step_by(ranks) {
        need.extend([a, b]);
        need.extend(corruptions(seed, i, rows as u64, corrupt));
    }
    for &(a, b) in t.neg.iter().skip(rank).step_by(ranks) {
        need.extend([a, b]);
    }
    let mut need: Vec<u64> = need.into_iter().collect();
    need.sort_unstable_by_key(|&v| (part.owner(v), v));
    let slot: rustc_hash::FxHashMap<u64, usize> =
        need.iter().enumerate().map(|(s, &v)| (v, s)).collect();
    let mut data = vec![0f32; need.len() * dim];
    let mut wanted: Vec<Vec<u32>> = vec![Vec::new(); ranks];
    for &v in &need {
        let (o, r) = part.locate(v);
        wanted[o].push(r as u32);
    }
    let remote: Vec<(usize, &[u32])> = wanted
        .iter()
        .enumerate()
        .filter(|&(o, w)| o != rank && !w.is_empty())
        .map(|(o, w)| (o, w.as_slice()))
        .collect();
    let count: usize = remote.iter().map(|(_, w)| w.len()).sum();
    let mut buf = vec![0u8; count.max(1) * rb];
    window.get_rows(comm.watchdog(), &remote, rb, 4096, &mut buf);
    let mut fetched = buf.chunks_exact(rb);
    for (s, &v) in need.iter().enumerate() {
        let (o, r) = part.locate(v);
        let out = &mut data[s * dim..(s + 1) * dim];
        if o == rank {
            out.copy_from_slice(&mine[r * dim..(r + 1) * dim]);
        } else {
            let b = fetched.next().expect("one fetched row per remote need");
            for (x, c) in out.iter_mut().zip(b.chunks_exact(4)) {
                *x = f32::from_le_bytes(c.try_into().expect("4 bytes"));
            }
        }
    }
    let row = |v: u64| {
        let s = slot[&v];
        &data[s * dim..(s + 1) * dim]
    };
    let share = score_share(&row, rows as u64, &t, None, corrupt, seed, (rank, ranks));
    // Every rank gets every share: (index, value) records, positives, negatives, ranks.
    let mut all = Share {
        pos: Vec::new(),
        neg: Vec::new(),
        ranks: Vec::new(),
    };
    for (mine, into) in [
        (&share.pos, &mut all.pos),
        (&share.neg, &mut all.neg),
        (&share.ranks, &mut all.ranks),
    ] {
        let flat: Vec<u64> = mine.iter().flat_map(|&(i, x)| [i, x.to_bits()]).collect();
        for b in comm.all_gather_bytes(&encode_u64(&flat)) {
            let v = decode_u64(&b);
            into.extend(v.chunks_exact(2).map(|c| (c[0], f64::from_bits(c[1]))));
        }
    }
    Ok(all.result())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::Edge;

    #[test]
    fn auc_counts_ordered_pairs_and_ties() {
        assert_eq!(roc_auc(&[3.0, 4.0], &[1.0, 2.0]), 1.0);
        assert_eq!(roc_auc(&[1.0, 2.0], &[3.0, 4.0]), 0.0);
        assert_eq!(roc_auc(&[1.0], &[1.0]), 0.5);
        // 2 of 4 (pos, neg) pairs ordered, one tie: (2 + 0.5) / 4.
        assert!((roc_auc(&[2.0, 0.5], &[1.0, 2.0]) - 0.375).abs() < 1e-12);
    }

    #[test]
    fn split_keeps_the_graph_connected_and_holds_out_the_fraction() {
        let d = tempfile::tempdir().expect("tempdir");
        // Two triangles joined by a bridge: only triangle edges may be held out.
        let raw = [(0, 1), (1, 2), (2, 0), (2, 3), (3, 4), (4, 5), (5, 3)];
        let edges: Vec<Edge> = raw
            .iter()
            .map(|&(s, t)| Edge {
                src: s,
                dst: t,
                weight: 1.0,
            })
            .collect();
        let g = d.path().join("g.h5");
        write_edges(&g, &edges, 6, false, false).expect("write");
        let (tr, te) = (d.path().join("train.h5"), d.path().join("test.h5"));
        let s = split(&g, 0.5, 1, &tr, &te).expect("split");
        // A spanning forest of 6 nodes has 5 edges: at most 2 can go.
        assert_eq!(s.test_edges, 2);
        assert_eq!(s.train_edges, 5);
        let t = read_test(&te, 6).expect("read");
        assert!(t
            .pos
            .iter()
            .all(|&(a, b)| a != b && !(a.min(b) == 2 && a.max(b) == 3)));
        assert_eq!(t.neg.len(), 2);
        let all: FxHashSet<(u64, u64)> = raw.iter().map(|&(a, b)| canon(a, b, false)).collect();
        assert!(t
            .neg
            .iter()
            .all(|&(a, b)| !all.contains(&canon(a, b, false))));
        // The training graph is still connected.
        let f = EdgeFile::open(&tr).expect("open");
        let mut parent: Vec<u64> = (0..6).collect();
        for e in f.read_edges(0, f.num_edges).expect("edges") {
            let (a, b) = (find(&mut parent, e.src), find(&mut parent, e.dst));
            parent[a as usize] = b;
        }
        let r = find(&mut parent, 0);
        assert!((0..6).all(|v| find(&mut parent, v) == r));
        assert!(
            read_test(&te, 7).is_err(),
            "row count mismatch must be refused"
        );
    }

    #[test]
    fn perfect_embeddings_rank_first() {
        // Nodes 0-1 and 2-3 identical pairs; 0-1 and 2-3 orthogonal.
        let emb = vec![1.0f32, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0];
        let t = TestSet {
            pos: vec![(0, 1), (2, 3)],
            neg: vec![(0, 2), (1, 3)],
        };
        let r = link_prediction(&emb, 2, &t, Score::Dot, 20, 0);
        assert_eq!(r.auc, 1.0);
        // Every corruption (a node of the other pair) scores below the truth.
        assert_eq!((r.mrr, r.hits1), (1.0, 1.0), "{r:?}");
    }
}
