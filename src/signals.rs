//! A batch job's warning signals. With checkpoints on, SIGTERM (scancel, a preemption) and SIGUSR1
//! (`sbatch --signal=USR1@120`; Open MPI's mpirun forwards it to every rank) make the job write
//! and commit a checkpoint at the next step, then stop with exit code 4 so that a script can
//! requeue it (`--resume-if-present` continues). A second SIGTERM ends the process at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

static RAISED: OnceLock<Arc<AtomicBool>> = OnceLock::new();

/// Catch SIGTERM and SIGUSR1 from now on (idempotent).
pub fn arm() -> std::io::Result<()> {
    if RAISED.get().is_some() {
        return Ok(());
    }
    let flag = Arc::new(AtomicBool::new(false));
    use signal_hook::consts::{SIGTERM, SIGUSR1};
    // Registered first, so it sees the flag before this signal sets it: a second SIGTERM
    // terminates (a job that cannot reach its next step is still killable).
    signal_hook::flag::register_conditional_shutdown(SIGTERM, 143, Arc::clone(&flag))?;
    signal_hook::flag::register(SIGTERM, Arc::clone(&flag))?;
    signal_hook::flag::register(SIGUSR1, Arc::clone(&flag))?;
    let _ = RAISED.set(flag);
    Ok(())
}

/// Whether the signals are caught.
pub fn armed() -> bool {
    RAISED.get().is_some()
}

/// Whether SIGTERM or SIGUSR1 arrived since `arm`.
pub fn raised() -> bool {
    RAISED.get().is_some_and(|f| f.load(Ordering::Relaxed))
}
