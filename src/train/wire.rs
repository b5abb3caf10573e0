//! The row cache's exchange on the wire: one message per peer and step, written by [`Writer`]
//! and read by [`Message::parse`], which refuses a truncated or malformed message with an
//! error (never a panic). Layout, little-endian:
//!
//! ```text
//! [pending: u64][tokens: u64]                 the step's counts (summed over the senders)
//! [walker bytes: u32][walkers]                walkers that cross (`sample::walk` records)
//! [deltas: u32][deltas x (head: u32, row)]    deltas of cached rows for the peer's rows
//! [requests: u32][requests x head: u32]       rows this rank asks the peer for
//! [rows x row]                                rows the peer asked for in the exchange before
//! ```
//!
//! A head is a row of the receiver with its matrix in the top bit (deltas carry their copy's
//! updates in the spare bits: `cache::UpdateCode`); a row is `row_bytes` of `--wire-dtype`.
//!
//! The gradient push of the paths without the cache (`Trainer::finish`) is a run of records
//! `[head: u32][row]`, written by [`push_record`] and read by [`push_records`].

use std::fmt;

/// Bytes before the walkers: two counts and the walkers' length.
const HEADER: usize = 8 + 8 + 4;

/// Bytes of a delta's head before its row.
pub const DELTA_HEAD: usize = 4;

/// A message that cannot be read: what was wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireError(pub String);

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for WireError {}

/// Writes one peer's message, part after part in the layout's order.
pub struct Writer {
    buf: Vec<u8>,
    row_bytes: usize,
    /// Deltas announced and not yet written; `None` once the requests are written.
    deltas_left: Option<usize>,
}

impl Writer {
    /// A message that starts with the step's `counts`, the `walkers` that cross and the
    /// number of `deltas` that follow.
    pub fn new(counts: [u64; 2], walkers: &[u8], deltas: usize, row_bytes: usize) -> Writer {
        let mut buf = Vec::with_capacity(HEADER + walkers.len() + 4);
        buf.extend_from_slice(&counts[0].to_le_bytes());
        buf.extend_from_slice(&counts[1].to_le_bytes());
        buf.extend_from_slice(&len32(walkers.len()).to_le_bytes());
        buf.extend_from_slice(walkers);
        buf.extend_from_slice(&len32(deltas).to_le_bytes());
        Writer {
            buf,
            row_bytes,
            deltas_left: Some(deltas),
        }
    }

    /// One delta: its head and its encoded row.
    pub fn delta(&mut self, head: u32, row: &[u8]) {
        let left = self
            .deltas_left
            .as_mut()
            .expect("deltas come before the requests");
        assert!(*left > 0, "more deltas than announced");
        assert_eq!(row.len(), self.row_bytes, "a delta's row has row_bytes");
        *left -= 1;
        self.buf.extend_from_slice(&head.to_le_bytes());
        self.buf.extend_from_slice(row);
    }

    /// The requests (after every announced delta).
    pub fn requests(&mut self, heads: &[u32]) {
        assert_eq!(
            self.deltas_left.take(),
            Some(0),
            "every announced delta is written before the requests, once"
        );
        self.buf
            .extend_from_slice(&len32(heads.len()).to_le_bytes());
        for h in heads {
            self.buf.extend_from_slice(&h.to_le_bytes());
        }
    }

    /// One answered row (after the requests).
    pub fn row(&mut self, row: &[u8]) {
        assert!(self.deltas_left.is_none(), "rows come after the requests");
        assert_eq!(row.len(), self.row_bytes, "a row has row_bytes");
        self.buf.extend_from_slice(row);
    }

    /// The message.
    pub fn finish(self) -> Vec<u8> {
        assert!(self.deltas_left.is_none(), "a message has its requests");
        self.buf
    }
}

fn len32(n: usize) -> u32 {
    u32::try_from(n).expect("a part of an exchange message counts below 2^32")
}

/// One peer's message, read: slices into its bytes.
#[derive(Debug, Clone, Copy)]
pub struct Message<'b> {
    pub counts: [u64; 2],
    pub walkers: &'b [u8],
    /// The delta records, `DELTA_HEAD + row_bytes` each.
    pub deltas: &'b [u8],
    requests: &'b [u8],
    /// The answered rows, `row_bytes` each.
    pub rows: &'b [u8],
    row_bytes: usize,
}

impl<'b> Message<'b> {
    /// Read a message whose rows have `row_bytes` each.
    pub fn parse(b: &'b [u8], row_bytes: usize) -> Result<Message<'b>, WireError> {
        let mut r = Reader { b, at: 0 };
        let counts = [r.u64("the step's counts")?, r.u64("the step's counts")?];
        let wl = r.u32("the walkers' length")? as usize;
        let walkers = r.take(wl, "the walkers")?;
        let nd = r.u32("the number of deltas")? as usize;
        let rec = DELTA_HEAD + row_bytes;
        let deltas = r.take(
            nd.checked_mul(rec)
                .ok_or_else(|| WireError(format!("{nd} deltas overflow the message")))?,
            "the deltas",
        )?;
        let nq = r.u32("the number of requests")? as usize;
        let requests = r.take(4 * nq, "the requests")?;
        let rows = &b[r.at..];
        if row_bytes == 0 || !rows.len().is_multiple_of(row_bytes) {
            return Err(WireError(format!(
                "{} bytes of rows, not a whole number of {row_bytes}-byte rows",
                rows.len()
            )));
        }
        Ok(Message {
            counts,
            walkers,
            deltas,
            requests,
            rows,
            row_bytes,
        })
    }

    /// The deltas as (head, encoded row).
    pub fn deltas(&self) -> impl Iterator<Item = (u32, &'b [u8])> {
        self.deltas
            .chunks_exact(DELTA_HEAD + self.row_bytes)
            .map(|r| (u32_le(&r[..DELTA_HEAD]), &r[DELTA_HEAD..]))
    }

    /// The heads of the rows asked for, in order.
    pub fn requests(&self) -> impl Iterator<Item = u32> + 'b {
        self.requests.chunks_exact(4).map(u32_le)
    }

    /// The answered rows, in the order they were asked for.
    pub fn rows(&self) -> impl Iterator<Item = &'b [u8]> {
        self.rows.chunks_exact(self.row_bytes)
    }

    /// Answered rows in the message.
    pub fn row_count(&self) -> usize {
        self.rows.len() / self.row_bytes
    }
}

/// A head: `row` of the receiver's `matrix` (0 or 1, in the top bit).
pub fn head(row: u32, matrix: usize) -> u32 {
    debug_assert!(row < 1 << 31 && matrix < 2);
    row | (matrix as u32) << 31
}

/// A head's matrix and row.
pub fn split_head(head: u32) -> (usize, u32) {
    ((head >> 31) as usize, head & 0x7fff_ffff)
}

/// Append a gradient record with `head` to `buf`; returns its `row_bytes` to fill.
pub fn push_record(buf: &mut Vec<u8>, head: u32, row_bytes: usize) -> &mut [u8] {
    buf.extend_from_slice(&head.to_le_bytes());
    let at = buf.len();
    buf.resize(at + row_bytes, 0);
    &mut buf[at..]
}

/// The gradient records of one peer's push as (head, encoded row); a message that is not a
/// whole number of records is an error.
pub fn push_records(
    b: &[u8],
    row_bytes: usize,
) -> Result<impl Iterator<Item = (u32, &[u8])>, WireError> {
    let rec = DELTA_HEAD + row_bytes;
    if !b.len().is_multiple_of(rec) {
        return Err(WireError(format!(
            "a gradient push of {} bytes is not a whole number of {rec}-byte records",
            b.len()
        )));
    }
    Ok(b.chunks_exact(rec)
        .map(|r| (u32_le(&r[..DELTA_HEAD]), &r[DELTA_HEAD..])))
}

fn u32_le(b: &[u8]) -> u32 {
    u32::from_le_bytes(b.try_into().expect("4 bytes"))
}

/// A cursor over a message that names what is missing.
struct Reader<'b> {
    b: &'b [u8],
    at: usize,
}

impl<'b> Reader<'b> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'b [u8], WireError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.b.len());
        let Some(end) = end else {
            return Err(WireError(format!(
                "a truncated exchange message: {what} need {n} bytes at byte {}, {} remain",
                self.at,
                self.b.len() - self.at
            )));
        };
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn u32(&mut self, what: &str) -> Result<u32, WireError> {
        self.take(4, what).map(u32_le)
    }

    fn u64(&mut self, what: &str) -> Result<u64, WireError> {
        self.take(8, what)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What one rank sends one peer.
    #[derive(Debug, Clone, PartialEq)]
    struct Parts {
        counts: [u64; 2],
        walkers: Vec<u8>,
        deltas: Vec<(u32, Vec<u8>)>,
        requests: Vec<u32>,
        rows: Vec<Vec<u8>>,
    }

    fn parts(row_bytes: usize) -> impl Strategy<Value = Parts> {
        let row = proptest::collection::vec(any::<u8>(), row_bytes);
        (
            any::<[u64; 2]>(),
            proptest::collection::vec(any::<u8>(), 0..64),
            proptest::collection::vec((any::<u32>(), row.clone()), 0..6),
            proptest::collection::vec(any::<u32>(), 0..6),
            proptest::collection::vec(row, 0..6),
        )
            .prop_map(|(counts, walkers, deltas, requests, rows)| Parts {
                counts,
                walkers,
                deltas,
                requests,
                rows,
            })
    }

    fn write(p: &Parts, row_bytes: usize) -> Vec<u8> {
        let mut w = Writer::new(p.counts, &p.walkers, p.deltas.len(), row_bytes);
        for (h, r) in &p.deltas {
            w.delta(*h, r);
        }
        w.requests(&p.requests);
        for r in &p.rows {
            w.row(r);
        }
        w.finish()
    }

    fn read(b: &[u8], row_bytes: usize) -> Result<Parts, WireError> {
        let m = Message::parse(b, row_bytes)?;
        Ok(Parts {
            counts: m.counts,
            walkers: m.walkers.to_vec(),
            deltas: m.deltas().map(|(h, r)| (h, r.to_vec())).collect(),
            requests: m.requests().collect(),
            rows: m.rows().map(<[u8]>::to_vec).collect(),
        })
    }

    proptest! {
        /// An exchange among 1-8 ranks conserves every record: what each rank wrote for each
        /// peer is what that peer reads, part by part, in order.
        #[test]
        fn an_exchange_conserves_every_record(
            (row_bytes, sent) in (1usize..=12, 1usize..=8).prop_flat_map(|(rb, ranks)| {
                // sent[src][dst]: what rank src writes for rank dst.
                let all = proptest::collection::vec(
                    proptest::collection::vec(parts(rb), ranks),
                    ranks,
                );
                (Just(rb), all)
            }),
        ) {
            let ranks = sent.len();
            let bytes: Vec<Vec<Vec<u8>>> = sent
                .iter()
                .map(|to| to.iter().map(|p| write(p, row_bytes)).collect())
                .collect();
            // The all-to-all: rank dst receives bytes[src][dst] from every src.
            for dst in 0..ranks {
                for src in 0..ranks {
                    let got = read(&bytes[src][dst], row_bytes);
                    prop_assert_eq!(got.as_ref(), Ok(&sent[src][dst]));
                }
            }
        }

        /// Every strict prefix of a message is refused with an error, and so is a message
        /// with a stray byte after its rows; no input panics the reader.
        #[test]
        fn truncated_or_garbled_messages_are_errors(
            p in parts(5),
            noise in proptest::collection::vec(any::<u8>(), 0..80),
        ) {
            let b = write(&p, 5);
            prop_assert_eq!(read(&b, 5), Ok(p.clone()));
            for cut in 0..b.len() {
                // A prefix that ends on a row boundary reads as fewer rows; anything else
                // is an error.
                if let Ok(q) = read(&b[..cut], 5) {
                    prop_assert!(q.rows.len() < p.rows.len());
                    prop_assert_eq!(&q.deltas, &p.deltas);
                }
            }
            let mut extra = b.clone();
            extra.push(0);
            prop_assert!(read(&extra, 5).is_err());
            let _ = read(&noise, 5);
        }
    }

    #[test]
    fn a_truncated_message_names_what_is_missing() {
        let p = Parts {
            counts: [1, 2],
            walkers: vec![7; 3],
            deltas: vec![(9, vec![1, 2])],
            requests: vec![4],
            rows: vec![],
        };
        let b = write(&p, 2);
        let e = Message::parse(&b[..25], 2).expect_err("truncated");
        assert!(e.0.contains("the number of deltas"), "{e}");
        let e = Message::parse(&b[..30], 2).expect_err("truncated");
        assert!(e.0.contains("the deltas"), "{e}");
    }

    #[test]
    #[should_panic(expected = "more deltas than announced")]
    fn the_writer_refuses_more_deltas_than_announced() {
        let mut w = Writer::new([0, 0], &[], 0, 2);
        w.delta(1, &[0, 0]);
    }

    proptest! {
        /// A gradient push conserves its records, and any prefix that is not a whole number
        /// of records is refused.
        #[test]
        fn a_gradient_push_conserves_its_records(
            recs in proptest::collection::vec((0u32..1 << 31, 0usize..2, any::<u8>()), 0..40),
            row_bytes in 1usize..40,
            cut in any::<prop::sample::Index>(),
        ) {
            let mut buf = Vec::new();
            for &(row, m, fill) in &recs {
                push_record(&mut buf, head(row, m), row_bytes).fill(fill);
            }
            let back: Vec<(usize, u32, Vec<u8>)> = push_records(&buf, row_bytes)
                .unwrap()
                .map(|(h, r)| {
                    let (m, row) = split_head(h);
                    (m, row, r.to_vec())
                })
                .collect();
            let want: Vec<(usize, u32, Vec<u8>)> =
                recs.iter().map(|&(row, m, f)| (m, row, vec![f; row_bytes])).collect();
            prop_assert_eq!(back, want);
            if !buf.is_empty() {
                let at = cut.index(buf.len());
                let whole = at % (DELTA_HEAD + row_bytes) == 0;
                prop_assert_eq!(push_records(&buf[..at], row_bytes).is_ok(), whole);
            }
        }
    }
}
