//! Outputs that never destroy what a user gave. Before any work, every output path is checked:
//! not a directory, not one of the command's inputs (the same file by device and inode, so a
//! symlink or a second path to an input counts), not another output of the same command, and
//! its directory takes a file. Then the output is written to a partial file beside it
//! (`DIR/.NAME.partial`) and renamed over the target only when complete, so a failed or killed
//! run leaves the old file as it was.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// An output and the flag that named it (for messages).
#[derive(Clone, Copy)]
pub struct Out<'a> {
    pub flag: &'a str,
    pub path: &'a Path,
}

/// The directory a file `path` is created in.
fn dir_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// The file `path` names as (device, inode), following symlinks; `None` when it does not exist.
fn identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Refuse outputs that would overwrite an input or each other, directories, and paths whose
/// directory cannot take a file. `inputs` are (flag, path) pairs; missing inputs are ignored
/// (their own open reports them).
pub fn check(outs: &[Out], inputs: &[(&str, &Path)]) -> Result<()> {
    for (i, o) in outs.iter().enumerate() {
        let p = o.path;
        if p.is_dir() {
            return Err(Error::config(format!(
                "{} {}: is a directory; give a file name, e.g. {}",
                o.flag,
                p.display(),
                p.join("out.h5").display()
            )));
        }
        let me = identity(p);
        for (flag, input) in inputs {
            let same = match (me, identity(input)) {
                (Some(a), Some(b)) => a == b,
                // The output does not exist yet: it cannot be an existing input.
                _ => false,
            };
            if same {
                return Err(Error::config(format!(
                    "{} {} is the same file as {flag} {}: writing it would destroy the input; choose another output path",
                    o.flag,
                    p.display(),
                    input.display()
                )));
            }
        }
        for other in &outs[..i] {
            let same = other.path == p || (me.is_some() && me == identity(other.path));
            if same {
                return Err(Error::config(format!(
                    "{} and {} name the same file {}: give each output its own path",
                    other.flag,
                    o.flag,
                    p.display()
                )));
            }
        }
        writable(p).map_err(|e| {
            Error::config(format!(
                "{} {}: cannot create a file in {}: {e}; pass a writable path",
                o.flag,
                p.display(),
                dir_of(p).display()
            ))
        })?;
    }
    Ok(())
}

/// Whether a file can be created beside `path` (a probe file, removed at once).
pub fn writable(path: &Path) -> std::io::Result<()> {
    let dir = dir_of(path);
    if !dir.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no such directory",
        ));
    }
    let probe = dir.join(format!(".graphscale-probe-{}", std::process::id()));
    std::fs::File::create(&probe)?;
    std::fs::remove_file(&probe)
}

/// The partial file an output is written to before it is renamed over `path`.
pub fn partial(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map_or_else(|| "output".into(), |n| n.to_string_lossy().into_owned());
    dir_of(path).join(format!(".{name}.partial"))
}

/// Publish a complete partial file: rename it over `path` (atomic on one filesystem).
pub fn commit(path: &Path) -> Result<()> {
    let tmp = partial(path);
    // Data on disk before the name points at it (a crash leaves the old file or the new); a
    // disk that filled up fails here at the latest.
    std::fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
}

/// Remove a partial file after a failure (the target is untouched).
pub fn discard(path: &Path) {
    let _ = std::fs::remove_file(partial(path));
}

/// Write one output through its partial file: `write` gets the partial path; on success the
/// partial file replaces `path`, on failure it is removed and the error says the old file
/// (if any) is intact.
pub fn write_with<T>(path: &Path, write: impl FnOnce(&Path) -> Result<T>) -> Result<T> {
    let tmp = partial(path);
    match write(&tmp).and_then(|v| commit(path).map(|()| v)) {
        Ok(v) => Ok(v),
        Err(e) => {
            discard(path);
            Err(failed(path, e))
        }
    }
}

/// Collective: an output every rank writes into: `write` (every rank) gets the partial path,
/// then `last` (rank 0 alone) completes it, and rank 0 renames it over `path` once every rank
/// has agreed that both succeeded; on failure the partial file goes and the error says the old
/// file (if any) is intact.
pub fn write_collective(
    comm: &crate::comm::Comm,
    path: &Path,
    write: impl FnOnce(&Path) -> Result<()>,
    last: impl FnOnce(&Path) -> Result<()>,
) -> Result<()> {
    use crate::spmd::agree;
    let tmp = partial(path);
    let root = comm.rank() == 0;
    let written = write(&tmp).and_then(|()| {
        let done = if root {
            last(&tmp).and_then(|()| commit(path))
        } else {
            Ok(())
        };
        agree(comm, done)
    });
    written.map_err(|e| {
        if root {
            discard(path);
        }
        failed(path, e)
    })
}

/// A command's one output `-o PATH`: `check` it against `inputs`, then `write_with`.
pub fn write_output<T>(
    path: &Path,
    inputs: &[(&str, &Path)],
    write: impl FnOnce(&Path) -> Result<T>,
) -> Result<T> {
    check(&[Out { flag: "-o", path }], inputs)?;
    write_with(path, write)
}

/// A failed write's error, naming the output (the partial file's name means nothing to a user)
/// and saying what became of an earlier file there.
pub fn failed(path: &Path, e: Error) -> Error {
    let tmp = partial(path).display().to_string();
    let msg = e.to_string().replace(&tmp, &path.display().to_string());
    let kept = if path.exists() {
        "; the earlier file there is unchanged"
    } else {
        ""
    };
    Error::Output(format!(
        "{msg} (nothing was written to {}{kept})",
        path.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out<'a>(flag: &'a str, path: &'a Path) -> Out<'a> {
        Out { flag, path }
    }

    #[test]
    fn an_output_that_is_an_input_is_refused_also_through_a_symlink() {
        let d = tempfile::tempdir().unwrap();
        let g = d.path().join("g.h5");
        std::fs::write(&g, b"graph").unwrap();
        let e = check(&[out("-o", &g)], &[("--graph", &g)]).unwrap_err();
        assert!(e.to_string().contains("is the same file as --graph"), "{e}");
        let link = d.path().join("link.h5");
        std::os::unix::fs::symlink(&g, &link).unwrap();
        let e = check(&[out("-o", &link)], &[("--graph", &g)]).unwrap_err();
        assert!(e.to_string().contains("would destroy the input"), "{e}");
        // A second path to the same file (through ".").
        let dotted = d.path().join(".").join("g.h5");
        assert!(check(&[out("-o", &dotted)], &[("--graph", &g)]).is_err());
        assert_eq!(std::fs::read(&g).unwrap(), b"graph");
        // A new file is fine.
        check(&[out("-o", &d.path().join("e.h5"))], &[("--graph", &g)]).unwrap();
    }

    #[test]
    fn directories_missing_directories_and_twin_outputs_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let e = check(&[out("-o", d.path())], &[]).unwrap_err();
        assert!(e.to_string().contains("is a directory"), "{e}");
        let nowhere = d.path().join("no/such/dir/e.h5");
        let e = check(&[out("-o", &nowhere)], &[]).unwrap_err();
        assert!(e.to_string().contains("no such directory"), "{e}");
        let a = d.path().join("a.h5");
        let e = check(&[out("-o", &a), out("--test", &a)], &[]).unwrap_err();
        assert!(e.to_string().contains("name the same file"), "{e}");
    }

    #[test]
    fn a_failed_write_keeps_the_old_file_and_leaves_no_partial() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("out.h5");
        std::fs::write(&f, b"old").unwrap();
        let r: Result<()> = write_with(&f, |tmp| {
            std::fs::write(tmp, b"half").unwrap();
            Err(Error::bad_input(tmp, "line 2: bad"))
        });
        let e = r.unwrap_err().to_string();
        assert_eq!(std::fs::read(&f).unwrap(), b"old");
        assert!(!partial(&f).exists());
        assert!(
            e.contains(&f.display().to_string()) && !e.contains(".partial"),
            "{e}"
        );
        assert!(e.contains("unchanged"), "{e}");
        write_with(&f, |tmp| {
            std::fs::write(tmp, b"new").map_err(|e| Error::io(tmp, e))
        })
        .unwrap();
        assert_eq!(std::fs::read(&f).unwrap(), b"new");
        assert!(!partial(&f).exists());
    }
}
