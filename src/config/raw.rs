//! The configuration as given: flags and the TOML run file (flags win), every value optional
//! until `TrainConfig::from_raw` fills in the defaults and checks them.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::*;
/// Values as given (flags or file); `None` means "not given".
#[derive(Clone, Debug, Default, Serialize, Deserialize, clap::Args)]
#[serde(deny_unknown_fields, default)]
pub struct RawTrain {
    /// HDF5 edge file (see docs/formats.md)
    #[arg(long)]
    pub graph: Option<PathBuf>,
    /// Output embeddings (HDF5, dataset `embeddings`); default: `<graph stem>.emb.h5` next to
    /// the graph, printed at start
    #[arg(short = 'o', long)]
    pub output: Option<PathBuf>,
    /// What to train (default deepwalk): walk models deepwalk and node2vec, LINE (line),
    /// knowledge-graph models distmult, complex, transe and rotate (on `convert --triples` files)
    #[arg(long, value_enum)]
    pub model: Option<Model>,
    /// Embedding dimension (default 128; 200 for knowledge-graph models)
    #[arg(long)]
    pub dim: Option<usize>,
    /// Storage type of the rows (default f32; math is always f32)
    #[arg(long, value_enum)]
    pub dtype: Option<Dtype>,
    /// Optimizer of the rows (default sgd; adagrad for knowledge-graph models)
    #[arg(long, value_enum)]
    pub optimizer: Option<Optimizer>,
    /// Momentum of --optimizer momentum (default 0.9)
    #[arg(long, allow_negative_numbers = true)]
    pub momentum: Option<f32>,
    /// Initial learning rate (default: for DeepWalk, node2vec and LINE in place 84 / the
    /// training pairs per node, from 0.025 up to 0.7; 0.025 for sgd and momentum otherwise, 0.1
    /// adagrad, 0.01 adam; 0.5 for distmult and complex with adagrad), decaying linearly to
    /// lr * 1e-4
    #[arg(long, allow_negative_numbers = true)]
    pub lr: Option<f32>,
    /// Fraction of the run over which the learning rate warms up linearly from 0
    #[arg(long, allow_negative_numbers = true)]
    pub warmup: Option<f32>,
    /// Fraction of the run the learning rate is held before its linear decay (default: from
    /// the learning rate: 0 up to 0.25, rising to 1 at 0.7; docs/tuning.md)
    #[arg(long, allow_negative_numbers = true)]
    pub lr_hold: Option<f32>,
    /// Walk models: random walks started from every node (default 10)
    #[arg(long)]
    pub walks_per_node: Option<u32>,
    /// Walk models: nodes per walk (default 80)
    #[arg(long)]
    pub walk_length: Option<u32>,
    /// Walk models: skip-gram window, context nodes on each side (default 10)
    #[arg(long)]
    pub window: Option<u32>,
    /// Negative samples per positive (default 5; 256 for knowledge-graph models)
    #[arg(long)]
    pub negatives: Option<u32>,
    /// Passes over the walks, edge samples or triples (default 1; 30 for
    /// knowledge-graph models)
    #[arg(long)]
    pub epochs: Option<u32>,
    /// node2vec return parameter
    #[arg(long, allow_negative_numbers = true)]
    pub p: Option<f32>,
    /// node2vec in-out parameter
    #[arg(long, allow_negative_numbers = true)]
    pub q: Option<f32>,
    /// LINE proximity order (1 or 2)
    #[arg(long)]
    pub order: Option<u32>,
    /// LINE: edge samples per epoch, as a multiple of the number of edges
    #[arg(long, allow_negative_numbers = true)]
    pub line_samples: Option<f64>,
    /// Frequent-node subsampling threshold (word2vec `sample`; 0 disables)
    #[arg(long, allow_negative_numbers = true)]
    pub subsample: Option<f64>,
    /// Positive pairs per training step over all ranks, each rank sampling its share (with
    /// node-shared rows: over all nodes, each rank taking its node's share)
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Row ids merged into one one-sided request
    #[arg(long)]
    pub request_batch_size: Option<usize>,
    /// Pairs (`--kernel pair`, LINE) or walk tokens (`--kernel token`: consecutive output
    /// tokens) that share one draw of negatives (1 = independent negatives, word2vec; 2 reads
    /// half the negative rows, for graphs whose rows do not fit in cache)
    #[arg(long)]
    pub shared_negatives: Option<usize>,
    /// How hogwild trains walks: token (default; each token's window against its row and k
    /// negatives shared by the window, one dense block) or pair (word2vec's pair by pair)
    #[arg(long, value_enum)]
    pub kernel: Option<Kernel>,
    /// Rows of the ranks on one node: shared (default; each rank maps the others' rows and
    /// hogwild updates them in place, only other nodes' rows are fetched and pushed) or private
    /// (every rank's rows only through one-sided reads; hogwild runs reproduce for a seed)
    #[arg(long, value_enum)]
    pub node_memory: Option<NodeMemory>,
    /// Keep each rank's rows in a memory-mapped file in this directory (local disk), so that the
    /// matrices may exceed RAM: the kernel writes pages back and evicts them under memory
    /// pressure. The files are unlinked once mapped. Implies --node-memory private; the rows
    /// then leave the memory estimate and --max-memory
    #[arg(long)]
    pub mmap_rows: Option<PathBuf>,
    /// Compute threads per rank (default: all cores / ranks on the node)
    #[arg(long)]
    pub threads: Option<usize>,
    /// How a batch updates rows: hogwild (in place, word2vec order; remote rows as deltas),
    /// batched (summed gradients, owner-side optimizer), or auto (hogwild for sgd)
    #[arg(long, value_enum)]
    pub update: Option<Update>,
    /// Batches whose gradients may be outstanding: 0 (default) applies each batch before the
    /// next fetch, 1 computes a batch while the next one is sampled and fetched
    #[arg(long)]
    pub max_staleness: Option<u32>,
    /// Hogwild across nodes: remote rows kept in this rank's cache of hot rows, trained in place
    /// and synchronised with their owners every --cache-refresh steps (0: no cache, every batch
    /// fetches its remote rows and pushes their deltas). Default: as many rows as the rank owns
    #[arg(long)]
    pub cache_rows: Option<usize>,
    /// Hogwild across nodes: batches that use a cached row before its delta is pushed and its
    /// value read again (its clock; 8x that many steps at the latest). Default and maximum:
    /// 32 / ranks, at least 2 (each rank's copy of a row is updated unseen by the others)
    #[arg(long)]
    pub cache_refresh: Option<u64>,
    /// How remote rows are read: alltoall (requests and rows in the aggregated all-to-all that
    /// carries the deltas; default) or rma (one-sided MPI_Get: native RDMA reads on InfiniBand)
    #[arg(long, value_enum)]
    pub fetch: Option<Fetch>,
    /// Where the embedding matrices live: sharded (default; every rank owns a partition of the
    /// rows, remote rows are fetched and their deltas pushed) or replicated (the data-parallel
    /// baseline, DDP: every rank holds every row and the replicas are made equal after each
    /// step; for scaling studies)
    #[arg(long, value_enum)]
    pub strategy: Option<Strategy>,
    /// `--strategy replicated`: how the replicas are made equal after a step: sparse (default;
    /// every rank all-gathers the rows touched and their deltas, as DDP with sparse embedding
    /// gradients) or dense (an all-reduce of the whole matrices' gradients, as DDP with a dense
    /// embedding table)
    #[arg(long, value_enum)]
    pub sync: Option<Sync>,
    /// Precision of rows and deltas on the wire across nodes: int8 (default for hogwild: a byte
    /// per value and an f32 scale per row; deltas rounded stochastically), f16, bf16 or f32
    /// (default for --update batched, which refuses int8 and f16); owners accumulate in f32
    #[arg(long, value_enum)]
    pub wire_dtype: Option<WireDtype>,
    /// Seed of every random choice (default 0): walks, negatives, initial rows
    #[arg(long)]
    pub seed: Option<u64>,
    /// Node-to-rank placement: striped (default) or block
    #[arg(long)]
    pub partition: Option<String>,
    /// Refuse to start when the per-rank memory estimate exceeds this (e.g. 8G, 512M)
    #[arg(long)]
    pub max_memory: Option<String>,
    /// JSON-lines metrics file (one line per rank and report)
    #[arg(long)]
    pub metrics: Option<PathBuf>,
    /// Directory for checkpoints (on a filesystem every rank can reach).
    #[arg(long)]
    pub checkpoint_dir: Option<PathBuf>,
    /// Checkpoint interval: seconds with a unit (`30s`, `10m`, `1h`) or a step count (`5000`).
    #[arg(long)]
    pub checkpoint_every: Option<String>,
    /// Resume from the last committed checkpoint in this directory (an error when it holds
    /// none: a mistyped path never starts over silently)
    #[arg(long, conflicts_with = "resume_if_present")]
    pub resume: Option<PathBuf>,
    /// Resume from this directory's last committed checkpoint if it has one, else start from the
    /// beginning (requeued batch jobs: `--checkpoint-dir ck --resume-if-present ck`)
    #[arg(long)]
    pub resume_if_present: Option<PathBuf>,
    /// What a non-finite loss or gradient does: abort the job, or skip the batch and count it.
    #[arg(long, value_enum)]
    pub on_nan: Option<OnNan>,
    /// What a walk or edge run whose loss per pair is still at its start (ln 2) after a tenth
    /// of the run does: warn once (default), or abort the job
    #[arg(long, value_enum)]
    pub on_stall: Option<OnStall>,
    /// Bound every pushed row gradient to this L2 norm (0: no clipping).
    #[arg(long, allow_negative_numbers = true)]
    pub clip_grad: Option<f32>,
    /// Knowledge-graph models: loss over a triple's score and its negatives' (default:
    /// softmax; logistic for transe and rotate)
    #[arg(long, value_enum)]
    pub loss: Option<KgLoss>,
    /// Knowledge-graph models: regularisation of every positive's factors (default: n3 for
    /// distmult and complex, none for transe and rotate)
    #[arg(long, value_enum)]
    pub regularization: Option<Reg>,
    /// Knowledge-graph models: weight of --regularization
    #[arg(long, allow_negative_numbers = true)]
    pub reg_weight: Option<f32>,
    /// Knowledge-graph models: margin gamma of transe and rotate scores and of --loss margin
    #[arg(long, allow_negative_numbers = true)]
    pub gamma: Option<f32>,
    /// Knowledge-graph models, --loss logistic: weight negatives by softmax(alpha x score)
    /// (RotatE's self-adversarial sampling; 0: uniform)
    #[arg(long, allow_negative_numbers = true)]
    pub adversarial_temperature: Option<f32>,
    /// Knowledge-graph models: how negatives are drawn (uniform or degree)
    #[arg(long, value_enum)]
    pub negative_sampling: Option<NegSampling>,
    /// Knowledge-graph models: draw negatives from this rank's own entity rows (default shard:
    /// no negative row is fetched or pushed; the same as all at 1 rank) or from every entity
    #[arg(long, value_enum)]
    pub negatives_from: Option<NegativesFrom>,
    /// Knowledge-graph models: weight each triple's loss alike (uniform) or by the RotatE code's
    /// subsampling weight, 1/sqrt of how often its (head, relation) and (relation, tail) occur
    #[arg(long, value_enum)]
    pub triple_weights: Option<TripleWeights>,
    /// Knowledge-graph models: validation triples (converted with --vocab-from the training
    /// file), ranked (filtered by train and valid) every --valid-every epochs and after the
    /// last; MRR and Hits@10 go to the progress line and the metrics (`valid`)
    #[arg(long)]
    pub valid: Option<PathBuf>,
    /// Epochs between validations (--valid; default 5)
    #[arg(long)]
    pub valid_every: Option<u32>,
    /// Stop once this many validations in a row have not raised the validation MRR (--valid;
    /// the written rows are those of the last epoch trained)
    #[arg(long)]
    pub patience: Option<u32>,
    /// GraphSAGE (--model sage): the width of the hidden layers (default 128)
    #[arg(long)]
    pub hidden: Option<usize>,
    /// GraphSAGE: neighbours sampled per node and hop, the seeds' hop first, one per layer
    /// (default 25,10)
    #[arg(long)]
    pub fanout: Option<String>,
    /// GraphSAGE: dropout on the hidden layers (default 0.5)
    #[arg(long)]
    pub dropout: Option<f32>,
    /// GraphSAGE: Adam's L2 weight decay (default 5e-4)
    #[arg(long)]
    pub weight_decay: Option<f32>,
    /// GraphSAGE: scale each node's feature row to sum 1 (row), leave it (none), or row when
    /// no feature is negative (auto: bag-of-words counts, as PyG's NormalizeFeatures; default)
    #[arg(long, value_enum)]
    pub feature_norm: Option<FeatureNorm>,
    /// GraphSAGE: how a node's neighbours combine with it: mean (its own row and their mean,
    /// two weight matrices; default) or gcn (one mean over the node and its neighbours, one
    /// matrix)
    #[arg(long, value_enum)]
    pub aggregator: Option<crate::model::sage::Aggregator>,
    /// GraphSAGE: a node's input row: its features (default), a learnable row of --dim values
    /// (learned: sharded by owner, read one-sidedly, its gradients pushed to the owner, which
    /// applies sparse Adam), or both side by side
    #[arg(long, value_enum)]
    pub input: Option<crate::config::SageInput>,
    /// GraphSAGE: what it learns from: the nodes' labels (supervised: a softmax or sigmoid per
    /// class; default), or no labels at all (unsupervised: GraphSAGE's loss pulling a node's
    /// output row toward a node met on a short walk from it and away from --negatives nodes
    /// drawn by degree^0.75; the output rows are embeddings for `eval nodeclf|linkpred`)
    #[arg(long, value_enum)]
    pub objective: Option<crate::config::SageObjective>,
    /// GraphSAGE: the training steps' dense products in f32 (default) or with bf16 operands and
    /// f32 sums (bf16: AVX-512 BF16's two multiply-adds per lane, about twice the rate; the
    /// weights, their gradients, Adam and evaluation stay f32)
    #[arg(long, value_enum)]
    pub compute_dtype: Option<crate::config::ComputeDtype>,
    /// Test hook: make one rank fail, `rank=R,step=S,kind=panic|exit|hang|kill`.
    #[arg(long, hide = true)]
    #[serde(skip)]
    pub inject_fault: Option<String>,
}

/// The TOML run file: the sections of the user's source design.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RunFile {
    graph: FileGraph,
    embedding: FileEmbedding,
    storage: FileStorage,
    compute: FileCompute,
    training: FileTraining,
    output: FileOutput,
    checkpoint: FileCheckpoint,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct FileCheckpoint {
    dir: Option<PathBuf>,
    every: Option<String>,
    resume: Option<PathBuf>,
    resume_if_present: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct FileGraph {
    name: Option<String>,
    path: Option<PathBuf>,
    num_nodes: Option<u64>,
    num_edges: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct FileEmbedding {
    dim: Option<usize>,
    dtype: Option<Dtype>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct FileStorage {
    scheme: Option<String>,
    max_memory: Option<String>,
    node_memory: Option<NodeMemory>,
    mmap_rows: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct FileCompute {
    threads: Option<usize>,
    batch_size: Option<usize>,
    request_batch_size: Option<usize>,
    max_staleness: Option<u32>,
    cache_rows: Option<usize>,
    cache_refresh: Option<u64>,
    fetch: Option<Fetch>,
    wire_dtype: Option<WireDtype>,
    strategy: Option<Strategy>,
    sync: Option<Sync>,
    shared_negatives: Option<usize>,
    kernel: Option<Kernel>,
    update: Option<Update>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct FileTraining {
    #[serde(alias = "algorithm")]
    model: Option<Model>,
    walk_length: Option<u32>,
    #[serde(alias = "window_size")]
    window: Option<u32>,
    #[serde(alias = "num_walks_per_node")]
    walks_per_node: Option<u32>,
    negatives: Option<u32>,
    epochs: Option<u32>,
    #[serde(alias = "learning_rate")]
    lr: Option<f32>,
    warmup: Option<f32>,
    lr_hold: Option<f32>,
    optimizer: Option<Optimizer>,
    momentum: Option<f32>,
    p: Option<f32>,
    q: Option<f32>,
    order: Option<u32>,
    line_samples: Option<f64>,
    subsample: Option<f64>,
    seed: Option<u64>,
    on_nan: Option<OnNan>,
    on_stall: Option<OnStall>,
    clip_grad: Option<f32>,
    loss: Option<KgLoss>,
    regularization: Option<Reg>,
    reg_weight: Option<f32>,
    gamma: Option<f32>,
    adversarial_temperature: Option<f32>,
    negative_sampling: Option<NegSampling>,
    negatives_from: Option<NegativesFrom>,
    triple_weights: Option<TripleWeights>,
    valid: Option<PathBuf>,
    valid_every: Option<u32>,
    patience: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct FileOutput {
    path: Option<PathBuf>,
    metrics: Option<PathBuf>,
}

impl RawTrain {
    /// Values from `path`, to be overridden by flags.
    pub fn from_toml(path: &Path) -> Result<RawTrain> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::from_toml_str(&text).map_err(|m| Error::bad_input(path, m))
    }

    pub fn from_toml_str(text: &str) -> std::result::Result<RawTrain, String> {
        let f: RunFile = toml::from_str(text).map_err(|e| e.to_string())?;
        let _ = (&f.graph.name, f.graph.num_nodes, f.graph.num_edges);
        Ok(RawTrain {
            graph: f.graph.path,
            output: f.output.path,
            metrics: f.output.metrics,
            model: f.training.model,
            dim: f.embedding.dim,
            dtype: f.embedding.dtype,
            optimizer: f.training.optimizer,
            momentum: f.training.momentum,
            lr: f.training.lr,
            warmup: f.training.warmup,
            lr_hold: f.training.lr_hold,
            walks_per_node: f.training.walks_per_node,
            walk_length: f.training.walk_length,
            window: f.training.window,
            negatives: f.training.negatives,
            epochs: f.training.epochs,
            p: f.training.p,
            q: f.training.q,
            order: f.training.order,
            line_samples: f.training.line_samples,
            subsample: f.training.subsample,
            batch_size: f.compute.batch_size,
            request_batch_size: f.compute.request_batch_size,
            shared_negatives: f.compute.shared_negatives,
            kernel: f.compute.kernel,
            node_memory: f.storage.node_memory,
            mmap_rows: f.storage.mmap_rows,
            threads: f.compute.threads,
            update: f.compute.update,
            max_staleness: f.compute.max_staleness,
            cache_rows: f.compute.cache_rows,
            cache_refresh: f.compute.cache_refresh,
            fetch: f.compute.fetch,
            wire_dtype: f.compute.wire_dtype,
            strategy: f.compute.strategy,
            sync: f.compute.sync,
            seed: f.training.seed,
            partition: f.storage.scheme,
            max_memory: f.storage.max_memory,
            checkpoint_dir: f.checkpoint.dir,
            checkpoint_every: f.checkpoint.every,
            resume: f.checkpoint.resume,
            resume_if_present: f.checkpoint.resume_if_present,
            on_nan: f.training.on_nan,
            on_stall: f.training.on_stall,
            clip_grad: f.training.clip_grad,
            loss: f.training.loss,
            regularization: f.training.regularization,
            reg_weight: f.training.reg_weight,
            gamma: f.training.gamma,
            adversarial_temperature: f.training.adversarial_temperature,
            negative_sampling: f.training.negative_sampling,
            negatives_from: f.training.negatives_from,
            triple_weights: f.training.triple_weights,
            valid: f.training.valid,
            valid_every: f.training.valid_every,
            patience: f.training.patience,
            hidden: None,
            fanout: None,
            dropout: None,
            weight_decay: None,
            feature_norm: None,
            aggregator: None,
            input: None,
            objective: None,
            compute_dtype: None,
            inject_fault: None,
        })
    }

    /// `self` with every value `flags` gives replacing the file's.
    pub fn overridden_by(self, flags: RawTrain) -> RawTrain {
        macro_rules! pick {
            ($($f:ident),*) => { RawTrain { $($f: flags.$f.or(self.$f)),* } };
        }
        pick!(
            graph,
            output,
            model,
            dim,
            dtype,
            optimizer,
            momentum,
            lr,
            warmup,
            lr_hold,
            walks_per_node,
            walk_length,
            window,
            negatives,
            epochs,
            p,
            q,
            order,
            line_samples,
            subsample,
            batch_size,
            request_batch_size,
            shared_negatives,
            kernel,
            node_memory,
            mmap_rows,
            threads,
            update,
            max_staleness,
            cache_rows,
            cache_refresh,
            fetch,
            wire_dtype,
            strategy,
            sync,
            seed,
            partition,
            max_memory,
            metrics,
            checkpoint_dir,
            checkpoint_every,
            resume,
            resume_if_present,
            on_nan,
            on_stall,
            clip_grad,
            loss,
            regularization,
            reg_weight,
            gamma,
            adversarial_temperature,
            negative_sampling,
            negatives_from,
            triple_weights,
            valid,
            valid_every,
            patience,
            hidden,
            fanout,
            dropout,
            weight_decay,
            feature_norm,
            aggregator,
            input,
            objective,
            compute_dtype,
            inject_fault
        )
    }
}
