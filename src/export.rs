//! Embeddings for numpy and gensim users: `.npy` (float32, C order) and word2vec text.

use std::io::Write;
use std::path::Path;

use crate::error::{Error, Result};

pub fn npy(path: &Path, rows: usize, dim: usize, data: &[f32]) -> Result<()> {
    let mut header =
        format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {dim}), }}");
    // magic (6) + version (2) + length (2) + header + '\n' must be a multiple of 64.
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let f = std::fs::File::create(path).map_err(|e| Error::io(path, e))?;
    let mut w = std::io::BufWriter::new(f);
    let io = |e| Error::io(path, e);
    w.write_all(b"\x93NUMPY\x01\x00").map_err(io)?;
    w.write_all(&(header.len() as u16).to_le_bytes())
        .map_err(io)?;
    w.write_all(header.as_bytes()).map_err(io)?;
    for x in data {
        w.write_all(&x.to_le_bytes()).map_err(io)?;
    }
    w.flush().map_err(io)
}

/// word2vec text (gensim's `KeyedVectors.load_word2vec_format`): a `rows dim` line, then per row
/// its key and values. The key is the node's name when the embeddings carry `node_names`
/// (whitespace inside a name becomes `_`: the format splits on it), else its row number.
pub fn word2vec(
    path: &Path,
    rows: usize,
    dim: usize,
    data: &[f32],
    names: Option<&[String]>,
) -> Result<()> {
    let f = std::fs::File::create(path).map_err(|e| Error::io(path, e))?;
    let mut w = std::io::BufWriter::new(f);
    let io = |e| Error::io(path, e);
    writeln!(w, "{rows} {dim}").map_err(io)?;
    for (i, row) in data.chunks_exact(dim).enumerate() {
        match names.and_then(|n| n.get(i)) {
            Some(n) if n.contains(char::is_whitespace) => {
                write!(w, "{}", n.replace(char::is_whitespace, "_"))
            }
            Some(n) => write!(w, "{n}"),
            None => write!(w, "{i}"),
        }
        .map_err(io)?;
        for x in row {
            write!(w, " {x}").map_err(io)?;
        }
        writeln!(w).map_err(io)?;
    }
    w.flush().map_err(io)
}
