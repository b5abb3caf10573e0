//! Graph input and topology: the HDF5 edge-list schema, text conversion, generators, the
//! partitioner that decides which rank owns a node, and the distributed load that builds each
//! rank's CSR without any rank holding the whole graph.

pub mod csr;
pub mod generate;
pub mod h5;
pub mod node;
pub mod nodedata;
pub mod partition;
pub mod reorder;
pub mod text;
pub mod triples;

pub use csr::LocalGraph;
pub use partition::Partitioner;

/// Global node id, as stored on disk.
pub type NodeId = u64;

/// Version of the HDF5 edge-list schema this build reads and writes (`docs/formats.md`).
pub const FORMAT_VERSION: u32 = 1;

/// One edge as read from a file or generated.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Edge {
    pub src: NodeId,
    pub dst: NodeId,
    pub weight: f32,
}
