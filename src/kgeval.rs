//! Knowledge-graph completion, filtered ranking: every test triple (h, r, t) asks for its tail
//! (h, r, ?) and its head (?, r, t) among all entities; candidates that form a known true
//! triple (in the filter files or the test file itself) are skipped, and the true entity's rank
//! is 1 + the candidates scoring higher + half of those scoring the same (ties neither help nor
//! hurt). MRR, MR and Hits@1/3/10 average both sides of every test triple (Bordes et al. 2013's
//! filtered setting, as the RotatE paper reports).

use std::path::{Path, PathBuf};

use rayon::prelude::*;
use rustc_hash::FxHashMap;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::graph::triples::{read_all, Triple};
use crate::model::kge::Score;

/// A trained knowledge-graph model as written by `graphscale train --model distmult|...`.
pub struct KgEmbeddings {
    pub score: Score,
    pub gamma: f32,
    pub entities: usize,
    pub dim: usize,
    pub rows: Vec<f32>,
    pub relations: Vec<f32>,
    pub rel_dim: usize,
}

impl KgEmbeddings {
    pub fn read(path: &Path) -> Result<KgEmbeddings> {
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
        let (entities, dim, rows) = crate::train::output::read_embeddings(path)?;
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
            relations,
            rel_dim,
        })
    }

    fn entity(&self, e: u64) -> &[f32] {
        &self.rows[e as usize * self.dim..(e as usize + 1) * self.dim]
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

/// Rank `test` (with `known` as the filter) against all entities of `emb`.
pub fn rank(emb: &KgEmbeddings, test: &[Triple], known: &[Triple]) -> KgMetrics {
    let mut tails: FxHashMap<(u64, u32), Vec<u64>> = FxHashMap::default();
    let mut heads: FxHashMap<(u32, u64), Vec<u64>> = FxHashMap::default();
    for &(h, r, t) in known.iter().chain(test) {
        tails.entry((h, r)).or_default().push(t);
        heads.entry((r, t)).or_default().push(h);
    }
    let ranks: Vec<[f64; 2]> = test
        .par_iter()
        .map_init(
            || vec![0f32; emb.entities],
            |scores, &(h, r, t)| {
                let rel = emb.relation(r);
                let (eh, et) = (emb.entity(h), emb.entity(t));
                emb.score
                    .score_all(true, eh, rel, &emb.rows, emb.gamma, scores);
                let tail = filtered_rank(scores, t, &tails[&(h, r)]);
                emb.score
                    .score_all(false, et, rel, &emb.rows, emb.gamma, scores);
                let head = filtered_rank(scores, h, &heads[&(r, t)]);
                [tail, head]
            },
        )
        .collect();
    let n = (2 * ranks.len()).max(1) as f64;
    let all = ranks.iter().flatten();
    let mean = |f: &dyn Fn(f64) -> f64| all.clone().map(|&r| f(r)).sum::<f64>() / n;
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

/// The rank of `truth` among `scores`, skipping the other `known` true entities: 1 + those
/// scoring higher + half of those scoring the same. A NaN score counts as higher.
fn filtered_rank(scores: &[f32], truth: u64, known: &[u64]) -> f64 {
    let st = scores[truth as usize];
    let (mut higher, mut ties) = (0u64, 0u64);
    for &s in scores {
        if s > st || s.is_nan() || st.is_nan() {
            higher += 1;
        } else if s == st {
            ties += 1;
        }
    }
    // The truth itself is a tie (or, for a NaN, counted above); known true entities leave.
    if st.is_nan() {
        higher -= 1;
    } else {
        ties -= 1;
    }
    let mut seen = rustc_hash::FxHashSet::default();
    for &k in known {
        if k == truth || !seen.insert(k) {
            continue;
        }
        let s = scores[k as usize];
        if s > st || s.is_nan() || st.is_nan() {
            higher -= 1;
        } else if s == st {
            ties -= 1;
        }
    }
    1.0 + higher as f64 + ties as f64 / 2.0
}

/// `graphscale eval kg`: read, check and rank.
pub fn evaluate(embeddings: &Path, test: &Path, filter: &[PathBuf]) -> Result<KgMetrics> {
    let emb = KgEmbeddings::read(embeddings)?;
    let rels = emb.num_relations() as u64;
    let test_triples = read_all(&[test.to_path_buf()], emb.entities as u64, rels)?;
    let known = read_all(filter, emb.entities as u64, rels)?;
    Ok(rank(&emb, &test_triples, &known))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filtered_ranks_skip_known_entities_and_split_ties() {
        // Entity 2 is the truth (score 0.5); 0 scores higher but is a known true tail.
        let scores = [0.9f32, 0.7, 0.5, 0.5, 0.1];
        assert_eq!(filtered_rank(&scores, 2, &[]), 1.0 + 2.0 + 0.5);
        assert_eq!(filtered_rank(&scores, 2, &[0, 2]), 1.0 + 1.0 + 0.5);
        assert_eq!(filtered_rank(&scores, 2, &[0, 0, 3]), 2.0);
        assert_eq!(filtered_rank(&scores, 0, &[]), 1.0);
    }

    #[test]
    fn a_planted_model_ranks_its_triples_first() {
        // DistMult with one-hot entities and an all-ones relation: (e, 0, e) scores 1 and
        // every other tail 0, so each test triple ranks first on both sides.
        let n = 5;
        let mut rows = vec![0f32; n * n];
        for e in 0..n {
            rows[e * n + e] = 1.0;
        }
        let emb = KgEmbeddings {
            score: Score::DistMult,
            gamma: 0.0,
            entities: n,
            dim: n,
            rows,
            relations: vec![1.0; n],
            rel_dim: n,
        };
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
