//! One collective step: the negative pool's refresh, the step's dispatch to its strategy, and the
//! batched path (`--update batched`): plan, fetch, launch, and finish (push gradients to their
//! owners, who apply the optimizer).

use super::*;

/// Read the remote rows `remote[owner] = [(slot, row)]` of `shard` one-sidedly into
/// `rows[slot]` as f32. Returns the number of rows read (the caller counts their bytes in
/// `fetch_bytes` and `one_sided_bytes`).
pub(super) fn fetch_remote(
    comm: &Comm,
    cfg: &TrainConfig,
    shard: &Shard,
    remote: &[Vec<(u32, u32)>],
    rows: &mut [f32],
) -> usize {
    let (rb, dim, dtype) = (shard.row_bytes(), shard.dim, shard.dtype);
    shard.window.get_tagged(
        comm.watchdog(),
        remote,
        rb,
        cfg.request_batch_size,
        |s, bytes| {
            let s = s as usize;
            decode_row(dtype, bytes, &mut rows[s * dim..(s + 1) * dim]);
        },
    )
}

impl<M: model::Model> Trainer<'_, M> {
    /// One collective step over this rank's `pairs` (center, context).
    pub fn train_step(&mut self, pairs: &[(NodeId, NodeId)], lr: f32) {
        self.train(Work::Pairs(pairs), lr);
    }

    /// One collective step over this rank's pairs or walk segments (segments need hogwild).
    pub(super) fn train(&mut self, work: Work, lr: f32) {
        self.begin_step();
        match self.path {
            StepPath::Replicated => self.replicated_step(work, lr),
            StepPath::InPlace => self.hogwild_step(work, lr),
            StepPath::Batched => self.batched_step(work, lr),
        }
    }

    /// A step's start: the negative pool's turn, the step's count and the metrics' sample, and
    /// the `--inject-fault` hook.
    fn begin_step(&mut self) {
        let comm = self.comm;
        if self.step.is_multiple_of(self.pool_every) || self.next_pool.is_none() {
            // Split phase: the pool drawn `pool_every` steps ago is installed and the next one
            // posted, so ranks a few steps apart never wait here. Without one under way (the
            // first step, after a resume or a drain) the pool is drawn on the spot.
            let t = Timer::start();
            match self.next_pool.take() {
                Some(p) => self.install_pool(p),
                None => {
                    let p = self.post_pool();
                    self.install_pool(p);
                    self.finish_pool();
                }
            }
            self.next_pool = Some(self.post_pool());
            self.m.seconds.sample += t.secs();
        }
        self.step += 1;
        crate::comm::STEP.store(self.step, std::sync::atomic::Ordering::Relaxed);
        let sent = comm
            .traffic()
            .sent
            .load(std::sync::atomic::Ordering::Relaxed);
        self.m.sample(
            self.t0.elapsed().as_secs_f64(),
            sent + self.m.one_sided_bytes,
        );
        self.maybe_fail();
    }

    /// The batched path (`--update batched`, or hogwild without rows in place): plan the
    /// batch's distinct rows, read them (local rows decoded, remote rows one-sidedly), compute
    /// on the pool, and push the gradients to their owners, who apply the optimizer.
    fn batched_step(&mut self, work: Work, lr: f32) {
        let (comm, g) = (self.comm, self.g);
        // Plan: unique rows of the batch, keyed (node, matrix).
        let t = Timer::start();
        let me = comm.rank();
        self.stamp += 1;
        let stamp = self.stamp;
        let part = &g.part;
        let (local_slot, remote_slot) = (&mut self.local_slot, &mut self.remote_slot);
        let mut keys: Vec<u64> = Vec::new();
        // Local rows are found through a stamped array (no hashing); remote rows through a map.
        let mut slot = |key: u64| -> u32 {
            let (owner, row) = part.locate(key >> 1);
            if owner == me {
                let e = &mut local_slot[(key & 1) as usize][row];
                if e.0 != stamp {
                    *e = (stamp, keys.len() as u32);
                    keys.push(key);
                }
                e.1
            } else {
                remote_slot.get_or_insert(key, || {
                    keys.push(key);
                    (keys.len() - 1) as u32
                })
            }
        };
        let plan = self.model.plan(work, &self.neg, &mut self.rng, &mut slot);
        self.remote_slot.clear(&keys);
        self.m.seconds.sample += t.secs();

        let rows = self.fetch_rows(&keys);
        let batch = Batch { keys, plan, rows };
        let pending = self.launch(batch);
        if self.cfg.max_staleness == 0 {
            self.finish(pending, lr);
        } else {
            // Compute of this batch runs on the pool while the next batch is sampled and
            // fetched; its push and apply happen after that fetch (staleness 1).
            self.pending.push_back(pending);
            if self.pending.len() > 1 {
                let prev = self.pending.pop_front().expect("two pending");
                self.finish(prev, lr);
            }
        }
    }

    /// The rows of a batch's `keys`, in slot order: local rows decoded from this rank's shards,
    /// remote rows read one-sidedly from their owners, grouped by matrix and owner.
    fn fetch_rows(&mut self, keys: &[u64]) -> Vec<f32> {
        let (comm, g, cfg) = (self.comm, self.g, self.cfg);
        let (me, dim) = (comm.rank(), cfg.dim);
        // Fetch: local rows directly, remote rows one-sidedly, grouped by matrix and owner.
        let t = Timer::start();
        let nslots = keys.len();
        let mut rows = vec![0f32; nslots * dim];
        let mut remote: Vec<Vec<Vec<(u32, u32)>>> =
            vec![vec![Vec::new(); comm.size()]; self.shards.len()];
        let mut local: Vec<Vec<(u32, u32)>> = vec![Vec::new(); self.shards.len()];
        for (s, &key) in keys.iter().enumerate() {
            let (owner, row) = g.part.locate(key >> 1);
            let m = (key & 1) as usize;
            if owner == me {
                local[m].push((s as u32, row as u32));
            } else {
                remote[m][owner].push((s as u32, row as u32));
            }
        }
        for (m, shard) in self.shards.iter().enumerate() {
            let rb = shard.row_bytes();
            let parallel = cfg.max_staleness == 0;
            let dtype = shard.dtype;
            shard.window.with_local(|bytes| {
                if parallel && local[m].len() >= 1024 {
                    // The pool is idle: decode the local rows in parallel, slot by slot.
                    use rayon::prelude::*;
                    let mut src = vec![u32::MAX; nslots];
                    for &(s, r) in &local[m] {
                        src[s as usize] = r;
                    }
                    self.pool.install(|| {
                        rows.par_chunks_mut(dim)
                            .zip(src.par_iter())
                            .with_min_len(256)
                            .for_each(|(out, &r)| {
                                if r != u32::MAX {
                                    let r = r as usize;
                                    decode_row(dtype, &bytes[r * rb..(r + 1) * rb], out);
                                }
                            });
                    });
                    return;
                }
                for &(s, r) in &local[m] {
                    let (s, r) = (s as usize, r as usize);
                    decode_row(
                        shard.dtype,
                        &bytes[r * rb..(r + 1) * rb],
                        &mut rows[s * dim..(s + 1) * dim],
                    );
                }
            });
            self.m.local_rows += local[m].len() as u64;
            let count = fetch_remote(comm, cfg, shard, &remote[m], &mut rows);
            self.m.remote_rows += count as u64;
            self.m.fetch_bytes += (count * shard.row_bytes()) as u64;
            self.m.one_sided_bytes += (count * shard.row_bytes()) as u64;
        }
        self.m.seconds.fetch += t.secs();
        rows
    }

    /// Follow the loss per term; say so once if it climbs far past its lowest (the run is
    /// training badly: diverging, or its rows' copies too stale).
    pub(super) fn watch_loss(&mut self, loss: f64, terms: u64) {
        if let Some((now, best)) =
            self.loss_watch
                .add(loss, terms, self.m.pairs, &mut self.m.loss_curve)
        {
            log::warn!(
                "rank {}: step {}: loss per term {now:.3}, up from {best:.3}: the run is training badly (diverging, or copies of rows too stale); lower --lr or --cache-refresh (docs/troubleshooting.md)",
                self.comm.rank(),
                self.step
            );
        }
    }

    /// Collective: this rank's share of the next negative pool starts on its way to every rank
    /// (the pool in use stays until [`Trainer::install_pool`]). Every rank posts and installs
    /// in the same order.
    pub(super) fn post_pool(&mut self) -> Posted {
        let share = encode_ids(&self.neg.draw_share(&mut self.rng), self.narrow_ids());
        self.comm.post(Channel::Pool, vec![share; self.comm.size()])
    }

    /// The pool every rank's posted shares make, the same on every rank. This rank's own sends
    /// are waited for at the next install (or [`Trainer::finish_pool`]), when every rank has
    /// long received them.
    pub(super) fn install_pool(&mut self, mut posted: Posted) {
        let shares = self.comm.receive(&mut posted);
        let narrow = self.narrow_ids();
        self.neg
            .install(shares.iter().map(|b| decode_ids(b, narrow)));
        self.finish_pool();
        self.pool_sending = Some(posted);
    }

    /// Whether node ids travel in 4 bytes (graphs of fewer than 2^32 nodes).
    pub(super) fn narrow_ids(&self) -> bool {
        self.g.num_nodes() <= u64::from(u32::MAX)
    }

    /// Wait for this rank's shares of the installed pool to leave (before the job's end).
    pub(super) fn finish_pool(&mut self) {
        if let Some(p) = self.pool_sending.take() {
            self.comm.complete(p);
        }
    }

    /// Apply the batch still in flight, if any (end of training).
    /// Collective when rows are node-shared: returns when no rank of the node updates rows.
    pub fn drain(&mut self, lr: f32) {
        if let Some(p) = self.next_pool.take() {
            self.install_pool(p);
        }
        self.finish_pool();
        if self.path == StepPath::Replicated {
            self.replica_drain();
            return;
        }
        self.settle(lr);
        if let Some(cache) = &mut self.cache {
            // Owners get every cached delta (the output and checkpoints hold them).
            let mut adm = std::mem::take(&mut self.adm);
            cache.flush(&mut adm);
            let carry = self.carry.take();
            self.exchange(&adm);
            self.carry = carry;
            self.adm = adm;
            // Collect it (split-phase exchanges).
            self.settle(lr);
        }
        if self.node_rows {
            self.comm.barrier();
        }
    }

    /// Start computing a batch's gradients on the pool; returns at once.
    pub(super) fn launch(&self, b: Batch<M::Plan>) -> Pending {
        let dim = self.cfg.dim;
        let (tx, rx) = std::sync::mpsc::channel();
        let (pairs, terms) = (b.plan.examples(), b.plan.loss_terms());
        let Batch { keys, plan, rows } = b;
        self.submit(move || {
            let t = Timer::start();
            let g = plan.gradients(&rows, dim);
            // The receiver only disappears if the rank is already failing.
            let _ = tx.send((g.rows, g.replicated, g.loss, t.secs()));
        });
        Pending {
            keys,
            pairs,
            terms,
            rx,
            step: self.step,
            cached: false,
        }
    }

    /// Wait for a launched batch, check it, push its gradients and apply them.
    pub(super) fn finish(&mut self, p: Pending, lr: f32) {
        let (comm, g, dim) = (self.comm, self.g, self.cfg.dim);
        let me = comm.rank();
        let t = Timer::start();
        let Ok((grads, replicated, loss, compute_secs)) = p.rx.recv() else {
            fatal(
                comm,
                Some(self.step),
                &"a compute task ended without a result",
            );
        };
        self.m.seconds.wait += t.secs();
        self.m.seconds.compute += compute_secs;
        if p.cached {
            if !loss.is_finite() {
                fatal(comm, Some(self.step), &"non-finite loss; lower --lr");
            }
            self.m.loss_sum += loss;
            self.m.loss_terms += p.terms;
            self.m.pairs += p.pairs as u64;
            self.m.steps += 1;
            self.watch_loss(loss, p.terms);
            return;
        }
        let mut grads = grads;
        let (keys, finite) = self.screen(p.keys, &mut grads, loss, p.terms, p.pairs);
        // Push: gradient rows to their owners in one exchange; local rows applied directly.
        // Batched gradients travel in --wire-dtype (f32, or bf16: f32's range); whatever
        // hogwild pushes through here, in f32.
        let wire = if self.cfg.update == Update::Batched {
            self.cfg.wire_dtype
        } else {
            WireDtype::F32
        };
        let wb = wire.row_bytes(dim);
        let t = Timer::start();
        let mut send = vec![Vec::new(); comm.size()];
        let mut mine: Vec<Vec<(u32, u32)>> = vec![Vec::new(); self.shards.len()];
        for (s, &key) in keys.iter().enumerate() {
            let (owner, row) = g.part.locate(key >> 1);
            let m = (key & 1) as usize;
            if owner == me {
                mine[m].push((row as u32, s as u32));
            } else {
                let out = wire::push_record(&mut send[owner], wire::head(row as u32, m), wb);
                encode_wire(wire, &grads[s * dim..(s + 1) * dim], out, None);
            }
        }
        self.m.push_bytes_sent += send.iter().map(|b| b.len() as u64).sum::<u64>();
        // Hogwild on one node with node-shared rows: every row was updated in place.
        let recv = if self.shared.as_ref().is_some_and(|s| s[VERTEX].all()) {
            vec![Vec::new(); comm.size()]
        } else {
            comm.all_to_all_v(send)
        };
        self.m.push_bytes_received += recv.iter().map(|b| b.len() as u64).sum::<u64>();
        self.m.seconds.push += t.secs();

        let t = Timer::start();
        let theirs = self.decode_gradients(&recv, wire);
        if let Some(in_place) = &self.shared {
            // Hogwild: this node's rows were updated in place; received rows are deltas, added
            // as the pool adds (relaxed atomics: the node's other ranks may update them now).
            for (m, rows) in in_place.iter().enumerate() {
                let first = rows.first_row[me].expect("a rank's own rows are in place") as usize;
                // SAFETY: the shards outlive this call, and nothing takes `&mut` access to their
                // windows while cells are in use (rows are applied, snapshot or dropped only
                // after `drain`). Pool tasks may be updating other rows meanwhile: these are
                // relaxed atomic accesses, as theirs are.
                let cells = unsafe { rows.cells.cells() };
                for (&r, d) in theirs[m].0.iter().zip(theirs[m].1.chunks_exact(dim)) {
                    cells::add_to(cells.row(first + r as usize, dim), d);
                }
            }
            self.m.seconds.apply += t.secs();
            self.m.steps += 1;
            return;
        }
        let parallel = self.cfg.max_staleness == 0;
        for (m, shard) in self.shards.iter_mut().enumerate() {
            let local = mine[m]
                .iter()
                .map(|&(r, s)| (r, &grads[s as usize * dim..(s as usize + 1) * dim]));
            let remote = theirs[m]
                .0
                .iter()
                .copied()
                .zip(theirs[m].1.chunks_exact(dim));
            if parallel {
                // The pool is idle between batches: rows are updated in parallel.
                shard.apply_par(&self.pool, &self.opt, lr, local.chain(remote).collect());
            } else {
                // The pool computes the next batch meanwhile: apply on this thread.
                shard.apply(&self.opt, lr, local.chain(remote));
            }
        }
        self.m.seconds.apply += t.secs();
        // Parameters every rank holds whole (relations): their gradients summed over the ranks
        // (collective; a skipped batch adds zeros), then the same update everywhere.
        let n = self.model.replicated_len();
        if n > 0 {
            let t = Timer::start();
            let mut sum = if finite && replicated.len() == n {
                replicated
            } else {
                vec![0f32; n]
            };
            comm.all_reduce_sum_f32(&mut sum);
            self.m.seconds.push += t.secs();
            let t = Timer::start();
            self.model.apply_replicated(&sum, lr);
            self.m.seconds.apply += t.secs();
        }
        self.m.steps += 1;
    }

    /// A finished batch's check: a non-finite loss or gradient aborts the job (naming up to 5
    /// of its rows) or, with `--on-nan skip`, drops the batch (its keys: none to push);
    /// `--clip-grad` clips the rows' gradients; the loss is counted. Returns the keys to push
    /// and whether the batch was finite.
    fn screen(
        &mut self,
        keys: Vec<u64>,
        grads: &mut [f32],
        loss: f64,
        terms: u64,
        pairs: usize,
    ) -> (Vec<u64>, bool) {
        let (comm, me, dim) = (self.comm, self.comm.rank(), self.cfg.dim);
        let nslots = keys.len();
        let finite = loss.is_finite() && grads.iter().all(|x| x.is_finite());
        if !finite && self.cfg.on_nan == OnNan::Abort {
            let bad: Vec<u64> = (0..nslots)
                .filter(|&s| grads[s * dim..(s + 1) * dim].iter().any(|x| !x.is_finite()))
                .take(5)
                .map(|s| keys[s] >> 1)
                .collect();
            fatal(
                comm,
                Some(self.step),
                &format!(
                    "non-finite loss or gradient{}; lower --lr, use --optimizer adagrad or --clip-grad, or --on-nan skip to drop such batches",
                    if bad.is_empty() {
                        String::new()
                    } else {
                        format!(" (rows of nodes {bad:?})")
                    }
                ),
            );
        }
        // --on-nan skip: drop the whole batch (it still takes part in the exchange).
        let keys = if finite {
            keys
        } else {
            self.m.skipped_batches += 1;
            log::warn!("rank {me}: step {}: non-finite batch skipped", self.step);
            Vec::new()
        };
        if self.cfg.clip_grad > 0.0 {
            let c = self.cfg.clip_grad;
            for g in grads.chunks_exact_mut(dim) {
                let norm = g.iter().map(|x| x * x).sum::<f32>().sqrt();
                if norm > c {
                    g.iter_mut().for_each(|x| *x *= c / norm);
                }
            }
        }
        if finite {
            self.m.loss_sum += loss;
            self.m.loss_terms += terms;
            self.m.pairs += pairs as u64;
            self.watch_loss(loss, terms);
        }
        (keys, finite)
    }

    /// The gradient rows other ranks pushed to this one (`[row | matrix << 31][dim x wire]`, in
    /// rank order: deterministic), per matrix: their rows and values. A row this rank does not
    /// own ends the job.
    fn decode_gradients(&self, recv: &[Vec<u8>], wire: WireDtype) -> Vec<(Vec<u32>, Vec<f32>)> {
        let (comm, dim) = (self.comm, self.cfg.dim);
        let mut theirs: Vec<(Vec<u32>, Vec<f32>)> =
            vec![(Vec::new(), Vec::new()); self.shards.len()];
        for (from, b) in recv.iter().enumerate() {
            let records = wire::push_records(b, wire.row_bytes(dim))
                .unwrap_or_else(|e| fatal(comm, Some(self.step), &format!("rank {from}: {e}")));
            for (head, r) in records {
                let (m, row_id) = wire::split_head(head);
                if m >= self.shards.len() || row_id as usize >= self.shards[m].rows {
                    fatal(
                        comm,
                        Some(self.step),
                        &"received a gradient for a row this rank does not own",
                    );
                }
                theirs[m].0.push(row_id);
                let vals = &mut theirs[m].1;
                let at = vals.len();
                vals.resize(at + dim, 0.0);
                decode_wire(wire, r, &mut vals[at..]);
            }
        }
        theirs
    }
}
