//! LINE's work source: edge samples per step, the edge sampler's cursor in checkpoints.

use super::*;

/// Edge samples per node below which LINE warns that it is under-trained.
pub(super) const LINE_MIN_SAMPLES_PER_NODE: f64 = 1000.0;

impl<M: model::Model> Trainer<'_, M> {
    pub(super) fn train_line(&mut self) {
        let cfg = self.cfg;
        let g = self.g;
        let sampler = EdgeSampler::new(g);
        let mass = sampler.mass;
        let total_mass = self.comm.all_reduce_f64(&[mass], ReduceOp::Sum)[0];
        let total_samples = cfg.line_samples * g.file_edges as f64 * f64::from(cfg.epochs);
        // --batch-size edges per step over all ranks, each rank its weight share.
        let steps = (total_samples / cfg.batch_size as f64).ceil().max(1.0) as u64;
        let my_batch = cfg.batch_size as f64 * mass / total_mass.max(1e-300);
        // Samples per node, not per edge, decide whether LINE has trained: Cora's 100 per edge
        // are 195 per node and give Micro-F1 38 where DeepWalk (16,000 pairs per node) gives 80;
        // BlogCatalog's are 3,200 per node and match DeepWalk.
        let per_node = total_samples / g.num_nodes().max(1) as f64;
        if self.comm.rank() == 0 && per_node < LINE_MIN_SAMPLES_PER_NODE {
            let need = (LINE_MIN_SAMPLES_PER_NODE * g.num_nodes() as f64
                / (g.file_edges.max(1) as f64 * f64::from(cfg.epochs)))
            .ceil();
            eprintln!(
                "graphscale: WARNING: LINE draws {per_node:.0} edge samples per node (--line-samples {} x {} edges / {} nodes): too few to train a graph this sparse; --line-samples {need} gives {LINE_MIN_SAMPLES_PER_NODE:.0} per node",
                cfg.line_samples,
                g.file_edges,
                g.num_nodes()
            );
        }
        let mut rng = rng_for(cfg.seed, self.comm.rank(), 4);
        let mut first = 0;
        if let Some(r) = self.resumed.take() {
            first = r.cursor.step;
            let salt = first.wrapping_mul(0x2545_F491_4F6C_DD1D);
            rng = rng_for(cfg.seed ^ salt, self.comm.rank(), 4);
        }
        let mut pairs = Vec::new();
        let mut progress = Progress::new(self.comm.rank() == 0);
        for s in first..steps {
            let t = Timer::start();
            pairs.clear();
            let k = my_batch as u64 + u64::from(rng.random::<f64>() < my_batch.fract());
            pairs.extend((0..k).map_while(|_| sampler.draw(g, &mut rng)));
            self.m.seconds.sample += t.secs();
            self.m.tokens += pairs.len() as u64;
            let p = s as f64 / steps as f64;
            let lr = self.lr_at(p);
            self.train_step(&pairs, lr);
            progress.tick(p, &self.m, lr);
            if self.stall.due(cfg, p) {
                self.drain(lr);
                let comm = self.comm;
                self.stall
                    .decide(comm, cfg, &mut self.m, &self.shards, p, g.num_nodes());
            }
            self.checkpoint_tick(lr, false, |_| (Vec::new(), Cursor::default()));
            if self.stopped.is_some() {
                break;
            }
        }
        self.drain(self.lr_at(1.0));
        self.checkpoint_finish(|_| (Vec::new(), Cursor::default()));
    }
}
