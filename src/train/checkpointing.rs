//! Checkpoints of a run with `--checkpoint-dir`: the first snapshot's preparation, the periodic
//! tick (snapshot, write in the background, commit), and the last one at the end.

use super::*;

impl<M: model::Model> Trainer<'_, M> {
    /// Collective: set up checkpointing and resume from `--resume` if given.
    pub fn prepare_checkpoints(&mut self) -> Result<()> {
        let cfg = self.cfg;
        if cfg.checkpoint_dir.is_none() && cfg.resume.is_none() {
            return Ok(());
        }
        let digest = csr::digest(self.comm, self.g);
        let ident = checkpoint::identity(cfg, self.g, digest);
        if let Some(dir) = &cfg.resume {
            let part = self.g.part.clone();
            let window = cfg.window;
            let kg = cfg.model.is_kg();
            let r =
                checkpoint::restore(self.comm, dir, self.g, &ident, &mut self.shards, |b, n| {
                    if kg {
                        // The model's own state (rank 0 saved it): every rank gets a copy.
                        Ok(vec![b.to_vec(); n])
                    } else {
                        WalkEngine::route_walkers(b, &part, window)
                    }
                })?;
            if let Some(r) = &r {
                if kg {
                    self.model
                        .restore_state(&r.walkers)
                        .map_err(|e| Error::bad_input(dir, e))?;
                }
                // Fresh streams for the rest of the run, derived from the seed and the step.
                let salt = r.cursor.step.wrapping_mul(0x2545_F491_4F6C_DD1D);
                self.rng = rng_for(cfg.seed ^ salt, self.comm.rank(), 2);
                self.step = r.cursor.step;
                self.m.resumed_from = Some(r.version);
            }
            if let Some(a) = self.adagrad.as_mut().filter(|_| r.is_some()) {
                a.load(&self.shards);
            }
            self.resumed = r;
        }
        if let (Some(dir), Some(every)) = (&cfg.checkpoint_dir, cfg.checkpoint_every) {
            if let Err(e) = crate::signals::arm() {
                log::warn!("cannot catch SIGTERM/SIGUSR1 (no checkpoint on a signal): {e}");
            }
            self.ckpt = Some(Checkpointing {
                dir: dir.clone(),
                every,
                next_version: checkpoint::next_version(self.comm, dir)?,
                last: Instant::now(),
                writing: None,
                identity: ident.to_string(),
            });
        }
        Ok(())
    }

    /// Collective, between steps: commit a finished background write; start a checkpoint when
    /// one is due. `state` gives the encoded walkers and the cursor at this point.
    pub(super) fn checkpoint_tick(
        &mut self,
        lr: f32,
        force: bool,
        state: impl FnOnce(&mut Self) -> (Vec<u8>, Cursor),
    ) {
        if self.ckpt.is_none() || self.stopped.is_some() {
            return;
        }
        // SIGTERM or SIGUSR1 on any rank: every rank checkpoints at this step, commits, stops.
        let signalled = !force
            && crate::signals::armed()
            && self.comm.max_u64(u64::from(crate::signals::raised())) > 0;
        let force = force || signalled;
        let Some(ck) = &mut self.ckpt else {
            return;
        };
        let (due, all_done) = match ck.every {
            _ if force => (true, true),
            Every::Steps(n) if ck.writing.is_none() => (self.step.is_multiple_of(n), true),
            Every::Steps(n) => {
                let (_, done) =
                    checkpoint::poll(self.comm, false, checkpoint::writer_done(&ck.writing));
                (self.step.is_multiple_of(n), done)
            }
            Every::Seconds(t) => {
                // Rank 0's clock decides, so that all ranks checkpoint at the same step.
                let mine = self.comm.rank() == 0 && ck.last.elapsed().as_secs_f64() >= t;
                checkpoint::poll(self.comm, mine, checkpoint::writer_done(&ck.writing))
            }
        };
        if ck.writing.is_some() && (all_done || due) {
            let w = ck.writing.take().expect("checked");
            if let Err(e) = checkpoint::finish_writing(self.comm, &ck.dir, w) {
                fatal(
                    self.comm,
                    Some(self.step),
                    &format!("checkpoint failed: {e}"),
                );
            }
        }
        if !due {
            return;
        }
        // The snapshot must hold every applied gradient: finish the batch in flight first.
        self.drain(lr);
        let t = Timer::start();
        let (walkers, mut cursor) = state(self);
        cursor.step = self.step;
        if let Some(a) = &self.adagrad {
            a.save(&mut self.shards);
        }
        let ck = self.ckpt.as_mut().expect("checked above");
        let mut snap = Snapshot::take(self.g, &self.shards, walkers, cursor.clone());
        snap.identity = ck.identity.clone();
        snap.config = self.cfg.to_json();
        let version = ck.next_version;
        ck.next_version += 1;
        ck.last = Instant::now();
        let path = checkpoint::shard_path(&ck.dir, version, self.comm.rank());
        self.m.checkpoint_bytes += snap.bytes();
        self.m.checkpoints += 1;
        let handle = std::thread::Builder::new()
            .name("checkpoint-writer".into())
            .spawn(move || {
                if let Some(d) = path.parent() {
                    std::fs::create_dir_all(d).map_err(|e| Error::io(d, e))?;
                }
                checkpoint::write_shard(&path, &snap)?;
                checkpoint::file_sum(&path)
            })
            .expect("spawn the checkpoint writer");
        ck.writing = Some(Writing {
            version,
            cursor,
            handle,
        });
        self.m.checkpoint_pause_seconds += t.secs();
        if signalled {
            let w = ck.writing.take().expect("just started");
            if let Err(e) = checkpoint::finish_writing(self.comm, &ck.dir, w) {
                fatal(
                    self.comm,
                    Some(self.step),
                    &format!("checkpoint failed: {e}"),
                );
            }
            self.stopped = Some((version, self.step));
        }
    }

    /// Collective, at the end of training: write the final state and commit it.
    pub(super) fn checkpoint_finish(&mut self, state: impl FnOnce(&mut Self) -> (Vec<u8>, Cursor)) {
        if self.stopped.is_some() {
            return;
        }
        self.checkpoint_tick(self.lr_at(1.0), true, state);
        if let Some(ck) = &mut self.ckpt {
            if let Some(w) = ck.writing.take() {
                if let Err(e) = checkpoint::finish_writing(self.comm, &ck.dir, w) {
                    fatal(
                        self.comm,
                        Some(self.step),
                        &format!("checkpoint failed: {e}"),
                    );
                }
            }
        }
    }
}
