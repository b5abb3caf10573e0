//! Node data beside a graph's edges, in the graph file (the inputs of GraphSAGE; docs/formats.md):
//! - `features`: `num_nodes x F`, f32 or f16; the rows of nodes the input does not name are
//!   zero. h5py reads it as a numpy array.
//! - `label_offsets` (`num_nodes + 1`, u64) and `label_ids` (u32): node v's classes are
//!   `label_ids[label_offsets[v]..label_offsets[v + 1]]` (none: unlabelled; several:
//!   multi-label); attribute `num_classes`.
//! - `split`: `num_nodes` u8, 0 none, 1 train, 2 valid, 3 test.
//!
//! Text inputs, `#` and `%` comment lines, fields separated by tabs, spaces or commas; a node is
//! its integer id, or its name when the graph has `node_names` (`convert --string-ids`):
//! - features `node column value` per nonzero (as `../shared/data/cora/features.tsv`), grouped
//!   by node in increasing id order (as such files are written); read twice, streaming: the
//!   first pass checks every line and finds the columns, the second writes blocks of rows, so
//!   memory holds one block;
//! - labels `node label` per pair (a node on several lines is multi-label);
//! - split `node train|valid|test`.
//!
//! Every error names the file and the line.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::Path;

use half::f16;

use super::h5::{flush, read_names};
use crate::comm::Comm;
use crate::config::Dtype;
use crate::error::{Error, Result};
use crate::graph::partition::{Partitioner, Scheme};
use crate::spmd::agree;
use crate::store::{decode_row, encode_row};

/// Bytes of feature rows written at once.
const BLOCK_BYTES: usize = 32 << 20;

/// The storage type of `features`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FeatureDtype {
    F32,
    F16,
}

/// Split codes of the `split` dataset.
pub const NONE: u8 = 0;
pub const TRAIN: u8 = 1;
pub const VALID: u8 = 2;
pub const TEST: u8 = 3;

/// How the lines of node-data files name nodes: integer ids below `num_nodes`, or the graph's
/// node names.
pub struct NodeIds {
    num_nodes: u64,
    names: Option<HashMap<String, u64>>,
}

impl NodeIds {
    /// The graph file's node count and names.
    pub fn of(file: &hdf5::File, path: &Path) -> Result<NodeIds> {
        let num_nodes = super::h5::read_attr_u64(file, path, "num_nodes")?
            .ok_or_else(|| Error::bad_input(path, "attribute 'num_nodes' missing"))?;
        let names = read_names(file, path, "node_names")?.map(|n| {
            n.into_iter()
                .enumerate()
                .map(|(i, s)| (s, i as u64))
                .collect()
        });
        Ok(NodeIds { num_nodes, names })
    }

    /// A graph of `num_nodes` integer ids.
    pub fn numeric(num_nodes: u64) -> NodeIds {
        NodeIds {
            num_nodes,
            names: None,
        }
    }

    fn id(&self, tok: &str) -> std::result::Result<u64, String> {
        match &self.names {
            Some(m) => m
                .get(tok)
                .copied()
                .ok_or_else(|| format!("node '{tok}' is not a node of the graph (its node_names)")),
            None => match tok.parse::<u64>() {
                Ok(v) if v < self.num_nodes => Ok(v),
                Ok(v) => Err(format!(
                    "node {v} is not in the graph of {} nodes (ids 0..{})",
                    self.num_nodes,
                    self.num_nodes.saturating_sub(1)
                )),
                Err(_) => Err(format!("'{tok}' is not a non-negative integer node id")),
            },
        }
    }
}

/// The data lines of `path` (comments and blank lines skipped), split into fields, with their
/// line numbers; `each` returns an error message for a bad line.
fn each_line(
    path: &Path,
    mut each: impl FnMut(&[&str]) -> std::result::Result<(), String>,
) -> Result<u64> {
    let f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut r = BufReader::with_capacity(1 << 20, f);
    let (mut line, mut no, mut lines) = (String::new(), 0u64, 0u64);
    loop {
        line.clear();
        if r.read_line(&mut line).map_err(|e| Error::io(path, e))? == 0 {
            return Ok(lines);
        }
        no += 1;
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') || t.starts_with('%') {
            continue;
        }
        // Up to MAX_FIELDS fields without an allocation per line.
        let mut buf = [""; MAX_FIELDS];
        let mut k = 0;
        for s in t
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|s| !s.is_empty())
        {
            if k < MAX_FIELDS {
                buf[k] = s;
            }
            k += 1;
        }
        let r = if k > MAX_FIELDS {
            Err(format!("{k} fields"))
        } else {
            each(&buf[..k])
        };
        r.map_err(|msg| Error::BadLine {
            path: path.to_path_buf(),
            line: no,
            msg,
        })?;
        lines += 1;
    }
}

const MAX_FIELDS: usize = 8;

/// `want` fields, or a message saying what the line should hold.
fn fields<'a>(f: &[&'a str], want: usize, what: &str) -> std::result::Result<Vec<&'a str>, String> {
    if f.len() == want {
        Ok(f.to_vec())
    } else {
        Err(format!("{} fields, expected {want}: {what}", f.len()))
    }
}

/// `features` of `n` rows of `cols`, written in blocks of rows.
struct FeatureWriter<'a> {
    ds: hdf5::Dataset,
    path: &'a Path,
    dtype: FeatureDtype,
    n: usize,
    cols: usize,
    /// Rows per block.
    block: usize,
}

impl<'a> FeatureWriter<'a> {
    fn create(
        file: &hdf5::File,
        path: &'a Path,
        n: usize,
        cols: usize,
        dtype: FeatureDtype,
    ) -> Result<FeatureWriter<'a>> {
        let block = (BLOCK_BYTES / (cols.max(1) * 4)).clamp(1, n.max(1));
        let ds = match dtype {
            FeatureDtype::F32 => file.new_dataset::<f32>(),
            FeatureDtype::F16 => file.new_dataset::<f16>(),
        }
        .chunk((block.clamp(1, 4096), cols.max(1)))
        .shape((n, cols))
        .create("features")
        .map_err(|e| Error::hdf5(path, "create dataset features", e))?;
        Ok(FeatureWriter {
            ds,
            path,
            dtype,
            n,
            cols,
            block,
        })
    }

    /// Write the block of rows from `first` (`buf` holds `block` rows; the last block fewer).
    fn write(&self, first: usize, buf: &[f32]) -> Result<()> {
        let rows = self.block.min(self.n - first);
        let a = ndarray::ArrayView2::from_shape((rows, self.cols), &buf[..rows * self.cols])
            .expect("rows x columns");
        let s = ndarray::s![first..first + rows, ..];
        match self.dtype {
            FeatureDtype::F32 => self.ds.write_slice(a, s),
            FeatureDtype::F16 => self.ds.write_slice(a.mapv(f16::from_f32).view(), s),
        }
        .map_err(|e| Error::hdf5(self.path, "write features", e))
    }
}

/// What `add_features` wrote.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Features {
    pub columns: u64,
    pub nonzeros: u64,
    pub nodes: u64,
}

/// One feature line: node, column, value.
fn feature_line(ids: &NodeIds, f: &[&str]) -> std::result::Result<(u64, u64, f32), String> {
    let f = fields(f, 3, "node, column, value")?;
    let v = ids.id(f[0])?;
    let c = f[1]
        .parse::<u64>()
        .map_err(|_| format!("column '{}' is not a non-negative integer", f[1]))?;
    if c >= 1 << 24 {
        return Err(format!("column {c}: at most 2^24 feature columns"));
    }
    let x = f[2]
        .parse::<f32>()
        .ok()
        .filter(|x| x.is_finite())
        .ok_or_else(|| format!("value '{}' is not a finite number", f[2]))?;
    Ok((v, c, x))
}

/// Write `features` into the graph file `file` (at `path`) from the sparse text `input`.
pub fn add_features(
    file: &hdf5::File,
    path: &Path,
    input: &Path,
    ids: &NodeIds,
    dtype: FeatureDtype,
) -> Result<Features> {
    // Pass 1: every line checked, the columns counted, the order checked.
    let (mut columns, mut nonzeros, mut nodes) = (0u64, 0u64, 0u64);
    let mut last: Option<(u64, u64)> = None;
    each_line(input, |f| {
        let (v, c, _) = feature_line(ids, f)?;
        match last {
            Some((lv, _)) if v < lv => {
                return Err(format!(
                    "node {v} after node {lv}: the lines must be grouped by node in increasing order (sort -n -k1,1 -s {})",
                    input.display()
                ))
            }
            Some((lv, lc)) if v == lv && c == lc => {
                return Err(format!("node {v} column {c} given twice"))
            }
            Some((lv, _)) if v == lv => {}
            _ => nodes += 1,
        }
        last = Some((v, c));
        columns = columns.max(c + 1);
        nonzeros += 1;
        Ok(())
    })?;
    if nonzeros == 0 {
        return Err(Error::bad_input(
            input,
            "no feature lines (node, column, value) found",
        ));
    }
    let (n, cols) = (ids.num_nodes as usize, columns as usize);
    let w = FeatureWriter::create(file, path, n, cols, dtype)?;
    let block = w.block;
    // Pass 2: blocks of rows, each written once (the lines are in node order).
    let mut buf = vec![0f32; block * cols];
    let mut first = 0usize;
    let mut failed = None;
    each_line(input, |f| {
        let (v, c, x) = feature_line(ids, f)?;
        let v = v as usize;
        while v >= first + block {
            if let Err(e) = w.write(first, &buf) {
                failed = Some(e);
                return Err("cannot write the features".into());
            }
            buf.iter_mut().for_each(|x| *x = 0.0);
            first += block;
        }
        buf[(v - first) * cols + c as usize] = x;
        Ok(())
    })
    .map_err(|e| failed.take().unwrap_or(e))?;
    while first < n {
        w.write(first, &buf)?;
        buf.iter_mut().for_each(|x| *x = 0.0);
        first += block;
    }
    flush(file, path)?;
    Ok(Features {
        columns,
        nonzeros,
        nodes,
    })
}

/// Write `features` from a dense `.npy` file (2-D, float32 or float64, row i = node i), read
/// through a memory map a block of rows at a time.
pub fn add_npy_features(
    file: &hdf5::File,
    path: &Path,
    input: &Path,
    ids: &NodeIds,
    dtype: FeatureDtype,
) -> Result<Features> {
    use ndarray_npy::{ViewNpyError, ViewNpyExt};
    let f = std::fs::File::open(input).map_err(|e| Error::io(input, e))?;
    // SAFETY: the map is read-only and dropped before this function returns; the file is an
    // input the user gave, not modified by graphscale (a concurrent truncation by another
    // process would fault, as for any reader of a memory map).
    let map = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| Error::io(input, e))?;
    let bad = |e: ViewNpyError| {
        Error::bad_input(
            input,
            format!("not a 2-D .npy of float32 or float64 rows in this machine's byte order ({e}); numpy: np.save(path, x.astype(np.float32))"),
        )
    };
    match ndarray::ArrayView2::<f32>::view_npy(&map) {
        Ok(a) => dense_rows(file, path, input, ids, dtype, a),
        Err(ViewNpyError::WrongDescriptor(_)) => {
            let a = ndarray::ArrayView2::<f64>::view_npy(&map).map_err(bad)?;
            dense_rows(file, path, input, ids, dtype, a)
        }
        Err(e) => Err(bad(e)),
    }
}

/// Rows of `a` (one per node, any layout) as `features`, checked finite.
fn dense_rows<T: Copy + Into<f64>>(
    file: &hdf5::File,
    path: &Path,
    input: &Path,
    ids: &NodeIds,
    dtype: FeatureDtype,
    a: ndarray::ArrayView2<T>,
) -> Result<Features> {
    let (rows, cols) = a.dim();
    if rows as u64 != ids.num_nodes || cols == 0 {
        return Err(Error::bad_input(
            input,
            format!(
                "{rows} rows of {cols} columns: the graph has {} nodes, and row i holds node i's features (one row per node, at least one column)",
                ids.num_nodes
            ),
        ));
    }
    // One pass: rows converted, counted and checked as they are written (a bad value fails
    // the convert, whose partial output is then removed).
    let (mut nonzeros, mut nodes, mut bad) = (0u64, 0u64, None);
    write_dense_features(file, path, cols, dtype, |v, out| {
        let before = nonzeros;
        for (c, (o, &x)) in out.iter_mut().zip(a.row(v)).enumerate() {
            let x = x.into();
            if !x.is_finite() && bad.is_none() {
                bad = Some((v, c));
            }
            nonzeros += u64::from(x != 0.0);
            *o = x as f32;
        }
        nodes += u64::from(nonzeros > before);
    })?;
    if let Some((r, c)) = bad {
        return Err(Error::bad_input(
            input,
            format!("row {r} column {c} is not a finite number"),
        ));
    }
    Ok(Features {
        columns: cols as u64,
        nonzeros,
        nodes,
    })
}

/// Write dense `features` (`rows` of `cols`, node order) into the graph file.
pub fn write_dense_features(
    file: &hdf5::File,
    path: &Path,
    cols: usize,
    dtype: FeatureDtype,
    mut row: impl FnMut(usize, &mut [f32]),
) -> Result<()> {
    let n = super::h5::read_attr_u64(file, path, "num_nodes")?.unwrap_or(0) as usize;
    let w = FeatureWriter::create(file, path, n, cols, dtype)?;
    let mut buf = vec![0f32; w.block * cols];
    for first in (0..n).step_by(w.block) {
        let rows = w.block.min(n - first);
        for (i, r) in buf.chunks_exact_mut(cols).take(rows).enumerate() {
            row(first + i, r);
        }
        w.write(first, &buf)?;
    }
    flush(file, path)
}

/// Labels per node: `offsets` (`num_nodes + 1`) into `ids`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Labels {
    pub offsets: Vec<u64>,
    pub ids: Vec<u32>,
    pub num_classes: u32,
    /// The labels' tokens when they were not integers (class i's name).
    pub names: Option<Vec<String>>,
}

impl Labels {
    /// From (node, class) pairs in any order; a pair given twice counts once.
    pub fn from_pairs(num_nodes: u64, mut pairs: Vec<(u64, u32)>) -> Labels {
        pairs.sort_unstable();
        pairs.dedup();
        let mut offsets = vec![0u64; num_nodes as usize + 1];
        for &(v, _) in &pairs {
            offsets[v as usize + 1] += 1;
        }
        for i in 0..num_nodes as usize {
            offsets[i + 1] += offsets[i];
        }
        Labels {
            num_classes: pairs.iter().map(|p| p.1 + 1).max().unwrap_or(0),
            ids: pairs.into_iter().map(|p| p.1).collect(),
            offsets,
            names: None,
        }
    }

    pub fn of(&self, v: usize) -> &[u32] {
        &self.ids[self.offsets[v] as usize..self.offsets[v + 1] as usize]
    }

    /// Some node has more than one class.
    pub fn multilabel(&self) -> bool {
        self.offsets.windows(2).any(|w| w[1] - w[0] > 1)
    }
}

/// Read `node label` lines. Labels that are all integers (below 2^20) are the class ids;
/// any other tokens get ids in order of first appearance, their names kept (`class_names`).
pub fn read_labels(input: &Path, ids: &NodeIds) -> Result<Labels> {
    let (mut pairs, mut names, mut index) = (Vec::new(), Vec::<String>::new(), HashMap::new());
    each_line(input, |f| {
        let f = fields(f, 2, "node, label")?;
        let v = ids.id(f[0])?;
        let c = *index.entry(f[1].to_string()).or_insert_with(|| {
            names.push(f[1].to_string());
            names.len() as u32 - 1
        });
        pairs.push((v, c));
        Ok(())
    })?;
    if pairs.is_empty() {
        return Err(Error::bad_input(
            input,
            "no label lines (node, label) found",
        ));
    }
    let numeric: Option<Vec<u32>> = names
        .iter()
        .map(|s| s.parse::<u32>().ok().filter(|&c| c < 1 << 20))
        .collect();
    let mut l = match numeric {
        Some(ids_of) => {
            let pairs = pairs
                .into_iter()
                .map(|(v, c)| (v, ids_of[c as usize]))
                .collect();
            Labels::from_pairs(ids.num_nodes, pairs)
        }
        None => {
            let mut l = Labels::from_pairs(ids.num_nodes, pairs);
            l.num_classes = names.len() as u32;
            l.names = Some(names);
            l
        }
    };
    l.num_classes = l
        .num_classes
        .max(l.ids.iter().map(|c| c + 1).max().unwrap_or(0));
    Ok(l)
}

/// Read `node train|valid|test` lines.
pub fn read_split(input: &Path, ids: &NodeIds) -> Result<Vec<u8>> {
    let mut split = vec![NONE; ids.num_nodes as usize];
    each_line(input, |f| {
        let f = fields(f, 2, "node, train|valid|test")?;
        let v = ids.id(f[0])? as usize;
        let code = match f[1] {
            "train" => TRAIN,
            "valid" | "val" | "validation" => VALID,
            "test" => TEST,
            s => return Err(format!("split '{s}': use train, valid or test")),
        };
        if split[v] != NONE {
            return Err(format!("node {} is in the split twice", f[0]));
        }
        split[v] = code;
        Ok(())
    })?;
    Ok(split)
}

/// A split drawn at random: `train` and `valid` fractions of the labelled nodes, the rest test.
pub fn random_split(labels: &Labels, train: f64, valid: f64, seed: u64) -> Vec<u8> {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    let n = labels.offsets.len() - 1;
    let mut labelled: Vec<usize> = (0..n).filter(|&v| !labels.of(v).is_empty()).collect();
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(seed);
    labelled.shuffle(&mut rng);
    let (a, b) = (
        (train * labelled.len() as f64).round() as usize,
        ((train + valid) * labelled.len() as f64).round() as usize,
    );
    let mut split = vec![NONE; n];
    for (i, &v) in labelled.iter().enumerate() {
        split[v] = if i < a {
            TRAIN
        } else if i < b.min(labelled.len()) {
            VALID
        } else {
            TEST
        };
    }
    split
}

/// Write the labels and the split into the graph file.
pub fn write_labels(
    file: &hdf5::File,
    path: &Path,
    l: &Labels,
    split: Option<&[u8]>,
) -> Result<()> {
    let err = |what: &'static str| move |e| Error::hdf5(path, what, e);
    file.new_dataset_builder()
        .with_data(&l.offsets)
        .create("label_offsets")
        .map_err(err("create dataset label_offsets"))?;
    file.new_dataset_builder()
        .with_data(&l.ids)
        .create("label_ids")
        .map_err(err("create dataset label_ids"))?;
    file.new_attr::<u64>()
        .create("num_classes")
        .and_then(|a| a.write_scalar(&u64::from(l.num_classes)))
        .map_err(err("attribute num_classes"))?;
    if let Some(names) = &l.names {
        super::h5::write_names(file, path, "class_names", names)?;
    }
    if let Some(s) = split {
        file.new_dataset_builder()
            .with_data(s)
            .create("split")
            .map_err(err("create dataset split"))?;
    }
    flush(file, path)
}

/// The node-data inputs of `convert`.
pub struct Inputs<'a> {
    pub features: Option<&'a Path>,
    pub dtype: FeatureDtype,
    pub labels: Option<&'a Path>,
    pub split: Option<&'a Path>,
    pub train_fraction: Option<f64>,
    pub seed: u64,
}

/// What `add` wrote, for the summary line.
#[derive(Debug, Default)]
pub struct Added {
    pub features: Option<Features>,
    pub labelled: u64,
    pub num_classes: u32,
    pub multilabel: bool,
    /// Nodes in train, valid, test.
    pub split: Option<[u64; 3]>,
}

/// Add the node data of `inputs` to the graph file at `path` (just written by `convert`).
pub fn add(path: &Path, inputs: &Inputs) -> Result<Added> {
    let file = hdf5::File::open_rw(path).map_err(|e| Error::hdf5(path, "open for node data", e))?;
    let ids = NodeIds::of(&file, path)?;
    let mut out = Added::default();
    if let Some(x) = inputs.features {
        let add = if x.extension().is_some_and(|e| e == "npy") {
            add_npy_features
        } else {
            add_features
        };
        out.features = Some(add(&file, path, x, &ids, inputs.dtype)?);
    }
    if let Some(l) = inputs.labels {
        let labels = read_labels(l, &ids)?;
        let split = match (inputs.split, inputs.train_fraction) {
            (Some(s), _) => Some(read_split(s, &ids)?),
            (None, Some(t)) => {
                if !(t > 0.0 && t <= 0.5) {
                    return Err(Error::config(format!(
                        "--train-fraction {t}: give a share in (0, 0.5] (as many nodes validate; the rest test)"
                    )));
                }
                Some(random_split(&labels, t, t, inputs.seed))
            }
            (None, None) => None,
        };
        out.labelled = (0..ids.num_nodes as usize)
            .filter(|&v| !labels.of(v).is_empty())
            .count() as u64;
        out.num_classes = labels.num_classes;
        out.multilabel = labels.multilabel();
        out.split = split.as_ref().map(|s| {
            let c = |k: u8| s.iter().filter(|&&x| x == k).count() as u64;
            [c(TRAIN), c(VALID), c(TEST)]
        });
        write_labels(&file, path, &labels, split.as_deref())?;
    }
    Ok(out)
}

/// The node data of a graph file, as read back.
pub struct NodeData {
    pub features: Option<(usize, Vec<f32>)>,
    pub labels: Option<Labels>,
    pub split: Option<Vec<u8>>,
}

/// Read the node data of `path` whole (for one rank's use and for checks).
pub fn read(path: &Path) -> Result<NodeData> {
    let (labels, split) = read_labelled(path)?;
    let f = super::h5::open_h5(path)?;
    let err = |what: &'static str| move |e| Error::hdf5(path, what, e);
    let features = match f.dataset("features") {
        Ok(d) => {
            let shape = d.shape();
            if shape.len() != 2 {
                return Err(Error::bad_input(
                    path,
                    format!("dataset 'features' has shape {shape:?}, expected (nodes, columns)"),
                ));
            }
            let x: Vec<f32> = if d.dtype().map_err(err("features type"))?.size() == 2 {
                d.read_raw::<f16>()
                    .map_err(err("read features"))?
                    .into_iter()
                    .map(f16::to_f32)
                    .collect()
            } else {
                d.read_raw::<f32>().map_err(err("read features"))?
            };
            Some((shape[1], x))
        }
        Err(_) => None,
    };
    Ok(NodeData {
        features,
        labels,
        split,
    })
}

/// The shape of `features` (rows, columns) and whether it is stored in f16; `None` without it.
pub fn feature_shape(path: &Path) -> Result<Option<(usize, usize, bool)>> {
    let f = super::h5::open_h5(path)?;
    let Ok(d) = f.dataset("features") else {
        return Ok(None);
    };
    let shape = d.shape();
    if shape.len() != 2 {
        return Err(Error::bad_input(
            path,
            format!("dataset 'features' has shape {shape:?}, expected (nodes, columns)"),
        ));
    }
    let half = d
        .dtype()
        .map_err(|e| Error::hdf5(path, "features type", e))?
        .size()
        == 2;
    Ok(Some((shape[0], shape[1], half)))
}

/// The feature rows `first, first + step, ...` below `end` (a rank's rows under a striped or
/// block partition), `rows_at_once` at a time, each block handed to `take` as f32 with its
/// first row's index among the selected rows.
pub fn read_feature_rows(
    path: &Path,
    selection: (usize, usize, usize),
    rows_at_once: usize,
    take: impl FnMut(usize, &[f32]),
) -> Result<()> {
    read_rows(path, "features", selection, rows_at_once, take)
}

/// As [`read_feature_rows`], from the 2-d dataset `name` (f32 or f16).
pub fn read_rows(
    path: &Path,
    name: &str,
    (first, end, step): (usize, usize, usize),
    rows_at_once: usize,
    mut take: impl FnMut(usize, &[f32]),
) -> Result<()> {
    use ndarray::{s, Array2};
    let f = super::h5::open_h5(path)?;
    let d = f
        .dataset(name)
        .map_err(|e| Error::hdf5(path, format!("open {name}"), e))?;
    let half = d
        .dtype()
        .map_err(|e| Error::hdf5(path, format!("{name} type"), e))?
        .size()
        == 2;
    let err = |e| Error::hdf5(path, format!("read {name}"), e);
    let (step, chunk) = (step.max(1), rows_at_once.max(1));
    let count = if end > first {
        (end - first).div_ceil(step)
    } else {
        0
    };
    let mut done = 0;
    while done < count {
        let n = chunk.min(count - done);
        let (a, b) = (first + done * step, first + (done + n - 1) * step + 1);
        let x: Vec<f32> = if half {
            let a: Array2<f16> = d.read_slice(s![a..b;step, ..]).map_err(err)?;
            a.iter().map(|v| v.to_f32()).collect()
        } else {
            let a: Array2<f32> = d.read_slice(s![a..b;step, ..]).map_err(err)?;
            a.into_raw_vec_and_offset().0
        };
        take(done, &x);
        done += n;
    }
    Ok(())
}

/// Rows of a 2-d dataset a rank reads at once (a slab of [`read_owned_rows`]).
pub const READ_ROWS: usize = 1 << 16;

/// Collective: the rows this rank owns under `part` of the 2-d dataset `name` of `path` (f32
/// or f16, `cols` wide), each handed to `take(local row, values)`. Rank `r` reads slabs `r, r +
/// ranks, ...` of [`READ_ROWS`] consecutive rows and sends every row to its owner (as `dtype`,
/// the bytes the owner stores), so that the file is read once, in whole chunks, at any rank
/// count: HDF5 reads a strided selection (a striped partition's rows) row by row, about 10x
/// slower per row than a slab.
pub fn read_owned_rows(
    comm: &Comm,
    (path, name): (&Path, &str),
    part: &Partitioner,
    (cols, dtype): (usize, Dtype),
    take: impl FnMut(usize, &[f32]),
) -> Result<()> {
    read_owned_rows_by(comm, (path, name), part, (cols, dtype), READ_ROWS, take)
}

/// [`read_owned_rows`] in slabs of at most `slab` rows.
fn read_owned_rows_by(
    comm: &Comm,
    (path, name): (&Path, &str),
    part: &Partitioner,
    (cols, dtype): (usize, Dtype),
    slab: usize,
    mut take: impl FnMut(usize, &[f32]),
) -> Result<()> {
    let (ranks, me, n) = (comm.size(), comm.rank(), part.num_nodes() as usize);
    let slab = slab.min(n.div_ceil(ranks)).max(1);
    let rb = cols * dtype.size();
    // Rank `o`'s rows in `[a, b)`: their local indices (`first + k step` is local row `k`).
    let owned = |o: usize, (a, b): (usize, usize)| {
        let (first, end, step) = selection(part, o);
        let k = |x: usize| x.saturating_sub(first).div_ceil(step);
        k(a)..k(b.min(end).max(first))
    };
    let mut rows: Vec<f32> = Vec::new();
    let mut row = vec![0f32; cols];
    for round in 0..n.div_ceil(slab * ranks) {
        let of = |r: usize| {
            let a = ((round * ranks + r) * slab).min(n);
            (a, (a + slab).min(n))
        };
        let (a, b) = of(me);
        rows.clear();
        let read = read_rows(path, name, (a, b, 1), slab, |_, x| {
            rows.extend_from_slice(x)
        });
        agree(comm, read)?;
        debug_assert_eq!(rows.len(), (b - a) * cols);
        let send = (0..ranks)
            .map(|o| {
                let (first, _, step) = selection(part, o);
                let ks = owned(o, (a, b));
                let mut out = vec![0u8; ks.len() * rb];
                for (k, bytes) in ks.zip(out.chunks_exact_mut(rb.max(1))) {
                    let i = first + k * step - a;
                    encode_row(dtype, &rows[i * cols..(i + 1) * cols], bytes);
                }
                out
            })
            .collect();
        for (s, got) in comm.all_to_all_v(send).iter().enumerate() {
            let ks = owned(me, of(s));
            debug_assert_eq!(got.len(), ks.len() * rb);
            for (k, bytes) in ks.zip(got.chunks_exact(rb.max(1))) {
                decode_row(dtype, bytes, &mut row);
                take(k, &row);
            }
        }
    }
    Ok(())
}

/// The rows rank `me` owns under `part` as a selection `(first, end, step)` of the file's rows.
pub fn selection(part: &Partitioner, me: usize) -> (usize, usize, usize) {
    match part.scheme() {
        Scheme::Striped => (me, part.num_nodes() as usize, part.ranks()),
        Scheme::Block => {
            let first = part.global(me, 0) as usize;
            (first, first + part.num_local(me), 1)
        }
    }
}

/// The labels and the split of `path` (whole), without its features.
pub fn read_labelled(path: &Path) -> Result<(Option<Labels>, Option<Vec<u8>>)> {
    let f = super::h5::open_h5(path)?;
    let err = |what: &'static str| move |e| Error::hdf5(path, what, e);
    let labels = match (f.dataset("label_offsets"), f.dataset("label_ids")) {
        (Ok(o), Ok(i)) => {
            let offsets = o.read_raw::<u64>().map_err(err("read label_offsets"))?;
            let ids = i.read_raw::<u32>().map_err(err("read label_ids"))?;
            if offsets.last().copied() != Some(ids.len() as u64)
                || offsets.windows(2).any(|w| w[0] > w[1])
            {
                return Err(Error::bad_input(
                    path,
                    "label_offsets do not index label_ids (damaged file?)",
                ));
            }
            let names = read_names(&f, path, "class_names")?;
            let num_classes = super::h5::read_attr_u64(&f, path, "num_classes")?.map_or_else(
                || ids.iter().map(|c| c + 1).max().unwrap_or(0),
                |c| c as u32,
            );
            Some(Labels {
                num_classes,
                offsets,
                ids,
                names,
            })
        }
        _ => None,
    };
    let split = match f.dataset("split") {
        Ok(d) => Some(d.read_raw::<u8>().map_err(err("read split"))?),
        Err(_) => None,
    };
    Ok((labels, split))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    fn graph(dir: &Path, n: u64) -> (std::path::PathBuf, hdf5::File) {
        let p = dir.join("g.h5");
        let f = hdf5::File::create(&p).unwrap();
        f.new_attr::<u64>()
            .create("num_nodes")
            .unwrap()
            .write_scalar(&n)
            .unwrap();
        (p, f)
    }

    #[test]
    fn sparse_features_land_in_their_rows_in_both_dtypes() {
        for dtype in [FeatureDtype::F32, FeatureDtype::F16] {
            let d = tempfile::tempdir().unwrap();
            let (p, f) = graph(d.path(), 5);
            let x = write(
                d.path(),
                "x.tsv",
                "# c\n0\t1\t0.5\n0\t3\t2\n3\t0\t-1.25\n4\t3\t7\n",
            );
            let r = add_features(&f, &p, &x, &NodeIds::numeric(5), dtype).unwrap();
            assert_eq!(
                r,
                Features {
                    columns: 4,
                    nonzeros: 4,
                    nodes: 3
                }
            );
            drop(f);
            let (cols, v) = read(&p).unwrap().features.unwrap();
            assert_eq!(cols, 4);
            #[rustfmt::skip]
            let want = [
                0.0, 0.5, 0.0, 2.0,
                0.0, 0.0, 0.0, 0.0,
                0.0, 0.0, 0.0, 0.0,
                -1.25, 0.0, 0.0, 0.0,
                0.0, 0.0, 0.0, 7.0,
            ];
            assert_eq!(v, want);
        }
    }

    #[test]
    fn blocks_of_rows_cover_every_node() {
        // More rows than one block holds: 3 columns of 4 bytes -> blocks of BLOCK_BYTES / 12.
        let n = (BLOCK_BYTES / 12) as u64 * 2 + 5;
        let d = tempfile::tempdir().unwrap();
        let (p, f) = graph(d.path(), n);
        let text = format!("0\t0\t1\n{}\t1\t2\n{}\t2\t3\n", n / 2, n - 1);
        let x = write(d.path(), "x.tsv", &text);
        add_features(&f, &p, &x, &NodeIds::numeric(n), FeatureDtype::F32).unwrap();
        drop(f);
        let (_, v) = read(&p).unwrap().features.unwrap();
        let nz: Vec<(usize, f32)> = v
            .iter()
            .enumerate()
            .filter(|(_, &x)| x != 0.0)
            .map(|(i, &x)| (i, x))
            .collect();
        let n = n as usize;
        assert_eq!(
            nz,
            vec![(0, 1.0), ((n / 2) * 3 + 1, 2.0), ((n - 1) * 3 + 2, 3.0)]
        );
    }

    #[test]
    fn bad_feature_lines_name_the_line_and_the_fix() {
        let d = tempfile::tempdir().unwrap();
        let (p, f) = graph(d.path(), 5);
        for (text, line, says) in [
            ("0\t1\t1\n7\t0\t1\n", 2, "not in the graph of 5 nodes"),
            ("0\t1\n", 1, "2 fields, expected 3"),
            ("0\tx\t1\n", 1, "column 'x'"),
            ("0\t1\tnan\n", 1, "not a finite number"),
            (
                "2\t1\t1\n1\t0\t1\n",
                2,
                "grouped by node in increasing order",
            ),
            ("1\t1\t1\n1\t1\t2\n", 2, "given twice"),
        ] {
            let x = write(d.path(), "x.tsv", text);
            let e = add_features(&f, &p, &x, &NodeIds::numeric(5), FeatureDtype::F32)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!("x.tsv:{line}")) && e.contains(says),
                "{text:?}: {e}"
            );
        }
        let x = write(d.path(), "x.tsv", "# nothing\n");
        let e = add_features(&f, &p, &x, &NodeIds::numeric(5), FeatureDtype::F32).unwrap_err();
        assert!(e.to_string().contains("no feature lines"), "{e}");
    }

    #[test]
    fn labels_and_split_round_trip_with_multilabel_nodes() {
        let d = tempfile::tempdir().unwrap();
        let (p, f) = graph(d.path(), 4);
        let ids = NodeIds::numeric(4);
        let l = read_labels(&write(d.path(), "l.tsv", "0 2\n3 1\n0 0\n0 2\n"), &ids).unwrap();
        assert_eq!(
            (l.of(0), l.of(1), l.of(3)),
            (&[0u32, 2][..], &[][..], &[1u32][..])
        );
        assert!(l.multilabel());
        assert_eq!((l.num_classes, &l.names), (3, &None));
        // Tokens: ids in order of first appearance, the names kept.
        let named = read_labels(&write(d.path(), "n.tsv", "2 b\n1 a\n2 a\n"), &ids).unwrap();
        assert_eq!((named.of(1), named.of(2)), (&[1u32][..], &[0u32, 1][..]));
        assert_eq!(named.names, Some(vec!["b".to_string(), "a".to_string()]));
        let s = read_split(
            &write(d.path(), "s.tsv", "0 train\n3 test\n1 valid\n"),
            &ids,
        )
        .unwrap();
        assert_eq!(s, vec![TRAIN, VALID, NONE, TEST]);
        write_labels(&f, &p, &l, Some(&s)).unwrap();
        drop(f);
        let back = read(&p).unwrap();
        assert_eq!(back.labels.unwrap(), l);
        assert_eq!(back.split.unwrap(), s);
        for (text, says) in [
            ("0 train\n0 test\n", "in the split twice"),
            ("0 dev\n", "use train, valid or test"),
            ("9 train\n", "not in the graph"),
        ] {
            let e = read_split(&write(d.path(), "s.tsv", text), &ids).unwrap_err();
            assert!(e.to_string().contains(says), "{text:?}: {e}");
        }
    }

    #[test]
    fn a_random_split_covers_the_labelled_nodes_in_its_fractions() {
        let pairs: Vec<(u64, u32)> = (0..1000u64)
            .filter(|v| v % 10 != 0)
            .map(|v| (v, 0))
            .collect();
        let l = Labels::from_pairs(1000, pairs);
        let s = random_split(&l, 0.2, 0.1, 7);
        let count = |c: u8| s.iter().filter(|&&x| x == c).count();
        assert_eq!((count(TRAIN), count(VALID), count(TEST)), (180, 90, 630));
        assert!((0..1000).step_by(10).all(|v| s[v] == NONE));
        assert_eq!(s, random_split(&l, 0.2, 0.1, 7));
    }
}

#[cfg(test)]
mod slab_tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn every_rank_gets_exactly_its_rows_from_the_slabs() {
        let dir = tempfile::tempdir().unwrap();
        let (n, cols) = (23usize, 3usize);
        for (file_dtype, dtype) in [
            (FeatureDtype::F32, Dtype::F32),
            (FeatureDtype::F16, Dtype::F16),
        ] {
            let path = dir.path().join(format!("{dtype:?}.h5"));
            let f = hdf5::File::create(&path).unwrap();
            f.new_attr::<u64>()
                .create("num_nodes")
                .unwrap()
                .write_scalar(&(n as u64))
                .unwrap();
            let value = |i: usize, c: usize| (i * 10 + c) as f32;
            write_dense_features(&f, &path, cols, file_dtype, |i, row| {
                for (c, x) in row.iter_mut().enumerate() {
                    *x = value(i, c);
                }
            })
            .unwrap();
            drop(f);
            for scheme in [Scheme::Striped, Scheme::Block] {
                for ranks in 1..=4 {
                    // Slabs of 2 rows: several rounds, a last one only some ranks read.
                    let got = crate::comm::local::run(ranks, Duration::from_secs(30), |c| {
                        let part = Partitioner::new(scheme, n as u64, c.size());
                        let mut rows = vec![None; part.num_local(c.rank())];
                        read_owned_rows_by(
                            &c,
                            (&path, "features"),
                            &part,
                            (cols, dtype),
                            2,
                            |r, row| {
                                assert!(rows[r].is_none(), "row {r} handed twice");
                                rows[r] = Some(row.to_vec());
                            },
                        )
                        .unwrap();
                        (part, rows)
                    });
                    for (rank, (part, rows)) in got.iter().enumerate() {
                        for (r, row) in rows.iter().enumerate() {
                            let i = part.global(rank, r) as usize;
                            let want: Vec<f32> = (0..cols).map(|c| value(i, c)).collect();
                            assert_eq!(
                                row.as_deref(),
                                Some(&want[..]),
                                "{scheme:?}, {ranks} ranks, rank {rank}, row {r}"
                            );
                        }
                    }
                }
            }
        }
    }
}
