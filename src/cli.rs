//! Command-line interface: raw flags, parsed by clap. `graphscale --graph G.h5 [flags]` with no
//! subcommand means `train` (the user's usage line is `mpirun -n 80 graphscale --graph edges.h5`).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::config::RawTrain;
use crate::graph::generate::Shape;

/// `--version`: the release and the commit it was built from (main adds the MPI library and
/// HDF5 found at run time).
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("GRAPHSCALE_COMMIT"),
    ")"
);

#[derive(Debug, Parser)]
#[command(
    name = "graphscale",
    version = crate::cli::LONG_VERSION,
    about = "Distributed graph embeddings over MPI: DeepWalk, node2vec, LINE and knowledge-graph models (DistMult, ComplEx, TransE, RotatE)",
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub train: TrainCmd,
    /// More log output (-v info, -vv debug)
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

/// The flags of the commands that run as an MPI job (train, info, eval linkpred and kg); the
/// serial commands do not take them.
#[derive(Debug, Args, Clone)]
pub struct Mpi {
    /// End the job when a collective or fetch takes longer than this (seconds)
    #[arg(long, default_value_t = 600.0)]
    pub comm_timeout: f64,
    /// Without mpirun: run this many ranks as threads of one process (debugging, tests)
    #[arg(long, default_value_t = 1)]
    pub ranks: usize,
    /// Group ranks N at a time into simulated nodes instead of the machine's real ones (scaling
    /// studies on one machine: 1 makes every rank its own node, so rows and walkers travel as
    /// between machines). Default: ranks share a node when they share a machine
    /// (env GRAPHSCALE_RANKS_PER_NODE sets it too)
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub ranks_per_node: Option<u64>,
}

impl Default for Mpi {
    fn default() -> Mpi {
        Mpi {
            comm_timeout: 600.0,
            ranks: 1,
            ranks_per_node: None,
        }
    }
}

impl Mpi {
    /// `--ranks-per-node`, else `GRAPHSCALE_RANKS_PER_NODE` (a positive integer), else `None`:
    /// the machine's nodes.
    pub fn ranks_per_node(&self) -> Option<usize> {
        self.ranks_per_node.map(|n| n as usize).or_else(|| {
            std::env::var("GRAPHSCALE_RANKS_PER_NODE")
                .ok()
                .and_then(|s| s.parse::<usize>().ok())
                .filter(|&n| n > 0)
        })
    }
}

// Parsed once per run: the size difference between variants does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Train embeddings (the default when no subcommand is given)
    Train(TrainCmd),
    /// Convert a text edge list to the HDF5 edge schema (serial, streaming)
    Convert(ConvertCmd),
    /// Generate a graph (serial)
    #[command(subcommand)]
    Generate(GenerateCmd),
    /// Load a graph over all ranks and print its statistics and partition balance
    Info(InfoCmd),
    /// Export embeddings to .npy or word2vec text
    Export(ExportCmd),
    /// Hold out edges for link prediction (keeps the graph connected; serial)
    Split(SplitCmd),
    /// Relabel a graph so that `--partition block` keeps neighbourhoods on one rank (serial)
    Reorder(ReorderCmd),
    /// Tables (CSV) and plots (SVG, PNG) of runs' --metrics files: speed-up, efficiency,
    /// phases, bytes per pair, memory, load balance, throughput over time
    Report(ReportCmd),
    /// Memory per rank and node, bytes per step and epoch, and time per epoch of a job, for the
    /// sharded strategy and the data-parallel baseline, before it is submitted
    Plan(PlanCmd),
    /// Evaluate embeddings
    #[command(subcommand)]
    Eval(EvalCmd),
    /// Transport self-tests used by the test suite (hidden)
    #[command(hide = true)]
    Selftest(SelftestCmd),
}

#[derive(Debug, Args)]
pub struct SelftestCmd {
    /// rma: poison-and-verify one-sided fetches; hang or panic: make one rank fail
    #[arg(value_parser = ["rma", "hang", "panic"])]
    pub mode: String,
    /// The rank that fails (hang, panic)
    #[arg(long, default_value_t = 1)]
    pub fail_rank: usize,
    #[arg(long, default_value_t = 1000)]
    pub rows: usize,
    #[arg(long, default_value_t = 20)]
    pub rounds: usize,
    #[command(flatten)]
    pub mpi: Mpi,
}

#[derive(Debug, Args)]
pub struct PlanCmd {
    /// Ranks of the job
    #[arg(long, default_value_t = 1)]
    pub ranks: usize,
    /// Ranks per node (default: 1, every rank on its own node)
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub ranks_per_node: Option<u64>,
    /// Graph nodes (1e9 is fine)
    #[arg(long)]
    pub nodes: f64,
    /// Graph edges (an undirected edge once)
    #[arg(long)]
    pub edges: f64,
    #[arg(long)]
    pub directed: bool,
    /// Edges carry weights (4 more bytes per adjacency entry; LINE's alias table)
    #[arg(long)]
    pub weighted: bool,
    #[arg(long, default_value_t = 128)]
    pub dim: usize,
    #[arg(long, value_enum, default_value = "f32")]
    pub dtype: crate::config::Dtype,
    #[arg(long, value_enum, default_value = "sgd")]
    pub optimizer: crate::config::Optimizer,
    #[arg(long, value_enum, default_value = "deepwalk")]
    pub model: crate::config::Model,
    /// LINE proximity order (1 trains one matrix)
    #[arg(long, default_value_t = 2)]
    pub order: u32,
    #[arg(long, default_value_t = 10.0)]
    pub walks_per_node: f64,
    #[arg(long, default_value_t = 80.0)]
    pub walk_length: f64,
    #[arg(long, default_value_t = 10.0)]
    pub window: f64,
    #[arg(long, default_value_t = 100.0)]
    pub line_samples: f64,
    /// Pairs per step over all ranks (default: 16384; the walk models' default across nodes
    /// follows the graph's hub, see --max-degree)
    #[arg(long)]
    pub batch_size: Option<f64>,
    /// The graph's largest degree: across nodes, the walk models' default step is the one
    /// `train` settles for this hub (`graphscale info` prints it; without it the plan assumes
    /// 16384 pairs per step and says so)
    #[arg(long)]
    pub max_degree: Option<f64>,
    // The job's ranks and ranks per node are the global --ranks and --ranks-per-node.
    /// Compute threads per rank
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Cores of one node the job may use (default: a core per compute thread and one for each
    /// rank's main thread). Fractions model simulated nodes that share a machine: 4 simulated
    /// nodes on 2 cores are 0.5 cores per node
    #[arg(long)]
    pub cores_per_node: Option<f64>,
    /// Memory of one node (e.g. 700G): plans that need more are refused, saying by how much
    #[arg(long)]
    pub mem_per_node: Option<String>,
    /// Sharded strategy's wire precision of rows and deltas
    #[arg(long, value_enum, default_value = "int8")]
    pub wire_dtype: crate::config::WireDtype,
    /// Seconds per message (alpha)
    #[arg(long, default_value_t = 2e-6)]
    pub latency: f64,
    /// Bytes per second of one node's link (beta; 12.5G = 100 Gb/s)
    #[arg(long, default_value = "12.5G")]
    pub bandwidth: String,
    /// Fit the compute, sampling and traffic rates to measured runs' --metrics files (repeat:
    /// compute and sampling from the first, each strategy's traffic from a run of it)
    #[arg(long)]
    pub calibrate: Vec<PathBuf>,
    /// Print the plans as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ReportCmd {
    /// Metrics files (`--metrics` of `graphscale train`), one run each
    #[arg(required = true)]
    pub metrics: Vec<PathBuf>,
    /// Directory for runs.csv, ranks.csv, timeline.csv and the plots
    #[arg(short = 'o', long)]
    pub output: PathBuf,
}

#[derive(Debug, Args)]
pub struct ReorderCmd {
    #[arg(long)]
    pub graph: PathBuf,
    /// The relabelled graph (with `original_ids`; training writes embeddings in original order)
    #[arg(short = 'o', long)]
    pub output: PathBuf,
    /// Ranks that will train it: with `--by clusters`, under `--partition block` (one contiguous
    /// range of the new ids each); with `--by degree` only for the printed edge cut
    #[arg(long, default_value_t = 1)]
    pub parts: usize,
    /// clusters: neighbourhoods in contiguous ranges, for fewer walker crossings between ranks
    /// (train with --partition block); degree: hubs first, for cache locality of the rows
    /// (train with the default --partition striped)
    #[arg(long, value_enum, default_value_t = crate::graph::reorder::By::Clusters)]
    pub by: crate::graph::reorder::By,
    /// Label-propagation rounds
    #[arg(long, default_value_t = 10)]
    pub rounds: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct SplitCmd {
    #[arg(long)]
    pub graph: PathBuf,
    /// Fraction of the edges to hold out
    #[arg(long, default_value_t = 0.1)]
    pub test_fraction: f64,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// The training graph (all other edges)
    #[arg(short = 'o', long)]
    pub output: PathBuf,
    /// The held-out edges and as many sampled non-edges (`neg_src`, `neg_dst`)
    #[arg(long)]
    pub test: PathBuf,
}

#[derive(Debug, Subcommand)]
pub enum EvalCmd {
    /// Link prediction: ROC-AUC on held-out edges vs non-edges, MRR and Hits@1/3/10
    Linkpred {
        #[arg(long)]
        embeddings: PathBuf,
        /// A test file written by `graphscale split`
        #[arg(long)]
        test: PathBuf,
        /// dot: e_u . e_v; hadamard: logistic regression on e_u * e_v (node2vec)
        #[arg(long, value_enum, default_value = "dot")]
        score: crate::eval::linkpred::Score,
        /// Corrupted pairs each true edge is ranked against (MRR, Hits@k)
        #[arg(long, default_value_t = 100)]
        corrupt: usize,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[arg(long)]
        json: bool,
        /// The dot score runs as an MPI job (the hadamard score on one process)
        #[command(flatten)]
        mpi: Mpi,
    },
    /// Knowledge-graph completion: filtered MRR, MR and Hits@1/3/10 of head and tail prediction
    /// against all entities
    Kg {
        /// Output of `graphscale train --model distmult|complex|transe|rotate`
        #[arg(long)]
        embeddings: PathBuf,
        /// Test triples converted with `graphscale convert --triples ... --vocab-from TRAIN`
        #[arg(long)]
        test: PathBuf,
        /// Triple files whose triples are known true (filtered setting), e.g. train.h5,valid.h5;
        /// the test triples always are
        #[arg(long, value_delimiter = ',')]
        filter: Vec<PathBuf>,
        /// Print {"mrr": .., "mr": .., "hits@1": .., "hits@3": .., "hits@10": ..}
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        mpi: Mpi,
    },
    /// GraphSAGE: accuracy, micro- and macro-F1 of a `train --model sage` output on the train,
    /// valid and test nodes of its graph, with every neighbour (layer-wise; an MPI job)
    Gnn {
        /// Output of `graphscale train --model sage`
        #[arg(long)]
        model: PathBuf,
        /// The graph file it was trained on (features, labels and split)
        #[arg(long)]
        graph: PathBuf,
        /// Print {"train": {"accuracy": .., "micro_f1": .., "macro_f1": ..}, "valid": .., "test": ..}
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        mpi: Mpi,
    },
    /// Node classification (DeepWalk protocol): one-vs-rest logistic regression, Micro/Macro-F1
    Nodeclf {
        #[arg(long)]
        embeddings: PathBuf,
        /// `node<TAB>label` lines (several lines per node for multi-label data)
        #[arg(long)]
        labels: PathBuf,
        #[arg(long, value_delimiter = ',', default_value = "0.1,0.5,0.9")]
        train_fractions: Vec<f64>,
        #[arg(long, default_value_t = 10)]
        repeats: usize,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Use these splits instead of random ones: JSON {"perms": [[node, ...], ...]}
        #[arg(long)]
        splits: Option<PathBuf>,
        /// Print {"results": {"0.1": {"micro_f1": ..}}} instead of a table
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args, Clone, Default)]
pub struct TrainCmd {
    /// TOML run file (sections graph, embedding, storage, compute, training, output); flags win
    #[arg(long)]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub raw: RawTrain,
    #[command(flatten)]
    pub mpi: Mpi,
}

#[derive(Debug, Args)]
pub struct ConvertCmd {
    /// Text edge list: `src dst [weight]` per line; `#`/`%` comments
    #[arg(required_unless_present = "triples", conflicts_with = "triples")]
    pub input: Option<PathBuf>,
    /// Knowledge-graph triples instead: `head<TAB>relation<TAB>tail` per line, string ids
    /// (datasets `src`, `rel`, `dst`, `node_names`, `relation_names`)
    #[arg(long, value_name = "TRIPLES")]
    pub triples: Option<PathBuf>,
    /// With --triples: use the entity and relation ids of this converted file (valid and test
    /// sets get the training file's ids; an unknown name is an error)
    #[arg(long, requires = "triples", conflicts_with = "names_from")]
    pub vocab_from: Option<PathBuf>,
    /// With --triples: also give ids to the entities and relations of these triple files
    /// (their triples are not written), e.g. valid and test sets whose entities never appear in
    /// training, as in WN18RR; repeat or separate by commas
    #[arg(long, requires = "triples", value_delimiter = ',')]
    pub names_from: Vec<PathBuf>,
    #[arg(short = 'o', long)]
    pub output: PathBuf,
    /// Edges are directed (default: undirected)
    #[arg(long)]
    pub directed: bool,
    /// Node tokens are arbitrary strings, mapped to dense ids kept in `node_names`
    #[arg(long)]
    pub string_ids: bool,
    /// Accept integer ids that leave more than 10% of the rows without an edge (by default
    /// refused: use --string-ids to make such ids dense)
    #[arg(long, conflicts_with = "string_ids")]
    pub keep_isolated: bool,
    /// Node features, `node<TAB>column<TAB>value` per nonzero, grouped by node in increasing
    /// order, or a dense float32/float64 `.npy` with one row per node (dataset `features`,
    /// nodes x columns; docs/formats.md)
    #[arg(long, conflicts_with = "triples")]
    pub features: Option<PathBuf>,
    /// Storage type of `features`
    #[arg(long, value_enum, default_value = "f32", requires = "features")]
    pub dtype: crate::graph::nodedata::FeatureDtype,
    /// Node labels, `node<TAB>label` per pair (several lines: multi-label); datasets
    /// `label_offsets`, `label_ids`
    #[arg(long, conflicts_with = "triples")]
    pub labels: Option<PathBuf>,
    /// The split, `node<TAB>train|valid|test` (dataset `split`); without it, --train-fraction
    #[arg(long, requires = "labels")]
    pub split: Option<PathBuf>,
    /// Without --split: this share of the labelled nodes trains, as many validate, the rest test
    #[arg(long, requires = "labels", conflicts_with = "split")]
    pub train_fraction: Option<f64>,
    /// Seed of the --train-fraction split
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

#[derive(Debug, Subcommand)]
pub enum GenerateCmd {
    /// Planted partition (stochastic block model) with its labels
    Sbm {
        #[arg(long)]
        nodes: u64,
        #[arg(long)]
        blocks: u64,
        #[arg(long, default_value_t = 10.0)]
        avg_degree: f64,
        /// Fraction of edges that leave their block
        #[arg(long, default_value_t = 0.1)]
        mix: f64,
        #[arg(short = 'o', long)]
        output: PathBuf,
        /// Write `node<TAB>block` lines here
        #[arg(long)]
        labels: Option<PathBuf>,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// A contextual SBM: this many feature columns per node, class-dependent Gaussians
        /// (dataset `features`), with the blocks as labels and a split in the graph file
        #[arg(long)]
        features: Option<usize>,
        /// The class means' distance from the origin in noise deviations (two classes apart by
        /// about signal x sqrt 2; docs/formats.md)
        #[arg(long, default_value_t = 1.0, requires = "features")]
        signal: f64,
        /// Share of the nodes that train (as many validate, the rest test)
        #[arg(long, default_value_t = 0.1, requires = "features")]
        train_fraction: f64,
        /// Storage type of `features`
        #[arg(long, value_enum, default_value = "f32", requires = "features")]
        dtype: crate::graph::nodedata::FeatureDtype,
    },
    /// Graph500 R-MAT: 2^scale nodes, edge_factor * 2^scale edges
    Rmat {
        #[arg(long)]
        scale: u32,
        #[arg(long, default_value_t = 16)]
        edge_factor: u64,
        #[arg(short = 'o', long)]
        output: PathBuf,
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
    /// A tiny shape with a known answer
    Shape {
        #[arg(value_enum)]
        shape: Shape,
        #[arg(long)]
        nodes: u64,
        #[arg(short = 'o', long)]
        output: PathBuf,
    },
}

#[derive(Debug, Args)]
pub struct InfoCmd {
    #[arg(long)]
    pub graph: PathBuf,
    #[command(flatten)]
    pub mpi: Mpi,
    /// Node placement: striped or block
    #[arg(long, default_value = "striped")]
    pub partition: String,
    /// Print JSON instead of a table
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ExportCmd {
    #[arg(long)]
    pub embeddings: PathBuf,
    #[arg(long, value_parser = ["npy", "word2vec"])]
    pub format: String,
    #[arg(short = 'o', long)]
    pub output: PathBuf,
}
