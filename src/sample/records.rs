//! A walk's items on the wire and in checkpoints. Between ranks a walk buffer holds walkers
//! (a fixed record: they hand their tokens to their home before they leave) and runs of tokens
//! for the homes, each led by a tag byte; node ids take 4 bytes when the graph has fewer than
//! 2^32 nodes. A checkpoint holds each walk in flight as a `Record`: the walker with its
//! sentence from its context on, every id in 8 bytes.

use super::walk::{Walker, CARRY, NONE};

/// The tags of the items in a walk buffer for another rank.
pub(super) const WALKER: u8 = 0;
pub(super) const RUN: u8 = 1;

impl Walker {
    /// Bytes of a walker on the wire, its tag included, with node ids of width `ids`.
    pub(super) fn wire_len(ids: Ids) -> usize {
        1 + 8 + 2 * ids.width() + 4 + 1 + 12
    }

    /// The walker on the wire, without tokens (it hands them to its home before it leaves).
    pub(super) fn encode_wire(&self, out: &mut Vec<u8>, ids: Ids) {
        debug_assert!(self.hist.is_empty(), "a walker leaves without its tokens");
        // The record's size first, then its fields in place: one reservation, no per-byte
        // growth checks.
        let at = out.len();
        out.resize(at + Walker::wire_len(ids), 0);
        let rec = &mut out[at..];
        rec[0] = WALKER;
        rec[1..9].copy_from_slice(&self.id.to_le_bytes());
        let o = 9 + ids.put(&mut rec[9..], self.prev);
        let o = o + ids.put(&mut rec[o..], self.cur);
        rec[o..o + 4].copy_from_slice(&self.step.to_le_bytes());
        rec[o + 4] = u8::from(self.visited);
        rec[o + 5..o + 9].copy_from_slice(&self.home.to_le_bytes());
        rec[o + 9..o + 13].copy_from_slice(&self.slot.to_le_bytes());
        rec[o + 13..o + 17].copy_from_slice(&self.kept.to_le_bytes());
    }

    /// Decode [`Walker::encode_wire`]'s record (after its tag) with `hist`'s allocation.
    pub(super) fn decode_wire(b: &[u8], ids: Ids, mut hist: Vec<(u64, u32)>) -> Walker {
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let iw = ids.width();
        let o = 8 + 2 * iw;
        hist.clear();
        Walker {
            id: u64::from_le_bytes(b[..8].try_into().expect("8 bytes")),
            prev: ids.get(&b[8..]),
            cur: ids.get(&b[8 + iw..]),
            step: u32_at(o),
            visited: b[o + 4] != 0,
            home: u32_at(o + 5),
            slot: u32_at(o + 9),
            kept: u32_at(o + 13),
            hist,
        }
    }
}

/// A run of a walk's tokens for its home on the wire: tag, the sentence's slot, the first
/// token's place, the count, whether the walk ended with it, then each token's node and window.
pub(super) fn encode_run(
    out: &mut Vec<u8>,
    slot: u32,
    pos: u32,
    toks: &[(u64, u32)],
    end: bool,
    ids: Ids,
) {
    let iw = ids.width();
    let at = out.len();
    out.resize(at + RUN_HEAD + toks.len() * (iw + 1), 0);
    let rec = &mut out[at..];
    rec[0] = RUN;
    rec[1..5].copy_from_slice(&slot.to_le_bytes());
    rec[5..9].copy_from_slice(&pos.to_le_bytes());
    rec[9..13].copy_from_slice(&(toks.len() as u32).to_le_bytes());
    rec[13] = u8::from(end);
    for (t, &(n, w)) in rec[RUN_HEAD..].chunks_exact_mut(iw + 1).zip(toks) {
        ids.put(t, n);
        t[iw] = w as u8;
    }
}

/// Bytes of a run's header (its tag included).
pub(super) const RUN_HEAD: usize = 14;

/// A walk buffer's item at `b` (its tag first): a walker, or a run as (slot, place, end, the
/// tokens' bytes); and the bytes it takes.
pub(super) enum Item<'b> {
    Walker(&'b [u8]),
    Run(u32, u32, bool, &'b [u8]),
}

pub(super) fn item(b: &[u8], ids: Ids) -> (Item<'_>, usize) {
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
    match b[0] {
        WALKER => {
            let len = Walker::wire_len(ids);
            (Item::Walker(&b[1..len]), len)
        }
        _ => {
            let len = RUN_HEAD + u32_at(9) as usize * (ids.width() + 1);
            let run = Item::Run(u32_at(1), u32_at(5), b[13] != 0, &b[RUN_HEAD..len]);
            (run, len)
        }
    }
}

/// A walker in a checkpoint: its place in the walk and the tokens of its sentence from its
/// context on (`trained` of them emitted before), every id in 8 bytes. Restored walkers open
/// their sentence on the rank they stand on.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Record {
    pub(super) id: u64,
    pub(super) prev: u64,
    pub(super) cur: u64,
    pub(super) step: u32,
    pub(super) visited: bool,
    pub(super) hist: Vec<(u64, u32)>,
    pub(super) trained: u32,
}

impl Record {
    pub(super) fn encode(&self, out: &mut Vec<u8>) {
        let at = out.len();
        out.resize(at + Record::len(self.hist.len()), 0);
        let rec = &mut out[at..];
        rec[..8].copy_from_slice(&self.id.to_le_bytes());
        rec[8..16].copy_from_slice(&self.prev.to_le_bytes());
        rec[16..24].copy_from_slice(&self.cur.to_le_bytes());
        rec[24..28].copy_from_slice(&self.step.to_le_bytes());
        rec[28] = u8::from(self.visited);
        rec[29] = self.hist.len() as u8;
        rec[30] = self.trained as u8;
        for (t, &(n, w)) in rec[31..].chunks_exact_mut(9).zip(&self.hist) {
            t[..8].copy_from_slice(&n.to_le_bytes());
            t[8] = w as u8;
        }
    }

    /// Bytes of a record of `tokens` tokens.
    fn len(tokens: usize) -> usize {
        31 + 9 * tokens
    }

    /// Decode bytes from a file: None unless they are a well-formed record within the limits.
    pub(super) fn try_decode(b: &[u8], num_nodes: u64, window: u32) -> Option<(Record, usize)> {
        let n = *b.get(29)? as usize;
        let trained = *b.get(30)? as usize;
        let len = Record::len(n);
        if b.len() < len || trained > n.min(window as usize) || n - trained > CARRY || b[28] > 1 {
            return None;
        }
        let (w, used) = Record::decode(&b[..len]);
        let ok = w.cur < num_nodes
            && (w.prev < num_nodes || w.prev == NONE)
            && w.hist.iter().all(|&(v, r)| v < num_nodes && r <= window);
        ok.then_some((w, used))
    }

    /// Decode a record of [`Record::encode`]; returns it and the bytes used.
    pub(super) fn decode(b: &[u8]) -> (Record, usize) {
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        let n = b[29] as usize;
        let end = Record::len(n);
        let hist = b[31..end]
            .chunks_exact(9)
            .map(|t| (u64_at_slice(t), u32::from(t[8])))
            .collect();
        let r = Record {
            id: u64_at(0),
            prev: u64_at(8),
            cur: u64_at(16),
            step: u32::from_le_bytes(b[24..28].try_into().expect("4 bytes")),
            visited: b[28] != 0,
            hist,
            trained: u32::from(b[30]),
        };
        (r, end)
    }
}

pub(super) fn u64_at_slice(t: &[u8]) -> u64 {
    u64::from_le_bytes(t[..8].try_into().expect("8 bytes"))
}

/// The width of node ids on the wire.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Ids {
    /// 8 bytes (graphs of 2^32 nodes or more).
    Wide,
    /// 4 bytes, u32::MAX for "none".
    Narrow,
}

impl Ids {
    pub(super) fn width(self) -> usize {
        match self {
            Ids::Wide => 8,
            Ids::Narrow => 4,
        }
    }

    /// Narrow ids when every node id and "none" fit in a u32.
    pub(super) fn for_nodes(num_nodes: u64) -> Ids {
        if num_nodes < u64::from(u32::MAX) {
            Ids::Narrow
        } else {
            Ids::Wide
        }
    }

    /// Write `v` at the start of `out`; returns the bytes written.
    pub(super) fn put(self, out: &mut [u8], v: u64) -> usize {
        match self {
            Ids::Wide => out[..8].copy_from_slice(&v.to_le_bytes()),
            // NONE (no previous node) keeps its meaning as u32::MAX.
            Ids::Narrow => out[..4].copy_from_slice(&(v as u32).to_le_bytes()),
        }
        self.width()
    }

    /// The id at the start of `b`.
    pub(super) fn get(self, b: &[u8]) -> u64 {
        match self {
            Ids::Wide => u64_at_slice(b),
            Ids::Narrow => match u32::from_le_bytes(b[..4].try_into().expect("4 bytes")) {
                u32::MAX => NONE,
                v => u64::from(v),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::walk::WalkEngine;

    #[test]
    fn walkers_and_runs_survive_the_wire() {
        let w = Walker {
            id: 7,
            prev: NONE,
            cur: 42,
            step: 3,
            visited: true,
            home: 5,
            slot: 70_000,
            kept: 300,
            hist: Vec::new(),
        };
        let toks = [(1u64, 10u32), (99, 3), (5, 1)];
        for ids in [Ids::Narrow, Ids::Wide] {
            let mut b = Vec::new();
            w.encode_wire(&mut b, ids);
            encode_run(&mut b, 9, 297, &toks, true, ids);
            let moved = Walker {
                prev: 41,
                ..w.clone()
            };
            moved.encode_wire(&mut b, ids);
            // Narrow ids: half the bytes per id, and "no previous node" survives.
            let iw = ids.width();
            assert_eq!(b.len(), 2 * (26 + 2 * iw) + RUN_HEAD + 3 * (iw + 1));
            let mut o = 0;
            let mut got = Vec::new();
            while o < b.len() {
                let (it, used) = item(&b[o..], ids);
                o += used;
                got.push(match it {
                    Item::Walker(r) => format!("{:?}", Walker::decode_wire(r, ids, vec![(3, 3)])),
                    Item::Run(slot, pos, end, t) => {
                        let t: Vec<_> = t
                            .chunks_exact(iw + 1)
                            .map(|t| (ids.get(t), u32::from(t[iw])))
                            .collect();
                        format!("{slot} {pos} {end} {t:?}")
                    }
                });
            }
            assert_eq!(
                got,
                [
                    format!("{w:?}"),
                    format!("9 297 true {toks:?}"),
                    format!("{moved:?}")
                ]
            );
            assert_eq!(
                WalkEngine::count_encoded(&b, if iw == 4 { 50 } else { 1 << 33 }),
                2
            );
        }
        assert_eq!(Ids::for_nodes(1 << 31), Ids::Narrow);
        assert_eq!(Ids::for_nodes(1 << 32), Ids::Wide);
    }

    #[test]
    fn checkpoint_records_survive_a_file() {
        let r = Record {
            id: 7,
            prev: NONE,
            cur: 42,
            step: 3,
            visited: true,
            hist: vec![(1, 10), (99, 3), (5, 1)],
            trained: 2,
        };
        let mut b = Vec::new();
        r.encode(&mut b);
        r.encode(&mut b);
        assert_eq!(b.len(), 2 * (31 + 9 * 3));
        let (a, used) = Record::try_decode(&b, 100, 10).expect("well-formed");
        assert_eq!(a, r);
        assert_eq!(Record::decode(&b[used..]).0, r);
        // A token's window past --window, or a node past the graph, is refused.
        assert!(Record::try_decode(&b, 100, 5).is_none());
        assert!(Record::try_decode(&b, 99, 10).is_none());
    }
}
