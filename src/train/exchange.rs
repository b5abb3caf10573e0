//! The row cache's exchange across nodes (`--update hogwild` with the cache): one split-phase
//! all-to-all per step carries the deltas of cached rows to their owners, the requests for rows
//! and their answers, the walkers that cross and the step's global counts; the owner adds the
//! deltas (combined per row: `cache::Combine`) and installs the rows that arrive.

use super::wire::{Message, Writer, DELTA_HEAD};
use super::*;

impl<M: model::Model> Trainer<'_, M> {
    /// Collective: send the admission's deltas to their owners and add the deltas received to
    /// this rank's rows, and read the rows it asks for, in `--wire-dtype`. With `--fetch
    /// alltoall` the requests ride in the exchange and are answered in the next one a rank
    /// sends, which brings the rows of the batch waiting for them (installed, and the batch
    /// launched); the exchange is split-phase: this step's is posted, and collected at the next
    /// step after its sampling and planning, so that no rank waits for another to finish a step
    /// (a rank may run one exchange ahead; rows then arrive two steps after they are asked for,
    /// deltas are added one step later). With `--fetch rma` the exchange is one all-to-all per
    /// step, the rows are read one-sidedly after a barrier and installed at once.
    /// Returns, per owner, the slots of the rows asked for in this exchange (alltoall).
    pub(super) fn exchange(&mut self, adm: &Admission) -> Vec<Vec<(u32, bool)>> {
        let comm = self.comm;
        let seq = self.seq;
        self.seq += 1;
        if self.cfg.fetch == Fetch::Rma {
            let (send, asked) = self.encode_exchange(adm, 0);
            let t = Timer::start();
            let recv = comm.all_to_all_v(send);
            self.m.seconds.push += t.secs();
            self.absorb(recv, seq, adm);
            self.launch_ready();
            return asked;
        }
        // The exchange a step ago: its walkers, deltas, requests and rows.
        let arrived = self
            .collect_posted()
            .unwrap_or_else(|| match &self.carried {
                // The first step after a checkpoint's drain: the walkers it brought are handed over
                // at this step's end, and count as this rank's until then.
                Some((walkers, _)) => walkers
                    .iter()
                    .map(|b| WalkEngine::count_encoded(b, self.g.num_nodes()))
                    .sum(),
                None => {
                    // The first step (or the first after a settle): no sums are known yet.
                    self.carried = Some((vec![Vec::new(); comm.size()], [u64::MAX, 0]));
                    0
                }
            });
        let (send, asked) = self.encode_exchange(adm, arrived);
        self.posted = Some((comm.post(Channel::Rows, send), seq));
        // The batch whose rows just arrived trains now, while the peers take this exchange:
        // with one thread per rank, training before the post kept every peer waiting for it
        // (its answers then miss this batch's updates of this rank's rows, as they may with a
        // pool).
        self.launch_ready();
        asked
    }

    /// Launch the batch the last absorbed exchange brought the rows of, if any.
    pub(super) fn launch_ready(&mut self) {
        if let Some(d) = self.ready.take() {
            self.launch_cached(d.planned, d.lr, d.step);
        }
    }

    /// Let the sends of the last collected exchange move on while this rank computes: over TCP
    /// (without Open MPI's `btl_tcp_progress_thread`) a message moves only while both ranks are
    /// inside MPI, and a test drives the progress engine.
    pub(super) fn poke(&mut self) {
        if let Some(p) = &mut self.sending {
            if self.comm.progress(p) {
                let done = self.sending.take().expect("checked");
                self.comm.complete(done);
            }
        }
    }

    /// Collect and absorb the exchange under way, if any; returns the walkers it brought.
    pub(super) fn collect_posted(&mut self) -> Option<u64> {
        let (mut p, seq) = self.posted.take()?;
        let t = Timer::start();
        let recv = self.comm.receive(&mut p);
        // This rank's sends of the exchange before: by now every peer has taken them. Waiting
        // for this exchange's own sends at once would wait for the slowest peer's receive.
        if let Some(prev) = self.sending.replace(p) {
            self.comm.complete(prev);
        }
        self.m.seconds.push += t.secs();
        Some(self.absorb(recv, seq, &Admission::default()))
    }

    /// The messages of an exchange (`wire`'s layout): per peer the step's counts, the walkers
    /// that cross, the deltas for its rows, the rows asked of it, and the rows it asked for in
    /// the exchange this rank absorbed last, in its order. `arrived` walkers (absorbed since the walkers' step) count as this rank's
    /// pending ones. Returns them and, per owner, the slots of the rows asked for.
    #[allow(clippy::type_complexity)]
    pub(super) fn encode_exchange(
        &mut self,
        adm: &Admission,
        arrived: u64,
    ) -> (Vec<Vec<u8>>, Vec<Vec<(u32, bool)>>) {
        let (comm, cfg, part) = (self.comm, self.cfg, &self.g.part);
        let (dim, wire, n) = (cfg.dim, cfg.wire_dtype, comm.size());
        let wb = wire.row_bytes(dim);
        let rma = cfg.fetch == Fetch::Rma;
        let in_place = self.shared.clone().expect("hogwild rows");
        let head = |key: u64| -> (usize, u32) {
            let (owner, row) = part.locate(key >> 1);
            (owner, (row as u32) | (((key & 1) as u32) << 31))
        };
        let t = Timer::start();
        let (walkers, mut counts) = match self.carry.take() {
            Some((w, c)) => (w, c),
            None => (vec![Vec::new(); n], [0; 2]),
        };
        counts[0] += arrived;
        let mut by_owner: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, &key) in adm.push_keys.iter().enumerate() {
            by_owner[head(key).0].push(i);
        }
        let mut send: Vec<Writer> = walkers
            .iter()
            .zip(&by_owner)
            .map(|(w, idx)| Writer::new(counts, w, idx.len(), wb))
            .collect();
        let mut enc = vec![0u8; wb];
        for (o, idx) in by_owner.iter().enumerate() {
            for &i in idx {
                // Dithered per delta: the step, the row and the owner seed the rounding.
                let dither = self.cfg.seed ^ (self.step << 24) ^ adm.push_keys[i].rotate_left(40);
                encode_wire(
                    wire,
                    &adm.push_vals[i * dim..(i + 1) * dim],
                    &mut enc,
                    Some(dither),
                );
                let h = (self.update_code).encode(head(adm.push_keys[i]).1, adm.push_refs[i]);
                send[o].delta(h, &enc);
            }
        }
        self.m.push_bytes_sent += adm.push_keys.len() as u64 * (DELTA_HEAD + wb) as u64;
        // Where each owner's rows go, in request order.
        let mut asked: Vec<Vec<(u32, bool)>> = vec![Vec::new(); n];
        let mut heads: Vec<Vec<u32>> = vec![Vec::new(); n];
        for &(slot, key, new) in &adm.fetch {
            let (o, h) = head(key);
            heads[o].push(h);
            asked[o].push((slot, new));
        }
        let mut row = vec![0f32; dim];
        let mut answers: Vec<(usize, usize)> = Vec::new();
        for (o, w) in send.iter_mut().enumerate() {
            w.requests(if rma { &[][..] } else { &heads[o][..] });
            // The rows `o` asked for in the exchange absorbed last, as they are now.
            answers.clear();
            answers.extend(self.to_answer[o].iter().map(|&h| self.own_row(h)));
            // SAFETY: the shards outlive this call and nothing takes `&mut` access to their
            // windows while cells are in use; pool tasks update rows with relaxed atomic
            // accesses, as these are.
            let cells = |m: usize| unsafe { in_place[m].cells.cells() };
            for (j, &(m, at)) in answers.iter().enumerate() {
                if let Some(&(next_m, next)) = answers.get(j + cache::AHEAD) {
                    cells::prefetch(cells(next_m).slice(next, dim));
                }
                cells::load(cells(m).slice(at, dim), &mut row);
                encode_wire(wire, &row, &mut enc, None);
                w.row(&enc);
            }
        }
        let send = send.into_iter().map(Writer::finish).collect();
        self.m.seconds.push += t.secs();
        (send, asked)
    }

    /// Add the deltas received for this rank's rows, the copies of one row that synchronised
    /// in this exchange combined (the rule in `cache`), and keep `combine` for the next one.
    fn apply_combined(&mut self, mut combine: Combine) {
        let dim = self.cfg.dim;
        let in_place = self.shared.clone().expect("hogwild rows");
        let mut row = vec![0f32; dim];
        let norm2 = |(m, o): (usize, usize)| {
            // SAFETY: as in `encode_exchange`.
            let cells = unsafe { in_place[m].cells.cells() };
            cells::load(cells.slice(o, dim), &mut row);
            row.iter().map(|x| x * x).sum::<f32>()
        };
        let ahead = |(m, o): (usize, usize)| {
            // SAFETY: as in `encode_exchange`.
            let cells = unsafe { in_place[m].cells.cells() };
            cells::prefetch(cells.slice(o, dim));
        };
        self.m.cache_deltas_damped += combine.drain(
            self.lr_now,
            norm2,
            |(m, o), delta, _| {
                // SAFETY: as in `encode_exchange`.
                let cells = unsafe { in_place[m].cells.cells() };
                cells::add_to(cells.slice(o, dim), delta);
            },
            ahead,
        );
        self.combine = combine;
    }

    /// Matrix and value offset of one of this rank's rows, from its head in a message; a head
    /// of a row it does not own ends the job.
    pub(super) fn own_row(&self, h: u32) -> (usize, usize) {
        let (m, row) = ((h >> 31) as usize, (h & 0x7fff_ffff) as usize);
        if m >= self.shards.len() || row >= self.shards[m].rows {
            fatal(
                self.comm,
                Some(self.step),
                &"received a row this rank does not own",
            );
        }
        let in_place = self.shared.as_ref().expect("hogwild rows");
        let first =
            in_place[m].first_row[self.comm.rank()].expect("a rank's own rows are in place");
        (m, (first as usize + row) * self.cfg.dim)
    }

    /// Take in exchange `seq`: add the deltas for this rank's rows (as the pool adds: relaxed
    /// atomics), keep the requests for the next exchange, hand its walkers and the global sums
    /// to the driver (`carried`), install the rows for the batch that asked for them in
    /// exchange `seq - 1` and launch it. With `--fetch rma` read `adm`'s rows one-sidedly.
    /// Returns the number of walkers that arrived.
    pub(super) fn absorb(&mut self, recv: Vec<Vec<u8>>, seq: u64, adm: &Admission) -> u64 {
        let (comm, cfg, part) = (self.comm, self.cfg, &self.g.part);
        let (dim, wire, n) = (cfg.dim, cfg.wire_dtype, comm.size());
        let wb = wire.row_bytes(dim);
        let rma = cfg.fetch == Fetch::Rma;
        let bad = |what: &str| -> ! {
            fatal(comm, Some(self.step), &format!("received {what}"));
        };
        let t = Timer::start();
        let mut row = vec![0f32; dim];
        let mut sums = [0u64; 2];
        let mut arrived = Vec::with_capacity(n);
        let mut walkers = 0;
        let waiting = match self.deferred.front() {
            Some(d) if d.seq + 1 == seq => self.deferred.pop_front(),
            _ => None,
        };
        let expected: Vec<usize> = (0..n)
            .map(|o| waiting.as_ref().map_or(0, |d| d.asked[o].len()))
            .collect();
        let mut rows_in: Vec<Message> = Vec::with_capacity(n);
        let mut combine = std::mem::replace(&mut self.combine, Combine::new(0));
        for (src, b) in recv.iter().enumerate() {
            let msg = match Message::parse(b, wb) {
                Ok(m) => m,
                Err(e) => bad(&format!("a bad exchange message from rank {src}: {e}")),
            };
            for (x, c) in sums.iter_mut().zip(msg.counts) {
                *x += c;
            }
            walkers += WalkEngine::count_encoded(msg.walkers, self.g.num_nodes());
            arrived.push(msg.walkers.to_vec());
            self.m.push_bytes_received += msg.deltas.len() as u64;
            for (h, r) in msg.deltas() {
                let (h, updates) = (self.update_code).decode(h);
                let at = self.own_row(h);
                decode_wire(wire, r, &mut row);
                combine.add(at, &row, updates);
            }
            self.to_answer[src].clear();
            self.to_answer[src].extend(msg.requests());
            if msg.row_count() != expected[src] {
                bad(&format!(
                    "{} bytes of rows from rank {src} for {} rows asked",
                    msg.rows.len(),
                    expected[src]
                ));
            }
            rows_in.push(msg);
        }
        self.apply_combined(combine);
        // Walkers of settle's exchanges join those not yet handed over, and their sums add to
        // the step's (they carry no tokens, and walkers only count towards "any left"): a
        // checkpoint's drain keeps the step's walkers and its tokens for the step that follows.
        match &mut self.carried {
            Some((w, s)) => {
                for (mine, new) in w.iter_mut().zip(arrived) {
                    mine.extend_from_slice(&new);
                }
                for (mine, new) in s.iter_mut().zip(sums) {
                    *mine = mine.saturating_add(new);
                }
            }
            None => self.carried = Some((arrived, sums)),
        }
        self.m.seconds.apply += t.secs();

        let t = Timer::start();
        let cache = self.cache.as_mut().expect("exchange needs the cache");
        if let Some(d) = &waiting {
            for (o, msg) in rows_in.iter().enumerate() {
                self.m.fetch_bytes += msg.rows.len() as u64;
                for (j, (&(slot, new), r)) in d.asked[o].iter().zip(msg.rows()).enumerate() {
                    if let Some(&(next, _)) = d.asked[o].get(j + cache::AHEAD) {
                        cache.prefetch(next);
                    }
                    decode_wire(wire, r, &mut row);
                    cache.install(slot, &row, new);
                }
            }
        }
        let fetched = adm.fetch.len();
        if rma {
            // Every owner has added the deltas before any rank reads.
            comm.barrier();
            let mut by: Vec<Vec<Vec<(u32, u32)>>> = vec![vec![Vec::new(); n]; self.shards.len()];
            let mut slot_new = Vec::with_capacity(fetched);
            for &(slot, key, new) in &adm.fetch {
                let (o, r) = part.locate(key >> 1);
                by[(key & 1) as usize][o].push((slot_new.len() as u32, r as u32));
                slot_new.push((slot, new));
            }
            let mut rows = vec![0f32; fetched * dim];
            for (m, shard) in self.shards.iter().enumerate() {
                let c = fetch_remote(comm, cfg, shard, &by[m], &mut rows);
                self.m.fetch_bytes += (c * shard.row_bytes()) as u64;
                self.m.one_sided_bytes += (c * shard.row_bytes()) as u64;
            }
            for (&(slot, new), r) in slot_new.iter().zip(rows.chunks_exact(dim)) {
                cache.install(slot, r, new);
            }
        }
        self.m.remote_rows += fetched as u64;
        self.m.remote_rows += waiting
            .as_ref()
            .map_or(0, |d| d.asked.iter().map(Vec::len).sum::<usize>())
            as u64;
        self.m.seconds.fetch += t.secs();
        debug_assert!(self.ready.is_none(), "a batch was left unlaunched");
        self.ready = waiting;
        walkers
    }
}
