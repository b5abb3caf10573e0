//! Configuration in two stages: raw values from flags and an optional TOML file (flags win), then
//! a validated [`TrainConfig`] whose constructor rejects contradictions with messages that name
//! the flag. The effective config travels into every output as JSON.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::graph::partition::Scheme;

mod check;
mod defaults;
mod raw;
mod sage;
pub use defaults::*;
pub use raw::RawTrain;
pub use sage::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Model {
    Deepwalk,
    Node2vec,
    Line,
    /// Knowledge graphs (triples): `<h, r, t>`
    Distmult,
    /// Knowledge graphs: `Re(<h, r, conj(t)>)`
    Complex,
    /// Knowledge graphs: `gamma - ||h + r - t||_1`
    Transe,
    /// Knowledge graphs: `gamma - sum |h o e^(i theta) - t|`
    Rotate,
    /// GraphSAGE over node features (`convert --features --labels --split`)
    Sage,
}

impl Model {
    /// A knowledge-graph model (trains triples; `graphscale convert --triples`).
    pub fn is_kg(self) -> bool {
        matches!(
            self,
            Model::Distmult | Model::Complex | Model::Transe | Model::Rotate
        )
    }
}

/// Knowledge-graph loss over a positive's score and its negatives'.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum KgLoss {
    /// Cross-entropy of the positive among itself and its negatives
    Softmax,
    /// softplus(-positive) + mean (or self-adversarial weighted) softplus(negative)
    Logistic,
    /// Mean hinge max(0, gamma - positive + negative)
    Margin,
}

/// Knowledge-graph regularisation of the factors of every positive triple.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Reg {
    None,
    /// Nuclear 3-norm: sum |x|^3 (complex moduli for complex and rotate)
    N3,
    /// sum x^2
    L2,
}

/// How knowledge-graph negatives are drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum NegSampling {
    /// Every entity alike
    Uniform,
    /// By degree^0.75 (as the walk models' negatives)
    Degree,
}

/// Which entities a rank draws its knowledge-graph negatives from (`--negatives-from`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum NegativesFrom {
    /// Every entity of the graph: negatives are fetched from and pushed to their owners
    All,
    /// This rank's own entity rows (PyTorch-BigGraph's negatives from the positive's
    /// partition): no negative row crosses the network
    Shard,
}

/// How much each knowledge-graph training triple weighs in the loss (`--triple-weights`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum TripleWeights {
    /// Every triple alike
    Uniform,
    /// The RotatE code's subsampling weight 1/sqrt(#(h, r) + #(r, t) + 6), normalised to mean
    /// 1: triples whose head and relation (or relation and tail) recur weigh less
    Subsampling,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    #[serde(alias = "float32")]
    F32,
    #[serde(alias = "float16")]
    F16,
    #[serde(alias = "bfloat16")]
    Bf16,
}

impl Dtype {
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::Bf16 => 2,
        }
    }
}

/// Precision of rows and deltas in the sharded strategy's messages (`--wire-dtype`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum WireDtype {
    #[serde(alias = "float32")]
    F32,
    #[serde(alias = "float16")]
    F16,
    #[serde(alias = "bfloat16")]
    Bf16,
    /// One byte per value and an f32 scale per row (the row's largest magnitude / 127): rows
    /// round to nearest, deltas stochastically (unbiased)
    Int8,
}

impl WireDtype {
    /// Bytes per value (the metrics' `wire_bytes`; int8 adds a 4-byte scale per row).
    pub fn size(self) -> usize {
        match self {
            WireDtype::F32 => 4,
            WireDtype::F16 | WireDtype::Bf16 => 2,
            WireDtype::Int8 => 1,
        }
    }

    /// The wire precision whose [`size`](Self::size) is `bytes` (metrics record the size).
    pub fn of_size(bytes: usize) -> Option<WireDtype> {
        match bytes {
            4 => Some(WireDtype::F32),
            2 => Some(WireDtype::F16),
            1 => Some(WireDtype::Int8),
            _ => None,
        }
    }

    /// Bytes of one row of `dim` values.
    pub fn row_bytes(self, dim: usize) -> usize {
        match self {
            WireDtype::Int8 => 4 + dim,
            w => dim * w.size(),
        }
    }
}

/// Bytes of a row of `dim` values on the wire, from the metrics' bytes per value.
pub fn wire_row_bytes(dim: usize, per_value: usize) -> usize {
    WireDtype::of_size(per_value).map_or(dim * per_value, |w| w.row_bytes(dim))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Optimizer {
    Sgd,
    #[serde(alias = "sgd_with_momentum")]
    Momentum,
    Adagrad,
    Adam,
}

impl Optimizer {
    /// f32 values of optimizer state per row of `dim` values.
    pub fn state_per_row(self, dim: usize) -> usize {
        match self {
            Optimizer::Sgd => 0,
            Optimizer::Momentum => dim,
            Optimizer::Adagrad => 1,
            Optimizer::Adam => 2 * dim + 1,
        }
    }
}

/// A validated training configuration.
#[derive(Clone, Debug, Serialize)]
pub struct TrainConfig {
    pub graph: PathBuf,
    /// Always set once validated: `-o`, or [`default_output`] of the graph.
    pub output: Option<PathBuf>,
    /// No `-o` was given: `output` is the default path.
    #[serde(skip)]
    pub output_is_default: bool,
    pub metrics: Option<PathBuf>,
    pub model: Model,
    pub dim: usize,
    pub dtype: Dtype,
    pub optimizer: Optimizer,
    pub momentum: f32,
    pub lr: f32,
    /// No `--lr` was given: a walk or edge model trained in place settles it after the load
    /// from the pairs each node gets ([`TrainConfig::settle_lr`]).
    #[serde(skip)]
    pub lr_is_default: bool,
    /// The share of the run the learning rate is held before its linear decay (`--lr-hold`,
    /// or [`lr_hold`] of the rate).
    pub lr_hold: f32,
    #[serde(skip)]
    pub lr_hold_given: bool,
    pub warmup: f32,
    pub walks_per_node: u32,
    pub walk_length: u32,
    pub window: u32,
    pub negatives: u32,
    pub epochs: u32,
    pub p: f32,
    pub q: f32,
    pub order: u32,
    pub line_samples: f64,
    pub subsample: f64,
    pub batch_size: usize,
    /// No `--batch-size` was given: a walk model across nodes settles it after the load
    /// ([`default_walk_batch`]).
    #[serde(skip)]
    pub batch_size_is_default: bool,
    pub request_batch_size: usize,
    pub shared_negatives: usize,
    pub kernel: Kernel,
    pub node_memory: NodeMemory,
    /// `--mmap-rows`: the directory of the rows' memory-mapped files.
    pub mmap_rows: Option<PathBuf>,
    pub threads: usize,
    /// Resolved: never `Auto`.
    pub update: Update,
    pub max_staleness: u32,
    /// `None`: as many rows as the rank owns (resolved after the load, `Trainer::new`).
    pub cache_rows: Option<usize>,
    /// `None`: [`default_cache_refresh`] of the job's ranks (resolved in `Trainer::new`).
    pub cache_refresh: Option<u64>,
    pub fetch: Fetch,
    pub wire_dtype: WireDtype,
    pub strategy: Strategy,
    pub sync: Sync,
    pub seed: u64,
    pub partition: Scheme,
    pub max_memory: Option<u64>,
    pub checkpoint_dir: Option<PathBuf>,
    pub checkpoint_every: Option<Every>,
    pub resume: Option<PathBuf>,
    /// `--resume` (true: the directory must hold a checkpoint) or `--resume-if-present`.
    pub resume_required: bool,
    pub on_nan: OnNan,
    pub on_stall: OnStall,
    pub clip_grad: f32,
    /// The knowledge-graph models' section (flattened: the effective config's JSON keeps its
    /// keys at the top level).
    #[serde(flatten)]
    pub kg: KgSettings,
    /// GraphSAGE's section (`--model sage` only; flattened).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub sage: Option<SageSettings>,
    #[serde(skip)]
    pub inject_fault: Option<Fault>,
}

/// The knowledge-graph models' settings: what `model::kge` and the triples' work source read.
#[derive(Clone, Debug, Serialize)]
pub struct KgSettings {
    pub kg_loss: KgLoss,
    pub reg: Reg,
    pub reg_weight: f32,
    pub gamma: f32,
    pub adversarial_temperature: f32,
    pub negative_sampling: NegSampling,
    pub negatives_from: NegativesFrom,
    pub triple_weights: TripleWeights,
    pub valid: Option<PathBuf>,
    pub valid_every: u32,
    /// `--patience`: validations without a better MRR before training stops.
    pub patience: Option<u32>,
}

/// How a batch's pairs update the rows (`--update`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Update {
    /// Hogwild when the options allow it (sgd, no clipping, --on-nan abort), on f32, f16 or
    /// bf16 rows.
    Auto,
    /// Pool threads update local rows in place pair by pair, as word2vec does; remote rows are
    /// updated in a fetched copy and their deltas pushed to the owner.
    Hogwild,
    /// Gradients are summed over the batch and the owner applies the optimizer once per row.
    Batched,
}

/// How `--update hogwild` trains walk pairs (`--kernel`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Kernel {
    /// Per output token, its window's input rows against its row and k negatives drawn once
    /// for the window: one dense block (Ji et al.'s pWord2Vec, BlazingText).
    Token,
    /// Pair by pair with k negatives each, in word2vec's order.
    Pair,
}

/// Where the embedding matrices live (`--strategy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// Every rank owns a partition of the rows (graphscale's design).
    Sharded,
    /// Every rank holds every row (replicated data parallelism, the DDP baseline).
    Replicated,
}

/// How `--strategy replicated` makes the replicas equal after a step (`--sync`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Sync {
    /// All-gather of the touched rows' keys and deltas (DDP with sparse embedding gradients).
    Sparse,
    /// All-reduce of dense gradient matrices (DDP with a dense embedding table).
    Dense,
}

/// How remote rows are read (`--fetch`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Fetch {
    /// Row requests travel in the all-to-all that pushes deltas; owners answer in a second one.
    Alltoall,
    /// One-sided `MPI_Get` from the owners' windows (RDMA reads on InfiniBand).
    Rma,
}

/// Whether the ranks of one node share their rows (`--node-memory`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum NodeMemory {
    /// One node-shared window per matrix (`MPI_Win_allocate_shared`): a rank reads and updates
    /// the rows of its node's ranks in place.
    Shared,
    /// Every rank's rows are its own; other ranks read them one-sidedly.
    Private,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum OnNan {
    Abort,
    Skip,
}

/// What a walk or edge run that is not learning does (`--on-stall`): its loss per pair still at
/// ln 2, where it starts, after a tenth of the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum OnStall {
    Warn,
    Abort,
}

/// A checkpoint interval.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub enum Every {
    Seconds(f64),
    Steps(u64),
}

impl std::str::FromStr for Every {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Every, String> {
        let t = s.trim();
        let bad = || {
            format!("--checkpoint-every '{s}' is neither a duration (30s, 10m, 1h) nor a step count (5000)")
        };
        if let Ok(n) = t.parse::<u64>() {
            return if n > 0 {
                Ok(Every::Steps(n))
            } else {
                Err(bad())
            };
        }
        let (num, mul) = match t.chars().last() {
            Some('s') => (&t[..t.len() - 1], 1.0),
            Some('m') => (&t[..t.len() - 1], 60.0),
            Some('h') => (&t[..t.len() - 1], 3600.0),
            _ => return Err(bad()),
        };
        match num.trim().parse::<f64>() {
            Ok(v) if v.is_finite() && v > 0.0 => Ok(Every::Seconds(v * mul)),
            _ => Err(bad()),
        }
    }
}

/// What `--inject-fault` does to its rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    Panic,
    Exit,
    Hang,
    Kill,
}

/// A test hook: rank `rank` fails at training step `step`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    pub rank: usize,
    pub step: u64,
    pub kind: FaultKind,
}

impl std::str::FromStr for Fault {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Fault, String> {
        let bad = |m: &str| {
            format!("--inject-fault '{s}': {m} (rank=R,step=S,kind=panic|exit|hang|kill)")
        };
        let (mut rank, mut step, mut kind) = (None, None, None);
        for part in s.split(',') {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| bad("expected key=value"))?;
            match k.trim() {
                "rank" => rank = Some(v.trim().parse().map_err(|_| bad("bad rank"))?),
                "step" => step = Some(v.trim().parse().map_err(|_| bad("bad step"))?),
                "kind" => {
                    kind = Some(match v.trim() {
                        "panic" => FaultKind::Panic,
                        "exit" => FaultKind::Exit,
                        "hang" => FaultKind::Hang,
                        "kill" => FaultKind::Kill,
                        _ => return Err(bad("unknown kind")),
                    })
                }
                _ => return Err(bad("unknown key")),
            }
        }
        match (rank, step, kind) {
            (Some(rank), Some(step), Some(kind)) => Ok(Fault { rank, step, kind }),
            _ => Err(bad("rank, step and kind are all needed")),
        }
    }
}

/// Ranks of this job on this node, from the launcher's environment (1 when unknown).
pub fn ranks_on_this_node() -> usize {
    [
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "MPI_LOCALNRANKS",
        "SLURM_NTASKS_PER_NODE",
    ]
    .iter()
    .find_map(|k| std::env::var(k).ok()?.parse::<usize>().ok())
    .unwrap_or(1)
    .max(1)
}

/// Where a run without `-o` writes its embeddings: `<graph stem>.emb.h5` next to the graph
/// (a finished run is never discarded).
pub fn default_output(graph: &std::path::Path) -> PathBuf {
    let stem = graph
        .file_stem()
        .map_or_else(|| "graphscale".into(), |s| s.to_string_lossy().into_owned());
    graph.with_file_name(format!("{stem}.emb.h5"))
}

/// Parse sizes like `512M`, `8G`, `1.5T` or plain bytes.
pub fn parse_bytes(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let (num, mul) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 1 << 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 1 << 30),
        Some('T' | 't') => (&t[..t.len() - 1], 1 << 40),
        _ => (t, 1),
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("--max-memory '{s}' is not a size like 512M or 8G"))?;
    if !(v.is_finite() && v > 0.0) {
        return Err(format!("--max-memory '{s}' must be positive"));
    }
    Ok((v * mul as f64) as u64)
}

/// Flags that mean nothing to the model are refused, not ignored: a user who sets
/// `--walk-length` for LINE believes it did something.
fn refuse_other_models_flags(r: &RawTrain, model: Model) -> Result<()> {
    let walks = matches!(model, Model::Deepwalk | Model::Node2vec);
    let line = model == Model::Line;
    let sage = model == Model::Sage;
    let unused: Vec<&str> = [
        (r.walks_per_node.is_some(), "--walks-per-node", walks),
        (r.walk_length.is_some(), "--walk-length", walks),
        (r.window.is_some(), "--window", walks),
        (r.kernel.is_some(), "--kernel", walks),
        (r.order.is_some(), "--order", line),
        (r.line_samples.is_some(), "--line-samples", line),
        (r.hidden.is_some(), "--hidden", sage),
        (r.fanout.is_some(), "--fanout", sage),
        (r.dropout.is_some(), "--dropout", sage),
        (r.weight_decay.is_some(), "--weight-decay", sage),
        (r.feature_norm.is_some(), "--feature-norm", sage),
        (r.aggregator.is_some(), "--aggregator", sage),
        (r.input.is_some(), "--input", sage),
        (r.objective.is_some(), "--objective", sage),
        (r.compute_dtype.is_some(), "--compute-dtype", sage),
    ]
    .into_iter()
    .filter(|&(given, _, applies)| given && !applies)
    .map(|(_, flag, _)| flag)
    .collect();
    if !unused.is_empty() {
        return Err(Error::config(format!(
                "{} {} not apply to --model {} ({}); drop {}",
                unused.join(", "),
                if unused.len() == 1 { "does" } else { "do" },
                format!("{model:?}").to_lowercase(),
                "--walks-per-node, --walk-length, --window and --kernel are the walk models' (deepwalk, node2vec), --order and --line-samples LINE's, --hidden, --fanout, --dropout, --weight-decay, --feature-norm, --aggregator, --input, --objective and --compute-dtype GraphSAGE's",
                if unused.len() == 1 { "it" } else { "them" }
            )));
    }
    Ok(())
}

/// The default optimizer of `model`: row-wise Adagrad for the knowledge-graph models (what
/// PyTorch-BigGraph and DGL-KE use), Adam for GraphSAGE's dense weights, else SGD.
fn default_optimizer(model: Model) -> Optimizer {
    match model {
        _ if model.is_kg() => Optimizer::Adagrad,
        Model::Sage => Optimizer::Adam,
        _ => Optimizer::Sgd,
    }
}

/// The default epochs of `model`.
fn default_epochs(model: Model) -> u32 {
    match model {
        _ if model.is_kg() => KG_EPOCHS,
        Model::Sage => SAGE_EPOCHS,
        _ => 1,
    }
}

/// The default step of `model` (pairs, triples or seeds over all ranks).
fn default_batch(model: Model) -> usize {
    match model {
        _ if model.is_kg() => KG_BATCH,
        Model::Sage => SAGE_BATCH,
        _ => BATCH,
    }
}

/// The default learning rate of `model` under `optimizer`.
fn default_lr(model: Model, optimizer: Optimizer) -> f32 {
    let distance = matches!(model, Model::Transe | Model::Rotate);
    match optimizer {
        Optimizer::Adagrad if model.is_kg() && !distance => KG_ADAGRAD_LR,
        Optimizer::Sgd | Optimizer::Momentum => 0.025,
        Optimizer::Adagrad => 0.1,
        Optimizer::Adam => 0.01,
    }
}

/// The flags given as text, parsed.
struct TextFlags {
    partition: Scheme,
    max_memory: Option<u64>,
    checkpoint_every: Option<Every>,
    inject_fault: Option<Fault>,
}

impl TextFlags {
    fn parse(r: &RawTrain) -> Result<TextFlags> {
        Ok(TextFlags {
            partition: match &r.partition {
                None => Scheme::Striped,
                Some(s) => s
                    .parse()
                    .map_err(|m: String| Error::config(format!("--partition: {m}")))?,
            },
            max_memory: r
                .max_memory
                .as_deref()
                .map(parse_bytes)
                .transpose()
                .map_err(Error::config)?,
            checkpoint_every: match r.checkpoint_every.as_deref().map(str::parse).transpose() {
                Err(m) => return Err(Error::config(m)),
                // A directory without an interval: every 10 minutes.
                Ok(None) if r.checkpoint_dir.is_some() => Some(Every::Seconds(600.0)),
                Ok(e) => e,
            },
            inject_fault: r
                .inject_fault
                .as_deref()
                .map(str::parse)
                .transpose()
                .map_err(Error::config)?,
        })
    }
}

impl TrainConfig {
    /// The configuration of the flags and file values `r`: defaults filled in per model,
    /// values checked, flags that do not apply to the model or strategy refused, and the
    /// update path settled.
    pub fn from_raw(r: RawTrain) -> Result<TrainConfig> {
        let given = r.clone();
        let bad = |m: String| Err(Error::config(m));
        let Some(graph) = r.graph.clone() else {
            return bad("--graph is required (an HDF5 edge file; see `graphscale convert`)".into());
        };
        let model = r.model.unwrap_or(Model::Deepwalk);
        let kg = model.is_kg();
        let distance = matches!(model, Model::Transe | Model::Rotate);
        let optimizer = r.optimizer.unwrap_or(default_optimizer(model));
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        if r.resume.is_some() && r.resume_if_present.is_some() {
            return bad("give one of resume and resume_if_present (--resume, --resume-if-present), not both".into());
        }
        let text = TextFlags::parse(&r)?;
        let sage_settings = SageSettings::from_raw(&r);
        let output_is_default = r.output.is_none();
        let mut c = TrainConfig {
            output: Some(r.output.unwrap_or_else(|| default_output(&graph))),
            output_is_default,
            graph,
            metrics: r.metrics,
            model,
            dim: r.dim.unwrap_or(if kg { KG_DIM } else { 128 }),
            dtype: r.dtype.unwrap_or(Dtype::F32),
            optimizer,
            momentum: r.momentum.unwrap_or(0.9),
            lr: r.lr.unwrap_or_else(|| default_lr(model, optimizer)),
            lr_is_default: r.lr.is_none(),
            lr_hold: r.lr_hold.unwrap_or(0.0),
            lr_hold_given: r.lr_hold.is_some(),
            warmup: r.warmup.unwrap_or(0.0),
            walks_per_node: r.walks_per_node.unwrap_or(10),
            walk_length: r.walk_length.unwrap_or(80),
            window: r.window.unwrap_or(10),
            negatives: r.negatives.unwrap_or(match model {
                _ if kg => KG_NEGATIVES,
                // GraphSAGE's unsupervised loss: the paper's Q.
                Model::Sage => SAGE_NEGATIVES,
                _ => 5,
            }),
            epochs: r.epochs.unwrap_or(default_epochs(model)),
            p: r.p.unwrap_or(1.0),
            q: r.q.unwrap_or(1.0),
            order: r.order.unwrap_or(2),
            line_samples: r.line_samples.unwrap_or(100.0),
            subsample: r.subsample.unwrap_or(1e-3),
            batch_size: r.batch_size.unwrap_or(default_batch(model)),
            batch_size_is_default: r.batch_size.is_none(),
            request_batch_size: r.request_batch_size.unwrap_or(4096),
            shared_negatives: r.shared_negatives.unwrap_or(if kg { KG_CHUNK } else { 1 }),
            kernel: r.kernel.unwrap_or(Kernel::Token),
            node_memory: r.node_memory.unwrap_or(if r.mmap_rows.is_some() {
                NodeMemory::Private
            } else {
                NodeMemory::Shared
            }),
            mmap_rows: r.mmap_rows,
            threads: r
                .threads
                .unwrap_or_else(|| (cores / ranks_on_this_node()).max(1)),
            update: r.update.unwrap_or(Update::Auto),
            max_staleness: r.max_staleness.unwrap_or(0),
            cache_rows: r.cache_rows,
            cache_refresh: r.cache_refresh,
            fetch: r.fetch.unwrap_or(Fetch::Alltoall),
            wire_dtype: r.wire_dtype.unwrap_or(WireDtype::Int8),
            strategy: r.strategy.unwrap_or(Strategy::Sharded),
            sync: r.sync.unwrap_or(Sync::Sparse),
            seed: r.seed.unwrap_or(0),
            partition: text.partition,
            max_memory: text.max_memory,
            checkpoint_dir: r.checkpoint_dir,
            checkpoint_every: text.checkpoint_every,
            resume_required: r.resume.is_some(),
            resume: r.resume.or(r.resume_if_present),
            on_nan: r.on_nan.unwrap_or(OnNan::Abort),
            on_stall: r.on_stall.unwrap_or(OnStall::Warn),
            clip_grad: r.clip_grad.unwrap_or(0.0),
            kg: KgSettings {
                kg_loss: r.loss.unwrap_or(if distance {
                    KgLoss::Logistic
                } else {
                    KgLoss::Softmax
                }),
                reg: r
                    .regularization
                    .unwrap_or(if kg && !distance { Reg::N3 } else { Reg::None }),
                reg_weight: r
                    .reg_weight
                    .unwrap_or(if kg && !distance { KG_N3 } else { 0.0 }),
                gamma: r.gamma.unwrap_or(6.0),
                adversarial_temperature: r.adversarial_temperature.unwrap_or(if distance {
                    1.0
                } else {
                    0.0
                }),
                negative_sampling: r.negative_sampling.unwrap_or(NegSampling::Uniform),
                negatives_from: r.negatives_from.unwrap_or(NegativesFrom::Shard),
                triple_weights: r.triple_weights.unwrap_or(TripleWeights::Uniform),
                valid: r.valid.clone(),
                valid_every: r.valid_every.unwrap_or(5),
                patience: r.patience,
            },
            sage: match model {
                Model::Sage => Some(sage_settings?),
                _ => None,
            },
            inject_fault: text.inject_fault,
        };
        c.check()?;
        refuse_other_models_flags(&given, model)?;
        c.settle_kg(&given)?;
        c.settle_replicated(&given)?;
        c.settle_update(given.wire_dtype.is_some())?;
        Ok(c)
    }

    /// The knowledge-graph models' checks and settings (they update through the owner's
    /// optimizer), or the refusal of their flags for any other model.
    fn settle_kg(&mut self, r: &RawTrain) -> Result<()> {
        let (model, kg) = (self.model, self.model.is_kg());
        let c = self;
        let kg_flags = [
            (r.loss.is_some(), "--loss"),
            (r.regularization.is_some(), "--regularization"),
            (r.reg_weight.is_some(), "--reg-weight"),
            (r.gamma.is_some(), "--gamma"),
            (
                r.adversarial_temperature.is_some(),
                "--adversarial-temperature",
            ),
            (r.negative_sampling.is_some(), "--negative-sampling"),
            (r.negatives_from.is_some(), "--negatives-from"),
            (r.triple_weights.is_some(), "--triple-weights"),
            (r.valid.is_some(), "--valid"),
            (r.valid_every.is_some(), "--valid-every"),
            (r.patience.is_some(), "--patience"),
        ];
        if kg {
            let mut errs = Vec::new();
            if c.update == Update::Hogwild {
                errs.push("knowledge-graph models update through the owner's optimizer: drop --update hogwild (they use --update batched)".to_string());
            }
            if c.strategy == Strategy::Replicated {
                errs.push("--strategy replicated (the data-parallel baseline) trains the walk and edge models; knowledge-graph models train sharded".into());
            }
            if matches!(model, Model::Complex | Model::Rotate) && !c.dim.is_multiple_of(2) {
                errs.push(format!("--model {}: --dim must be even (complex coordinates: real and imaginary halves), got {}", format!("{model:?}").to_lowercase(), c.dim));
            }
            if !(c.kg.reg_weight.is_finite() && c.kg.reg_weight >= 0.0) {
                errs.push("--reg-weight must be >= 0".into());
            }
            if !(c.kg.gamma.is_finite() && c.kg.gamma > 0.0) {
                errs.push("--gamma must be positive".into());
            }
            if !(c.kg.adversarial_temperature.is_finite() && c.kg.adversarial_temperature >= 0.0) {
                errs.push("--adversarial-temperature must be >= 0 (0: uniform weights)".into());
            } else if r.adversarial_temperature.is_some_and(|a| a > 0.0)
                && c.kg.kg_loss != KgLoss::Logistic
            {
                errs.push(
                    "--adversarial-temperature weights the negatives of --loss logistic".into(),
                );
            }
            if c.negatives == 0 {
                errs.push("--negatives must be at least 1 for knowledge-graph models".into());
            }
            if c.kg.valid_every == 0 {
                errs.push("--valid-every must be at least 1 (epochs)".into());
            }
            if c.kg.patience.is_some() && c.kg.valid.is_none() {
                errs.push("--patience stops on the validation MRR: give --valid valid.h5".into());
            }
            if c.kg.patience == Some(0) {
                errs.push("--patience must be at least 1 (validations)".into());
            }
            if !errs.is_empty() {
                return Err(Error::config(errs.join("; ")));
            }
            if c.kg.kg_loss != KgLoss::Logistic {
                c.kg.adversarial_temperature = 0.0;
            }
            c.update = Update::Batched;
        } else if let Some((_, flag)) = kg_flags.iter().find(|(given, _)| *given) {
            return Err(Error::config(format!(
                "{flag} applies to the knowledge-graph models (--model distmult, complex, transe, rotate), not --model {}",
                format!("{model:?}").to_lowercase()
            )));
        }
        Ok(())
    }

    /// `--strategy replicated`: the default kernel's settings, and the refusal of the sharded
    /// strategy's flags (and of `--sync` for any other strategy).
    fn settle_replicated(&mut self, r: &RawTrain) -> Result<()> {
        let c = self;
        let r_wire = r.wire_dtype;
        if c.strategy == Strategy::Replicated && c.model == Model::Sage {
            // GraphSAGE's baseline holds every feature row; its update is its own (Adam).
            if r.cache_rows.is_some() {
                return Err(Error::config(
                    "--cache-rows (the cache of remote feature rows) applies to --strategy sharded, not replicated",
                ));
            }
        } else if c.strategy == Strategy::Replicated {
            let mut errs = Vec::new();
            let mut b = c.hogwild_blockers();
            if c.dtype != Dtype::F32 {
                b.push("--dtype f32");
            }
            if c.optimizer != Optimizer::Sgd {
                b.push("--optimizer sgd");
            }
            if !b.is_empty() || c.update == Update::Batched {
                errs.push(format!(
                    "--strategy replicated trains with the default kernel (in-place sgd on f32 rows) and needs {}",
                    if b.is_empty() { "--update hogwild or auto".into() } else { b.join(", ") }
                ));
            }
            let sharded_only = [
                (r.cache_rows.is_some(), "--cache-rows"),
                (r.cache_refresh.is_some(), "--cache-refresh"),
                (r.fetch.is_some(), "--fetch"),
                (r_wire.is_some(), "--wire-dtype"),
                (r.max_staleness.is_some_and(|s| s > 0), "--max-staleness"),
            ];
            for (given, flag) in sharded_only {
                if given {
                    errs.push(format!(
                        "{flag} applies to --strategy sharded, not replicated"
                    ));
                }
            }
            if c.checkpoint_dir.is_some() || c.resume.is_some() {
                errs.push("--strategy replicated (the data-parallel baseline) does not checkpoint: drop --checkpoint-dir and --resume".into());
            }
            if !errs.is_empty() {
                return Err(Error::config(errs.join("; ")));
            }
            c.update = Update::Hogwild;
            c.wire_dtype = WireDtype::F32;
        } else if r.sync.is_some() {
            return Err(Error::config(
                "--sync applies to --strategy replicated (the data-parallel baseline)".to_string(),
            ));
        }
        Ok(())
    }

    /// `--update auto` resolved, and the wire precision that goes with the update path
    /// (`wire_given`: `--wire-dtype` was given).
    fn settle_update(&mut self, wire_given: bool) -> Result<()> {
        let c = self;
        if c.update == Update::Auto {
            c.update = if c.hogwild_blockers().is_empty() {
                Update::Hogwild
            } else {
                Update::Batched
            };
        }
        if c.update == Update::Batched && !wire_given {
            // The default reduced wire precision is hogwild's; batched gradients travel in f32.
            c.wire_dtype = WireDtype::F32;
        }
        if matches!(c.wire_dtype, WireDtype::F16 | WireDtype::Int8) && c.update == Update::Batched {
            let w = if c.wire_dtype == WireDtype::F16 {
                "f16: this run updates through --update batched{}, whose gradients need f32's range (f16 overflows above 65504 and flushes below 6e-8)"
            } else {
                "int8: this run updates through --update batched{}, whose gradients are not quantised (int8 carries hogwild's rows and deltas)"
            };
            return Err(Error::config(format!(
                "--wire-dtype {}: use --wire-dtype bf16 (half the bytes, f32's range) or f32",
                w.replace(
                    "{}",
                    &match c.hogwild_blockers().as_slice() {
                        [] => String::new(),
                        b => format!(" (hogwild needs {})", b.join(", ")),
                    }
                )
            )));
        }
        Ok(())
    }

    /// The options that rule out `--update hogwild`: in-place updates need sgd or row-wise
    /// adagrad, and cannot clip a summed gradient or take a batch back.
    fn hogwild_blockers(&self) -> Vec<&'static str> {
        let mut b = Vec::new();
        if !matches!(self.optimizer, Optimizer::Sgd | Optimizer::Adagrad) {
            b.push("--optimizer sgd or adagrad");
        }
        if self.clip_grad > 0.0 {
            b.push("no --clip-grad");
        }
        if self.on_nan != OnNan::Abort {
            b.push("--on-nan abort");
        }
        b
    }

    /// Bytes this rank will allocate for `rows` rows: two matrices (vertex and context; LINE
    /// first order uses one) in the storage dtype plus f32 optimizer state for each. Rows in
    /// memory-mapped files (`--mmap-rows`) are not counted: the kernel pages them.
    pub fn memory_estimate(&self, rows: u64) -> u64 {
        let values = if self.mmap_rows.is_some() {
            0
        } else {
            self.dim as u64 * self.dtype.size() as u64
        };
        let per_row = values + 4 * self.optimizer.state_per_row(self.dim) as u64;
        self.matrices() as u64 * rows * per_row
    }

    /// Bytes of `--strategy replicated`'s replicas (f32, every row of every matrix) and, with
    /// `--sync dense`, of its gradient matrices; 0 for the sharded strategy.
    pub fn replica_bytes(&self, num_nodes: u64) -> u64 {
        if self.strategy == Strategy::Sharded {
            return 0;
        }
        let copies = if self.sync == Sync::Dense { 2 } else { 1 };
        copies * self.matrices() as u64 * num_nodes * self.dim as u64 * 4
    }

    /// Embedding matrices trained: vertex and context, or one for LINE first order and the
    /// knowledge-graph models (entities; their relations are replicated, not sharded).
    pub fn matrices(&self) -> usize {
        if (self.model == Model::Line && self.order == 1) || self.model.is_kg() {
            1
        } else {
            2
        }
    }

    /// Rows of the remote-row cache for a rank that owns `rows` rows per matrix:
    /// `--cache-rows`, or as many as it owns.
    pub fn cache_rows_for(&self, rows: usize) -> usize {
        self.cache_rows.unwrap_or(rows * self.matrices())
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("config serializes")
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    /// Every run file shipped in `inputs/` parses and validates (with a graph given).
    #[test]
    fn shipped_run_files_are_valid() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("inputs");
        let mut files = Vec::new();
        let mut dirs = vec![root];
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    dirs.push(p);
                } else if p.extension().is_some_and(|x| x == "toml") {
                    files.push(p);
                }
            }
        }
        assert!(files.len() >= 4, "{files:?}");
        for f in files {
            let raw = super::RawTrain::from_toml(&f).unwrap_or_else(|e| panic!("{e}"));
            let flags = super::RawTrain {
                graph: Some("g.h5".into()),
                ..Default::default()
            };
            let c = super::TrainConfig::from_raw(raw.overridden_by(flags))
                .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            let kg = f.to_string_lossy().contains("/kg/");
            assert_eq!(c.model.is_kg(), kg, "{}", f.display());
        }
    }

    /// The sections keep the effective config flat: the same keys at the top level, in the
    /// order the output files and checkpoints have always carried them.
    #[test]
    fn the_effective_config_keeps_its_keys_flat() {
        let c = super::TrainConfig::from_raw(super::RawTrain {
            graph: Some("g.h5".into()),
            model: Some(super::Model::Rotate),
            ..Default::default()
        })
        .unwrap();
        let v: serde_json::Value = serde_json::from_str(&c.to_json()).unwrap();
        let o = v.as_object().unwrap();
        assert!(!o.contains_key("kg"));
        assert_eq!(o["gamma"], serde_json::json!(6.0));
        assert_eq!(o["kg_loss"], serde_json::json!("logistic"));
        // The order, from the text (serde_json's map sorts its keys).
        let text = c.to_json();
        let at: Vec<usize> = [
            "clip_grad",
            "kg_loss",
            "reg",
            "reg_weight",
            "gamma",
            "adversarial_temperature",
            "negative_sampling",
            "negatives_from",
            "triple_weights",
            "valid",
            "valid_every",
            "patience",
        ]
        .iter()
        .map(|k| text.find(&format!("\"{k}\":")).unwrap())
        .collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "{text}");
        assert!(text.ends_with("\"patience\":null}"), "{text}");
    }

    proptest! {
        /// Any run file text parses or gives an error; never a panic.
        #[test]
        fn run_files_never_panic(text in "\\PC{0,200}") {
            if let Ok(raw) = RawTrain::from_toml_str(&text) {
                let _ = TrainConfig::from_raw(RawTrain { graph: Some("g.h5".into()), ..raw });
            }
        }

        /// Structured run files with arbitrary values: validated, never a panic.
        #[test]
        fn run_file_values_never_panic(
            dim in any::<i64>(), lr in any::<f64>(), window in any::<i64>(),
            every in "\\PC{0,8}", mem in "\\PC{0,8}", dtype in "[a-z0-9]{0,8}",
        ) {
            let text = format!(
                "[embedding]\ndim = {dim}\ndtype = {dtype:?}\n[training]\nlearning_rate = {lr:?}\nwindow_size = {window}\n[storage]\nmax_memory = {mem:?}\n[checkpoint]\ndir = \"ck\"\nevery = {every:?}\n"
            );
            if let Ok(raw) = RawTrain::from_toml_str(&text) {
                let _ = TrainConfig::from_raw(RawTrain { graph: Some("g.h5".into()), ..raw });
            }
        }

        #[test]
        fn small_parsers_never_panic(s in "\\PC{0,24}") {
            let _ = s.parse::<Every>();
            let _ = s.parse::<Fault>();
            let _ = parse_bytes(&s);
        }
    }

    use super::*;

    fn raw() -> RawTrain {
        RawTrain {
            graph: Some("g.h5".into()),
            ..Default::default()
        }
    }

    #[test]
    fn the_walk_and_edge_models_settle_their_rate_from_the_budget() {
        let settle = |r: RawTrain, nodes: u64, edges: u64| {
            let mut c = TrainConfig::from_raw(r).unwrap();
            let pairs = c.settle_lr(nodes, edges);
            (c, pairs)
        };
        // DeepWalk 1 walk x 20, window 5: 120 pairs per node; the default rate is the budget's.
        let small = RawTrain {
            walks_per_node: Some(1),
            walk_length: Some(20),
            window: Some(5),
            ..raw()
        };
        let (c, pairs) = settle(small.clone(), 1 << 20, 30 << 20);
        assert_eq!(pairs, Some(120.0));
        assert_eq!((c.lr, c.lr_hold), (MAX_BUDGET_LR, 1.0));
        // A rate given is kept; its hold follows it unless --lr-hold is given.
        let (c, _) = settle(
            RawTrain {
                lr: Some(0.025),
                ..small.clone()
            },
            1 << 20,
            30 << 20,
        );
        assert_eq!((c.lr, c.lr_hold), (0.025, 0.0));
        let (c, _) = settle(
            RawTrain {
                lr_hold: Some(0.5),
                ..small.clone()
            },
            1 << 20,
            30 << 20,
        );
        assert_eq!((c.lr, c.lr_hold), (MAX_BUDGET_LR, 0.5));
        // The defaults (10 x 80, window 10): word2vec's rate and schedule.
        let (c, pairs) = settle(raw(), 10_312, 333_983);
        assert_eq!(pairs, Some(8800.0));
        assert_eq!((c.lr, c.lr_hold), (WORD2VEC_LR, 0.0));
        // LINE: edge samples per node.
        let line = RawTrain {
            model: Some(Model::Line),
            line_samples: Some(10.0),
            ..raw()
        };
        let (c, pairs) = settle(line, 1000, 6000);
        assert_eq!(pairs, Some(60.0));
        assert_eq!(c.lr, MAX_BUDGET_LR);
        // The batched update (another optimizer) and the knowledge-graph models keep theirs.
        let (c, pairs) = settle(
            RawTrain {
                optimizer: Some(Optimizer::Momentum),
                ..small
            },
            1 << 20,
            30 << 20,
        );
        assert_eq!((pairs, c.lr, c.lr_hold), (None, 0.025, 0.0));
        let (c, pairs) = settle(
            RawTrain {
                model: Some(Model::Distmult),
                ..raw()
            },
            100,
            1000,
        );
        assert_eq!((pairs, c.lr), (None, KG_ADAGRAD_LR));
    }

    #[test]
    fn flags_override_the_file() {
        let file = RawTrain::from_toml_str(
            "[embedding]\ndim = 64\ndtype = \"float16\"\n[training]\nalgorithm = \"line\"\nlearning_rate = 0.01\n",
        )
        .unwrap();
        let flags = RawTrain {
            dim: Some(32),
            ..raw()
        };
        let c = TrainConfig::from_raw(file.overridden_by(flags)).unwrap();
        assert_eq!(
            (c.dim, c.dtype, c.model, c.lr),
            (32, Dtype::F16, Model::Line, 0.01)
        );
    }

    #[test]
    fn knowledge_graph_negatives_default_to_the_shard_and_read_from_the_file() {
        let kg = |text: &str| {
            let file = RawTrain::from_toml_str(text).unwrap();
            TrainConfig::from_raw(file.overridden_by(raw())).unwrap()
        };
        let c = kg("[training]\nalgorithm = \"distmult\"\n");
        assert_eq!(c.kg.negatives_from, NegativesFrom::Shard);
        let c = kg("[training]\nalgorithm = \"distmult\"\nnegatives_from = \"all\"\n");
        assert_eq!(c.kg.negatives_from, NegativesFrom::All);
        // A knowledge-graph option on a walk model is refused by name.
        let e = TrainConfig::from_raw(RawTrain {
            negatives_from: Some(NegativesFrom::All),
            ..raw()
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("--negatives-from"), "{e}");
    }

    #[test]
    fn knowledge_graph_models_take_up_to_4096_negatives_and_walks_1000() {
        let check = |text: &str| {
            let file = RawTrain::from_toml_str(text).unwrap();
            TrainConfig::from_raw(file.overridden_by(raw())).map(|c| c.negatives)
        };
        assert_eq!(
            check("[training]\nmodel = \"distmult\"\nnegatives = 2000\n").unwrap(),
            2000
        );
        let e = check("[training]\nmodel = \"distmult\"\nnegatives = 5000\n").unwrap_err();
        assert!(e.to_string().contains("at most 4096"), "{e}");
        let e = check("[training]\nnegatives = 2000\n").unwrap_err();
        assert!(e.to_string().contains("at most 1000"), "{e}");
    }

    #[test]
    fn auto_update_is_hogwild_only_where_it_applies() {
        let resolve = |r: RawTrain| TrainConfig::from_raw(r).map(|c| c.update);
        assert_eq!(resolve(raw()).unwrap(), Update::Hogwild);
        for dtype in [Dtype::F16, Dtype::Bf16] {
            let r = RawTrain {
                dtype: Some(dtype),
                ..raw()
            };
            assert_eq!(resolve(r).unwrap(), Update::Hogwild, "{dtype:?} rows");
        }
        // Row-wise Adagrad trains in place too (its accumulators beside the rows).
        assert_eq!(
            resolve(RawTrain {
                optimizer: Some(Optimizer::Adagrad),
                ..raw()
            })
            .unwrap(),
            Update::Hogwild
        );
        for r in [
            RawTrain {
                optimizer: Some(Optimizer::Momentum),
                ..raw()
            },
            RawTrain {
                clip_grad: Some(1.0),
                ..raw()
            },
            RawTrain {
                on_nan: Some(OnNan::Skip),
                ..raw()
            },
        ] {
            assert_eq!(resolve(r).unwrap(), Update::Batched);
        }
        let e = resolve(RawTrain {
            update: Some(Update::Hogwild),
            optimizer: Some(Optimizer::Adam),
            ..raw()
        })
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("--update hogwild needs --optimizer sgd or adagrad"),
            "{e}"
        );
        let file = RawTrain::from_toml_str("[compute]\nupdate = \"batched\"\n").unwrap();
        assert_eq!(
            resolve(RawTrain {
                graph: Some("g.h5".into()),
                ..file
            })
            .unwrap(),
            Update::Batched
        );
    }

    #[test]
    fn the_walk_kernel_defaults_to_token_and_reads_from_the_file() {
        let kernel = |r: RawTrain| TrainConfig::from_raw(r).map(|c| c.kernel).unwrap();
        assert_eq!(kernel(raw()), Kernel::Token);
        let file = RawTrain::from_toml_str("[compute]\nkernel = \"pair\"\n").unwrap();
        assert_eq!(
            kernel(RawTrain {
                graph: Some("g.h5".into()),
                ..file
            }),
            Kernel::Pair
        );
        let e = RawTrain::from_toml_str("[compute]\nkernel = \"tokens\"\n").unwrap_err();
        assert!(e.contains("tokens"), "{e}");
    }

    #[test]
    fn node_memory_defaults_to_shared_and_reads_from_the_file() {
        let mode = |r: RawTrain| TrainConfig::from_raw(r).map(|c| c.node_memory).unwrap();
        assert_eq!(mode(raw()), NodeMemory::Shared);
        let file = RawTrain::from_toml_str("[storage]\nnode_memory = \"private\"\n").unwrap();
        assert_eq!(
            mode(RawTrain {
                graph: Some("g.h5".into()),
                ..file
            }),
            NodeMemory::Private
        );
        let e = RawTrain::from_toml_str("[storage]\nnode_memory = \"yes\"\n").unwrap_err();
        assert!(e.contains("yes"), "{e}");
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let e = RawTrain::from_toml_str("[training]\nlearning_rat = 0.1\n").unwrap_err();
        assert!(e.contains("learning_rat"), "{e}");
    }

    #[test]
    fn bad_values_name_their_flags() {
        let cases: Vec<(RawTrain, &str)> = vec![
            (
                RawTrain {
                    dim: Some(0),
                    ..raw()
                },
                "--dim",
            ),
            (
                RawTrain {
                    window: Some(0),
                    ..raw()
                },
                "--window",
            ),
            (
                RawTrain {
                    lr: Some(-0.1),
                    ..raw()
                },
                "--lr",
            ),
            (
                RawTrain {
                    model: Some(Model::Node2vec),
                    p: Some(0.0),
                    ..raw()
                },
                "--p and --q",
            ),
            (
                RawTrain {
                    p: Some(2.0),
                    ..raw()
                },
                "only apply to --model node2vec",
            ),
            (
                RawTrain {
                    model: Some(Model::Line),
                    order: Some(3),
                    ..raw()
                },
                "--order",
            ),
            (
                RawTrain {
                    max_memory: Some("lots".into()),
                    ..raw()
                },
                "--max-memory",
            ),
            (
                RawTrain {
                    graph: None,
                    ..raw()
                },
                "--graph is required",
            ),
        ];
        for (r, want) in cases {
            let e = TrainConfig::from_raw(r).unwrap_err().to_string();
            assert!(e.contains(want), "{e} should mention {want}");
        }
    }

    #[test]
    fn wire_dtype_defaults_by_update_path_and_refuses_f16_gradients() {
        let c = |r: RawTrain| TrainConfig::from_raw(r);
        let hog = c(raw()).unwrap();
        assert_eq!(
            (hog.update, hog.wire_dtype),
            (Update::Hogwild, WireDtype::Int8)
        );
        assert_eq!((hog.fetch, hog.cache_rows), (Fetch::Alltoall, None));
        let batched = c(RawTrain {
            optimizer: Some(Optimizer::Momentum),
            ..raw()
        })
        .unwrap();
        assert_eq!(
            (batched.update, batched.wire_dtype),
            (Update::Batched, WireDtype::F32)
        );
        // Batched gradients travel in bf16 when asked (f32's range); f16 is refused.
        let bf = c(RawTrain {
            optimizer: Some(Optimizer::Momentum),
            wire_dtype: Some(WireDtype::Bf16),
            ..raw()
        })
        .unwrap();
        assert_eq!(
            (bf.update, bf.wire_dtype),
            (Update::Batched, WireDtype::Bf16)
        );
        let e = c(RawTrain {
            optimizer: Some(Optimizer::Momentum),
            wire_dtype: Some(WireDtype::F16),
            ..raw()
        })
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("--wire-dtype f16")
                && e.contains("--wire-dtype bf16")
                && e.contains("--optimizer sgd"),
            "{e}"
        );
        let e = c(RawTrain {
            optimizer: Some(Optimizer::Momentum),
            wire_dtype: Some(WireDtype::Int8),
            ..raw()
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("--wire-dtype int8") && e.contains("bf16"), "{e}");
        let e = c(RawTrain {
            cache_refresh: Some(0),
            ..raw()
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("--cache-refresh"), "{e}");
        let file = RawTrain::from_toml_str(
            "[compute]\ncache_rows = 0\ncache_refresh = 4\nfetch = \"rma\"\nwire_dtype = \"f32\"\n",
        )
        .unwrap();
        let f = c(RawTrain {
            graph: Some("g.h5".into()),
            ..file
        })
        .unwrap();
        assert_eq!(
            (f.cache_rows, f.cache_refresh, f.fetch, f.wire_dtype),
            (Some(0), Some(4), Fetch::Rma, WireDtype::F32)
        );
    }

    #[test]
    fn memory_estimate_follows_the_formula() {
        let c = TrainConfig::from_raw(RawTrain {
            dim: Some(128),
            dtype: Some(Dtype::F16),
            optimizer: Some(Optimizer::Momentum),
            ..raw()
        })
        .unwrap();
        assert_eq!(c.memory_estimate(1000), 2 * 1000 * (128 * 2 + 128 * 4));
        assert_eq!(parse_bytes("1.5G").unwrap(), 3 << 29);
    }
}
