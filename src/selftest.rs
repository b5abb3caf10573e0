//! `graphscale selftest rma`: the one-sided reads of the transport checked byte by byte on the
//! machine and MPI library at hand (a tool above the transport, not part of it).

use crate::comm::{Comm, Window};

/// Poison-and-verify: every rank fills its rows with a pattern of (rank, row), then fetches
/// random rows of every rank into a buffer poisoned with 0xFF and checks every byte, first
/// through a private window, then through a node-shared one (whose span must also show each
/// node rank's rows where it says). Collective. Returns the number of rows this rank verified.
pub fn selftest_rma(comm: &Comm, rows: usize, rounds: usize) -> crate::Result<u64> {
    let mut verified = 0;
    for shared in [false, true] {
        let w = if shared {
            comm.node_window(rows * SELFTEST_DIM * 4)
        } else {
            comm.window(rows * SELFTEST_DIM * 4)
        };
        verified += verify_rows(comm, w, rows, rounds)?;
    }
    Ok(verified)
}

const SELFTEST_DIM: usize = 16;

fn verify_rows(comm: &Comm, mut w: Window, rows: usize, rounds: usize) -> crate::Result<u64> {
    use rand::RngExt;
    const DIM: usize = SELFTEST_DIM;
    let row_bytes = DIM * 4;
    let pattern = |rank: usize, row: usize, j: usize| (rank * 1_000_003 + row * 31 + j) as f32;
    let me = comm.rank();
    w.with_local_mut(|b| {
        for r in 0..rows {
            for j in 0..DIM {
                let o = (r * DIM + j) * 4;
                b[o..o + 4].copy_from_slice(&pattern(me, r, j).to_le_bytes());
            }
        }
    });
    comm.barrier();
    let mut verified = 0u64;
    if let Some(span) = w.node_span() {
        for &(owner, at, len) in &span.parts {
            let last = rows.saturating_sub(1);
            for r in [0, last] {
                let o = (r * DIM + DIM - 1) * 4;
                if rows == 0 || o + 4 > len {
                    continue;
                }
                // SAFETY: `o + 4 <= len` (checked) and the part is mapped while `w` lives;
                // every rank wrote its rows before the barrier above, nobody writes them now.
                let got = unsafe { std::ptr::read_unaligned(at.add(o).cast::<f32>()) };
                if got.to_bits() != pattern(owner, r, DIM - 1).to_bits() {
                    return Err(crate::Error::Mismatch(format!(
                        "rank {me}: row {r} of rank {owner} in the node-shared span reads {got}"
                    )));
                }
                verified += 1;
            }
        }
    }
    let mut rng = crate::sample::rng_for(7, me, 99);
    for _ in 0..rounds {
        let wanted: Vec<Vec<u32>> = (0..comm.size())
            .map(|_| {
                (0..rows.min(257))
                    .map(|_| rng.random_range(0..rows as u32))
                    .collect()
            })
            .collect();
        let requests: Vec<(usize, &[u32])> = wanted
            .iter()
            .enumerate()
            .map(|(o, v)| (o, v.as_slice()))
            .collect();
        let total: usize = wanted.iter().map(Vec::len).sum();
        let mut out = vec![0xFFu8; total * row_bytes];
        w.get_rows(comm.watchdog(), &requests, row_bytes, 64, &mut out);
        let mut i = 0;
        for (owner, rs) in &requests {
            for &r in *rs {
                for j in 0..DIM {
                    let o = (i * DIM + j) * 4;
                    let got = f32::from_le_bytes(out[o..o + 4].try_into().expect("4 bytes"));
                    if got.to_bits() != pattern(*owner, r as usize, j).to_bits() {
                        return Err(crate::Error::Mismatch(format!(
                            "rank {me}: row {r} of rank {owner}, value {j}: fetched {got}, expected {}",
                            pattern(*owner, r as usize, j)
                        )));
                    }
                }
                i += 1;
                verified += 1;
            }
        }
    }
    comm.barrier();
    Ok(verified)
}
