//! GraphSAGE's settings (`--model sage`): the flags of `model::sage` and `train::sage`.

use serde::{Deserialize, Serialize};

use super::RawTrain;
use crate::error::{Error, Result};

/// GraphSAGE's settings (`model::sage`, `train::sage`).
#[derive(Clone, Debug, Serialize)]
pub struct SageSettings {
    pub hidden: usize,
    /// Per hop, the seeds' first: one layer each.
    pub fanout: Vec<usize>,
    pub dropout: f32,
    pub weight_decay: f32,
    pub feature_norm: FeatureNorm,
    pub aggregator: crate::model::sage::Aggregator,
    /// What a node's input row is (`--input`).
    pub input: SageInput,
    /// The learnable rows' width (`--dim`; with `--input learned|both`).
    pub learned_dim: usize,
    /// Labels or none (`--objective`).
    pub objective: SageObjective,
    /// The training steps' dense products (`--compute-dtype`).
    pub compute_dtype: ComputeDtype,
}

/// The number type of GraphSAGE's dense products in training steps (`--compute-dtype`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ComputeDtype {
    /// f32 operands and sums.
    F32,
    /// bf16 operands (rounded to nearest even), f32 sums, where a product's output width is a
    /// multiple of 16; needs AVX-512 BF16.
    Bf16,
}

/// What GraphSAGE learns from (`--objective`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum SageObjective {
    /// The nodes' labels: a softmax (one class per node) or a sigmoid per class.
    Supervised,
    /// No labels: GraphSAGE's unsupervised loss over short walks and degree^0.75 negatives.
    Unsupervised,
}

/// A GraphSAGE node's input row (`--input`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum SageInput {
    /// Its feature row.
    Features,
    /// A learnable row of `--dim` values, sharded by owner as the walk models' rows are.
    Learned,
    /// Its feature row and a learnable row, side by side.
    Both,
}

impl SageInput {
    pub fn features(self) -> bool {
        self != SageInput::Learned
    }

    pub fn learned(self) -> bool {
        self != SageInput::Features
    }
}

/// GraphSAGE's feature scaling (`--feature-norm`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum FeatureNorm {
    /// Rows to sum 1 when no feature is negative.
    Auto,
    Row,
    None,
}

impl SageSettings {
    /// Whether training's dense products take bf16 operands (`--compute-dtype bf16`).
    pub fn bf16(&self) -> bool {
        self.compute_dtype == ComputeDtype::Bf16
    }

    /// The settings of `--model sage` from the flags given.
    pub(super) fn from_raw(r: &RawTrain) -> Result<SageSettings> {
        let fanout = match &r.fanout {
            None => vec![25, 10],
            Some(t) => t
                .split(',')
                .map(|x| x.trim().parse::<usize>().ok().filter(|&f| f > 0))
                .collect::<Option<Vec<usize>>>()
                .filter(|f| (1..=4).contains(&f.len()))
                .ok_or_else(|| {
                    Error::config(format!(
                        "--fanout '{t}': 1 to 4 positive counts separated by commas, the seeds' hop first (25,10)"
                    ))
                })?,
        };
        let s = SageSettings {
            hidden: r.hidden.unwrap_or(128),
            fanout,
            dropout: r.dropout.unwrap_or(0.5),
            weight_decay: r.weight_decay.unwrap_or(5e-4),
            feature_norm: r.feature_norm.unwrap_or(FeatureNorm::Auto),
            aggregator: r.aggregator.unwrap_or(crate::model::sage::Aggregator::Mean),
            input: r.input.unwrap_or(SageInput::Features),
            learned_dim: r.dim.unwrap_or(128),
            objective: r.objective.unwrap_or(SageObjective::Supervised),
            compute_dtype: r.compute_dtype.unwrap_or(ComputeDtype::F32),
        };
        let mut errs = Vec::new();
        if r.dim.is_some() && !s.input.learned() {
            errs.push("--dim sets the width of GraphSAGE's learnable input rows: give it with --input learned or both");
        }
        if s.input.learned() && !(1..=65536).contains(&s.learned_dim) {
            errs.push("--dim must be 1 to 65536");
        }
        if !(1..=65536).contains(&s.hidden) {
            errs.push("--hidden must be 1 to 65536");
        }
        if !(0.0..1.0).contains(&s.dropout) {
            errs.push("--dropout must be in [0, 1)");
        }
        if !(s.weight_decay.is_finite() && s.weight_decay >= 0.0) {
            errs.push("--weight-decay must be >= 0");
        }
        if s.compute_dtype == ComputeDtype::Bf16 && !crate::model::bf16::available() {
            errs.push("--compute-dtype bf16 needs AVX-512 BF16 (Intel Cooper Lake or Sapphire Rapids and later, AMD Zen 4 and later), which this CPU lacks; use --compute-dtype f32");
        }
        if errs.is_empty() {
            Ok(s)
        } else {
            Err(Error::config(errs.join("; ")))
        }
    }
}
