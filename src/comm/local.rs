//! N ranks as threads of one process: the same algorithms, no network. Collectives meet in a
//! shared mailbox between two barriers; windows are per-rank buffers behind read-write locks
//! (readers copy rows under a read lock, the owner applies updates under a write lock).

use std::collections::VecDeque;
use std::sync::{Arc, Barrier, Condvar, Mutex, RwLock};
use std::time::Duration;

use super::{Channel, Comm, Traffic, Watchdog, CHANNELS};

/// `mailbox[dst][src]`: bytes sent from `src` to `dst` in the current exchange.
type Mailbox = Vec<Vec<Option<Vec<u8>>>>;
/// One window: every rank's bytes.
type Shards = Arc<Vec<RwLock<Vec<u8>>>>;

/// `[dst][src]`: the messages `src` posted to `dst`, oldest first.
type Mailboxes = Vec<Vec<VecDeque<Vec<u8>>>>;

struct Shared {
    size: usize,
    /// Ranks per "node" for node-shared windows (ranks r and s share when r / n == s / n).
    per_node: usize,
    barrier: Barrier,
    mailbox: Mutex<Mailbox>,
    new_window: Mutex<Option<Shards>>,
    /// Split-phase exchanges: `posted[ch][dst][src]` holds what `src` posted to `dst` on channel
    /// `ch`, in order.
    posted: Mutex<Vec<Mailboxes>>,
    arrived: Condvar,
}

pub struct LocalComm {
    rank: usize,
    shared: Arc<Shared>,
    pub(super) watchdog: Watchdog,
    pub(super) traffic: Traffic,
}

/// Run `f` on `n` ranks (threads) and return their results in rank order.
/// A panic on any rank is re-raised after all threads have ended or the watchdog fired.
pub fn run<R: Send>(n: usize, timeout: Duration, f: impl Fn(Comm) -> R + Sync) -> Vec<R> {
    run_nodes(n, n, timeout, f)
}

/// [`run`], with the ranks grouped `per_node` at a time into nodes (node-shared windows).
pub fn run_nodes<R: Send>(
    n: usize,
    per_node: usize,
    timeout: Duration,
    f: impl Fn(Comm) -> R + Sync,
) -> Vec<R> {
    assert!(n > 0 && per_node > 0);
    let shared = Arc::new(Shared {
        size: n,
        per_node,
        barrier: Barrier::new(n),
        mailbox: Mutex::new(vec![vec![None; n]; n]),
        new_window: Mutex::new(None),
        posted: Mutex::new(vec![vec![vec![VecDeque::new(); n]; n]; CHANNELS]),
        arrived: Condvar::new(),
    });
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let shared = shared.clone();
                let f = &f;
                std::thread::Builder::new()
                    .name(format!("rank-{rank}"))
                    .stack_size(16 << 20)
                    .spawn_scoped(s, move || {
                        let watchdog = Watchdog::start(rank, timeout, |msg| {
                            log::error!("{msg}");
                            eprintln!("graphscale: {msg}");
                            std::process::exit(3);
                        });
                        f(Comm::Local(LocalComm {
                            rank,
                            shared,
                            watchdog,
                            traffic: Traffic::default(),
                        }))
                    })
                    .expect("spawn rank thread")
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

impl LocalComm {
    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn size(&self) -> usize {
        self.shared.size
    }

    pub fn barrier(&self) {
        self.shared.barrier.wait();
    }

    pub fn all_to_all_v(&self, send: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
        {
            let mut mb = self.shared.mailbox.lock().expect("mailbox lock");
            for (dst, buf) in send.into_iter().enumerate() {
                mb[dst][self.rank] = Some(buf);
            }
        }
        self.barrier();
        let recv = {
            let mut mb = self.shared.mailbox.lock().expect("mailbox lock");
            mb[self.rank]
                .iter_mut()
                .map(|slot| slot.take().expect("every rank sent to every rank"))
                .collect()
        };
        self.barrier();
        recv
    }

    /// Split-phase exchange, first half: queue `send[dst]` for every rank.
    pub fn post(&self, ch: Channel, send: Vec<Vec<u8>>) {
        let mut q = self.shared.posted.lock().expect("posted lock");
        for (dst, buf) in send.into_iter().enumerate() {
            q[ch as usize][dst][self.rank].push_back(buf);
        }
        self.shared.arrived.notify_all();
    }

    /// Second half: the oldest message every rank posted here.
    pub fn collect(&self, ch: Channel) -> Vec<Vec<u8>> {
        let mut q = self.shared.posted.lock().expect("posted lock");
        loop {
            let mine = &mut q[ch as usize][self.rank];
            if mine.iter().all(|from| !from.is_empty()) {
                return mine
                    .iter_mut()
                    .map(|from| from.pop_front().expect("checked"))
                    .collect();
            }
            q = self.shared.arrived.wait(q).expect("posted lock");
        }
    }

    /// Collective. With `node_shared` the window shows every rank's bytes ([`LocalWindow::node_span`]):
    /// the ranks, threads of one process, are one node.
    pub fn window(&self, local_bytes: usize, node_shared: bool) -> LocalWindow {
        let sizes = self.all_to_all_v(vec![
            (local_bytes as u64).to_le_bytes().to_vec();
            self.size()
        ]);
        if self.rank == 0 {
            let bufs = sizes
                .iter()
                .map(|b| {
                    let n = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
                    RwLock::new(vec![0u8; n as usize])
                })
                .collect();
            *self.shared.new_window.lock().expect("window lock") = Some(Arc::new(bufs));
        }
        self.barrier();
        let shards = self
            .shared
            .new_window
            .lock()
            .expect("window lock")
            .clone()
            .expect("rank 0 created the window");
        self.barrier();
        if self.rank == 0 {
            *self.shared.new_window.lock().expect("window lock") = None;
        }
        LocalWindow {
            rank: self.rank,
            shards,
            node: node_shared.then_some(self.shared.per_node),
        }
    }
}

pub struct LocalWindow {
    rank: usize,
    shards: Shards,
    /// For a node-shared window: ranks per node.
    node: Option<usize>,
}

impl LocalWindow {
    /// Every rank's bytes, for a node-shared window. The rank buffers are separate
    /// allocations (no single mapping), so rows cannot be updated in place through this; it
    /// serves data that is written before a barrier and only read after it (the adjacency).
    pub fn node_span(&self) -> Option<super::NodeSpan> {
        let per = self.node?;
        let parts = self
            .shards
            .iter()
            .enumerate()
            .filter(|(rank, _)| rank / per == self.rank / per)
            .map(|(rank, s)| {
                let mut b = s.write().expect("window lock");
                (rank, b.as_mut_ptr(), b.len())
            })
            .collect();
        Some(super::NodeSpan {
            mapping: None,
            parts,
        })
    }

    pub fn with_local<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        f(&self.shards[self.rank].read().expect("window lock"))
    }

    pub fn with_local_mut<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        f(&mut self.shards[self.rank].write().expect("window lock"))
    }

    pub fn get_rows(&self, requests: &[(usize, &[u32])], row_bytes: usize, out: &mut [u8]) {
        let mut off = 0;
        for &(owner, rows) in requests {
            let shard = self.shards[owner].read().expect("window lock");
            for &r in rows {
                let src = r as usize * row_bytes;
                out[off..off + row_bytes].copy_from_slice(&shard[src..src + row_bytes]);
                off += row_bytes;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Split-phase exchanges: a rank may post a second before collecting the first; each
    /// collect returns the oldest message of every rank, its own included.
    #[test]
    fn posted_exchanges_are_collected_in_order() {
        let got = run(3, Duration::from_secs(30), |c| {
            let me = c.rank() as u8;
            let msg = |k: u8| -> Vec<Vec<u8>> { (0..3u8).map(|dst| vec![me, dst, k]).collect() };
            let first = c.post(Channel::Rows, msg(0));
            let second = c.post(Channel::Rows, msg(1));
            let a = c.collect(first);
            let b = c.collect(second);
            // A third exchange after both: the queues are empty again.
            let third = c.post(Channel::Rows, msg(2));
            (
                a,
                b,
                c.collect(third),
                c.traffic().sent.load(std::sync::atomic::Ordering::Relaxed),
            )
        });
        for (rank, (a, b, c, sent)) in got.into_iter().enumerate() {
            for (k, recv) in [a, b, c].into_iter().enumerate() {
                let want: Vec<Vec<u8>> =
                    (0..3u8).map(|src| vec![src, rank as u8, k as u8]).collect();
                assert_eq!(recv, want, "rank {rank}, exchange {k}");
            }
            // Three exchanges of 3 bytes to each of 2 other ranks.
            assert_eq!(sent, 18);
        }
    }

    #[test]
    fn channels_are_matched_independently() {
        let got = run(2, Duration::from_secs(30), |c| {
            let me = c.rank() as u8;
            let msg = |k: u8| -> Vec<Vec<u8>> { (0..2u8).map(|dst| vec![me, dst, k]).collect() };
            // A pool exchange posted first is collected after a rows exchange posted later.
            let pool = c.post(Channel::Pool, msg(7));
            let rows = c.post(Channel::Rows, msg(1));
            let r = c.collect(rows);
            (r, c.collect(pool))
        });
        for (rank, (rows, pool)) in got.into_iter().enumerate() {
            let want =
                |k: u8| -> Vec<Vec<u8>> { (0..2u8).map(|src| vec![src, rank as u8, k]).collect() };
            assert_eq!(rows, want(1), "rank {rank}: rows channel");
            assert_eq!(pool, want(7), "rank {rank}: pool channel");
        }
    }
}
