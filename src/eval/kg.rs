//! Knowledge-graph completion, filtered ranking: every test triple (h, r, t) asks for its tail
//! (h, r, ?) and its head (?, r, t) among all entities; candidates that form a known true
//! triple (in the filter files or the test file itself) are skipped, and the true entity's rank
//! is 1 + the candidates scoring higher + half of those scoring the same (ties neither help nor
//! hurt). MRR, MR and Hits@1/3/10 average both sides of every test triple (Bordes et al. 2013's
//! filtered setting, as the RotatE paper reports).
//!
//! Distributed over the ranks of the job: each rank reads one stripe of the entity rows
//! (entities `rank, rank + ranks, ...`) and scores every test query against its stripe only;
//! the rows of the test triples' own entities are all-gathered (every rank computes each query
//! and the true entity's score from the same bytes), and the per-query counts of higher and tied
//! candidates are summed over the ranks. The result is the same at any rank count.

use std::path::{Path, PathBuf};

use rayon::prelude::*;
use rustc_hash::FxHashMap;
use serde::Serialize;

use crate::comm::{Comm, ReduceOp};
use crate::error::{Error, Result};
use crate::graph::partition::{Partitioner, Scheme};
use crate::graph::triples::{read_all, Triple};
use crate::model::kge::Score;

/// A trained knowledge-graph model as written by `graphscale train --model distmult|...`:
/// this rank's entity rows under `part` (a stripe when read from a file, the training shard
/// during training), all its relations.
pub struct KgEmbeddings {
    pub score: Score,
    pub gamma: f32,
    pub entities: usize,
    pub dim: usize,
    pub rows: Vec<f32>,
    pub part: Partitioner,
    pub rank: usize,
    pub relations: Vec<f32>,
    pub rel_dim: usize,
}

impl KgEmbeddings {
    /// Every entity row.
    pub fn read(path: &Path) -> Result<KgEmbeddings> {
        Self::read_stripe(path, 0, 1)
    }

    /// Entity rows `rank, rank + ranks, ...`.
    pub fn read_stripe(path: &Path, rank: usize, ranks: usize) -> Result<KgEmbeddings> {
        let f = crate::graph::h5::open_h5(path)?;
        let model: hdf5::types::VarLenUnicode = f
            .attr("model")
            .and_then(|a| a.read_scalar())
            .map_err(|e| Error::hdf5(path, "attribute 'model'", e))?;
        let score = Score::parse(model.as_str()).ok_or_else(|| {
            Error::bad_input(
                path,
                format!(
                    "attribute model = '{}': not a knowledge-graph model (distmult, complex, transe, rotate); `eval kg` ranks triples with the relations such a run writes",
                    model.as_str()
                ),
            )
        })?;
        let (entities, dim, rows) = crate::embeddings::read_embeddings_stripe(path, rank, ranks)?;
        let ds = f.dataset("relations").map_err(|_| {
            Error::bad_input(
                path,
                "no dataset 'relations' (written by knowledge-graph training)",
            )
        })?;
        let shape = ds.shape();
        let rel_dim = if shape.len() == 2 { shape[1] } else { 0 };
        if rel_dim != score.rel_dim(dim) {
            return Err(Error::bad_input(
                path,
                format!(
                    "dataset 'relations' has shape {shape:?}; {} with {dim}-dimensional entities needs {} values per relation",
                    score.name(),
                    score.rel_dim(dim)
                ),
            ));
        }
        let relations = ds
            .read_raw::<f32>()
            .map_err(|e| Error::hdf5(path, "read relations", e))?;
        let gamma = f
            .attr("gamma")
            .and_then(|a| a.read_scalar::<f32>())
            .map_err(|e| Error::hdf5(path, "attribute 'gamma'", e))?;
        Ok(KgEmbeddings {
            score,
            gamma,
            entities,
            dim,
            rows,
            part: Partitioner::new(Scheme::Striped, entities as u64, ranks),
            rank,
            relations,
            rel_dim,
        })
    }

    /// Entity `e`'s row, if this rank holds it.
    fn local(&self, e: u64) -> Option<&[f32]> {
        let i = self.index(e)?;
        self.rows.get(i * self.dim..(i + 1) * self.dim)
    }

    /// This rank's row index of entity `e`, if it holds it.
    fn index(&self, e: u64) -> Option<usize> {
        if e >= self.entities as u64 {
            return None;
        }
        let (owner, row) = self.part.locate(e);
        (owner == self.rank).then_some(row)
    }

    fn relation(&self, r: u32) -> &[f32] {
        &self.relations[r as usize * self.rel_dim..(r as usize + 1) * self.rel_dim]
    }

    pub fn num_relations(&self) -> usize {
        self.relations.len() / self.rel_dim.max(1)
    }
}

/// Filtered ranking metrics, averaged over both sides of every test triple.
#[derive(Clone, Debug, Serialize)]
pub struct KgMetrics {
    pub mrr: f64,
    pub mr: f64,
    #[serde(rename = "hits@1")]
    pub hits1: f64,
    #[serde(rename = "hits@3")]
    pub hits3: f64,
    #[serde(rename = "hits@10")]
    pub hits10: f64,
    /// Test triples ranked (each on both sides).
    pub triples: usize,
    pub model: String,
}

/// Rank `test` (with `known` as the filter) against all entities of `emb` (the whole matrix).
pub fn rank(emb: &KgEmbeddings, test: &[Triple], known: &[Triple]) -> KgMetrics {
    let rows: FxHashMap<u64, &[f32]> = test
        .iter()
        .flat_map(|&(h, _, t)| [h, t])
        .map(|e| (e, emb.local(e).expect("every row is local")))
        .collect();
    let counts = stripe_counts(emb, test, known, &rows);
    metrics(emb, test, &counts)
}

/// Per test triple [tail higher, tail ties, head higher, head ties] among this stripe's
/// candidates, filtered (known true entities other than the truth skipped; the truth is not
/// its own tie). `rows` holds the rows of every test entity.
fn stripe_counts(
    emb: &KgEmbeddings,
    test: &[Triple],
    known: &[Triple],
    rows: &FxHashMap<u64, &[f32]>,
) -> Vec<u64> {
    let mut tails: FxHashMap<(u64, u32), Vec<u64>> = FxHashMap::default();
    let mut heads: FxHashMap<(u32, u64), Vec<u64>> = FxHashMap::default();
    for &(h, r, t) in known.iter().chain(test) {
        tails.entry((h, r)).or_default().push(t);
        heads.entry((r, t)).or_default().push(h);
    }
    let local = emb.rows.len() / emb.dim.max(1);
    let counts: Vec<[u64; 4]> = test
        .par_iter()
        .map_init(
            || (vec![0f32; local], vec![0f32; 1]),
            |(scores, one), &(h, r, t)| {
                let rel = emb.relation(r);
                let (eh, et) = (rows[&h], rows[&t]);
                let mut out = [0u64; 4];
                for (side, tail) in [true, false].into_iter().enumerate() {
                    let (e, truth, known) = if tail {
                        (eh, t, &tails[&(h, r)])
                    } else {
                        (et, h, &heads[&(r, t)])
                    };
                    // The truth's score from the gathered row, identical on every rank.
                    emb.score
                        .score_all(tail, e, rel, rows[&truth], emb.gamma, one);
                    emb.score
                        .score_all(tail, e, rel, &emb.rows, emb.gamma, scores);
                    let (hi, ti) = filtered_counts(emb, scores, one[0], truth, known);
                    out[2 * side] = hi;
                    out[2 * side + 1] = ti;
                }
                out
            },
        )
        .collect();
    counts.into_iter().flatten().collect()
}

/// Candidates of the stripe scoring higher than `st` and the same (NaN counts as higher),
/// without `truth` and the other `known` true entities.
fn filtered_counts(
    emb: &KgEmbeddings,
    scores: &[f32],
    st: f32,
    truth: u64,
    known: &[u64],
) -> (u64, u64) {
    let worse = |s: f32| s > st || s.is_nan() || st.is_nan();
    let (mut higher, mut ties) = (0u64, 0u64);
    for &s in scores {
        if worse(s) {
            higher += 1;
        } else if s == st {
            ties += 1;
        }
    }
    let mut seen = rustc_hash::FxHashSet::default();
    for &k in known.iter().chain([&truth]) {
        let Some(i) = emb.index(k) else { continue };
        if !seen.insert(k) {
            continue;
        }
        let s = scores[i];
        if worse(s) {
            higher -= 1;
        } else if s == st {
            ties -= 1;
        }
    }
    (higher, ties)
}

/// Metrics from the summed counts of every test triple.
fn metrics(emb: &KgEmbeddings, test: &[Triple], counts: &[u64]) -> KgMetrics {
    let ranks: Vec<f64> = counts
        .chunks_exact(2)
        .map(|c| 1.0 + c[0] as f64 + c[1] as f64 / 2.0)
        .collect();
    let n = ranks.len().max(1) as f64;
    let mean = |f: &dyn Fn(f64) -> f64| ranks.iter().map(|&r| f(r)).sum::<f64>() / n;
    KgMetrics {
        mrr: mean(&|r| 1.0 / r),
        mr: mean(&|r| r),
        hits1: mean(&|r| f64::from(u8::from(r <= 1.0))),
        hits3: mean(&|r| f64::from(u8::from(r <= 3.0))),
        hits10: mean(&|r| f64::from(u8::from(r <= 10.0))),
        triples: test.len(),
        model: emb.score.name().to_string(),
    }
}

/// Collective `graphscale eval kg`: read, check and rank, distributed over the ranks.
pub fn evaluate(
    comm: &Comm,
    embeddings: &Path,
    test: &Path,
    filter: &[PathBuf],
) -> Result<KgMetrics> {
    let (rank, ranks) = (comm.rank(), comm.size());
    let emb = crate::spmd::agree(comm, KgEmbeddings::read_stripe(embeddings, rank, ranks))?;
    let rels = emb.num_relations() as u64;
    let read = read_all(&[test.to_path_buf()], emb.entities as u64, rels).and_then(|t| {
        let k = read_all(filter, emb.entities as u64, rels)?;
        Ok((t, k))
    });
    let (test_triples, known) = crate::spmd::agree(comm, read)?;
    Ok(rank_distributed(comm, &emb, &test_triples, &known))
}

/// Collective: rank `test` (filtered by `known`) with every rank holding its part of the
/// entity rows (`emb.part`); the same result on every rank.
pub fn rank_distributed(
    comm: &Comm,
    emb: &KgEmbeddings,
    test_triples: &[Triple],
    known: &[Triple],
) -> KgMetrics {
    // The test entities' rows: each rank contributes those it holds.
    let mut need: Vec<u64> = test_triples.iter().flat_map(|&(h, _, t)| [h, t]).collect();
    need.sort_unstable();
    need.dedup();
    let mut mine = Vec::new();
    for &e in &need {
        if let Some(row) = emb.local(e) {
            mine.extend_from_slice(&e.to_le_bytes());
            mine.extend(row.iter().flat_map(|x| x.to_le_bytes()));
        }
    }
    let parts = comm.all_gather_bytes(&mine);
    let rec = 8 + 4 * emb.dim;
    let gathered: Vec<(u64, Vec<f32>)> = parts
        .iter()
        .flat_map(|b| b.chunks_exact(rec))
        .map(|r| {
            let e = u64::from_le_bytes(r[..8].try_into().expect("8 bytes"));
            let v = r[8..]
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
                .collect();
            (e, v)
        })
        .collect();
    let rows: FxHashMap<u64, &[f32]> = gathered.iter().map(|(e, v)| (*e, v.as_slice())).collect();
    let counts = stripe_counts(emb, test_triples, known, &rows);
    let counts = comm.all_reduce_u64(&counts, ReduceOp::Sum);
    metrics(emb, test_triples, &counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_hot(n: usize, first: usize, step: usize) -> KgEmbeddings {
        // DistMult with one-hot entities and an all-ones relation: (e, 0, e) scores 1 and
        // every other pair 0. A stripe holds entities first, first + step, ...
        let mut rows = Vec::new();
        for e in (first..n).step_by(step) {
            let mut row = vec![0f32; n];
            row[e] = 1.0;
            rows.extend(row);
        }
        KgEmbeddings {
            score: Score::DistMult,
            gamma: 0.0,
            entities: n,
            dim: n,
            rows,
            part: Partitioner::new(Scheme::Striped, n as u64, step),
            rank: first,
            relations: vec![1.0; n],
            rel_dim: n,
        }
    }

    #[test]
    fn filtered_counts_skip_known_entities_and_the_truth() {
        // Entity 2 is the truth (score 0.5); 0 scores higher but is a known true tail.
        let emb = one_hot(5, 0, 1);
        let scores = [0.9f32, 0.7, 0.5, 0.5, 0.1];
        assert_eq!(filtered_counts(&emb, &scores, 0.5, 2, &[]), (2, 1));
        assert_eq!(filtered_counts(&emb, &scores, 0.5, 2, &[0, 2]), (1, 1));
        assert_eq!(filtered_counts(&emb, &scores, 0.5, 2, &[0, 0, 3]), (1, 0));
        // A stripe (entities 1, 3) holds neither the truth nor entity 0.
        let odd = one_hot(5, 1, 2);
        assert_eq!(filtered_counts(&odd, &[0.7, 0.5], 0.5, 2, &[0, 2]), (1, 1));
    }

    #[test]
    fn stripes_sum_to_the_whole_ranking() {
        let n = 7;
        let whole = one_hot(n, 0, 1);
        let test = [(1u64, 0u32, 2u64), (3, 0, 3), (5, 0, 6)];
        let known = [(1u64, 0u32, 1u64)];
        let rows: FxHashMap<u64, &[f32]> = (0..n as u64)
            .map(|e| (e, whole.local(e).unwrap()))
            .collect();
        let all = stripe_counts(&whole, &test, &known, &rows);
        let mut sum = vec![0u64; all.len()];
        for first in 0..3 {
            let part = one_hot(n, first, 3);
            for (s, c) in sum
                .iter_mut()
                .zip(stripe_counts(&part, &test, &known, &rows))
            {
                *s += c;
            }
        }
        assert_eq!(sum, all);
    }

    #[test]
    fn a_planted_model_ranks_its_triples_first() {
        // (e, 0, e) scores 1 and every other pair 0 (`one_hot`), so each of these test
        // triples ranks first on both sides.
        let emb = one_hot(5, 0, 1);
        let m = rank(&emb, &[(1, 0, 1), (3, 0, 3)], &[]);
        assert_eq!((m.mrr, m.mr, m.hits1), (1.0, 1.0, 1.0));
        // A triple the model gets wrong: (1, 0, 2) scores 0 like every tail but 1: the
        // truth ties with 3 others (after 1, which scores higher) -> rank 1 + 1 + 1.5.
        let m = rank(&emb, &[(1, 0, 2)], &[]);
        assert_eq!(m.mr, 3.5);
        // With (1, 0, 1) known, the higher-scoring tail leaves: rank 2.5 on the tail side;
        // the head side (?, 0, 2) keeps 3.5.
        let m = rank(&emb, &[(1, 0, 2)], &[(1, 0, 1)]);
        assert_eq!(m.mr, (2.5 + 3.5) / 2.0);
    }
}
