//! graphscale: distributed graph embedding training over MPI.
//!
//! Every rank owns a storage partition (its nodes' embedding rows and optimizer state) and a
//! compute pool; rows a batch needs are fetched one-sidedly, gradients are pushed to their
//! owners in aggregated all-to-all exchanges. See `docs/architecture.md`.

pub mod comm;
pub mod error;
pub mod graph;
pub mod spmd;

pub use error::{Error, Result};
pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod embeddings;
pub mod estimate;
pub mod eval;
pub mod export;
pub mod model;
pub mod outfile;
pub mod plan;
pub mod report;
pub mod sample;
pub mod selftest;
pub mod signals;
pub mod stats;
pub mod store;
pub mod train;
