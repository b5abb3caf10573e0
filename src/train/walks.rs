//! The walk models' work source (DeepWalk, node2vec): walk supersteps feed the steps, the walk
//! engine's walkers and node2vec queries move through the driver's exchanges, and its cursor is
//! what a checkpoint keeps.

use super::*;

impl<M: model::Model> Trainer<'_, M> {
    pub(super) fn train_walks(&mut self) {
        let cfg = self.cfg;
        let params = self.walk_params();
        let mut wrng = rng_for(cfg.seed, self.comm.rank(), 3);
        let comm = self.comm;
        let sum_deg = comm.sum_u64(self.g.local_entries());
        let node = if params.node_walks {
            NodeGraph::new(comm, self.g)
        } else {
            None
        };
        let mut engine = WalkEngine::new(self.g, params, cfg.subsample, sum_deg, node, &mut wrng);
        let total = cfg.epochs as f64
            * f64::from(cfg.walks_per_node)
            * self.g.num_nodes() as f64
            * f64::from(cfg.walk_length);
        let (mut done, first_epoch) = self.resume_walks(&mut engine, &mut wrng);
        let mut segs = Segments::default();
        let mut pairs = Vec::new();
        let by_token = self.path != StepPath::Batched && cfg.kernel == Kernel::Token;
        let carry = self.cache.is_some();
        let mut progress = Progress::new(self.comm.rank() == 0);
        for epoch in first_epoch..cfg.epochs {
            if epoch > first_epoch || self.m.resumed_from.is_none() {
                engine.new_epoch();
            }
            loop {
                let t = Timer::start();
                segs.clear();
                pairs.clear();
                // With the row cache, walkers and the step's counts travel in the rows'
                // exchange (one collective less per step), and the rate is that of the progress
                // before this step; otherwise they have their own exchange and all-reduce.
                let (out, global) = if carry {
                    let (out, mut send) = engine.superstep_local(self.g, &mut wrng, &mut segs);
                    if let Some(q) = engine.queries() {
                        let answers =
                            comm.all_to_all_v(WalkEngine::answer(self.g, &comm.all_to_all_v(q)));
                        engine.resolve(self.g, &answers, &mut send);
                    }
                    self.carry = Some((send, [engine.pending(), out.tokens]));
                    (out, None)
                } else {
                    let out =
                        engine.superstep(self.g, &mut wrng, &mut segs, |b| comm.all_to_all_v(b));
                    let g = self
                        .comm
                        .all_reduce_u64(&[engine.pending(), out.tokens], ReduceOp::Sum);
                    done += g[1] as f64;
                    (out, Some([g[0], g[1]]))
                };
                if !by_token {
                    segs.pairs(&mut pairs);
                }
                self.m.seconds.sample += t.secs();
                let lr = self.lr_at(done / total);
                if by_token {
                    self.train(Work::Segments(&segs), lr);
                } else {
                    self.train_step(&pairs, lr);
                }
                let global = global.unwrap_or_else(|| {
                    let (walkers, global) = self.carried.take().expect("the exchange ran");
                    let t = Timer::start();
                    engine.deliver(walkers.iter().map(Vec::as_slice));
                    self.m.seconds.sample += t.secs();
                    done += global[1] as f64;
                    global
                });
                self.m.tokens += out.tokens;
                progress.tick(done / total, &self.m, lr);
                if self.stall.due(cfg, done / total) {
                    self.drain(lr);
                    let nodes = self.g.num_nodes();
                    let frac = done / total;
                    self.stall
                        .decide(comm, cfg, &mut self.m, &self.shards, frac, nodes);
                }
                if global[0] == 0 {
                    break;
                }
                self.checkpoint_tick(lr, false, |tr| tr.walk_state(&engine, epoch, done));
                if self.stopped.is_some() {
                    break;
                }
            }
            if self.stopped.is_some() {
                break;
            }
        }
        self.drain(self.lr_at(1.0));
        self.m.walker_crossings = engine.crossed;
        // Walks started here x their length: the tokens the walks would have without dead ends
        // (`graphscale plan` counts pairs per such token).
        self.m.walk_tokens_nominal =
            engine.cursor().1 * u64::from(cfg.walk_length) * u64::from(cfg.epochs);
        let epochs = cfg.epochs;
        self.checkpoint_finish(|_| {
            let cursor = Cursor {
                epoch: epochs,
                done,
                started: 1.0,
                ..Cursor::default()
            };
            (Vec::new(), cursor)
        });
    }

    /// A checkpoint's walk state: the walkers (with those the drain's exchanges brought) and the
    /// cursor. Collective. The walkers the drain brought are saved, and stay where they are:
    /// the engine gets them at the end of the next step, as it would have without the
    /// checkpoint. Delivered at once, they walked a step early, every rank started as many more
    /// to fill its share in flight, and each checkpoint added walkers (8 simulated nodes with
    /// `--checkpoint-every 4`: 126 steps instead of 437, docs/failure-model.md).
    fn walk_state(&self, engine: &WalkEngine, epoch: u32, done: f64) -> (Vec<u8>, Cursor) {
        let walkers = match &self.carried {
            Some((w, _)) => engine.encode_walkers_with(w.iter().map(Vec::as_slice)),
            None => engine.encode_walkers(),
        };
        let (next, starts) = engine.cursor();
        let g = self.comm.all_reduce_u64(&[next, starts], ReduceOp::Sum);
        let cursor = Cursor {
            step: 0,
            epoch,
            done,
            started: g[0] as f64 / g[1].max(1) as f64,
            next_start: next,
            ..Cursor::default()
        };
        (walkers, cursor)
    }

    /// The walk engine's parameters: walkers in flight for this rank's share of the step, and
    /// whether walks continue across the node's ranks (node-shared rows and adjacency).
    /// Collective.
    fn walk_params(&self) -> WalkParams {
        let cfg = self.cfg;
        // With node-shared rows the node's ranks also share their adjacency: a walk continues
        // across them and only moves to another node ship it. The job's "nodes" are counted
        // as the sum over ranks of 1 / (ranks on its node).
        let on_node = self.shared.as_ref().map_or(1, |s| {
            s[VERTEX].first_row.iter().filter(|f| f.is_some()).count()
        });
        // The same on every rank (the adjacency windows are collective), also on a rank alone
        // on its node.
        let node_walks = self.node_rows;
        let parts = self
            .comm
            .all_reduce_f64(&[1.0 / on_node as f64], ReduceOp::Sum)[0]
            .round();
        // A walker keeps walking while its next node is on this rank (or node): the whole walk
        // there, or min(L, P / (P - 1)) steps per superstep on average when nodes are spread
        // evenly over P ranks (or nodes).
        let spread = if node_walks {
            parts
        } else {
            self.comm.size() as f64
        };
        let batch_parts = if node_walks && parts > 1.0 {
            self.comm.size()
        } else {
            spread as usize
        };
        let steps = if spread > 1.0 {
            (spread / (spread - 1.0)).min(f64::from(cfg.walk_length))
        } else {
            f64::from(cfg.walk_length)
        };
        WalkParams {
            walk_length: cfg.walk_length,
            window: cfg.window,
            walks_per_node: cfg.walks_per_node,
            node2vec: (cfg.model == Model::Node2vec).then_some((cfg.p, cfg.q)),
            // A walker emits about window + 1 pairs per step. At most 1/16 of a rank's walks are
            // in flight, so that small graphs still get many optimizer steps.
            // --batch-size is the number of pairs per step of one copy of the rows: remote rows
            // are copies as old as a step. With private rows every rank holds such copies and
            // takes its share of walkers in flight, so the optimisation is the same at any rank
            // count. With node-shared rows a node's ranks update one copy in place (nothing of
            // the node is stale), so each rank takes its node's share: the ranks of one node
            // step as single-rank jobs would (BlogCatalog, 4 ranks on one node: 5.3M pairs/s
            // at the same Micro-F1, against 3.6M with a quarter of the walkers each). Across
            // nodes every rank also trains its own copies of the remote rows, so each takes its
            // share of the job's ranks as private rows do: with its node's share, 4 nodes of 2
            // ranks (BlogCatalog) trained copies twice as long per step and lost 0.8 Micro-F1
            // (36.58 at clock 1 against 37.42 with private rows).
            in_flight: ((cfg.batch_size.div_ceil(batch_parts) as f64
                / ((cfg.window as usize + 1) as f64 * steps)) as usize)
                .min((self.g.num_local() * cfg.walks_per_node as usize).div_ceil(16))
                .max(1),
            local_steps: cfg.walk_length,
            node_walks,
        }
    }

    /// A resumed job: the engine continues from the checkpoint's cursor (its walkers; at
    /// another rank count, the same share of the walks' starts) with the sampler's generator
    /// salted by the step. Returns the tokens done and the epoch to continue.
    fn resume_walks(&mut self, engine: &mut WalkEngine, wrng: &mut Rng) -> (f64, u32) {
        let cfg = self.cfg;
        let (mut done, mut first_epoch) = (0f64, 0);
        if let Some(r) = self.resumed.take() {
            let c = &r.cursor;
            let (_, starts) = engine.cursor();
            let next = if r.same_ranks {
                c.next_start
            } else {
                (c.started * starts as f64).round() as u64
            };
            engine.resume(next, &r.walkers);
            done = c.done;
            first_epoch = c.epoch;
            let salt = c.step.wrapping_mul(0x2545_F491_4F6C_DD1D);
            *wrng = rng_for(cfg.seed ^ salt, self.comm.rank(), 3);
        }
        (done, first_epoch)
    }
}
