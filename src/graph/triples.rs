//! Knowledge-graph triples. Text `head<TAB>relation<TAB>tail` (string ids) becomes the HDF5 edge
//! schema with relations: directed edges head -> tail in `src`/`dst`, relation ids in `rel`
//! (u32), entity names in `node_names`, relation names in `relation_names`, and the root
//! attribute `num_relations`. `--vocab-from` converts valid/test files with the ids of a
//! converted training file. Streaming: memory is one chunk plus the name maps.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use super::h5::{read_attr_u64, read_names, EdgeFile, EdgeWriter};
use super::NodeId;
use crate::error::{Error, Result};

/// One triple: (head entity, relation, tail entity).
pub type Triple = (NodeId, u32, NodeId);

/// A training triple and the weight of its loss (`--triple-weights`; 1 when uniform): 24 bytes,
/// as a [`Triple`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Weighted {
    pub h: NodeId,
    pub t: NodeId,
    pub r: u32,
    pub w: f32,
}

impl Weighted {
    /// Weight 1.
    pub fn plain(&(h, r, t): &Triple) -> Weighted {
        Weighted { h, t, r, w: 1.0 }
    }

    /// (head, relation, tail).
    pub fn triple(&self) -> Triple {
        (self.h, self.r, self.t)
    }
}

/// Entity and relation names to dense ids: grown in order of first appearance, or fixed (read
/// from a converted file; an unknown name is an error).
pub struct Vocab {
    pub entities: Vec<String>,
    pub relations: Vec<String>,
    emap: HashMap<String, NodeId>,
    rmap: HashMap<String, u32>,
    /// The file the vocabulary was read from (`--vocab-from`): names are then fixed.
    from: Option<PathBuf>,
}

impl Vocab {
    pub fn new() -> Vocab {
        Vocab {
            entities: Vec::new(),
            relations: Vec::new(),
            emap: HashMap::new(),
            rmap: HashMap::new(),
            from: None,
        }
    }

    /// The names of a converted triple file, fixed.
    pub fn read(path: &Path) -> Result<Vocab> {
        let f = TripleFile::open(path)?;
        let missing = |what: &str| {
            Error::bad_input(
                path,
                format!("no dataset '{what}': --vocab-from needs a file written by `graphscale convert --triples`"),
            )
        };
        let entities = f.entity_names()?.ok_or_else(|| missing("node_names"))?;
        let relations = f
            .relation_names()?
            .ok_or_else(|| missing("relation_names"))?;
        let emap = entities
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), i as NodeId))
            .collect();
        let rmap = relations
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), i as u32))
            .collect();
        Ok(Vocab {
            entities,
            relations,
            emap,
            rmap,
            from: Some(path.to_path_buf()),
        })
    }

    fn entity(&mut self, tok: &str) -> std::result::Result<NodeId, String> {
        if let Some(&i) = self.emap.get(tok) {
            return Ok(i);
        }
        if let Some(from) = &self.from {
            return Err(format!(
                "entity '{tok}' is not in the vocabulary of {} (an entity never seen in training has no embedding: drop the triple, or convert the training file with --names-from this file)",
                from.display()
            ));
        }
        let i = self.entities.len() as NodeId;
        self.emap.insert(tok.to_string(), i);
        self.entities.push(tok.to_string());
        Ok(i)
    }

    fn relation(&mut self, tok: &str) -> std::result::Result<u32, String> {
        if let Some(&i) = self.rmap.get(tok) {
            return Ok(i);
        }
        if let Some(from) = &self.from {
            return Err(format!(
                "relation '{tok}' is not in the vocabulary of {} (a relation never seen in training has no parameters: drop the triple, or convert the training file with --names-from this file)",
                from.display()
            ));
        }
        let i = u32::try_from(self.relations.len()).map_err(|_| "more than 2^32 relations")?;
        self.rmap.insert(tok.to_string(), i);
        self.relations.push(tok.to_string());
        Ok(i)
    }
}

impl Default for Vocab {
    fn default() -> Self {
        Vocab::new()
    }
}

/// Parse one line: `None` for blank and `#` comment lines. Fields are tab-separated (names may
/// hold spaces), or whitespace-separated when the line has no tab.
pub fn parse_triple(line: &str, vocab: &mut Vocab) -> std::result::Result<Option<Triple>, String> {
    let t = line.trim_end_matches(['\n', '\r']);
    if t.trim().is_empty() || t.starts_with('#') {
        return Ok(None);
    }
    let fields: Vec<&str> = if t.contains('\t') {
        t.split('\t').map(str::trim).collect()
    } else {
        t.split_whitespace().collect()
    };
    if fields.len() != 3 || fields.iter().any(|f| f.is_empty()) {
        return Err(format!(
            "expected 'head<TAB>relation<TAB>tail', found {} field{}",
            fields.len(),
            if fields.len() == 1 { "" } else { "s" }
        ));
    }
    let h = vocab.entity(fields[0])?;
    let r = vocab.relation(fields[1])?;
    let d = vocab.entity(fields[2])?;
    Ok(Some((h, r, d)))
}

/// Summary of a conversion.
#[derive(Debug)]
pub struct Converted {
    pub entities: u64,
    pub relations: u64,
    pub triples: u64,
}

/// Every triple line of `input`, parsed with `vocab`, to `each`.
fn for_each_triple(
    input: &Path,
    vocab: &mut Vocab,
    mut each: impl FnMut(Triple) -> Result<()>,
) -> Result<()> {
    let f = std::fs::File::open(input).map_err(|e| Error::io(input, e))?;
    let mut reader = BufReader::with_capacity(1 << 20, f);
    let mut line = String::new();
    let mut no = 0u64;
    loop {
        line.clear();
        if reader
            .read_line(&mut line)
            .map_err(|e| Error::io(input, e))?
            == 0
        {
            return Ok(());
        }
        no += 1;
        let parsed = parse_triple(&line, vocab).map_err(|msg| Error::BadLine {
            path: input.to_path_buf(),
            line: no,
            msg,
        })?;
        if let Some(t) = parsed {
            each(t)?;
        }
    }
}

/// Convert the triples of `input` to `output`: with the names of `vocab_from` when given,
/// otherwise with ids in order of first appearance in `input`, then in `names_from` (whose
/// triples are not written).
pub fn convert(
    input: &Path,
    output: &Path,
    vocab_from: Option<&Path>,
    names_from: &[PathBuf],
) -> Result<Converted> {
    let mut vocab = match vocab_from {
        Some(p) => Vocab::read(p)?,
        None => Vocab::new(),
    };
    let mut writer = EdgeWriter::create_triples(output)?;
    for_each_triple(input, &mut vocab, |(h, r, t)| writer.push_triple(h, r, t))?;
    for p in names_from {
        for_each_triple(p, &mut vocab, |_| Ok(()))?;
    }
    if writer.edges() == 0 {
        drop(writer);
        let _ = std::fs::remove_file(output);
        return Err(Error::bad_input(
            input,
            "no triples found (empty file or only comments)",
        ));
    }
    let (entities, triples) = writer.finish_triples(&vocab.entities, &vocab.relations)?;
    Ok(Converted {
        entities,
        relations: vocab.relations.len() as u64,
        triples,
    })
}

/// An opened triple file: an edge file with `rel` and `num_relations`.
pub struct TripleFile {
    pub edges: EdgeFile,
    pub num_relations: u64,
}

impl TripleFile {
    pub fn open(path: &Path) -> Result<TripleFile> {
        let edges = EdgeFile::open(path)?;
        if !edges.has_rel {
            return Err(Error::bad_input(
                path,
                "no dataset 'rel': this is a plain graph, not a knowledge graph; the knowledge-graph models (distmult, complex, transe, rotate) train triples: convert `head<TAB>relation<TAB>tail` text with `graphscale convert --triples`",
            ));
        }
        let num_relations =
            read_attr_u64(edges.file(), path, "num_relations")?.ok_or_else(|| {
                Error::bad_input(
                    path,
                    "missing root attribute 'num_relations' (u64): the number of relations",
                )
            })?;
        if num_relations == 0 || num_relations > u64::from(u32::MAX) {
            return Err(Error::bad_input(
                path,
                format!("attribute num_relations = {num_relations}: must be in 1..2^32"),
            ));
        }
        Ok(TripleFile {
            edges,
            num_relations,
        })
    }

    pub fn len(&self) -> u64 {
        self.edges.num_edges
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn num_entities(&self) -> u64 {
        self.edges.num_nodes
    }

    /// Triples `[start, end)`, checked: ids below `num_nodes` and `num_relations`.
    pub fn read(&self, start: u64, end: u64) -> Result<Vec<Triple>> {
        let edges = self.edges.read_edges(start, end)?;
        let rels = self.edges.read_rel(start, end)?;
        if let Some(i) = rels
            .iter()
            .position(|&r| u64::from(r) >= self.num_relations)
        {
            return Err(Error::bad_input(
                self.edges.path(),
                format!(
                    "dataset 'rel' index {}: relation id {} >= num_relations {}",
                    start + i as u64,
                    rels[i],
                    self.num_relations
                ),
            ));
        }
        Ok(edges
            .iter()
            .zip(rels)
            .map(|(e, r)| (e.src, r, e.dst))
            .collect())
    }

    pub fn entity_names(&self) -> Result<Option<Vec<String>>> {
        read_names(self.edges.file(), self.edges.path(), "node_names")
    }

    pub fn relation_names(&self) -> Result<Option<Vec<String>>> {
        read_names(self.edges.file(), self.edges.path(), "relation_names")
    }
}

/// Every triple of the files in `paths`, checked against `entities` and `relations` (the
/// filter of a ranking evaluation).
pub fn read_all(paths: &[PathBuf], entities: u64, relations: u64) -> Result<Vec<Triple>> {
    let mut out = Vec::new();
    for p in paths {
        let f = TripleFile::open(p)?;
        if f.num_entities() != entities || f.num_relations != relations {
            return Err(Error::bad_input(
                p,
                format!(
                    "{} entities and {} relations, but the embeddings have {entities} and {relations}: convert it with --vocab-from the training file",
                    f.num_entities(),
                    f.num_relations
                ),
            ));
        }
        out.extend(f.read(0, f.len())?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn triples_parse_with_tabs_or_spaces_and_keep_first_appearance_ids() {
        let mut v = Vocab::new();
        assert_eq!(parse_triple("a\tr\tb\n", &mut v).unwrap(), Some((0, 0, 1)));
        assert_eq!(parse_triple("b s a", &mut v).unwrap(), Some((1, 1, 0)));
        assert_eq!(parse_triple("x y\tr\tb", &mut v).unwrap(), Some((2, 0, 1)));
        assert_eq!(parse_triple("# c", &mut v).unwrap(), None);
        assert_eq!(parse_triple("  \n", &mut v).unwrap(), None);
        assert_eq!(v.entities, ["a", "b", "x y"]);
        assert_eq!(v.relations, ["r", "s"]);
    }

    #[test]
    fn malformed_triples_say_what_was_found() {
        let mut v = Vocab::new();
        let e = parse_triple("a\tb", &mut v).unwrap_err();
        assert!(e.contains("found 2 fields"), "{e}");
        let e = parse_triple("a\tb\tc\td", &mut v).unwrap_err();
        assert!(e.contains("found 4 fields"), "{e}");
        let e = parse_triple("a\t\tc", &mut v).unwrap_err();
        assert!(e.contains("head<TAB>relation<TAB>tail"), "{e}");
    }

    #[test]
    fn a_fixed_vocabulary_converts_with_the_same_ids_and_refuses_unknown_names() {
        let dir = tempfile::tempdir().unwrap();
        let (train, test) = (dir.path().join("train.txt"), dir.path().join("test.txt"));
        std::fs::write(&train, "a\tr\tb\nb\ts\tc\n").unwrap();
        std::fs::write(&test, "c\ts\ta\nb\tr\ta\n").unwrap();
        let (th, sh) = (dir.path().join("train.h5"), dir.path().join("test.h5"));
        let c = convert(&train, &th, None, &[]).unwrap();
        assert_eq!((c.entities, c.relations, c.triples), (3, 2, 2));
        convert(&test, &sh, Some(&th), &[]).unwrap();
        let f = TripleFile::open(&sh).unwrap();
        assert_eq!(f.read(0, 2).unwrap(), vec![(2, 1, 0), (1, 0, 0)]);
        assert_eq!((f.num_entities(), f.num_relations), (3, 2));
        assert_eq!(f.relation_names().unwrap().unwrap(), ["r", "s"]);

        std::fs::write(&test, "a\tr\tb\nq\tr\ta\n").unwrap();
        let e = convert(&test, &dir.path().join("bad.h5"), Some(&th), &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("test.txt:2") && e.contains("entity 'q'"), "{e}");
        std::fs::write(&test, "a\tzz\tb\n").unwrap();
        let e = convert(&test, &dir.path().join("bad.h5"), Some(&th), &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("test.txt:1") && e.contains("relation 'zz'"),
            "{e}"
        );
    }
}
