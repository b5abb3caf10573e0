//! Text edge lists -> the HDF5 schema, streaming: the file is read line by line and written in
//! chunks, so memory holds one chunk plus (with `--string-ids`) the token -> id map.
//!
//! Accepted lines: `u v` or `u v w`, separated by spaces, tabs or commas; `#` and `%` start
//! comment lines; blank lines are skipped.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::Path;

use super::h5::EdgeWriter;
use super::{Edge, NodeId};
use crate::error::{Error, Result};

/// Maps tokens to dense ids in order of first appearance (`--string-ids`), or parses numbers.
pub enum Ids {
    Numeric,
    Strings {
        map: HashMap<String, NodeId>,
        names: Vec<String>,
    },
}

impl Ids {
    pub fn strings() -> Ids {
        Ids::Strings {
            map: HashMap::new(),
            names: Vec::new(),
        }
    }

    fn id(&mut self, tok: &str) -> std::result::Result<NodeId, String> {
        match self {
            Ids::Numeric => tok.parse::<u64>().map_err(|_| {
                format!("'{tok}' is not a non-negative integer node id; use --string-ids for symbolic ids")
            }),
            Ids::Strings { map, names } => {
                if let Some(&i) = map.get(tok) {
                    return Ok(i);
                }
                let i = names.len() as u64;
                map.insert(tok.to_string(), i);
                names.push(tok.to_string());
                Ok(i)
            }
        }
    }
}

/// A parsed line: `None` for comments and blank lines.
pub type Parsed = Option<(NodeId, NodeId, Option<f32>)>;

/// Parse one line. The error is the message without the position (the caller adds file:line).
pub fn parse_line(line: &str, ids: &mut Ids) -> std::result::Result<Parsed, String> {
    let t = line.trim();
    if t.is_empty() || t.starts_with('#') || t.starts_with('%') {
        return Ok(None);
    }
    let mut fields = t
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|f| !f.is_empty());
    let (Some(a), Some(b)) = (fields.next(), fields.next()) else {
        return Err("expected 'src dst' or 'src dst weight', found one field".into());
    };
    let w = match fields.next() {
        None => None,
        Some(ws) => {
            let w: f32 = ws
                .parse()
                .map_err(|_| format!("weight '{ws}' is not a number"))?;
            if !w.is_finite() || w < 0.0 {
                return Err(format!("weight {ws} must be finite and non-negative"));
            }
            Some(w)
        }
    };
    if fields.next().is_some() {
        return Err("more than 3 fields (expected 'src dst [weight]')".into());
    }
    let s = ids.id(a)?;
    let d = ids.id(b)?;
    Ok(Some((s, d, w)))
}

/// Summary of a conversion.
#[derive(Debug)]
pub struct Converted {
    pub num_nodes: u64,
    pub num_edges: u64,
    pub weighted: bool,
    /// Rows no edge touches (integer ids never used: a gap in the numbering).
    pub isolated: u64,
}

/// Integer ids leaving more than this share of the rows without an edge are refused (they would
/// be walked from, trained as noise and exported as untrained vectors) unless `--keep-isolated`.
pub const MAX_ISOLATED_SHARE: f64 = 0.1;

/// Integer ids are rows: at most 2^34 (16 billion) of them.
pub const MAX_NUMERIC_ID: u64 = 1 << 34;

/// Convert `input` to an HDF5 edge file at `output`. Integer ids are rows as they are; when
/// more than `MAX_ISOLATED_SHARE` of the rows would have no edge the input is refused (with the
/// count) unless `keep_isolated`: `--string-ids` gives such ids dense rows and keeps them as names.
pub fn convert(
    input: &Path,
    output: &Path,
    directed: bool,
    string_ids: bool,
    keep_isolated: bool,
) -> Result<Converted> {
    let f = std::fs::File::open(input).map_err(|e| Error::io(input, e))?;
    let reader = BufReader::with_capacity(1 << 20, f);
    let mut ids = if string_ids {
        Ids::strings()
    } else {
        Ids::Numeric
    };
    let mut writer: Option<EdgeWriter> = None;
    let mut weighted = false;
    let mut line = String::new();
    let mut reader = reader;
    let mut no = 0u64;
    // Integer ids seen (a bit per id; 125 MB at a billion ids).
    let mut seen: Vec<u64> = Vec::new();
    let mut mark = |v: u64| -> std::result::Result<(), String> {
        if v >= MAX_NUMERIC_ID {
            return Err(format!(
                "node id {v} would make a matrix of {} rows; use --string-ids (dense rows, the ids kept as node_names)",
                v + 1
            ));
        }
        let (w, b) = ((v / 64) as usize, v % 64);
        if w >= seen.len() {
            seen.resize((w + 1).next_power_of_two(), 0);
        }
        seen[w] |= 1 << b;
        Ok(())
    };
    loop {
        line.clear();
        let n = reader
            .read_line(&mut line)
            .map_err(|e| Error::io(input, e))?;
        if n == 0 {
            break;
        }
        no += 1;
        let bad = |msg: String| Error::BadLine {
            path: input.to_path_buf(),
            line: no,
            msg,
        };
        let Some((s, d, w)) = parse_line(&line, &mut ids).map_err(bad)? else {
            continue;
        };
        let wr = match &mut writer {
            Some(wr) => {
                if w.is_some() != weighted {
                    return Err(bad(format!(
                        "{} fields here but {} on the first edge line; every line needs the same columns",
                        if w.is_some() { 3 } else { 2 },
                        if weighted { 3 } else { 2 }
                    )));
                }
                wr
            }
            None => {
                weighted = w.is_some();
                writer.insert(EdgeWriter::create(output, weighted)?)
            }
        };
        if !string_ids {
            mark(s).and_then(|()| mark(d)).map_err(bad)?;
        }
        wr.push(Edge {
            src: s,
            dst: d,
            weight: w.unwrap_or(1.0),
        })?;
    }
    let Some(wr) = writer else {
        return Err(Error::bad_input(
            input,
            "no edges found (empty file or only comments)",
        ));
    };
    let (num_nodes, num_edges) = match &ids {
        Ids::Numeric => wr.finish(None, directed, None)?,
        Ids::Strings { names, .. } => wr.finish(Some(names.len() as u64), directed, Some(names))?,
    };
    let used: u64 = seen.iter().map(|w| u64::from(w.count_ones())).sum();
    let isolated = if string_ids { 0 } else { num_nodes - used };
    if !keep_isolated && isolated as f64 > MAX_ISOLATED_SHARE * num_nodes as f64 {
        return Err(Error::bad_input(
            input,
            format!(
                "the integer ids are sparse: {isolated} of the {num_nodes} rows (ids 0..{}) have no edge and would be trained as untouched noise; convert with --string-ids (dense rows, the ids kept as node_names) or pass --keep-isolated",
                num_nodes - 1
            ),
        ));
    }
    Ok(Converted {
        num_nodes,
        num_edges,
        weighted,
        isolated,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_the_accepted_forms() {
        let mut ids = Ids::Numeric;
        assert_eq!(parse_line("1 2", &mut ids).unwrap(), Some((1, 2, None)));
        assert_eq!(
            parse_line("3\t4\t0.5\n", &mut ids).unwrap(),
            Some((3, 4, Some(0.5)))
        );
        assert_eq!(parse_line("5,6", &mut ids).unwrap(), Some((5, 6, None)));
        assert_eq!(parse_line("# comment", &mut ids).unwrap(), None);
        assert_eq!(parse_line("% comment", &mut ids).unwrap(), None);
        assert_eq!(parse_line("   ", &mut ids).unwrap(), None);
    }

    #[test]
    fn rejects_malformed_lines_with_reasons() {
        let mut ids = Ids::Numeric;
        assert!(parse_line("1", &mut ids).unwrap_err().contains("one field"));
        assert!(parse_line("a b", &mut ids)
            .unwrap_err()
            .contains("--string-ids"));
        assert!(parse_line("-1 2", &mut ids)
            .unwrap_err()
            .contains("non-negative"));
        assert!(parse_line("1 2 x", &mut ids)
            .unwrap_err()
            .contains("not a number"));
        assert!(parse_line("1 2 NaN", &mut ids)
            .unwrap_err()
            .contains("finite"));
        assert!(parse_line("1 2 -3", &mut ids)
            .unwrap_err()
            .contains("non-negative"));
        assert!(parse_line("1 2 3 4", &mut ids)
            .unwrap_err()
            .contains("more than 3"));
    }

    #[test]
    fn string_ids_are_dense_in_first_appearance_order() {
        let mut ids = Ids::strings();
        assert_eq!(parse_line("b a", &mut ids).unwrap(), Some((0, 1, None)));
        assert_eq!(parse_line("a c", &mut ids).unwrap(), Some((1, 2, None)));
        let Ids::Strings { names, .. } = ids else {
            unreachable!()
        };
        assert_eq!(names, ["b", "a", "c"]);
    }

    proptest! {
        #[test]
        fn parser_never_panics(s in "\\PC{0,40}") {
            let _ = parse_line(&s, &mut Ids::Numeric);
            let _ = parse_line(&s, &mut Ids::strings());
        }

        #[test]
        fn numeric_lines_round_trip(a in any::<u64>(), b in any::<u64>(), sep in prop::sample::select(vec![" ", "\t", ",", "  "])) {
            let line = format!("{a}{sep}{b}");
            prop_assert_eq!(parse_line(&line, &mut Ids::Numeric).unwrap(), Some((a, b, None)));
        }
    }
}
