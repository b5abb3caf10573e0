//! GraphSAGE's labels: every node's classes and split, the targets of a step's seeds, and the
//! counts behind accuracy and micro- and macro-F1.

use std::path::Path;

use crate::error::{Error, Result};
use crate::graph::nodedata;
use crate::model::sage::Targets;

/// Every node's classes and split, whole on every rank (about 13 bytes per node).
pub(super) struct Labelled {
    pub(super) labels: nodedata::Labels,
    /// Whether some node has several classes: the sigmoid loss, micro-F1 for validation.
    pub(super) multi: bool,
    pub(super) classes: usize,
    pub(super) split: Vec<u8>,
}

impl Labelled {
    pub(super) fn load(path: &Path) -> Result<Labelled> {
        let (labels, split) = nodedata::read_labelled(path)?;
        let missing = |what: &str, flag: &str| {
            Error::bad_input(
                path,
                format!(
                    "--model sage needs {what}: convert the graph with {flag} (docs/formats.md)"
                ),
            )
        };
        let labels = labels.ok_or_else(|| missing("node labels", "--labels"))?;
        let split = split.ok_or_else(|| missing("a split", "--split or --train-fraction"))?;
        let n = split.len();
        let unlabelled = (0..n).find(|&v| split[v] != nodedata::NONE && labels.of(v).is_empty());
        if let Some(v) = unlabelled {
            return Err(Error::bad_input(
                path,
                format!("node {v} is in the split but has no label"),
            ));
        }
        Ok(Labelled {
            multi: labels.multilabel(),
            classes: labels.num_classes as usize,
            labels,
            split,
        })
    }

    /// No labels (GraphSAGE's unsupervised loss): every node of the graph at `path` trains,
    /// none is scored.
    pub(super) fn unlabelled(path: &Path) -> Result<Labelled> {
        let n = crate::graph::h5::EdgeFile::open(path)?.num_nodes;
        Ok(Labelled {
            labels: nodedata::Labels::from_pairs(n, Vec::new()),
            multi: false,
            classes: 0,
            split: vec![nodedata::TRAIN; n as usize],
        })
    }

    /// What the progress lines call the share of training seeds predicted right and the
    /// validation and test score.
    pub(super) fn names(&self) -> (&'static str, &'static str) {
        if self.multi {
            ("exact match", "micro-F1")
        } else {
            ("accuracy", "accuracy")
        }
    }

    pub(super) fn nodes(&self, code: u8) -> Vec<u64> {
        (0..self.split.len() as u64)
            .filter(|&v| self.split[v as usize] == code)
            .collect()
    }

    /// The labels of `seeds` into `buf` (offsets, then classes), as the model takes them.
    pub(super) fn targets<'b>(
        &self,
        seeds: &[u64],
        buf: &'b mut (Vec<u32>, Vec<u32>),
    ) -> Targets<'b> {
        let (offsets, ids) = buf;
        offsets.clear();
        ids.clear();
        offsets.push(0);
        for &v in seeds {
            ids.extend_from_slice(self.labels.of(v as usize));
            offsets.push(ids.len() as u32);
        }
        if self.multi {
            Targets::Multi { offsets, ids }
        } else {
            Targets::Single(ids)
        }
    }

    /// Per class the true positives, false positives and false negatives of the nodes of split
    /// `code` among `nodes` with their `scores`, then the nodes predicted exactly right and all
    /// of them. A node is predicted with as many classes as it truly has, the top-scoring ones
    /// (one class: the top score's), as `eval nodeclf` and the published protocol of the
    /// multi-label benchmarks predict.
    pub(super) fn counts(&self, nodes: &[u64], scores: &[f32], code: u8) -> Vec<u64> {
        let k = self.classes.max(2);
        let mut c = vec![0u64; 3 * k + 2];
        let (mut predicted, mut order) = (vec![false; k], Vec::with_capacity(k));
        for (i, &v) in nodes.iter().enumerate() {
            if self.split[v as usize] != code {
                continue;
            }
            let row = &scores[i * k..(i + 1) * k];
            let truth = self.labels.of(v as usize);
            order.clear();
            order.extend(0..k);
            order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
            predicted.iter_mut().for_each(|p| *p = false);
            for &j in &order[..truth.len().min(k)] {
                predicted[j] = true;
            }
            let mut exact = true;
            for (j, &p) in predicted.iter().enumerate() {
                let t = truth.contains(&(j as u32));
                match (p, t) {
                    (true, true) => c[j] += 1,
                    (true, false) => c[k + j] += 1,
                    (false, true) => c[2 * k + j] += 1,
                    (false, false) => {}
                }
                exact &= p == t;
            }
            c[3 * k] += u64::from(exact);
            c[3 * k + 1] += 1;
        }
        c
    }
}

/// Micro-F1 of per-class counts (`counts`' layout, `k` classes): the accuracy with one class
/// per node.
pub(super) fn micro_f1(c: &[u64], k: usize) -> f64 {
    let (tp, fp, fn_) = (
        c[..k].iter().sum::<u64>(),
        c[k..2 * k].iter().sum::<u64>(),
        c[2 * k..3 * k].iter().sum::<u64>(),
    );
    2.0 * tp as f64 / (2 * tp + fp + fn_).max(1) as f64
}
