//! Negatives from the global degree^0.75 distribution without any rank holding a global table.
//! Each rank keeps an alias table over its own nodes; on refresh, every rank draws its share of a
//! pool (proportional to its mass) and the pool is all-gathered, so every rank then holds the
//! same sample of the global distribution and draws from it uniformly.

use rand::{Rng as _, RngExt as _};

use super::alias::AliasTable;
use super::Rng;
use crate::comm::{decode_u64, encode_u64, Channel, Comm, Posted};
use crate::graph::LocalGraph;

pub struct NegativePool {
    local: Option<AliasTable>,
    share: f64,
    pool: Vec<u64>,
    pool_size: usize,
    rank: usize,
    part: crate::graph::Partitioner,
    /// This rank's shares of the installed pool, possibly still under way.
    sending: Option<Posted>,
}

impl NegativePool {
    /// Collective. `weight(i)` is the unnormalised probability of local node `i`
    /// (degree^0.75 by default).
    pub fn new(comm: &Comm, g: &LocalGraph, pool_size: usize, power: f64) -> NegativePool {
        let w: Vec<f64> = (0..g.num_local())
            .map(|i| g.weighted_degree(i).powf(power))
            .collect();
        let mass: f64 = w.iter().sum();
        let total = comm.all_reduce_f64(&[mass], crate::comm::ReduceOp::Sum)[0];
        NegativePool {
            local: AliasTable::new(w),
            share: if total > 0.0 { mass / total } else { 0.0 },
            pool: Vec::new(),
            pool_size: pool_size.max(1),
            rank: comm.rank(),
            part: g.part.clone(),
            sending: None,
        }
    }

    /// Collective: draw a fresh pool and install it.
    pub fn refresh(&mut self, comm: &Comm, rng: &mut Rng) {
        let posted = self.post_refresh(comm, rng);
        self.install(comm, posted);
        self.finish(comm);
    }

    /// Collective, first half of a split-phase refresh: this rank's share of the next pool
    /// starts on its way to every rank; the current pool stays in use until
    /// [`NegativePool::install`]. Every rank posts and installs in the same order.
    pub fn post_refresh(&mut self, comm: &Comm, rng: &mut Rng) -> Posted {
        let mine = match &self.local {
            // Randomised rounding keeps every rank's expected share exact.
            Some(t) => {
                let want = self.share * self.pool_size as f64;
                let frac = want.fract();
                let extra = u64::from(((rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < frac);
                let k = want as u64 + extra;
                (0..k)
                    .map(|_| self.part.global(self.rank, t.sample(rng)))
                    .collect()
            }
            None => Vec::new(),
        };
        comm.post(Channel::Pool, vec![encode_u64(&mine); comm.size()])
    }

    /// Second half: the pool every rank's posted shares make, the same on every rank. This
    /// rank's own shares of it are waited for at the next install (or [`NegativePool::finish`]),
    /// when every rank has long received them.
    pub fn install(&mut self, comm: &Comm, mut posted: Posted) {
        self.pool = comm
            .receive(&mut posted)
            .iter()
            .flat_map(|b| decode_u64(b))
            .collect();
        self.finish(comm);
        self.sending = Some(posted);
    }

    /// Wait for this rank's shares of the installed pool to leave (before the job's end).
    pub fn finish(&mut self, comm: &Comm) {
        if let Some(p) = self.sending.take() {
            comm.complete(p);
        }
    }

    /// One negative (the pool is never empty after a refresh of a graph with edges).
    #[inline]
    pub fn draw(&self, rng: &mut Rng) -> u64 {
        let r = rng.next_u64();
        self.pool[(((r >> 32) * self.pool.len() as u64) >> 32) as usize]
    }

    /// `out.len()` negatives. The pool is larger than the caches: a tight loop of independent
    /// lookups lets the CPU overlap their misses, which one draw per pair does not.
    pub fn fill(&self, rng: &mut Rng, out: &mut [u64]) {
        let n = self.pool.len() as u64;
        for o in out.iter_mut() {
            *o = self.pool[(((rng.next_u64() >> 32) * n) >> 32) as usize];
        }
    }

    /// `out.len()` negatives from this rank's own nodes alone, by its local table (the
    /// global distribution restricted to them); false, leaving `out`, without local nodes.
    pub fn fill_local(&self, rng: &mut Rng, out: &mut [u64]) -> bool {
        let Some(t) = &self.local else {
            return false;
        };
        for o in out.iter_mut() {
            *o = self.part.global(self.rank, t.sample(rng));
        }
        true
    }

    /// `out.len()` negatives uniform among this rank's own nodes; false, leaving `out`,
    /// without local nodes.
    pub fn fill_local_uniform(&self, rng: &mut Rng, out: &mut [u64]) -> bool {
        let n = self.part.num_local(self.rank);
        if n == 0 {
            return false;
        }
        for o in out.iter_mut() {
            *o = self
                .part
                .global(self.rank, rng.random_range(0..n as u64) as usize);
        }
        true
    }

    pub fn is_empty(&self) -> bool {
        self.pool.is_empty()
    }
}
