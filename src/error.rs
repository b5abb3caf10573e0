//! One error type whose variants a user can act on: each names the file, the dataset or line,
//! and what to do about it.

use std::path::PathBuf;

/// Everything that can go wrong in graphscale, phrased for the person running the job.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be opened, read or written.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The HDF5 library refused an operation on a file.
    #[error("{path}: {what}: {msg}")]
    Hdf5 {
        path: PathBuf,
        what: String,
        msg: String,
    },
    /// A file was read but its content breaks the documented format.
    #[error("{path}: {msg}")]
    BadInput { path: PathBuf, msg: String },
    /// A text file has a malformed line.
    #[error("{path}:{line}: {msg}")]
    BadLine {
        path: PathBuf,
        line: u64,
        msg: String,
    },
    /// Flags or configuration values that cannot work, naming the flag and the fix.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Setup failed on one or more ranks; every rank returns this after agreeing.
    #[error("{}", format_failures(.0))]
    Ranks(Vec<(usize, String)>),
    /// The embedding or evaluation inputs do not fit together.
    #[error("{0}")]
    Mismatch(String),
    /// The job was asked to stop (SIGTERM, SIGUSR1) and did so after committing a checkpoint.
    #[error("{0}")]
    Stopped(String),
    /// An output could not be written; the message says what became of the earlier file.
    #[error("{0}")]
    Output(String),
}

fn format_failures(failures: &[(usize, String)]) -> String {
    let first = &failures[0].1;
    if failures.len() > 1 && failures.iter().all(|(_, m)| m == first) {
        return format!("{first} (on all {} failing ranks)", failures.len());
    }
    failures
        .iter()
        .map(|(r, m)| {
            // An error agreed on already (a nested agreement) names its rank once.
            if m.starts_with(&format!("rank {r}: ")) {
                m.clone()
            } else {
                format!("rank {r}: {m}")
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    pub fn bad_input(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        Error::BadInput {
            path: path.into(),
            msg: msg.into(),
        }
    }

    pub fn hdf5(path: impl Into<PathBuf>, what: impl Into<String>, e: hdf5::Error) -> Self {
        Error::Hdf5 {
            path: path.into(),
            what: what.into(),
            msg: e.to_string(),
        }
    }

    pub fn config(msg: impl Into<String>) -> Self {
        Error::Config(msg.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_is_named_once_however_often_its_error_was_agreed() {
        let once = Error::Ranks(vec![(0, "out.h5: disk full".into())]).to_string();
        assert_eq!(once, "rank 0: out.h5: disk full");
        let twice = Error::Ranks(vec![(0, once.clone()), (2, "other".into())]).to_string();
        assert_eq!(twice, "rank 0: out.h5: disk full\nrank 2: other");
    }
}
