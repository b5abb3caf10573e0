//! The knowledge-graph work source: training triples per step, passed along the ring of ranks
//! at each epoch (`kg`), and the validation ranking with early stopping.

use super::*;

impl<M: model::Model> Trainer<'_, M> {
    /// Knowledge graphs: every epoch shuffles the triples this rank holds (its share of the
    /// file, or with shard negatives the share the ring has passed it) and trains them in steps
    /// of its share of `--batch-size`; every rank takes the same number of steps (the largest
    /// share's), the others with empty batches. Adagrad's learning rate stays constant.
    pub(super) fn train_triples(
        &mut self,
        mut triples: Vec<Weighted>,
        valid: Option<&(Vec<Triple>, Vec<Triple>)>,
    ) {
        use rand::seq::SliceRandom;
        let cfg = self.cfg;
        let per_rank = cfg.batch_size.div_ceil(self.comm.size()).max(1);
        let steps = self
            .comm
            .max_u64(triples.len().div_ceil(per_rank) as u64)
            .max(1);
        let total = f64::from(cfg.epochs) * steps as f64;
        let mut progress = Progress::new(self.comm.rank() == 0);
        let lr = cfg.lr;
        // --patience: the best validation MRR so far and the validations since it rose.
        let (mut best, mut flat) = (f64::NEG_INFINITY, 0u32);
        // A resumed run continues the epoch in progress, after the share of its steps done.
        let (mut first_epoch, mut first_step) = (1, 0);
        if let Some(r) = self.resumed.take() {
            first_epoch = r.cursor.epoch.max(1);
            first_step = (r.cursor.started * steps as f64).round() as u64;
            best = r.cursor.valid_best.unwrap_or(f64::NEG_INFINITY);
            flat = r.cursor.valid_flat;
        }
        let mut done = f64::from(first_epoch - 1) * steps as f64 + first_step as f64;
        // Where training stands after `s` steps of `epoch`, for a checkpoint.
        let cursor = |epoch: u32, s: u64, best: f64, flat: u32| Cursor {
            epoch,
            started: s as f64 / steps as f64,
            done: f64::from(epoch - 1) * steps as f64 + s as f64,
            valid_best: best.is_finite().then_some(best),
            valid_flat: flat,
            ..Cursor::default()
        };
        let state = |t: &mut Self| {
            if t.comm.rank() == 0 {
                t.model.state()
            } else {
                Vec::new()
            }
        };
        // With negatives from the rank's own shard, a triple trained on the same rank every
        // epoch would only ever meet that shard's entities as negatives (its query is never
        // contrasted with the other shards' entities). Epoch e trains the share of rank
        // (r + e - 1) mod p instead, passed one rank along the ring each epoch (one exchange of
        // the triples, 24 B per triple against kilobytes of rows): over p epochs every
        // triple meets every shard.
        let rotate =
            cfg.kg.negatives_from == crate::config::NegativesFrom::Shard && self.comm.size() > 1;
        let mut held = 0u64;
        for epoch in first_epoch..=cfg.epochs {
            if rotate {
                let want = u64::from(epoch - 1) % self.comm.size() as u64;
                let t = Timer::start();
                triples = kg::pass_along(self.comm, triples, want + self.comm.size() as u64 - held);
                held = want;
                self.m.seconds.sample += t.secs();
            }
            // Each epoch's order depends on the seed, the epoch and the triples this rank holds
            // alone, so that a resumed run shuffles an epoch as the interrupted one did.
            triples.sort_unstable_by_key(Weighted::triple);
            let salt = u64::from(epoch).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            triples.shuffle(&mut rng_for(cfg.seed ^ salt, self.comm.rank(), 5));
            let skip = if epoch == first_epoch { first_step } else { 0 };
            for s in skip..steps {
                let lo = (s as usize * per_rank).min(triples.len());
                let hi = (lo + per_rank).min(triples.len());
                self.train(Work::Triples(&triples[lo..hi]), lr);
                self.m.tokens += (hi - lo) as u64;
                done += 1.0;
                progress.tick(done / total, &self.m, lr);
                // The last step of an epoch is saved as the start of the next.
                let (e, k) = if s + 1 == steps {
                    (epoch + 1, 0)
                } else {
                    (epoch, s + 1)
                };
                self.checkpoint_tick(lr, false, |t| (state(t), cursor(e, k, best, flat)));
                if self.stopped.is_some() {
                    break;
                }
            }
            if self.stopped.is_some() {
                break;
            }
            if let Some((v, known)) = valid {
                if epoch % cfg.kg.valid_every == 0 || epoch == cfg.epochs {
                    self.drain(lr);
                    self.validate(epoch, v, known);
                    // Every rank ranks the same triples with the same rows: the same MRR, so
                    // all stop at the same epoch.
                    if let (Some(patience), Some(&[_, mrr, _])) =
                        (cfg.kg.patience, self.m.valid.last())
                    {
                        if mrr > best + 1e-4 {
                            (best, flat) = (mrr, 0);
                        } else {
                            flat += 1;
                        }
                        if flat >= patience && epoch < cfg.epochs {
                            self.m.stopped_at_epoch = Some(epoch);
                            if self.comm.rank() == 0 {
                                eprintln!(
                                    "graphscale: epoch {epoch}: stopping early: validation MRR has not risen above {best:.4} for {flat} validation(s) (--patience {patience})"
                                );
                            }
                            break;
                        }
                    }
                }
            }
        }
        self.drain(lr);
        // The run is over (all epochs, or stopped early): a resume trains no further.
        self.checkpoint_finish(|t| (state(t), cursor(cfg.epochs + 1, 0, best, flat)));
    }

    /// Collective (`--valid`): rank the validation triples with the rows as they are now.
    pub(super) fn validate(&mut self, epoch: u32, valid: &[Triple], known: &[Triple]) {
        let t = Timer::start();
        let (shard, dim) = (&self.shards[VERTEX], self.cfg.dim);
        let rows = shard.window.with_local(|bytes| {
            let mut out = vec![0f32; shard.rows * dim];
            for (o, b) in out
                .chunks_exact_mut(dim)
                .zip(bytes.chunks_exact(shard.row_bytes()))
            {
                decode_row(shard.dtype, b, o);
            }
            out
        });
        let Some(r) = self.model.ranking() else {
            return;
        };
        let emb = crate::eval::kg::KgEmbeddings {
            score: r.score,
            gamma: r.gamma,
            entities: self.g.num_nodes() as usize,
            dim,
            rows,
            part: self.g.part.clone(),
            rank: self.comm.rank(),
            relations: r.relations,
            rel_dim: r.rel_dim,
        };
        let m = crate::eval::kg::rank_distributed(self.comm, &emb, valid, known);
        self.m.valid.push([f64::from(epoch), m.mrr, m.hits10]);
        if self.comm.rank() == 0 {
            eprintln!(
                "graphscale: epoch {epoch}: valid MRR {:.4}  Hits@1 {:.4}  Hits@10 {:.4}  ({} triples, filtered; {:.1} s)",
                m.mrr,
                m.hits1,
                m.hits10,
                m.triples,
                t.secs()
            );
        }
    }
}
