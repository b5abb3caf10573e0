//! The hot-row cache of hogwild across nodes (HET, VLDB 2022, for embedding models): a rank keeps
//! copies of the remote rows its batches touch, its pool trains them in place as it trains its
//! own rows, and each copy is synchronised with its owner: its accumulated delta (value now minus
//! value at the last synchronisation) is pushed, and its value is read again. Staleness is
//! bounded per row by its own clock, as in HET: a copy is re-read once `refresh` batches have
//! used it since it was read (a hub used by every batch every `refresh` steps; a rarely used row
//! far less often, since few updates reach it anywhere), and at the latest `AGE * refresh` steps
//! after it was read; a delta waits at most `AGE * refresh` steps (plus the batches still on the
//! pool) before its owner has it.
//!
//! A bound in steps alone was measured to fail (BlogCatalog, 4 simulated nodes): copies of hub
//! rows trained by every rank for 32 steps without seeing each other's updates overshoot (each
//! rank pushes the hub away from the same inputs), and Micro-F1 at 50% fell from 37.3 to 31.5 (64
//! steps: 27.0); re-reading every 8 steps kept it (37.8) but moved 4x the bytes of the old path's
//! share of rows that are rarely used.
//!
//! How the copies' changes combine (measured, docs/architecture.md "Rows trained on many
//! nodes"): the owner adds a delta as it comes, except that the deltas of one row arriving in
//! one exchange are combined by a saturation model ([`Combine`]). Each pushed delta carries the
//! updates its copy took ([`UpdateCode`], in its row head's spare bits). A copy that took `n` updates from the row's value `x` moved it about
//! `c(n) = 1 - exp(-r n)` of the way to where its batches pull it (`r` grows with the learning
//! rate and the row's norm); one machine taking all `N` updates would have moved it `c(N)` of
//! the way, so the owner applies the copies' sum scaled by `c(N) / sum c(n)`. Copies far from
//! their target (`r N` small: few updates, small rows, early in training, a small learning
//! rate) add up whole, as one machine's updates would; copies that each got there (a hub every
//! rank trained many times) are averaged, since their sum would move the hub about `copies`
//! times too far (BlogCatalog, 8 simulated nodes: Micro-F1 28.9 summed, 36.9 combined; 16
//! nodes diverged summed). Averaging every group instead kept BlogCatalog (36.7) but lost the
//! updates of runs where every update counts (an SBM of 1,200 nodes, d 32, resumed at 3 ranks:
//! Micro-F1 0.64 against 0.96). The clock is shared by the copies: `--cache-refresh` defaults
//! to 32 / ranks (every rank keeps its own copies, also ranks of one node).
//!
//! The cache only decides: which slot each of a batch's remote rows takes, which rows must be
//! (re)read from their owners, and which deltas go out. The trainer moves the bytes
//! (`Trainer::exchange`) and installs what arrives ([`RowCache::install`]).

use std::collections::VecDeque;
use std::sync::atomic::AtomicU32;

use crate::model::cells::Shared;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::model::cells;

const EMPTY: u64 = u64::MAX;
const CLEAN: u64 = u64::MAX;
const NO_SLOT: u32 = u32::MAX;

/// A copy is re-read, and a delta pushed, at the latest this many times `refresh` steps after.
pub const AGE: u64 = 8;

/// How many rows ahead the loops over scattered rows prefetch.
pub const AHEAD: usize = 4;

/// What one batch needs from the exchange, filled by [`RowCache::admit`].
#[derive(Default)]
pub struct Admission {
    /// Per key of the batch (same order), its slot.
    pub slots: Vec<u32>,
    /// Rows to read from their owners: (slot, key, whether the slot is new).
    pub fetch: Vec<(u32, u64, bool)>,
    /// Deltas to push: keys, `dim` values per key, and per key the updates its copy took
    /// since its last synchronisation (saturating).
    pub push_keys: Vec<u64>,
    pub push_vals: Vec<f32>,
    pub push_refs: Vec<u16>,
    /// Counters of this admission.
    pub hits: u64,
    pub misses: u64,
    pub refreshes: u64,
    pub evictions: u64,
}

impl Admission {
    /// Start a new step's admission (the trainer calls it once per exchange).
    pub fn clear(&mut self) {
        self.slots.clear();
        self.fetch.clear();
        self.push_keys.clear();
        self.push_vals.clear();
        self.push_refs.clear();
        self.hits = 0;
        self.misses = 0;
        self.refreshes = 0;
        self.evictions = 0;
    }
}

/// How fast a copy's updates use up the way to where its inputs pull the row, per unit of
/// `lr * |row|^2` (the row's own norm standing in for those of the rows it is scored against).
/// Measured, not derived (docs/architecture.md "Rows trained on many nodes"): 0.25, 1, 4 and
/// 16 gave Micro-F1 36.15, 36.64, 36.93, 37.01 on BlogCatalog at 8 simulated nodes (d 128) and
/// 0.956, 0.951, 0.941, 0.910 on the under-trained SBM of the fault tests (d 32, a resumed run
/// at 3 ranks), whose every update counts. `GS_STIFFNESS` overrides it for measurements.
pub const STIFFNESS: f64 = 4.0;

/// The updates a pushed delta's copy took, carried in the spare high bits of its 4-byte row
/// head (below the matrix bit): a log scale of `2^bits - 1` steps up to 2^16 updates (8 bits,
/// as at up to 2^23 rows per rank: 16 steps per doubling). Rows per rank decide the bits, the
/// same on every rank. Without spare bits (2^31 rows per rank) every delta reads as one update,
/// and copies add up as before the rule.
#[derive(Clone, Copy, Debug)]
pub struct UpdateCode {
    row_bits: u32,
    bits: u32,
}

impl UpdateCode {
    /// For shards of at most `max_rows` rows.
    pub fn new(max_rows: usize) -> UpdateCode {
        let row_bits = (usize::BITS - max_rows.max(1).leading_zeros()).min(31);
        UpdateCode {
            row_bits,
            bits: (31 - row_bits).min(8),
        }
    }

    fn steps_per_doubling(self) -> f64 {
        f64::from((1u32 << self.bits) - 1) / 16.0
    }

    /// A row head (`row | matrix << 31`) with `updates` in its spare bits.
    pub fn encode(self, head: u32, updates: u16) -> u32 {
        let code = if self.bits == 0 {
            0
        } else {
            let c = (self.steps_per_doubling() * f64::from(updates.max(1)).log2()).round() as u32;
            c.min((1 << self.bits) - 1)
        };
        head | (code << self.row_bits)
    }

    /// The row head and the updates of an encoded head.
    pub fn decode(self, head: u32) -> (u32, u32) {
        let code_mask = ((1u32 << self.bits) - 1) << self.row_bits;
        let code = (head & code_mask) >> self.row_bits;
        let updates = if self.bits == 0 {
            1
        } else {
            (f64::from(code) / self.steps_per_doubling()).exp2().round() as u32
        };
        (head & !code_mask, updates)
    }
}

/// The owner's side of the rule above: the deltas of one exchange, summed per row with the
/// copies' updates, then handed out combined in the order their rows first arrived. Its
/// buffers live across exchanges (no allocation per step once warm).
pub struct Combine {
    dim: usize,
    stiffness: f64,
    /// Per row (matrix + 2 x row index), its index in `rows` + 1 (0: none yet): one read
    /// per delta where a hash map's probe missed the caches.
    at: Vec<u32>,
    rows: Vec<(usize, usize)>,
    /// Per row: copies, and their updates in all.
    count: Vec<(u32, u64)>,
    /// Every delta's row (index into `rows`) and updates.
    updates: Vec<(u32, u32)>,
    sum: Vec<f32>,
    /// Per row, the sum of the copies' shares of their way and the rate (scratch of `drain`).
    share: Vec<f64>,
    rate: Vec<f64>,
    out: Vec<f32>,
}

/// The share of the way to where its inputs pull it that a row covers in `n` updates, each
/// covering `rate` of what is left.
fn covered(rate: f64, n: f64) -> f64 {
    -(-rate * n).exp_m1()
}

impl Combine {
    pub fn new(dim: usize) -> Combine {
        let stiffness = std::env::var("GS_STIFFNESS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(STIFFNESS);
        Combine::with_stiffness(dim, stiffness)
    }

    pub fn with_stiffness(dim: usize, stiffness: f64) -> Combine {
        Combine {
            dim,
            stiffness,
            at: Vec::new(),
            rows: Vec::new(),
            count: Vec::new(),
            updates: Vec::new(),
            sum: Vec::new(),
            share: Vec::new(),
            rate: Vec::new(),
            out: vec![0.0; dim],
        }
    }

    /// Where `row` (matrix 0 or 1, offset of its first value: a multiple of `dim`) is in `at`.
    #[inline]
    fn index(&self, (m, o): (usize, usize)) -> usize {
        debug_assert!(m < 2 && o % self.dim == 0, "row ({m}, {o})");
        o / self.dim * 2 + m
    }

    /// One copy's delta for `row` (matrix 0 or 1, offset of its first value in the matrix),
    /// made by `updates` updates of the copy.
    pub fn add(&mut self, row: (usize, usize), delta: &[f32], updates: u32) {
        debug_assert_eq!(delta.len(), self.dim);
        let d = self.dim;
        let k = self.index(row);
        if k >= self.at.len() {
            self.at.resize(k + 1, 0);
        }
        let i = match self.at[k] {
            0 => {
                self.rows.push(row);
                self.count.push((0, 0));
                self.sum.resize(self.sum.len() + d, 0.0);
                self.at[k] = self.rows.len() as u32;
                self.rows.len() as u32 - 1
            }
            e => e - 1,
        };
        let updates = updates.max(1);
        self.updates.push((i, updates));
        let c = &mut self.count[i as usize];
        c.0 += 1;
        c.1 += u64::from(updates);
        let i = i as usize;
        for (a, x) in self.sum[i * d..(i + 1) * d].iter_mut().zip(delta) {
            *a += x;
        }
    }

    /// Hand every row's combined delta and its number of copies to `apply`, and start afresh.
    /// `norm2(row)` is the row's squared norm at its owner now and `lr` the learning rate of
    /// the step that made the deltas. A copy that took `n` updates covered `c(n) = 1 -
    /// exp(-r n)` of its way, `r = stiffness * lr * |row|^2`, and one place taking all `N` of
    /// the copies' updates would have covered `c(N)`: the owner applies the copies' sum scaled
    /// by `c(N) / sum c(n)`. That is the whole sum while the copies are far from where their
    /// inputs pull the row (`r N` small: updates add up), and their mean once each got there
    /// (a hub every copy trained many times). `ahead(row)` hints that `row` is needed soon (a
    /// prefetch). Returns the deltas scaled below half their sum.
    pub fn drain(
        &mut self,
        lr: f32,
        mut norm2: impl FnMut((usize, usize)) -> f32,
        mut apply: impl FnMut((usize, usize), &[f32], u32),
        ahead: impl Fn((usize, usize)),
    ) -> u64 {
        let d = self.dim;
        self.share.clear();
        self.share.resize(self.rows.len(), 0.0);
        let stiffness = self.stiffness * f64::from(lr);
        self.rate.clear();
        self.rate
            .extend(
                self.rows
                    .iter()
                    .zip(&self.count)
                    .enumerate()
                    .map(|(i, (&row, &(k, _)))| {
                        if let Some((&next, _)) = self
                            .rows
                            .get(i + AHEAD)
                            .zip(self.count.get(i + AHEAD))
                            .filter(|(_, c)| c.0 >= 2)
                        {
                            ahead(next);
                        }
                        if k < 2 {
                            0.0
                        } else {
                            stiffness * f64::from(norm2(row))
                        }
                    }),
            );
        let rate = &self.rate;
        for &(i, n) in &self.updates {
            let i = i as usize;
            if self.count[i].0 > 1 {
                self.share[i] += covered(rate[i], f64::from(n));
            }
        }
        let mut scaled = 0;
        for (i, &row) in self.rows.iter().enumerate() {
            if let Some(&next) = self.rows.get(i + AHEAD) {
                ahead(next);
            }
            let (k, total) = self.count[i];
            let sum = &self.sum[i * d..(i + 1) * d];
            // Shares too small to resolve are the linear regime: the sum.
            let f = if k < 2 || rate[i] * total as f64 <= 1e-9 {
                1.0
            } else {
                (covered(rate[i], total as f64) / self.share[i]).min(1.0)
            };
            if f >= 1.0 {
                apply(row, sum, k);
                continue;
            }
            if f < 0.5 {
                scaled += u64::from(k);
            }
            let f = f as f32;
            for (m, a) in self.out.iter_mut().zip(sum) {
                *m = a * f;
            }
            apply(row, &self.out, k);
        }
        for i in 0..self.rows.len() {
            let k = self.index(self.rows[i]);
            self.at[k] = 0;
        }
        self.rows.clear();
        self.count.clear();
        self.updates.clear();
        self.sum.clear();
        scaled
    }
}

/// A cache slot's state.
#[derive(Clone, Copy, Debug)]
struct Slot {
    /// The row key held (EMPTY: none).
    key: u64,
    /// Step at which the slot's value was last read from its owner.
    fetched: u64,
    /// Last step whose batch references the slot.
    used: u64,
    /// Step at which the slot's delta is due to be pushed (CLEAN: nothing to push).
    due_at: u64,
    /// Use counts (halved at every eviction round: recent use weighs more).
    uses: u32,
    /// References of batches to the slot since its delta was last taken (its updates).
    refs: u32,
    /// Batches that used the slot since its value was read (its clock).
    touches: u32,
    /// A read of the slot's row is under way (asked, not yet installed).
    awaiting: bool,
}

const FREE_SLOT: Slot = Slot {
    key: EMPTY,
    fetched: 0,
    used: 0,
    due_at: CLEAN,
    uses: 0,
    refs: 0,
    touches: 0,
    awaiting: false,
};

/// Copies of remote rows (keys `node << 1 | matrix`), trained in place by the pool.
pub struct RowCache {
    dim: usize,
    /// The copies, `capacity * dim` f32 bits; pool tasks hold a clone of the `Arc`.
    pub cells: Arc<Vec<AtomicU32>>,
    /// Adagrad in place: per slot its copy's accumulator (f32 bits), which a new copy takes
    /// from `acc_seed` and a refreshed one keeps (`train::adagrad`).
    pub acc: Arc<Vec<AtomicU32>>,
    pub acc_seed: f32,
    /// Per slot, the value at its last synchronisation (the delta's origin).
    base: Vec<f32>,
    slot_of: Directory,
    /// Per slot, its state (one cache line or two: a batch's slots are scattered).
    meta: Vec<Slot>,
    free: Vec<u32>,
    due: VecDeque<(u64, u32)>,
    refresh: u64,
    /// One row of scratch.
    row: Vec<f32>,
}

/// Where each key's copy is. A table indexed by the key while the key space is small next to
/// the cache (4 bytes per key, at most a sixteenth of the copies' bytes: `--dim` 128 and up to 16
/// ranks keeping copies, with the default cache size); a hash map otherwise (a billion nodes over
/// 80 ranks). A table lookup is one read where the map's probe missed the caches: at 2 simulated
/// nodes the map's lookups in [`RowCache::admit`] were 3.2% of the ranks' CPU time. Planning
/// numbers a batch's remote rows through one too (`slots::KeySlots`).
pub(super) enum Directory {
    Table { slot: Vec<u32>, len: usize },
    Map(FxHashMap<u64, u32>),
}

impl Directory {
    fn new(key_space: u64, capacity: usize, dim: usize) -> Directory {
        if Directory::table_fits(key_space, capacity, dim) {
            Directory::table(key_space)
        } else {
            Directory::Map(FxHashMap::default())
        }
    }

    /// Whether a table for `key_space` keys is at most a sixteenth of the cache's copies.
    fn table_fits(key_space: u64, capacity: usize, dim: usize) -> bool {
        key_space.saturating_mul(4) <= RowCache::bytes(capacity, dim) / 16
    }

    pub(super) fn table(key_space: u64) -> Directory {
        Directory::Table {
            slot: vec![NO_SLOT; key_space as usize],
            len: 0,
        }
    }

    #[inline]
    pub(super) fn get(&self, k: u64) -> Option<u32> {
        match self {
            Directory::Table { slot, .. } => {
                slot.get(k as usize).copied().filter(|&s| s != NO_SLOT)
            }
            Directory::Map(m) => m.get(&k).copied(),
        }
    }

    pub(super) fn insert(&mut self, k: u64, s: u32) {
        match self {
            Directory::Table { slot, len } => {
                *len += usize::from(slot[k as usize] == NO_SLOT);
                slot[k as usize] = s;
            }
            Directory::Map(m) => {
                m.insert(k, s);
            }
        }
    }

    pub(super) fn remove(&mut self, k: u64) {
        match self {
            Directory::Table { slot, len } => {
                *len -= usize::from(slot[k as usize] != NO_SLOT);
                slot[k as usize] = NO_SLOT;
            }
            Directory::Map(m) => {
                m.remove(&k);
            }
        }
    }

    pub(super) fn len(&self) -> usize {
        match self {
            Directory::Table { len, .. } => *len,
            Directory::Map(m) => m.len(),
        }
    }
}

impl RowCache {
    /// A cache of `capacity` rows of `dim` values for keys below `key_space`.
    pub fn new(capacity: usize, dim: usize, refresh: u64, key_space: u64) -> RowCache {
        let dir = Directory::new(key_space, capacity, dim);
        RowCache::with_directory(capacity, dim, refresh, dir)
    }

    fn with_directory(capacity: usize, dim: usize, refresh: u64, slot_of: Directory) -> RowCache {
        let mut c = RowCache {
            dim,
            cells: Arc::new(Vec::new()),
            acc: Arc::new(Vec::new()),
            acc_seed: 0.0,
            base: Vec::new(),
            slot_of,
            meta: Vec::new(),
            free: Vec::new(),
            due: VecDeque::new(),
            refresh: refresh.max(1),
            row: vec![0.0; dim],
        };
        c.grow(capacity);
        c
    }

    pub fn capacity(&self) -> usize {
        self.meta.len()
    }

    /// Rows held now.
    pub fn len(&self) -> usize {
        self.slot_of.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slot_of.len() == 0
    }

    /// Make room for `capacity` rows. Only while no pool task holds the cells (the trainer
    /// drains its batches first).
    pub fn grow(&mut self, capacity: usize) {
        let old = self.capacity();
        if capacity <= old {
            return;
        }
        let cells = Arc::get_mut(&mut self.cells)
            .expect("the cache grows only while no batch holds its rows");
        // Copies are read at random: on huge pages the TLB covers the cache.
        crate::comm::reserve_huge(cells, capacity * self.dim);
        cells.extend((0..(capacity - old) * self.dim).map(|_| AtomicU32::new(0)));
        Arc::get_mut(&mut self.acc)
            .expect("the cache grows only while no batch holds its rows")
            .extend((old..capacity).map(|_| AtomicU32::new(0)));
        crate::comm::reserve_huge(&mut self.base, capacity * self.dim);
        self.base.resize(capacity * self.dim, 0.0);
        self.meta.resize(capacity, FREE_SLOT);
        self.free.extend((old as u32..capacity as u32).rev());
    }

    /// Push the slot's delta (value now minus base) and make the value now its base.
    fn take_delta(&mut self, slot: u32, adm: &mut Admission) {
        let (d, s) = (self.dim, slot as usize);
        adm.push_keys.push(self.meta[s].key);
        let base = &mut self.base[s * d..(s + 1) * d];
        cells::load(Shared::F32(&self.cells[s * d..(s + 1) * d]), &mut self.row);
        // One pass: the delta out, the value now its base.
        adm.push_vals
            .extend(self.row.iter().zip(base.iter_mut()).map(|(&now, b)| {
                let delta = now - *b;
                *b = now;
                delta
            }));
        adm.push_refs
            .push(self.meta[s].refs.min(u32::from(u16::MAX)) as u16);
        self.meta[s].refs = 0;
        self.meta[s].due_at = CLEAN;
    }

    fn schedule(&mut self, slot: u32, step: u64) {
        let at = step + AGE * self.refresh;
        self.meta[slot as usize].due_at = at;
        self.due.push_back((at, slot));
    }

    /// Slots for a batch's remote `keys` (distinct), each referenced `refs[i]` times by the
    /// batch's updates, at `step`, whose pool batches still running
    /// started at `oldest_pending` or later (their slots are not evicted). Returns false when
    /// the cache lacks room even after evicting every row no running batch uses: the caller
    /// drains its batches and calls again, or grows the cache. Deltas of evicted rows stay in
    /// `adm` either way (it is cleared by the caller, once per step).
    pub fn admit(
        &mut self,
        keys: &[u64],
        refs: &[u32],
        step: u64,
        oldest_pending: u64,
        adm: &mut Admission,
    ) -> bool {
        debug_assert_eq!(keys.len(), refs.len());
        adm.slots.clear();
        adm.fetch.clear();
        let mut misses = 0;
        // The slots found here (NO_SLOT for a miss) are reused below: one lookup per key.
        for &k in keys {
            match self.slot_of.get(k) {
                Some(s) => {
                    self.meta[s as usize].used = step;
                    adm.slots.push(s);
                }
                None => {
                    misses += 1;
                    adm.slots.push(NO_SLOT);
                }
            }
        }
        if misses > self.free.len() {
            self.evict(misses - self.free.len(), step.min(oldest_pending), adm);
            if misses > self.free.len() {
                return false;
            }
        }
        for (i, &k) in keys.iter().enumerate() {
            // The batch's copies are far apart in memory: ask for them ahead (the kernel trains
            // them next; prefetching only the refreshed rows was 0.92x at 8 simulated nodes),
            // and for the bases of those a refresh takes deltas of now.
            if let Some(&s) = adm.slots.get(i + AHEAD).filter(|&&s| s != NO_SLOT) {
                self.prefetch_for_use(s, step);
            }
            let slot = match Some(adm.slots[i]).filter(|&s| s != NO_SLOT) {
                Some(s) => {
                    let si = s as usize;
                    let old = self.read_due(si, step);
                    self.meta[si].touches += 1;
                    // A row whose read is under way is as fresh as it will get.
                    if old && !self.meta[si].awaiting {
                        // Too old to read: push what it learnt, read it again.
                        if self.meta[si].due_at != CLEAN {
                            self.take_delta(s, adm);
                        }
                        adm.fetch.push((s, k, false));
                        self.meta[si].awaiting = true;
                        self.meta[si].fetched = step;
                        self.meta[si].touches = 1;
                        adm.refreshes += 1;
                    } else {
                        adm.hits += 1;
                    }
                    s
                }
                None => {
                    let s = self.free.pop().expect("room was made above");
                    let si = s as usize;
                    self.slot_of.insert(k, s);
                    self.meta[si].key = k;
                    self.meta[si].fetched = step;
                    self.meta[si].touches = 1;
                    self.meta[si].uses = 0;
                    self.meta[si].refs = 0;
                    self.meta[si].awaiting = true;
                    adm.fetch.push((s, k, true));
                    adm.misses += 1;
                    s
                }
            };
            let si = slot as usize;
            self.meta[si].used = step;
            self.meta[si].uses = self.meta[si].uses.saturating_add(1);
            self.meta[si].refs = self.meta[si].refs.saturating_add(refs[i]);
            if self.meta[si].due_at == CLEAN {
                self.schedule(slot, step);
            }
            adm.slots[i] = slot;
        }
        // Deltas that have waited `AGE * refresh` steps go out even if their rows are not used.
        while let Some(&(at, s)) = self.due.front() {
            if at > step {
                break;
            }
            if let Some(&(_, next)) = self.due.get(AHEAD) {
                self.prefetch(next);
            }
            self.due.pop_front();
            let si = s as usize;
            if self.meta[si].due_at != at || self.meta[si].key == EMPTY {
                continue;
            }
            self.take_delta(s, adm);
            // A batch still on the pool may add to it after this: push the rest later.
            if self.meta[si].used >= oldest_pending.min(step) {
                self.schedule(s, step);
            }
        }
        true
    }

    /// Free at least `need` slots (and an eighth of the cache, so that evictions come in
    /// rounds) among rows no batch from step `pinned` on uses, least used first; their deltas
    /// go out with this step's exchange.
    fn evict(&mut self, need: usize, pinned: u64, adm: &mut Admission) {
        let mut cand: Vec<u32> = (0..self.capacity() as u32)
            .filter(|&s| {
                let s = s as usize;
                self.meta[s].key != EMPTY && self.meta[s].used < pinned && !self.meta[s].awaiting
            })
            .collect();
        let n = need.max(self.capacity() / 8).min(cand.len());
        if n == 0 {
            return;
        }
        if n < cand.len() {
            cand.select_nth_unstable_by_key(n - 1, |&s| self.meta[s as usize].uses);
        }
        for (j, &s) in cand[..n].iter().enumerate() {
            if let Some(&next) = cand[..n].get(j + AHEAD) {
                self.prefetch(next);
            }
            let si = s as usize;
            if self.meta[si].due_at != CLEAN {
                self.take_delta(s, adm);
            }
            self.slot_of.remove(self.meta[si].key);
            self.meta[si].key = EMPTY;
            self.free.push(s);
        }
        for m in &mut self.meta {
            m.uses /= 2;
        }
        adm.evictions += n as u64;
    }

    /// Whether the next use of slot `s`, at `step`, re-reads its row: its copy has been used
    /// `--cache-refresh` times since its read, or the read is `AGE` clocks old.
    fn read_due(&self, s: usize, step: u64) -> bool {
        let m = &self.meta[s];
        m.touches >= self.refresh as u32 || step - m.fetched >= AGE * self.refresh
    }

    /// Hint the CPU to bring in what using `slot` at `step` reads: its copy (the kernel trains
    /// it next), and its base only if the use re-reads it and takes its delta (as `admit`
    /// decides). Bases of hits are not read.
    fn prefetch_for_use(&self, slot: u32, step: u64) {
        let (d, s) = (self.dim, slot as usize);
        cells::prefetch(Shared::F32(&self.cells[s * d..(s + 1) * d]));
        let m = &self.meta[s];
        if self.read_due(s, step) && !m.awaiting && m.due_at != CLEAN {
            crate::store::prefetch_range(self.base[s * d..].as_ptr().cast(), d * 4);
        }
    }

    /// Hint the CPU to bring the slot's copy and base into cache (values unchanged).
    pub fn prefetch(&self, slot: u32) {
        let (d, s) = (self.dim, slot as usize);
        cells::prefetch(Shared::F32(&self.cells[s * d..(s + 1) * d]));
        crate::store::prefetch_range(self.base[s * d..].as_ptr().cast(), d * 4);
    }

    /// Install a row read from its owner into `slot`: a new slot takes it as it is; a refreshed
    /// slot keeps what its batches added since its delta was taken (value += fresh - base).
    pub fn install(&mut self, slot: u32, fresh: &[f32], new: bool) {
        let (d, s) = (self.dim, slot as usize);
        let cells = Shared::F32(&self.cells[s * d..(s + 1) * d]);
        let base = &mut self.base[s * d..(s + 1) * d];
        if new {
            cells::store(cells, fresh);
            self.acc[s].store(
                self.acc_seed.to_bits(),
                std::sync::atomic::Ordering::Relaxed,
            );
        } else {
            for ((r, b), f) in self.row.iter_mut().zip(base.iter()).zip(fresh) {
                *r = f - b;
            }
            cells::add_to(cells, &self.row);
        }
        base.copy_from_slice(fresh);
        self.meta[s].awaiting = false;
    }

    /// Every delta not yet pushed (end of training, checkpoints: after the pool has drained).
    pub fn flush(&mut self, adm: &mut Admission) {
        adm.clear();
        for s in 0..self.capacity() as u32 {
            if self.meta[s as usize].key != EMPTY && self.meta[s as usize].due_at != CLEAN {
                self.take_delta(s, adm);
            }
        }
        self.due.clear();
    }

    /// Bytes of the cache's copies and their bases.
    pub fn bytes(capacity: usize, dim: usize) -> u64 {
        (capacity * dim * 8) as u64
    }

    /// Bytes of a full cache for keys below `key_space`: its copies, their bases and its
    /// directory (a table of 4 bytes per key, or a hash map of about 20 bytes per row).
    pub fn footprint(capacity: usize, dim: usize, key_space: u64) -> u64 {
        let copies = RowCache::bytes(capacity, dim);
        copies
            + if capacity == 0 {
                0
            } else if Directory::table_fits(key_space, capacity, dim) {
                key_space * 4
            } else {
                capacity as u64 * 20
            }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;

    fn set(c: &RowCache, slot: u32, v: f32) {
        let d = c.dim;
        for x in &c.cells[slot as usize * d..(slot as usize + 1) * d] {
            x.store(v.to_bits(), Relaxed);
        }
    }

    /// The same cache with each kind of directory (keys below `key_space`).
    fn both(capacity: usize, dim: usize, refresh: u64, key_space: u64) -> [RowCache; 2] {
        let map = Directory::Map(FxHashMap::default());
        let table = Directory::table(key_space);
        [map, table].map(|d| RowCache::with_directory(capacity, dim, refresh, d))
    }

    #[test]
    fn the_directory_is_a_table_while_the_key_space_is_small_next_to_the_cache() {
        // 10 312 rows of d 128 (BlogCatalog at 2 simulated nodes): 80 KiB of table.
        let c = RowCache::new(10_312, 128, 8, 20_624);
        assert!(matches!(c.slot_of, Directory::Table { .. }));
        let copies = RowCache::bytes(10_312, 128);
        assert_eq!(
            RowCache::footprint(10_312, 128, 20_624),
            copies + 4 * 20_624
        );
        // A billion nodes over 80 ranks (a cache smaller than a rank's own rows here): a map.
        let c = RowCache::new(1_000, 128, 8, 2_000_000_000);
        assert!(matches!(c.slot_of, Directory::Map(_)));
        let copies = RowCache::bytes(1_000, 128);
        assert_eq!(
            RowCache::footprint(1_000, 128, 2_000_000_000),
            copies + 20_000
        );
        assert_eq!(RowCache::footprint(0, 128, 2_000_000_000), 0);
    }

    #[test]
    fn hits_refreshes_and_deltas() {
        for c in both(4, 2, 3, 16) {
            hits_refreshes_and_deltas_with(c);
        }
    }

    fn hits_refreshes_and_deltas_with(mut c: RowCache) {
        let mut a = Admission::default();
        let admit = |c: &mut RowCache, keys: &[u64], step, oldest, a: &mut Admission| {
            a.clear();
            c.admit(keys, &vec![1; keys.len()], step, oldest, a)
        };
        assert!(admit(&mut c, &[10, 12], 1, 1, &mut a));
        assert_eq!((a.misses, a.hits, a.fetch.len()), (2, 0, 2));
        for &(s, _, new) in &a.fetch.clone() {
            assert!(new);
            c.install(s, &[1.0, 1.0], true);
        }
        let s10 = a.slots[0];
        set(&c, s10, 1.5); // the pool trained it
                           // Steps 2 and 3: hits, nothing to fetch or push.
        for step in [2, 3] {
            assert!(admit(&mut c, &[10], step, step, &mut a));
            assert_eq!((a.hits, a.fetch.len(), a.push_keys.len()), (1, 0, 0));
        }
        // Step 4: the fourth batch since its read uses row 10: its delta (0.5) is pushed and
        // it is read again.
        assert!(admit(&mut c, &[10], 4, 4, &mut a));
        assert_eq!(a.refreshes, 1);
        assert_eq!(a.fetch, vec![(s10, 10, false)]);
        assert_eq!(a.push_keys, vec![10]);
        assert_eq!(&a.push_vals, &[0.5, 0.5]);
        // The owner holds 1.5 + another rank's 0.25; the pool added 0.125 since the delta left.
        set(&c, s10, 1.625);
        c.install(s10, &[1.75, 1.75], false);
        let v = f32::from_bits(c.cells[s10 as usize * 2].load(Relaxed));
        assert_eq!(v, 1.875);
        // Row 12, unused since step 1, has its (zero) delta pushed AGE * 3 steps later, and is
        // read again when next used.
        assert!(admit(&mut c, &[10], 1 + AGE * 3 - 1, 5, &mut a));
        assert!(!a.push_keys.contains(&12));
        assert!(admit(&mut c, &[10], 1 + AGE * 3, 5, &mut a));
        assert!(a.push_keys.contains(&12));
        assert!(admit(&mut c, &[12], 1 + AGE * 3 + 1, 5, &mut a));
        assert_eq!(a.fetch.len(), 1);
        assert_eq!(a.refreshes, 1);
        // Flush pushes exactly what row 10 learnt since its last push (0.125).
        c.flush(&mut a);
        let i = a.push_keys.iter().position(|&k| k == 10).unwrap();
        assert_eq!(&a.push_vals[2 * i..2 * i + 2], &[0.125, 0.125]);
    }

    #[test]
    fn full_cache_evicts_least_used_unpinned_rows_with_their_deltas() {
        for c in both(2, 1, 100, 8) {
            full_cache_evicts_with(c);
        }
    }

    fn full_cache_evicts_with(mut c: RowCache) {
        let mut a = Admission::default();
        assert!(c.admit(&[1, 2], &[1; 2], 1, 1, &mut a));
        // A row whose read is under way is never evicted: the reads arrive first.
        for &(slot, _, new) in &a.fetch.clone() {
            c.install(slot, &[0.0], new);
        }
        let s1 = a.slots[0];
        set(&c, s1, 2.0);
        a.clear();
        assert!(c.admit(&[2], &[1; 1], 2, 2, &mut a));
        // Step 3 needs a third row: row 1 (used once, at step 1) goes, with its delta 2.0.
        a.clear();
        assert!(c.admit(&[2, 3], &[1; 2], 3, 3, &mut a));
        assert_eq!(a.evictions, 1);
        assert_eq!(a.push_keys, vec![1]);
        assert_eq!(a.push_vals, vec![2.0]);
        assert_eq!(a.slots[1], s1);
        c.install(s1, &[0.0], true);
        // Rows used by a batch still running (from step 3) are never evicted: no room.
        a.clear();
        assert!(!c.admit(&[4, 5], &[1; 2], 4, 3, &mut a));
        c.grow(4);
        assert!(c.admit(&[4, 5], &[1; 2], 4, 3, &mut a));
        assert_eq!(c.len(), 4);
    }

    #[test]
    fn copies_far_from_their_target_add_and_copies_that_reached_it_average() {
        let mut c = Combine::with_stiffness(2, 1.0);
        // Row (0, 4), norm^2 1: three copies of 1000 updates at rate 0.1 each reached their
        // target: their mean (to within e^-100).
        c.add((0, 4), &[1.0, 2.0], 1000);
        c.add((1, 4), &[5.0, 5.0], 100_000);
        c.add((0, 4), &[3.0, -2.0], 1000);
        c.add((0, 4), &[2.0, 3.0], 1000);
        // Row (1, 6), norm^2 0: no curvature, the whole sum.
        c.add((1, 6), &[1.0, 1.0], 3);
        c.add((1, 6), &[2.0, 0.0], 3);
        // Row (0, 8), norm^2 1: two copies of 5 updates: c(10) / 2 c(5) = (1 + e^-0.5) / 2.
        c.add((0, 8), &[3.0, 3.0], 5);
        c.add((0, 8), &[3.0, 0.0], 5);
        let norm2 = |row: (usize, usize)| if row == (1, 6) { 0.0 } else { 1.0 };
        let mut got = Vec::new();
        let scaled = c.drain(
            0.1,
            norm2,
            |row, d, k| got.push((row, d.to_vec(), k)),
            |_| {},
        );
        let f = (1.0 + (-0.5f32).exp()) / 2.0;
        let want = [
            ((0, 4), [2.0, 1.0], 3),
            ((1, 4), [5.0, 5.0], 1),
            ((1, 6), [3.0, 1.0], 2),
            ((0, 8), [6.0 * f, 3.0 * f], 2),
        ];
        assert_eq!(got.len(), want.len());
        for ((row, d, k), (wrow, wd, wk)) in got.iter().zip(want) {
            assert_eq!((*row, *k), (wrow, wk));
            for (x, y) in d.iter().zip(wd) {
                assert!((x - y).abs() < 1e-5, "{row:?}: {d:?} against {wd:?}");
            }
        }
        // Only row (0, 4) went below half its sum (f is 0.80 for row (0, 8)).
        assert_eq!(scaled, 3);
        // The next exchange starts afresh: no row carries its updates over.
        c.add((0, 4), &[1.0, 1.0], 1);
        let mut got = Vec::new();
        assert_eq!(
            c.drain(
                0.1,
                norm2,
                |row, d, k| got.push((row, d.to_vec(), k)),
                |_| {}
            ),
            0
        );
        assert_eq!(got, vec![((0, 4), vec![1.0, 1.0], 1)]);
    }

    #[test]
    fn update_counts_ride_in_the_row_head_within_a_few_percent() {
        for max_rows in [
            1usize,
            1000,
            (1 << 23) - 1,
            1 << 23,
            100_000_000,
            (1 << 31) - 1,
        ] {
            let c = UpdateCode::new(max_rows);
            for row in [0u32, (max_rows - 1) as u32] {
                for m in [0u32, 1] {
                    for n in [1u16, 2, 7, 64, 1000, u16::MAX] {
                        let head = (m << 31) | row;
                        let (dhead, dn) = c.decode(c.encode(head, n));
                        assert_eq!(dhead, head, "{max_rows} rows: {n}");
                        if c.bits == 0 {
                            assert_eq!(dn, 1);
                        } else {
                            // Half a step of the log scale, at most.
                            let tol = (0.5 / c.steps_per_doubling()).exp2();
                            let r = f64::from(dn) / f64::from(n);
                            assert!(
                                r <= tol * 1.001 + 0.5 / f64::from(n)
                                    && r >= 1.0 / tol / 1.001 - 0.5 / f64::from(n),
                                "{max_rows} rows, {n} updates read as {dn}"
                            );
                        }
                    }
                }
            }
        }
        assert_eq!(UpdateCode::new((1 << 23) - 1).bits, 8);
        assert_eq!(UpdateCode::new((1 << 31) - 1).bits, 0);
    }

    /// Random batches against owners that add every pushed delta: whatever the capacity,
    /// refresh period and evictions, no update is lost (single-threaded, so nothing races), and
    /// a refreshed copy holds its owner's value plus what was learnt since.
    #[test]
    fn no_update_is_lost_through_refreshes_and_evictions() {
        use rand::{RngExt, SeedableRng};
        for (capacity, refresh, seed) in [(8, 1, 1), (8, 3, 2), (40, 5, 3), (200, 16, 4), (3, 2, 5)]
        {
            let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(seed);
            let keys = 100u64;
            let mut owner = vec![0f32; keys as usize];
            let mut added = vec![0f32; keys as usize];
            let [mut c, mut t] = both(capacity, 1, refresh, keys);
            let (mut a, mut at) = (Admission::default(), Admission::default());
            for step in 1..300u64 {
                let mut batch: Vec<u64> = (0..rng.random_range(1..=capacity.min(12) as u64))
                    .map(|_| {
                        // Skewed: low keys are hot.
                        let x: f64 = rng.random();
                        (x * x * keys as f64) as u64
                    })
                    .collect();
                batch.sort_unstable();
                batch.dedup();
                a.clear();
                assert!(
                    c.admit(&batch, &vec![1; batch.len()], step, step, &mut a),
                    "step {step}"
                );
                // A table for a directory admits exactly as the map does.
                at.clear();
                assert!(t.admit(&batch, &vec![1; batch.len()], step, step, &mut at));
                assert_eq!(
                    (&a.slots, &a.fetch, &a.push_keys),
                    (&at.slots, &at.fetch, &at.push_keys)
                );
                assert_eq!((c.len(), a.evictions), (t.len(), at.evictions));
                for &(slot, _, new) in &at.fetch.clone() {
                    t.install(slot, &[0.0], new);
                }
                for (i, &k) in a.push_keys.iter().enumerate() {
                    owner[k as usize] += a.push_vals[i];
                }
                for &(slot, k, new) in &a.fetch.clone() {
                    c.install(slot, &[owner[k as usize]], new);
                }
                // The "pool": every row of the batch learns 1.
                for (&k, &slot) in batch.iter().zip(&a.slots) {
                    let cell = &c.cells[slot as usize];
                    cell.store(
                        (f32::from_bits(cell.load(Relaxed)) + 1.0).to_bits(),
                        Relaxed,
                    );
                    added[k as usize] += 1.0;
                }
            }
            c.flush(&mut a);
            for (i, &k) in a.push_keys.iter().enumerate() {
                owner[k as usize] += a.push_vals[i];
            }
            assert_eq!(owner, added, "capacity {capacity}, refresh {refresh}");
        }
    }
}
