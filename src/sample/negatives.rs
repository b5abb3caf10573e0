//! Negatives from the global degree^0.75 distribution without any rank holding a global table.
//! Each rank keeps an alias table over its own nodes; on refresh, every rank draws its share of a
//! pool (proportional to its mass) and the driver sends it to every rank, so every rank then
//! holds the same sample of the global distribution and draws from it uniformly. The pool does
//! no communication itself: the driver sums the ranks' masses ([`NegativePool::set_total`]) and
//! moves the shares ([`NegativePool::draw_share`], [`NegativePool::install`]).

use rand::{Rng as _, RngExt as _};

use super::alias::AliasTable;
use super::Rng;
use crate::graph::LocalGraph;

pub struct NegativePool {
    local: Option<AliasTable>,
    mass: f64,
    share: f64,
    pool: Vec<u64>,
    pool_size: usize,
    rank: usize,
    part: crate::graph::Partitioner,
}

impl NegativePool {
    /// This rank's table over its nodes `g` (rank `rank`), `weight(i)` = weighted degree^`power`
    /// (0.75 by default). Its share of a pool is unknown until [`NegativePool::set_total`], and
    /// the pool is empty until [`NegativePool::install`].
    pub fn new(g: &LocalGraph, rank: usize, pool_size: usize, power: f64) -> NegativePool {
        let w: Vec<f64> = (0..g.num_local())
            .map(|i| g.weighted_degree(i).powf(power))
            .collect();
        let mass: f64 = w.iter().sum();
        NegativePool {
            local: AliasTable::new(w),
            mass,
            share: 0.0,
            pool: Vec::new(),
            pool_size: pool_size.max(1),
            rank,
            part: g.part.clone(),
        }
    }

    /// This rank's mass (the sum of its nodes' weights).
    pub fn mass(&self) -> f64 {
        self.mass
    }

    /// The sum of every rank's [`NegativePool::mass`]: this rank's share of a pool follows.
    pub fn set_total(&mut self, total: f64) {
        self.share = if total > 0.0 { self.mass / total } else { 0.0 };
    }

    /// This rank's share of a fresh pool (global node ids), for every rank to install.
    pub fn draw_share(&self, rng: &mut Rng) -> Vec<u64> {
        match &self.local {
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
        }
    }

    /// The pool every rank's shares make, in rank order (the same on every rank).
    pub fn install(&mut self, shares: impl IntoIterator<Item = Vec<u64>>) {
        self.pool = shares.into_iter().flatten().collect();
    }

    /// The installed pool itself.
    pub fn into_pool(self) -> Vec<u64> {
        self.pool
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
