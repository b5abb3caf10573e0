//! Evaluation of trained embeddings, apart from the solver (it reads embeddings through
//! `crate::embeddings`): `nodeclf` node classification (the DeepWalk protocol), `linkpred` the
//! edge split and link prediction, `kg` filtered ranking of knowledge-graph triples.

pub mod kg;
pub mod linkpred;
pub mod nodeclf;

pub use nodeclf::*;
