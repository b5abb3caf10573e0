//! `--update hogwild`: the pool updates rows in place; a remote row is trained in a copy (a
//! fetched copy per step without the cache, a cached copy with it) whose change goes to its owner.

use super::adagrad::InPlaceAdagrad;
use super::*;
use crate::store::SharedRows;

/// Hogwild batches on the pool at once across nodes with the row cache: the next batch's
/// exchange runs while the pool trains the previous one.
pub(super) const CACHE_DEPTH: usize = 2;

/// Steps between refreshes of the copies' starting accumulator (Adagrad in place).
const SEED_EVERY: u64 = 32;

/// Rows of the remote-row cache: `--cache-rows`, or by default as many rows as this rank owns
/// (over its matrices), at most the rows of other nodes.
pub(super) fn cache_capacity(cfg: &TrainConfig, g: &LocalGraph, rows: &[InPlaceRows]) -> usize {
    let in_place = rows[VERTEX].cells.len() / cfg.dim;
    let remote = g.num_nodes().saturating_sub(in_place as u64) as usize * cfg.matrices();
    match cfg.cache_rows {
        Some(n) => n,
        None => cfg.cache_rows_for(g.num_local()).min(remote),
    }
}

/// A fair coin for the `n`-th reference (a SplitMix64 finalizer's top bit): which references
/// form the random half of `remote_uses_half`, the same for every run.
pub(super) fn coin(n: u64) -> bool {
    let mut z = n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) >> 63 == 1
}

/// A planned batch's references to this node's rows and to other nodes' (every reference: a row
/// may be read by several pairs).
fn count_references<P: model::Plan>(planned: &P) -> (u64, u64) {
    let (mut local, mut remote) = (0u64, 0u64);
    for &r in planned.references().into_iter().flatten() {
        if r & model::REMOTE == 0 {
            local += 1;
        } else if r != model::SKIP {
            remote += 1;
        }
    }
    (local, remote)
}

impl<M: model::Model> Trainer<'_, M> {
    /// `--update hogwild`: plan the batch (only remote rows get slots), finish the previous
    /// batch, fetch the remote rows, and launch this batch's in-place updates on the pool. The
    /// caller samples the next batch while they run.
    pub(super) fn hogwild_step(&mut self, work: Work, lr: f32) {
        let (comm, g, cfg) = (self.comm, self.g, self.cfg);
        let dim = cfg.dim;
        let t = Timer::start();
        let part = &g.part;
        let in_place = self
            .shared
            .clone()
            .expect("hogwild_step needs rows to update in place");
        let remote_slot = &mut self.remote_slot;
        let mut keys: Vec<u64> = Vec::new();
        // Per slot: its references (updates), and whether a reference of the random half
        // (`remote_uses_half`) reached it.
        let mut refs: Vec<u32> = Vec::new();
        let mut half: Vec<bool> = Vec::new();
        let mut nref = 0u64;
        // A row of this node is referenced by its place in the in-place cells (no copy, no
        // deduplication); a row of another node gets a slot in the fetch buffer.
        let mut refer = |key: u64| -> u32 {
            let (owner, row) = part.locate(key >> 1);
            match in_place[(key & 1) as usize].first_row[owner] {
                Some(first) => first + row as u32,
                None => {
                    let slot = remote_slot.get_or_insert(key, || {
                        keys.push(key);
                        refs.push(0);
                        half.push(false);
                        (keys.len() - 1) as u32
                    });
                    refs[slot as usize] += 1;
                    nref += 1;
                    half[slot as usize] |= coin(nref);
                    model::REMOTE | slot
                }
            }
        };
        let planned = self.model.plan(work, &self.neg, &mut self.rng, &mut refer);
        self.remote_slot.clear(&keys);
        self.refresh_adagrad_seed();
        self.m.remote_uses_half += half.iter().filter(|&&h| h).count() as u64;
        let (local, remote) = count_references(&planned);
        self.m.local_rows += local;
        self.m.remote_refs += remote;
        self.m.seconds.sample += t.secs();
        if self.cache.is_some() {
            self.cached_launch(planned, keys, &refs, lr);
            return;
        }

        // Across ranks, a batch reads remote rows as they are after every update of the
        // previous step: the previous batch ends, its deltas are pushed and applied everywhere
        // (first barrier), and no owner writes rows in place while others still read them
        // (second barrier). With one thread per rank a run is then reproducible.
        // With every row in place (one node, node-shared rows) nothing waits for a batch's
        // end: up to IN_PLACE_DEPTH batches are on the pool at once, so that its threads do not
        // idle while the last segments of a batch finish. Otherwise the previous batch ends
        // first.
        let depth = if in_place[VERTEX].all() {
            crate::estimate::IN_PLACE_DEPTH
        } else {
            1
        };
        while self.pending.len() >= depth {
            let prev = self.pending.pop_front().expect("pending batch");
            self.finish(prev, lr);
        }
        let t = Timer::start();
        // With every rank's rows in place (one node, node-shared rows) nothing is fetched.
        let ranks = comm.size() > 1 && !in_place[VERTEX].all();
        if ranks {
            comm.barrier();
        }
        let mut rows = vec![0f32; keys.len() * dim];
        let mut remote: Vec<Vec<Vec<(u32, u32)>>> =
            vec![vec![Vec::new(); comm.size()]; self.shards.len()];
        for (s, &key) in keys.iter().enumerate() {
            let (owner, row) = part.locate(key >> 1);
            remote[(key & 1) as usize][owner].push((s as u32, row as u32));
        }
        for (m, shard) in self.shards.iter().enumerate() {
            let count = fetch_remote(comm, cfg, shard, &remote[m], &mut rows);
            self.m.remote_rows += count as u64;
            self.m.fetch_bytes += (count * shard.row_bytes()) as u64;
            self.m.one_sided_bytes += (count * shard.row_bytes()) as u64;
        }
        if ranks {
            comm.barrier();
        }
        self.m.seconds.fetch += t.secs();

        let (centers, targets) = (in_place[VERTEX].cells, in_place[in_place.len() - 1].cells);
        let acc = self.adagrad_cells();
        let (tx, rx) = std::sync::mpsc::channel();
        let (npairs, terms) = (planned.examples(), planned.loss_terms());
        let done = self.pool_started();
        self.submit(move || {
            let t = Timer::start();
            // SAFETY: the trainer keeps its shards (and accumulators) alive and takes no `&mut`
            // access to their windows until it has received this task's result (`finish`,
            // `drain`, `Drop`).
            let (c, tg) = unsafe { (centers.cells(), targets.cells()) };
            // SAFETY: as above.
            let acc = acc.map(|(a, seed)| unsafe { (a.map(|m| InPlaceAdagrad::matrix(m)), seed) });
            let (deltas, loss) = planned.train_copy([c, tg], &rows, dim, lr, acc);
            let secs = t.secs();
            done();
            // The receiver only disappears if the rank is already failing.
            let _ = tx.send((deltas, Vec::new(), loss, secs));
        });
        self.pending.push_back(Pending {
            keys,
            pairs: npairs,
            terms,
            rx,
            step: self.step,
            cached: false,
        });
    }

    /// With Adagrad in place, every `SEED_EVERY` steps: the copies' starting accumulator
    /// (`adagrad::InPlaceAdagrad::refresh_seed`), also for the cache's new copies.
    fn refresh_adagrad_seed(&mut self) {
        let due = self.step.is_multiple_of(SEED_EVERY);
        if let Some(a) = self.adagrad.as_mut().filter(|_| due) {
            a.refresh_seed();
            if let Some(cache) = self.cache.as_mut() {
                cache.acc_seed = a.seed;
            }
        }
    }

    /// With Adagrad in place: the accumulators of the centers' and targets' matrices (to hand
    /// to a pool task) and the copies' starting accumulator.
    fn adagrad_cells(&self) -> Option<([SharedRows; 2], f32)> {
        self.adagrad
            .as_ref()
            .map(|a| ([a.cells(VERTEX), a.cells(1)], a.seed))
    }

    /// Run a batch's task on the compute pool: on a pool thread while this thread goes on, or
    /// here and now when this thread is the pool's one thread (`--threads 1`,
    /// [`trainer_pool`]).
    pub(super) fn submit(&self, job: impl FnOnce() + Send + 'static) {
        if self.inline {
            self.pool.install(job);
        } else {
            self.pool.spawn(job);
        }
    }

    /// A batch is about to go to the pool: add the time the pool stood without work to the
    /// `idle` phase. Returns what the task calls when it ends.
    pub(super) fn pool_started(&mut self) -> impl FnOnce() + Send + 'static {
        use std::sync::atomic::Ordering::SeqCst;
        if self.inflight.fetch_add(1, SeqCst) == 0 {
            let end = self.last_end.load(SeqCst);
            let now = self.t0.elapsed().as_nanos() as u64;
            if end > 0 && now > end {
                self.m.seconds.idle += (now - end) as f64 * 1e-9;
            }
        }
        let (inflight, last_end, t0) = (self.inflight.clone(), self.last_end.clone(), self.t0);
        move || {
            last_end.store(t0.elapsed().as_nanos() as u64, SeqCst);
            inflight.fetch_sub(1, SeqCst);
        }
    }

    /// Hogwild across nodes with the row cache: give the batch's remote rows cache slots,
    /// exchange deltas and rows with their owners (collective), and launch the batch. Up to
    /// `CACHE_DEPTH` batches are on the pool, so the exchange overlaps the previous batch.
    pub(super) fn cached_launch(
        &mut self,
        mut planned: M::Plan,
        keys: Vec<u64>,
        refs: &[u32],
        lr: f32,
    ) {
        self.lr_now = lr;
        self.poke();
        while self.pending.len() >= CACHE_DEPTH {
            let prev = self.pending.pop_front().expect("pending batch");
            self.finish(prev, lr);
        }
        self.poke();
        let t = Timer::start();
        let mut adm = std::mem::take(&mut self.adm);
        adm.clear();
        loop {
            // Rows of batches on the pool, or waiting for their rows, stay.
            let oldest = self
                .pending
                .front()
                .map_or(self.step, |p| p.step)
                .min(self.deferred.front().map_or(self.step, |d| d.step));
            let cache = self.cache.as_mut().expect("cached_launch needs the cache");
            if cache.admit(&keys, refs, self.step, oldest, &mut adm) {
                break;
            }
            if self.pending.is_empty() {
                // One batch (with the one waiting for its rows) needs more rows than the cache
                // holds. No pool task holds the cache now: it may grow.
                let want = (cache.len() + keys.len()).max(cache.capacity() * 5 / 4);
                // The default size (the rows this rank owns) is a start that grows as batches
                // need: a warning only for a --cache-rows given (16 simulated nodes warned
                // about 40 times per BlogCatalog run of the defaults).
                let (level, advice) = if self.cfg.cache_rows.is_some() {
                    (log::Level::Warn, "raise --cache-rows or lower --batch-size")
                } else {
                    (log::Level::Info, "the default size grows as batches need")
                };
                log::log!(
                    level,
                    "rank {}: step {}: a batch needs {} remote rows, the cache holds {}: growing it to {want} ({advice})",
                    self.comm.rank(),
                    self.step,
                    keys.len(),
                    cache.capacity()
                );
                cache.grow(want);
                self.m.cache_rows = want as u64;
            } else {
                // Rows of the batches on the pool cannot be evicted: let them end.
                while let Some(prev) = self.pending.pop_front() {
                    self.finish(prev, lr);
                }
            }
        }
        self.m.cache_hits += adm.hits;
        self.m.cache_misses += adm.misses;
        self.m.cache_refreshes += adm.refreshes;
        self.m.cache_evictions += adm.evictions;
        planned.remap_remote(&adm.slots);
        self.m.seconds.sample += t.secs();
        let seq = self.seq;
        let asked = self.exchange(&adm);
        self.adm = adm;
        if self.cfg.fetch == Fetch::Rma {
            // The rows are in: train now.
            self.launch_cached(planned, lr, self.step);
        } else {
            // Its rows arrive with the exchange that answers this one, which launches it.
            self.deferred.push_back(Deferred {
                planned,
                lr,
                step: self.step,
                asked,
                seq,
            });
        }
    }

    /// Collective: end the batches on the pool and those waiting for their rows: collect the
    /// exchange under way, and send exchanges without new requests (answering the others') until
    /// every batch has its rows. Every rank has as many batches waiting (all take the same
    /// steps), so all run the same rounds.
    pub(super) fn settle(&mut self, lr: f32) {
        let carry = self.carry.take();
        loop {
            self.collect_posted();
            if self.deferred.is_empty() {
                if let Some(p) = self.sending.take() {
                    self.comm.complete(p);
                }
                break;
            }
            // No new requests; the answers to the others' ride along.
            let mut adm = std::mem::take(&mut self.adm);
            adm.clear();
            self.exchange(&adm);
            self.adm = adm;
        }
        self.launch_ready();
        self.carry = carry;
        while let Some(prev) = self.pending.pop_front() {
            self.finish(prev, lr);
        }
    }

    /// Put a batch whose rows are all in place or cached on the pool.
    pub(super) fn launch_cached(&mut self, planned: M::Plan, lr: f32, step: u64) {
        let in_place = self.shared.clone().expect("hogwild rows");
        let (centers, targets) = (in_place[VERTEX].cells, in_place[in_place.len() - 1].cells);
        let cache = self.cache.as_ref().expect("cache");
        let (remote, remote_acc) = (cache.cells.clone(), cache.acc.clone());
        let acc = self.adagrad_cells();
        let dim = self.cfg.dim;
        let (tx, rx) = std::sync::mpsc::channel();
        let (npairs, terms) = (planned.examples(), planned.loss_terms());
        let done = self.pool_started();
        self.submit(move || {
            let t = Timer::start();
            // SAFETY: as in `hogwild_step`: the trainer keeps its shards alive and takes no
            // `&mut` access to their windows until it has received this task's result.
            let (c, tg) = unsafe { (centers.cells(), targets.cells()) };
            let rows = Cells {
                matrices: [c, tg],
                remote: Shared::F32(&remote),
                dim,
                acc: acc.map(|(a, _)| model::Accumulators {
                    // SAFETY: as above, for the accumulators' windows.
                    matrices: a.map(|m| unsafe { InPlaceAdagrad::matrix(m) }),
                    remote: &remote_acc,
                }),
            };
            let loss = planned.train(&rows, lr);
            // Let go of the cache's rows before reporting: the trainer may then grow it.
            drop((remote, remote_acc));
            let secs = t.secs();
            done();
            // The receiver only disappears if the rank is already failing.
            let _ = tx.send((Vec::new(), Vec::new(), loss, secs));
        });
        self.pending.push_back(Pending {
            keys: Vec::new(),
            pairs: npairs,
            terms,
            rx,
            step,
            cached: true,
        });
    }
}
