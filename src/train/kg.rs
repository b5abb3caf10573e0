//! A knowledge graph's training triples between ranks: the weight of each triple's loss
//! (`--triple-weights`, counted over every rank's share) and the ring that passes the shares
//! along at each epoch boundary.

use rustc_hash::FxHashMap;

use crate::comm::{Comm, ReduceOp};
use crate::config::TripleWeights;
use crate::graph::triples::{Triple, Weighted};

/// Triples per round of the weights' exchanges (12-byte keys, two per triple, each way), so that
/// the buffers stay bounded whatever the size of a rank's share.
const ROUND: usize = 1 << 22;

/// Collective: this rank's `triples` with the weights of their losses.
///
/// `subsampling` is the RotatE code's subsampling weight: with c(h, r) the number of training
/// triples (on every rank) with head h and relation r, and c(r, t) those with relation r and tail
/// t, each counted from 4 as that code does, a triple weighs 1/sqrt(c(h, r) + c(r, t)), scaled
/// so that the weights average 1 over the whole file (the learning rate keeps its meaning). Each
/// key is counted by the rank its entity hashes to; a rank then asks those ranks for its keys'
/// counts, in rounds of `ROUND` triples.
pub fn weigh(comm: &Comm, triples: &[Triple], how: TripleWeights) -> Vec<Weighted> {
    weigh_in_rounds(comm, triples, how, ROUND)
}

fn weigh_in_rounds(
    comm: &Comm,
    triples: &[Triple],
    how: TripleWeights,
    round: usize,
) -> Vec<Weighted> {
    if how == TripleWeights::Uniform {
        return triples.iter().map(Weighted::plain).collect();
    }
    let p = comm.size();
    // (head, relation) and (tail, relation), the side in the entity's top bit (ids stay far
    // below 2^63).
    let keys = |&(h, r, t): &Triple| [(h, r), (t | 1 << 63, r)];
    // Fibonacci hashing spreads consecutive ids over the ranks.
    let owner = |e: u64| ((e.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) % p as u64) as usize;
    let encode = |part: &[Triple]| {
        let mut send = vec![Vec::with_capacity(part.len() * 24 / p); p];
        for tr in part {
            for (e, r) in keys(tr) {
                let b: &mut Vec<u8> = &mut send[owner(e)];
                b.extend_from_slice(&e.to_le_bytes());
                b.extend_from_slice(&r.to_le_bytes());
            }
        }
        send
    };
    let decode = |k: &[u8]| {
        (
            u64::from_le_bytes(k[..8].try_into().expect("8 bytes")),
            u32::from_le_bytes(k[8..12].try_into().expect("4 bytes")),
        )
    };
    let rounds = comm.max_u64(triples.len().div_ceil(round) as u64) as usize;
    let part =
        |i: usize| &triples[(i * round).min(triples.len())..((i + 1) * round).min(triples.len())];
    let mut counts: FxHashMap<(u64, u32), u32> = FxHashMap::default();
    for i in 0..rounds {
        for msg in comm.all_to_all_v(encode(part(i))) {
            for k in msg.chunks_exact(12) {
                *counts.entry(decode(k)).or_insert(3) += 1;
            }
        }
    }
    let mut out = Vec::with_capacity(triples.len());
    for i in 0..rounds {
        let asked = comm.all_to_all_v(encode(part(i)));
        let replies = asked
            .iter()
            .map(|msg| {
                msg.chunks_exact(12)
                    .flat_map(|k| counts[&decode(k)].to_le_bytes())
                    .collect()
            })
            .collect();
        let got = comm.all_to_all_v(replies);
        // The replies come in the order the keys went.
        let mut at = vec![0usize; p];
        for tr in part(i) {
            let c: u32 = keys(tr)
                .iter()
                .map(|&(e, _)| {
                    let (o, a) = (owner(e), &mut at[owner(e)]);
                    *a += 4;
                    u32::from_le_bytes(got[o][*a - 4..*a].try_into().expect("4 bytes"))
                })
                .sum();
            out.push(Weighted {
                w: 1.0 / (c as f32).sqrt(),
                ..Weighted::plain(tr)
            });
        }
    }
    let s = comm.all_reduce_f64(
        &[out.iter().map(|x| f64::from(x.w)).sum(), out.len() as f64],
        ReduceOp::Sum,
    );
    if s[1] > 0.0 {
        let mean = s[0] / s[1];
        out.iter_mut()
            .for_each(|x| x.w = (f64::from(x.w) / mean) as f32);
    }
    out
}

/// Collective: each rank's triples go `shift` ranks back along the ring (rank r receives those
/// of rank (r + shift) mod p). A triple travels as 24 little-endian bytes (head, relation,
/// tail, weight).
pub fn pass_along(comm: &Comm, triples: Vec<Weighted>, shift: u64) -> Vec<Weighted> {
    let p = comm.size() as u64;
    let shift = (shift % p) as usize;
    if shift == 0 {
        return triples;
    }
    let to = (comm.rank() + comm.size() - shift) % comm.size();
    let mut send = vec![Vec::new(); comm.size()];
    let b = &mut send[to];
    b.reserve(triples.len() * 24);
    for x in &triples {
        b.extend_from_slice(&x.h.to_le_bytes());
        b.extend_from_slice(&x.r.to_le_bytes());
        b.extend_from_slice(&x.t.to_le_bytes());
        b.extend_from_slice(&x.w.to_le_bytes());
    }
    drop(triples);
    let recv = comm.all_to_all_v(send);
    let from = (comm.rank() + shift) % comm.size();
    recv[from]
        .chunks_exact(24)
        .map(|c| {
            let u = |i: usize| u64::from_le_bytes(c[i..i + 8].try_into().expect("8 bytes"));
            let v = |i: usize| c[i..i + 4].try_into().expect("4 bytes");
            Weighted {
                h: u(0),
                r: u32::from_le_bytes(v(8)),
                t: u(12),
                w: f32::from_le_bytes(v(20)),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn passing_triples_along_the_ring_gives_each_rank_the_share_shift_ranks_ahead() {
        // Rank r holds r + 1 triples naming it (a relation id above u16, a head above u32, a
        // weight that is not 1), so that every field and the share sizes are checked.
        let share = |r: u64| -> Vec<Weighted> {
            (0..=r)
                .map(|i| Weighted {
                    h: r << 40 | i,
                    r: 70_000 + r as u32,
                    t: r,
                    w: 0.5 + r as f32 + i as f32 / 8.0,
                })
                .collect()
        };
        for p in [1usize, 2, 3] {
            for shift in 0..2 * p as u64 + 1 {
                let got = crate::comm::local::run(p, Duration::from_secs(30), |c| {
                    pass_along(&c, share(c.rank() as u64), shift)
                });
                for (r, held) in got.iter().enumerate() {
                    let from = (r as u64 + shift) % p as u64;
                    assert_eq!(held, &share(from), "{p} ranks, shift {shift}: rank {r}");
                }
            }
        }
    }

    /// The RotatE code's weights over all of `triples`, in f64, before the scaling to mean 1.
    fn direct(triples: &[Triple]) -> Vec<f64> {
        let (mut hr, mut rt) = (FxHashMap::default(), FxHashMap::default());
        for &(h, r, t) in triples {
            *hr.entry((h, r)).or_insert(3u32) += 1;
            *rt.entry((r, t)).or_insert(3u32) += 1;
        }
        triples
            .iter()
            .map(|&(h, r, t)| 1.0 / f64::from(hr[&(h, r)] + rt[&(r, t)]).sqrt())
            .collect()
    }

    #[test]
    fn subsampling_weights_count_every_ranks_triples_and_average_one() {
        // Heads and tails that recur with the same relation (and entities that are the head of
        // a relation and also its tail, which count apart), split unevenly over the ranks.
        let mut all: Vec<Triple> = Vec::new();
        for i in 0..40u64 {
            all.push((i % 3, (i % 2) as u32, 100 + i % 7));
            all.push((100 + i % 5, 2, i % 3));
        }
        // Entity 0 is also the head of relation 2, of which it is a tail above.
        for i in 0..4u64 {
            all.push((i % 3, 2, 200 + i));
        }
        all.push((7, 0, 8));
        let want = direct(&all);
        let mean = want.iter().sum::<f64>() / want.len() as f64;
        for p in [1usize, 2, 3] {
            let bounds: Vec<usize> = (0..=p).map(|r| all.len() * r * r / (p * p)).collect();
            let got = crate::comm::local::run(p, Duration::from_secs(30), |c| {
                let r = c.rank();
                // Rounds of 5 triples: ranks with shares of different sizes take part in
                // rounds where they have nothing to send.
                weigh_in_rounds(
                    &c,
                    &all[bounds[r]..bounds[r + 1]],
                    TripleWeights::Subsampling,
                    5,
                )
            });
            let got: Vec<Weighted> = got.into_iter().flatten().collect();
            assert_eq!(got.len(), all.len());
            for (i, (x, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(x.triple(), all[i], "{p} ranks: triple {i}");
                assert!(
                    (f64::from(x.w) - w / mean).abs() < 1e-5,
                    "{p} ranks: triple {i} weighs {} against {}",
                    x.w,
                    w / mean
                );
            }
        }
        // Uniform weights are all 1, and no exchange is needed.
        let got = crate::comm::local::run(2, Duration::from_secs(30), |c| {
            weigh(&c, &all[..3], TripleWeights::Uniform)
        });
        assert!(got.iter().flatten().all(|x| x.w == 1.0));
    }
}
