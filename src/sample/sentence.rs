//! A walk's sentence, assembled on its home rank. A walker no longer carries its tokens from rank
//! to rank: where it visits, it keeps the tokens of its stay and hands them to its home (the rank
//! it started on) as one run when it leaves; the home appends the runs in walk order and emits the
//! sentence in segments of `CARRY` new tokens, each led by the `window` tokens before it, as the
//! walker did when it carried them. A crossing then moves the walker's fixed record and the
//! tokens of one stay, not every token of the walk so far (BlogCatalog 10 x 80 at 4 simulated
//! nodes: about 40 tokens of 5 bytes on each of 60 crossings per walk).
//!
//! Runs reach the home in walk order: a walker's run leaves in the same exchange as the walker,
//! the next stay's run in a later one, and an exchange is taken whole and in order (a run
//! deposited on the home itself follows the runs delivered before its walker arrived). Each run
//! names its first token's place in the sentence, and a run out of place is a bug, not input.

use super::walk::{Segments, CARRY};

/// A traced segment: (walk id, its tokens, its leading context).
pub(super) type Traced = (u64, Vec<(u64, u32)>, usize);

/// One walk's sentence on its home.
#[derive(Debug, Default)]
pub(super) struct Sentence {
    pub id: u64,
    /// The sentence from its context on: the first `trained` tokens were emitted before (the
    /// last `window` of them, the context of what follows), the rest wait.
    pub toks: Vec<(u64, u32)>,
    pub trained: u32,
    /// The place in the walk's kept tokens (counted from where this home opened the sentence)
    /// of the next token to come.
    pub next: u32,
}

/// The sentences a home assembles, in slots the walkers name.
#[derive(Debug, Default)]
pub(super) struct Sentences {
    slots: Vec<Option<Sentence>>,
    free: Vec<u32>,
    live: usize,
    window: usize,
    /// Token buffers of finished sentences, for new ones.
    spare: Vec<Vec<(u64, u32)>>,
    /// Test hook: every emitted segment as (walk id, its tokens, its leading context).
    pub trace: Option<Vec<Traced>>,
}

impl Sentences {
    pub fn new(window: u32) -> Sentences {
        Sentences {
            window: window as usize,
            ..Sentences::default()
        }
    }

    /// Sentences open here (walks started or resumed here that have not ended, or whose last
    /// run has not arrived).
    pub fn live(&self) -> usize {
        self.live
    }

    /// Open the sentence of walk `id` with `toks`, of which the first `trained` were emitted
    /// (a resumed walk's context and waiting tokens; empty for a new walk). Returns its slot.
    pub fn open(&mut self, id: u64, toks: &[(u64, u32)], trained: u32) -> u32 {
        let mut t = self.spare.pop().unwrap_or_default();
        t.clear();
        t.extend_from_slice(toks);
        let s = Sentence {
            id,
            next: t.len() as u32,
            toks: t,
            trained,
        };
        self.live += 1;
        match self.free.pop() {
            Some(slot) => {
                self.slots[slot as usize] = Some(s);
                slot
            }
            None => {
                self.slots.push(Some(s));
                (self.slots.len() - 1) as u32
            }
        }
    }

    /// The sentence in `slot`.
    pub fn get(&self, slot: u32) -> Option<&Sentence> {
        self.slots.get(slot as usize)?.as_ref()
    }

    /// Append a run of tokens whose first is at `pos` in the walk of `slot`; `end` when the walk
    /// ended after them. Segments of `CARRY` new tokens, and the rest at the end, go to `out`.
    pub fn add(
        &mut self,
        slot: u32,
        pos: u32,
        run: impl Iterator<Item = (u64, u32)>,
        end: bool,
        out: &mut Segments,
    ) {
        let window = self.window;
        let s = self.slots[slot as usize]
            .as_mut()
            .unwrap_or_else(|| panic!("a run for the empty sentence slot {slot}"));
        assert_eq!(pos, s.next, "walk {}: a run out of place", s.id);
        let before = s.toks.len();
        s.toks.extend(run);
        s.next += (s.toks.len() - before) as u32;
        while s.toks.len() - s.trained as usize >= CARRY {
            emit(s, s.trained as usize + CARRY, window, out, &mut self.trace);
        }
        if end {
            let mut s = self.slots[slot as usize].take().expect("checked above");
            if s.toks.len() > s.trained as usize {
                let n = s.toks.len();
                emit(&mut s, n, window, out, &mut self.trace);
            }
            self.spare.push(s.toks);
            self.free.push(slot);
            self.live -= 1;
        }
    }
}

/// Emit `s.toks[..upto]` as a segment led by its `trained` context; keep the last `window` of
/// them as the context of what follows.
fn emit(
    s: &mut Sentence,
    upto: usize,
    window: usize,
    out: &mut Segments,
    trace: &mut Option<Vec<Traced>>,
) {
    out.segs.push((out.tokens.len() as u32, s.trained));
    out.tokens.extend_from_slice(&s.toks[..upto]);
    if let Some(t) = trace {
        t.push((s.id, s.toks[..upto].to_vec(), s.trained as usize));
    }
    let drop = upto.saturating_sub(window);
    s.toks.drain(..drop);
    s.trained = (upto - drop) as u32;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs of any sizes, ending anywhere, emit the whole sentence once in segments of at most
    /// `CARRY` new tokens, each led by the `window` tokens before it.
    #[test]
    fn runs_emit_the_sentence_in_carry_segments() {
        for (len, cut) in [
            (5usize, 2usize),
            (CARRY, 7),
            (CARRY + 1, 1),
            (3 * CARRY + 17, 50),
        ] {
            let walk: Vec<(u64, u32)> = (0..len as u64).map(|v| (v, 1 + v as u32 % 3)).collect();
            let mut ss = Sentences::new(3);
            ss.trace = Some(Vec::new());
            let slot = ss.open(9, &[], 0);
            let mut out = Segments::default();
            let mut pos = 0;
            for run in walk.chunks(cut) {
                let end = pos + run.len() == len;
                ss.add(slot, pos as u32, run.iter().copied(), end, &mut out);
                pos += run.len();
            }
            assert_eq!(ss.live(), 0);
            let mut sentence = Vec::new();
            for (id, toks, h) in ss.trace.take().expect("on") {
                assert_eq!(id, 9);
                assert_eq!(h, sentence.len().min(3));
                assert_eq!(&toks[..h], &sentence[sentence.len() - h..]);
                assert!(toks.len() - h <= CARRY && toks.len() > h);
                sentence.extend_from_slice(&toks[h..]);
            }
            assert_eq!(sentence, walk, "length {len}, runs of {cut}");
            assert_eq!(out.segs.len(), len.div_ceil(CARRY));
        }
    }

    #[test]
    #[should_panic(expected = "out of place")]
    fn a_run_out_of_place_is_a_bug() {
        let mut ss = Sentences::new(3);
        let slot = ss.open(1, &[], 0);
        let mut out = Segments::default();
        ss.add(slot, 0, [(1, 1), (2, 1)].into_iter(), false, &mut out);
        ss.add(slot, 3, [(3, 1)].into_iter(), true, &mut out);
    }

    /// A resumed sentence continues after its context and waiting tokens; slots are reused.
    #[test]
    fn a_resumed_sentence_continues() {
        let mut ss = Sentences::new(2);
        let a = ss.open(1, &[], 0);
        let mut out = Segments::default();
        ss.add(a, 0, std::iter::empty(), true, &mut out);
        assert!(out.segs.is_empty());
        let b = ss.open(2, &[(7, 1), (8, 1), (9, 2)], 2);
        assert_eq!(b, a);
        assert_eq!(ss.get(b).map(|s| s.next), Some(3));
        ss.add(b, 3, [(10, 1)].into_iter(), true, &mut out);
        assert_eq!(out.segment(0), (&[(7, 1), (8, 1), (9, 2), (10, 1)][..], 2));
    }
}
