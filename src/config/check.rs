//! The validated configuration's last check: ranges, the model's own flags, and flags that
//! contradict each other, every problem named in one error.

use super::*;

impl TrainConfig {
    /// The flags' ranges: each out-of-range value adds its message to `errs`.
    fn check_values(&self, errs: &mut Vec<String>) {
        let mut need = |ok: bool, m: &str| {
            if !ok {
                errs.push(m.to_string());
            }
        };
        need(self.dim > 0, "--dim must be at least 1");
        need(self.dim <= 65536, "--dim must be at most 65536");
        need(
            self.lr.is_finite() && self.lr > 0.0,
            "--lr must be a positive number",
        );
        need(
            (0.0..1.0).contains(&self.warmup),
            "--warmup must be in [0, 1)",
        );
        need(
            (0.0..=1.0).contains(&self.lr_hold),
            "--lr-hold must be in [0, 1]",
        );
        need(self.epochs > 0, "--epochs must be at least 1");
        // Knowledge-graph chunks score their shared negatives as one matrix product, so more
        // of them stay cheap there (DistMult on WN18RR gains up to 2,000: docs/results.md).
        if self.model.is_kg() {
            need(self.negatives <= 4096, "--negatives must be at most 4096");
        } else {
            need(self.negatives <= 1000, "--negatives must be at most 1000");
            need(
                self.negatives >= 1,
                "--negatives must be at least 1 (negative sampling needs negatives: 5 is word2vec's default)",
            );
        }
        need(self.batch_size > 0, "--batch-size must be at least 1");
        need(
            self.request_batch_size > 0,
            "--request-batch-size must be at least 1",
        );
        need(self.threads > 0, "--threads must be at least 1");
        need(
            self.mmap_rows.is_none() || self.node_memory == NodeMemory::Private,
            "--mmap-rows keeps each rank's rows in a file of its own: use --node-memory private (its default with --mmap-rows)",
        );
        if let Some(dir) = &self.mmap_rows {
            need(
                dir.is_dir(),
                &format!("--mmap-rows {}: not a directory (create it on a local disk with room for the rows)", dir.display()),
            );
        }
        need(
            self.shared_negatives > 0,
            "--shared-negatives must be at least 1",
        );
        need(
            self.max_staleness <= 1,
            "--max-staleness must be 0 (apply before the next fetch) or 1 (overlap one batch)",
        );
        need(
            (0.0..1.0).contains(&self.momentum),
            "--momentum must be in [0, 1)",
        );
        need(
            self.subsample.is_finite() && self.subsample >= 0.0,
            "--subsample must be >= 0 (0 disables)",
        );
    }

    /// The model's own flags (walks, LINE): each bad value adds its message to `errs`.
    fn check_model(&self, errs: &mut Vec<String>) {
        let mut need = |ok: bool, m: &str| {
            if !ok {
                errs.push(m.to_string());
            }
        };
        match self.model {
            Model::Deepwalk | Model::Node2vec => {
                need(self.window > 0, "--window must be at least 1");
                need(self.window <= 64, "--window must be at most 64");
                need(self.walk_length >= 2, "--walk-length must be at least 2");
                need(
                    self.walks_per_node > 0,
                    "--walks-per-node must be at least 1",
                );
            }
            Model::Line => {
                need(
                    self.order == 1 || self.order == 2,
                    "--order must be 1 or 2 (LINE)",
                );
                need(
                    self.line_samples.is_finite() && self.line_samples > 0.0,
                    "--line-samples must be positive",
                );
            }
            Model::Distmult | Model::Complex | Model::Transe | Model::Rotate | Model::Sage => {}
        }
    }

    pub(super) fn check(&self) -> Result<()> {
        let mut errs = Vec::new();
        self.check_values(&mut errs);
        self.check_model(&mut errs);
        let mut need = |ok: bool, m: &str| {
            if !ok {
                errs.push(m.to_string());
            }
        };
        need(
            self.p.is_finite() && self.p > 0.0 && self.q.is_finite() && self.q > 0.0,
            "--p and --q must be positive (node2vec)",
        );
        if self.model != Model::Node2vec && (self.p != 1.0 || self.q != 1.0) {
            errs.push(format!(
                "--p/--q only apply to --model node2vec (got --model {:?})",
                self.model
            ));
        }
        if self.dtype != Dtype::F32 && self.optimizer == Optimizer::Adam && self.lr > 0.1 {
            errs.push("--optimizer adam with a reduced-precision --dtype needs --lr <= 0.1".into());
        }
        if !(self.clip_grad.is_finite() && self.clip_grad >= 0.0) {
            errs.push("--clip-grad must be >= 0 (0 disables)".into());
        }
        if self.cache_refresh == Some(0) {
            errs.push("--cache-refresh must be at least 1 (steps)".into());
        }
        if self.checkpoint_every.is_some() && self.checkpoint_dir.is_none() {
            errs.push("--checkpoint-every needs --checkpoint-dir".into());
        }
        // (Knowledge-graph models refuse hogwild in `from_raw`, naming their reason.)
        if self.update == Update::Hogwild && !self.model.is_kg() {
            let b = self.hogwild_blockers();
            if !b.is_empty() {
                errs.push(format!(
                    "--update hogwild needs {}; use --update batched (or auto) otherwise",
                    b.join(", ")
                ));
            }
        }
        if self.optimizer == Optimizer::Sgd && self.momentum != 0.9 {
            errs.push("--momentum needs --optimizer momentum".into());
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(Error::config(errs.join("; ")))
        }
    }
}
