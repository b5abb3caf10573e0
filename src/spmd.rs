//! SPMD rules (DESIGN section 7). During setup every rank computes a result and all ranks agree
//! on it: if any rank failed, every rank returns the same error naming the failing ranks, and
//! every rank exits non-zero. After training starts a failure on one rank aborts the whole job.

use crate::comm::Comm;
use crate::error::{Error, Result};

/// All ranks learn whether any rank failed; on failure all return `Error::Ranks` with each
/// failing rank's message. Collective: every rank must call it at the same point.
pub fn agree<T>(comm: &Comm, r: Result<T>) -> Result<T> {
    let msg = match &r {
        Ok(_) => String::new(),
        Err(e) => {
            let s = e.to_string();
            if s.is_empty() {
                "unknown error".to_string()
            } else {
                s
            }
        }
    };
    let failed = comm.max_u64(u64::from(!msg.is_empty()));
    if failed == 0 {
        return r;
    }
    let all = comm.all_gather_bytes(msg.as_bytes());
    let failures: Vec<(usize, String)> = all
        .into_iter()
        .enumerate()
        .filter(|(_, m)| !m.is_empty())
        .map(|(rank, m)| (rank, String::from_utf8_lossy(&m).into_owned()))
        .collect();
    // Errors that are already agreed (the same on every failing rank) keep their shape instead
    // of nesting.
    let same = failures.iter().all(|(_, m)| *m == failures[0].1);
    if same {
        match r {
            Err(Error::Ranks(inner)) => return Err(Error::Ranks(inner)),
            // Every rank stopped on a signal at the same step: the job's exit code says so.
            Err(Error::Stopped(m)) if failures.len() == comm.size() => {
                return Err(Error::Stopped(m))
            }
            _ => {}
        }
    }
    Err(Error::Ranks(failures))
}

/// Log a fatal error after setup and end the job on every rank (MPI_Abort). Never returns.
pub fn fatal(comm: &Comm, step: Option<u64>, e: &dyn std::fmt::Display) -> ! {
    let at = step.map(|s| format!(" at step {s}")).unwrap_or_default();
    let msg = format!("rank {}{at}: {e}; aborting the job", comm.rank());
    log::error!("{msg}");
    eprintln!("graphscale: error: {msg}");
    comm.abort(1)
}

/// Install a panic hook that names the rank and ends the whole MPI job, so that a panic on one
/// rank never leaves the others waiting in a collective (exit code 70).
pub fn install_panic_hook(rank: usize, mpi: bool) {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        eprintln!("graphscale: rank {rank} panicked: {info}");
        default(info);
        // The job is the MPI world, or this process when ranks are threads.
        if mpi {
            crate::comm::mpi::abort_world(70);
        }
        std::process::exit(70);
    }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::local;
    use std::time::Duration;

    #[test]
    fn all_ranks_agree_on_one_failure() {
        let out = local::run(3, Duration::from_secs(20), |c| {
            let r: Result<u32> = if c.rank() == 1 {
                Err(Error::config("bad thing"))
            } else {
                Ok(7)
            };
            agree(&c, r).map_err(|e| e.to_string())
        });
        for o in out {
            assert_eq!(o.unwrap_err(), "rank 1: invalid configuration: bad thing");
        }
    }

    #[test]
    fn success_passes_through() {
        let out = local::run(2, Duration::from_secs(20), |c| {
            agree(&c, Ok(c.rank())).unwrap()
        });
        assert_eq!(out, vec![0, 1]);
    }
}
