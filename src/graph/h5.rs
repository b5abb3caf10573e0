//! The HDF5 edge-list schema (`docs/formats.md`): datasets `src`, `dst` (unsigned integers,
//! written as u64), optional `weight` (f32) and `rel` (u32); root attributes `num_nodes`,
//! `directed`, `format_version`; optional `node_names` (strings, row i = node i).

use std::path::{Path, PathBuf};

use hdf5::types::{TypeDescriptor, VarLenUnicode};

use super::{Edge, NodeId, FORMAT_VERSION};
use crate::error::{Error, Result};

/// Rows per HDF5 chunk for the edge datasets.
const CHUNK: usize = 1 << 20;

/// An opened, validated edge file. Reads are hyperslabs; nothing is loaded whole.
pub struct EdgeFile {
    path: PathBuf,
    file: hdf5::File,
    pub num_nodes: u64,
    pub num_edges: u64,
    pub directed: bool,
    pub weighted: bool,
    pub has_rel: bool,
}

/// Open `path` with a message that says what kind of problem it is.
pub fn open_h5(path: &Path) -> Result<hdf5::File> {
    std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    hdf5::File::open(path).map_err(|e| {
        Error::bad_input(
            path,
            format!(
                "not a readable HDF5 file ({e}); text edge lists are converted with \
                 `graphscale convert {} -o graph.h5`",
                path.display()
            ),
        )
    })
}

fn check_unsigned(path: &Path, ds: &hdf5::Dataset, name: &str) -> Result<()> {
    let td = ds
        .dtype()
        .and_then(|t| t.to_descriptor())
        .map_err(|e| Error::hdf5(path, format!("dataset '{name}' type"), e))?;
    match td {
        TypeDescriptor::Unsigned(_) => Ok(()),
        other => Err(Error::bad_input(
            path,
            format!("dataset '{name}' has type {other}; node ids must be unsigned integers (u64)"),
        )),
    }
}

impl EdgeFile {
    pub fn open(path: &Path) -> Result<EdgeFile> {
        let file = open_h5(path)?;
        let need = |name: &str| {
            file.dataset(name).map_err(|_| {
                Error::bad_input(
                    path,
                    format!(
                        "missing dataset '{name}' (an edge file has 1-D datasets 'src' and 'dst')"
                    ),
                )
            })
        };
        let src = need("src")?;
        let dst = need("dst")?;
        check_unsigned(path, &src, "src")?;
        check_unsigned(path, &dst, "dst")?;
        if src.ndim() != 1 || dst.ndim() != 1 {
            return Err(Error::bad_input(
                path,
                "datasets 'src' and 'dst' must be 1-D",
            ));
        }
        let (ns, nd) = (src.size() as u64, dst.size() as u64);
        if ns != nd {
            return Err(Error::bad_input(
                path,
                format!(
                    "'src' has {ns} entries but 'dst' has {nd}; they must have the same length"
                ),
            ));
        }
        let weighted = match file.dataset("weight") {
            Ok(w) => {
                let td = w.dtype().and_then(|t| t.to_descriptor());
                if !matches!(td, Ok(TypeDescriptor::Float(_))) {
                    return Err(Error::bad_input(
                        path,
                        "dataset 'weight' must be floating point (f32)",
                    ));
                }
                if w.size() as u64 != ns {
                    return Err(Error::bad_input(
                        path,
                        format!("'weight' has {} entries but there are {ns} edges", w.size()),
                    ));
                }
                true
            }
            Err(_) => false,
        };
        let has_rel = file.dataset("rel").is_ok();
        let num_nodes = read_attr_u64(&file, path, "num_nodes")?.ok_or_else(|| {
            Error::bad_input(
                path,
                "missing root attribute 'num_nodes' (u64): the number of nodes",
            )
        })?;
        let directed = read_attr_u64(&file, path, "directed")?.unwrap_or(0) != 0;
        if let Some(v) = read_attr_u64(&file, path, "format_version")? {
            if v != u64::from(FORMAT_VERSION) {
                return Err(Error::bad_input(
                    path,
                    format!(
                        "format_version {v} is not supported (this build reads {FORMAT_VERSION})"
                    ),
                ));
            }
        }
        if num_nodes == 0 || ns == 0 {
            return Err(Error::bad_input(
                path,
                format!("empty graph ({num_nodes} nodes, {ns} edges): nothing to train on"),
            ));
        }
        Ok(EdgeFile {
            path: path.to_path_buf(),
            file,
            num_nodes,
            num_edges: ns,
            directed,
            weighted,
            has_rel,
        })
    }

    pub fn file(&self) -> &hdf5::File {
        &self.file
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Read and validate edges `[start, end)`.
    pub fn read_edges(&self, start: u64, end: u64) -> Result<Vec<Edge>> {
        let (a, b) = (start as usize, end as usize);
        let read_u64 = |name: &str| -> Result<Vec<u64>> {
            let ds = self
                .file
                .dataset(name)
                .map_err(|e| Error::hdf5(&self.path, format!("open '{name}'"), e))?;
            Ok(ds
                .read_slice_1d::<u64, _>(a..b)
                .map_err(|e| Error::hdf5(&self.path, format!("read {name}[{a}..{b}]"), e))?
                .to_vec())
        };
        let src = read_u64("src")?;
        let dst = read_u64("dst")?;
        let weight = if self.weighted {
            let ds = self
                .file
                .dataset("weight")
                .map_err(|e| Error::hdf5(&self.path, "open 'weight'", e))?;
            Some(
                ds.read_slice_1d::<f32, _>(a..b)
                    .map_err(|e| Error::hdf5(&self.path, format!("read weight[{a}..{b}]"), e))?
                    .to_vec(),
            )
        } else {
            None
        };
        let mut out = Vec::with_capacity(src.len());
        for i in 0..src.len() {
            let (s, d) = (src[i], dst[i]);
            for (name, v) in [("src", s), ("dst", d)] {
                if v >= self.num_nodes {
                    return Err(Error::bad_input(
                        &self.path,
                        format!(
                            "{name}[{}] = {v} is out of range: num_nodes is {} (ids are 0-based)",
                            start + i as u64,
                            self.num_nodes
                        ),
                    ));
                }
            }
            let w = weight.as_ref().map_or(1.0, |w| w[i]);
            if !w.is_finite() || w < 0.0 {
                return Err(Error::bad_input(
                    &self.path,
                    format!(
                        "weight[{}] = {w}: weights must be finite and non-negative",
                        start + i as u64
                    ),
                ));
            }
            out.push(Edge {
                src: s,
                dst: d,
                weight: w,
            });
        }
        Ok(out)
    }

    /// Relation ids of edges `[start, end)` (knowledge graphs).
    pub fn read_rel(&self, start: u64, end: u64) -> Result<Vec<u32>> {
        let ds = self
            .file
            .dataset("rel")
            .map_err(|_| Error::bad_input(&self.path, "missing dataset 'rel' (relation ids)"))?;
        Ok(ds
            .read_slice_1d::<u32, _>(start as usize..end as usize)
            .map_err(|e| Error::hdf5(&self.path, "read rel", e))?
            .to_vec())
    }
}

pub fn read_attr_u64(file: &hdf5::File, path: &Path, name: &str) -> Result<Option<u64>> {
    match file.attr(name) {
        Ok(a) => a
            .read_scalar::<u64>()
            .map(Some)
            .map_err(|e| Error::hdf5(path, format!("attribute '{name}'"), e)),
        Err(_) => Ok(None),
    }
}

/// Streams edges into a new edge file in chunks; memory stays bounded by the chunk.
pub struct EdgeWriter {
    path: PathBuf,
    file: hdf5::File,
    src: hdf5::Dataset,
    dst: hdf5::Dataset,
    weight: Option<hdf5::Dataset>,
    /// Knowledge graphs: the relation id of every edge (`push_triple`).
    rel: Option<hdf5::Dataset>,
    buf: Vec<Edge>,
    rels: Vec<u32>,
    written: usize,
    max_id: Option<NodeId>,
}

fn extendable<T: hdf5::H5Type>(
    file: &hdf5::File,
    path: &Path,
    name: &str,
) -> Result<hdf5::Dataset> {
    file.new_dataset::<T>()
        .chunk(CHUNK)
        .shuffle()
        .deflate(1)
        .shape(0..)
        .create(name)
        .map_err(|e| Error::hdf5(path, format!("create dataset '{name}'"), e))
}

impl EdgeWriter {
    pub fn create(path: &Path, weighted: bool) -> Result<EdgeWriter> {
        let file = hdf5::File::create(path).map_err(|e| Error::hdf5(path, "create file", e))?;
        let src = extendable::<u64>(&file, path, "src")?;
        let dst = extendable::<u64>(&file, path, "dst")?;
        let weight = if weighted {
            Some(extendable::<f32>(&file, path, "weight")?)
        } else {
            None
        };
        Ok(EdgeWriter {
            path: path.to_path_buf(),
            file,
            src,
            dst,
            weight,
            rel: None,
            buf: Vec::with_capacity(CHUNK),
            rels: Vec::new(),
            written: 0,
            max_id: None,
        })
    }

    /// A writer of triples (head, relation, tail): directed edges with a `rel` dataset.
    pub fn create_triples(path: &Path) -> Result<EdgeWriter> {
        let mut w = EdgeWriter::create(path, false)?;
        w.rel = Some(extendable::<u32>(&w.file, path, "rel")?);
        w.rels.reserve(CHUNK);
        Ok(w)
    }

    /// Append a triple (a writer from `create_triples`).
    pub fn push_triple(&mut self, head: NodeId, rel: u32, tail: NodeId) -> Result<()> {
        debug_assert!(self.rel.is_some());
        self.rels.push(rel);
        self.push(Edge {
            src: head,
            dst: tail,
            weight: 1.0,
        })
    }

    pub fn push(&mut self, e: Edge) -> Result<()> {
        self.max_id = Some(self.max_id.unwrap_or(0).max(e.src).max(e.dst));
        self.buf.push(e);
        if self.buf.len() >= CHUNK {
            self.flush()?;
        }
        Ok(())
    }

    pub fn edges(&self) -> u64 {
        (self.written + self.buf.len()) as u64
    }

    fn flush(&mut self) -> Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let (a, b) = (self.written, self.written + self.buf.len());
        let err = |e| Error::hdf5(&self.path, "append edges", e);
        let s: Vec<u64> = self.buf.iter().map(|e| e.src).collect();
        let d: Vec<u64> = self.buf.iter().map(|e| e.dst).collect();
        self.src.resize(b).map_err(err)?;
        self.src.write_slice(&s, a..b).map_err(err)?;
        self.dst.resize(b).map_err(err)?;
        self.dst.write_slice(&d, a..b).map_err(err)?;
        if let Some(w) = &self.weight {
            let ws: Vec<f32> = self.buf.iter().map(|e| e.weight).collect();
            w.resize(b).map_err(err)?;
            w.write_slice(&ws, a..b).map_err(err)?;
        }
        if let Some(r) = &self.rel {
            r.resize(b).map_err(err)?;
            r.write_slice(&self.rels, a..b).map_err(err)?;
            self.rels.clear();
        }
        self.written = b;
        self.buf.clear();
        Ok(())
    }

    /// Write the attributes and close. `num_nodes` defaults to the largest id + 1.
    pub fn finish(
        mut self,
        num_nodes: Option<u64>,
        directed: bool,
        names: Option<&[String]>,
    ) -> Result<(u64, u64)> {
        self.flush()?;
        let n = num_nodes.unwrap_or_else(|| self.max_id.map_or(0, |m| m + 1));
        let path = self.path.clone();
        let err = |what: &str| {
            let p = path.clone();
            let w = what.to_string();
            move |e| Error::hdf5(p, w, e)
        };
        write_attr(&self.file, "num_nodes", n).map_err(err("attribute num_nodes"))?;
        write_attr(&self.file, "directed", u64::from(directed))
            .map_err(err("attribute directed"))?;
        write_attr(&self.file, "format_version", u64::from(FORMAT_VERSION))
            .map_err(err("attribute format_version"))?;
        if let Some(names) = names {
            write_names(&self.file, &path, "node_names", names)?;
        }
        flush(&self.file, &path)?;
        Ok((n, self.written as u64))
    }

    /// `finish` for triples: also the relation count and the entity and relation names.
    pub fn finish_triples(self, entities: &[String], relations: &[String]) -> Result<(u64, u64)> {
        let (file, path) = (self.file.clone(), self.path.clone());
        let out = self.finish(Some(entities.len() as u64), true, Some(entities))?;
        write_attr(&file, "num_relations", relations.len() as u64)
            .map_err(|e| Error::hdf5(&path, "attribute num_relations", e))?;
        write_names(&file, &path, "relation_names", relations)?;
        flush(&file, &path)?;
        Ok(out)
    }
}

/// Flush `f` to the disk and report a failed write (a full disk, a quota): HDF5 keeps written
/// data in its caches, and a write that fails when the file is closed on drop goes unreported,
/// leaving a truncated file behind a successful exit.
pub fn flush(f: &hdf5::File, path: &Path) -> Result<()> {
    f.flush()
        .map_err(|e| Error::hdf5(path, "write to disk (is it full?)", e))
}

/// A 1-D dataset of variable-length UTF-8 strings.
pub fn write_names(file: &hdf5::File, path: &Path, name: &str, names: &[String]) -> Result<()> {
    let v: Vec<VarLenUnicode> = names
        .iter()
        .map(|s| s.parse().expect("names hold no NUL bytes"))
        .collect();
    file.new_dataset_builder()
        .with_data(&v)
        .create(name)
        .map_err(|e| Error::hdf5(path, format!("dataset {name}"), e))?;
    Ok(())
}

/// The strings of dataset `name`, if it exists.
pub fn read_names(file: &hdf5::File, path: &Path, name: &str) -> Result<Option<Vec<String>>> {
    let Ok(ds) = file.dataset(name) else {
        return Ok(None);
    };
    let v: Vec<VarLenUnicode> = ds
        .read_raw()
        .map_err(|e| Error::hdf5(path, format!("read dataset '{name}' (strings)"), e))?;
    Ok(Some(
        v.into_iter().map(|s| s.as_str().to_string()).collect(),
    ))
}

fn write_attr(file: &hdf5::File, name: &str, v: u64) -> hdf5::Result<()> {
    file.new_attr::<u64>().create(name)?.write_scalar(&v)
}

/// Write a whole edge list at once (generators, tests).
pub fn write_edges(
    path: &Path,
    edges: &[Edge],
    num_nodes: u64,
    directed: bool,
    weighted: bool,
) -> Result<()> {
    let mut w = EdgeWriter::create(path, weighted)?;
    for &e in edges {
        w.push(e)?;
    }
    w.finish(Some(num_nodes), directed, None)?;
    Ok(())
}
