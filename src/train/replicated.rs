//! `--strategy replicated`: the data-parallel baseline graphscale is measured against (DDP with
//! a replicated embedding table). Every rank holds every row of every matrix and trains its
//! share of the walks or edges with the same sampler, planner and kernel as the sharded
//! strategy: a batch trains a copy of the rows it touches, and its change of each row (its
//! delta, -lr times the batch's gradient for sgd) is what the ranks exchange. After each step
//! the replicas are made equal again:
//!
//! - `--sync sparse` (default): every rank all-gathers the keys and deltas of the rows each rank
//!   touched (DDP with sparse embedding gradients);
//! - `--sync dense`: an all-reduce of dense gradient matrices as large as the matrices (DDP
//!   with a dense embedding table).
//!
//! Every rank adds the same deltas in the same order, so the replicas stay bitwise equal. The
//! next batch is sampled and planned while the pool trains the current one, as in the sharded
//! strategy; its rows are read after the step's sync.

use std::sync::mpsc::Receiver;

use rand::RngExt;

use super::{Trainer, VERTEX};
use crate::config::{Sync, TrainConfig};
use crate::model::cells::Shared;
use crate::model::{self, Model, Plan, Work};
use crate::sample::rng_for;
use crate::spmd::fatal;
use crate::stats::Timer;

/// One rank's replica of every matrix.
pub(super) struct Replica {
    /// Per matrix: every node's row in f32, in node id order.
    rows: Vec<Vec<f32>>,
    /// `--sync dense`: per matrix, the step's gradient matrix (zero between steps).
    dense: Vec<Vec<f32>>,
    /// The batch on the pool: its row keys (node << 1 | matrix), its pairs and loss terms, and
    /// where its (deltas, loss, compute seconds) arrive.
    pending: Option<(Vec<u64>, [u64; 2], Receiver<TaskResult>)>,
}

/// What a batch's pool task sends back: its deltas, its sampled loss, its compute seconds.
type TaskResult = (Vec<f32>, f64, f64);

impl Replica {
    /// Rows initialised as the sharded strategy initialises them (vertex rows seeded by node
    /// id, context rows zero): both strategies start from the same matrices.
    pub(super) fn new(cfg: &TrainConfig, num_nodes: u64) -> Replica {
        let (dim, n) = (cfg.dim, num_nodes as usize);
        let mut rows = vec![vec![0f32; n * dim]; cfg.matrices()];
        for (v, row) in rows[VERTEX].chunks_exact_mut(dim).enumerate() {
            let mut rng = rng_for(cfg.seed, 0, 1 + v as u64);
            for x in row.iter_mut() {
                *x = (rng.random::<f32>() * 2.0 - 1.0) / dim as f32;
            }
        }
        let dense = match cfg.sync {
            Sync::Dense => vec![vec![0f32; n * dim]; cfg.matrices()],
            Sync::Sparse => Vec::new(),
        };
        Replica {
            rows,
            dense,
            pending: None,
        }
    }

    /// Node `v`'s row of matrix `m`.
    pub(super) fn row(&self, m: usize, v: usize, dim: usize) -> &[f32] {
        &self.rows[m][v * dim..(v + 1) * dim]
    }
}

impl<M: Model> Trainer<'_, M> {
    /// Plan the batch (every row it touches gets a slot in its copy), end the previous step
    /// (collective: its deltas are exchanged and added to every replica), then read this
    /// batch's rows from the replica and launch it on the pool.
    pub(super) fn replicated_step(&mut self, work: Work, lr: f32) {
        let dim = self.cfg.dim;
        let t = Timer::start();
        let slots = &mut self.remote_slot;
        let mut keys: Vec<u64> = Vec::new();
        let mut refer = |key: u64| -> u32 {
            model::REMOTE
                | slots.get_or_insert(key, || {
                    keys.push(key);
                    (keys.len() - 1) as u32
                })
        };
        let planned = self.model.plan(work, &self.neg, &mut self.rng, &mut refer);
        self.remote_slot.clear(&keys);
        self.m.local_rows += planned
            .references()
            .into_iter()
            .flatten()
            .filter(|&&r| r != model::SKIP)
            .count() as u64;
        self.m.seconds.sample += t.secs();

        self.replica_finish();

        let t = Timer::start();
        let replica = self
            .replica
            .as_ref()
            .expect("replicated_step needs the replica");
        let mut rows = vec![0f32; keys.len() * dim];
        for (out, &key) in rows.chunks_exact_mut(dim).zip(&keys) {
            out.copy_from_slice(replica.row((key & 1) as usize, (key >> 1) as usize, dim));
        }
        self.m.seconds.fetch += t.secs();
        let (tx, rx) = std::sync::mpsc::channel();
        let (npairs, terms) = (planned.examples(), planned.loss_terms());
        let done = self.pool_started();
        self.submit(move || {
            let t = Timer::start();
            // Every reference is to the batch's copy: no row is updated in place.
            let (deltas, loss) =
                planned.train_copy([Shared::F32(&[]), Shared::F32(&[])], &rows, dim, lr, None);
            let secs = t.secs();
            done();
            // The receiver only disappears if the rank is already failing.
            let _ = tx.send((deltas, loss, secs));
        });
        self.replica.as_mut().expect("replica").pending = Some((keys, [npairs as u64, terms], rx));
    }

    /// Collective: wait for the batch on the pool and make the replicas equal: every rank's
    /// deltas are added to every replica, in rank order.
    pub(super) fn replica_finish(&mut self) {
        let (comm, dim) = (self.comm, self.cfg.dim);
        let Some((keys, [pairs, terms], rx)) = self.replica.as_mut().and_then(|r| r.pending.take())
        else {
            return;
        };
        let t = Timer::start();
        let Ok((deltas, loss, secs)) = rx.recv() else {
            fatal(
                comm,
                Some(self.step),
                &"a compute task ended without a result",
            );
        };
        self.m.seconds.wait += t.secs();
        self.m.seconds.compute += secs;
        if !loss.is_finite() {
            fatal(comm, Some(self.step), &"non-finite loss; lower --lr");
        }
        self.m.loss_sum += loss;
        self.m.loss_terms += terms;
        self.m.pairs += pairs;
        self.m.steps += 1;

        let (p, matrices) = (comm.size(), self.shards.len());
        let replica = self.replica.as_mut().expect("replica");
        let num_nodes = replica.rows[VERTEX].len() / dim;
        match self.cfg.sync {
            Sync::Sparse => {
                // [rows: u64][keys: u64 x rows][deltas: f32 x rows x dim]; a rank alone has no
                // one to tell.
                let t = Timer::start();
                let all = if p > 1 {
                    let mut msg = Vec::with_capacity(8 + keys.len() * (8 + 4 * dim));
                    msg.extend_from_slice(&(keys.len() as u64).to_le_bytes());
                    for key in &keys {
                        msg.extend_from_slice(&key.to_le_bytes());
                    }
                    for x in &deltas {
                        msg.extend_from_slice(&x.to_le_bytes());
                    }
                    self.m.push_bytes_sent += (msg.len() * (p - 1)) as u64;
                    comm.all_gather_bytes(&msg)
                } else {
                    vec![Vec::new()]
                };
                self.m.seconds.push += t.secs();
                let t = Timer::start();
                let add = |rows: &mut Vec<Vec<f32>>, key: u64, d: &mut dyn Iterator<Item = f32>| {
                    let (m, v) = ((key & 1) as usize, (key >> 1) as usize);
                    let row = &mut rows[m][v * dim..(v + 1) * dim];
                    row.iter_mut().zip(d).for_each(|(r, x)| *r += x);
                };
                // Every rank adds every rank's deltas in rank order: the same sums everywhere.
                for (src, b) in all.iter().enumerate() {
                    if src == comm.rank() {
                        for (&key, d) in keys.iter().zip(deltas.chunks_exact(dim)) {
                            add(&mut replica.rows, key, &mut d.iter().copied());
                        }
                        continue;
                    }
                    self.m.push_bytes_received += b.len() as u64;
                    let n = b
                        .get(..8)
                        .map_or(0, |x| u64::from_le_bytes(x.try_into().expect("8 bytes")))
                        as usize;
                    if b.len() != 8 + n * (8 + 4 * dim) {
                        fatal(
                            comm,
                            Some(self.step),
                            &format!("received a malformed sync message from rank {src}"),
                        );
                    }
                    let (ks, ds) = b[8..].split_at(8 * n);
                    for (kb, db) in ks.chunks_exact(8).zip(ds.chunks_exact(4 * dim)) {
                        let key = u64::from_le_bytes(kb.try_into().expect("8 bytes"));
                        if (key & 1) as usize >= matrices || (key >> 1) as usize >= num_nodes {
                            fatal(
                                comm,
                                Some(self.step),
                                &format!(
                                    "received a delta for row {key} of no matrix from rank {src}"
                                ),
                            );
                        }
                        let mut d = db
                            .chunks_exact(4)
                            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")));
                        add(&mut replica.rows, key, &mut d);
                    }
                }
                self.m.seconds.apply += t.secs();
            }
            Sync::Dense => {
                let t = Timer::start();
                for (&key, d) in keys.iter().zip(deltas.chunks_exact(dim)) {
                    let (m, v) = ((key & 1) as usize, (key >> 1) as usize);
                    let g = &mut replica.dense[m][v * dim..(v + 1) * dim];
                    g.iter_mut().zip(d).for_each(|(g, x)| *g += x);
                }
                self.m.seconds.apply += t.secs();
                let t = Timer::start();
                for g in replica.dense.iter_mut() {
                    comm.all_reduce_sum_f32(g);
                    let ring = (2 * (p - 1) * g.len() * 4 / p) as u64;
                    self.m.push_bytes_sent += ring;
                    self.m.push_bytes_received += ring;
                }
                self.m.seconds.push += t.secs();
                let t = Timer::start();
                for (rows, g) in replica.rows.iter_mut().zip(replica.dense.iter_mut()) {
                    for (r, x) in rows.iter_mut().zip(g.iter_mut()) {
                        *r += *x;
                        *x = 0.0;
                    }
                }
                self.m.seconds.apply += t.secs();
            }
        }
    }

    /// End of training (collective): the last step's sync, then this rank's own rows copied
    /// into its shards, which the output and the metrics read as for the sharded strategy.
    /// Every replica is checked against rank 0's (a CRC of its bytes) first: a divergence ends
    /// the job instead of writing one rank's view as the result.
    pub(super) fn replica_drain(&mut self) {
        self.replica_finish();
        let Some(replica) = self.replica.as_ref() else {
            return;
        };
        let mut crc = crc32fast::Hasher::new();
        let mut buf = Vec::with_capacity(1 << 16);
        for chunk in replica.rows.iter().flat_map(|m| m.chunks(1 << 14)) {
            buf.clear();
            buf.extend(chunk.iter().flat_map(|x| x.to_le_bytes()));
            crc.update(&buf);
        }
        let crc = u64::from(crc.finalize());
        let range = [
            self.comm.all_reduce_u64(&[crc], crate::comm::ReduceOp::Min)[0],
            self.comm.all_reduce_u64(&[crc], crate::comm::ReduceOp::Max)[0],
        ];
        if range[0] != range[1] {
            fatal(
                self.comm,
                Some(self.step),
                &"the replicas of --strategy replicated differ at the end of training (a bug: please report it)",
            );
        }
        let (rank, dim, part) = (self.comm.rank(), self.cfg.dim, self.g.part.clone());
        for (m, shard) in self.shards.iter_mut().enumerate() {
            shard.init(|r, out| {
                out.copy_from_slice(replica.row(m, part.global(rank, r) as usize, dim));
            });
        }
    }
}
