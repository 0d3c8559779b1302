//! One agent per pin directory: an exclusive `flock` on the directory itself, released
//! by the kernel when the holder exits, however it exits.

use std::{
    fs::File,
    os::unix::fs::{MetadataExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
};

use nix::{
    errno::Errno,
    fcntl::{Flock, FlockArg},
};

use crate::error::AgentError;

/// Held for the agent's lifetime.
#[derive(Debug)]
pub struct PinDirLock {
    _dir: Flock<File>,
}

impl PinDirLock {
    /// Creates `path` if needed and locks it, or names the agent that holds it.
    pub fn acquire(path: &Path) -> Result<Self, AgentError> {
        std::fs::create_dir_all(path).map_err(|source| io("create pin directory", path, source))?;
        // Root only: the maps behind these pins steer every pod connection.
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
            .map_err(|source| io("restrict pin directory", path, source))?;
        let dir = File::open(path).map_err(|source| io("open pin directory", path, source))?;
        let dir = match Flock::lock(dir, FlockArg::LockExclusiveNonblock) {
            Ok(locked) => locked,
            Err((dir, Errno::EWOULDBLOCK)) => {
                let inode = dir.metadata().map(|m| m.ino()).unwrap_or(0);
                let pid = std::fs::read_to_string("/proc/locks")
                    .ok()
                    .and_then(|t| holder_pid(&t, inode))
                    .map_or_else(|| "unknown".to_owned(), |p| p.to_string());
                return Err(AgentError::PinDirBusy {
                    path: path.to_path_buf(),
                    pid,
                });
            }
            Err((_, errno)) => return Err(io("lock pin directory", path, errno.into())),
        };
        Ok(Self { _dir: dir })
    }
}

fn io(action: &'static str, path: &Path, source: std::io::Error) -> AgentError {
    AgentError::Io {
        action,
        path: PathBuf::from(path),
        source,
    }
}

/// The pid holding a FLOCK on `inode`, from the text of /proc/locks
/// (`1: FLOCK  ADVISORY  WRITE 1234 00:23:5678 0 EOF`).
pub fn holder_pid(proc_locks: &str, inode: u64) -> Option<u32> {
    proc_locks.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.get(1) != Some(&"FLOCK") {
            return None;
        }
        let dev_ino = f.get(5)?;
        let ino: u64 = dev_ino.rsplit(':').next()?.parse().ok()?;
        if ino != inode {
            return None;
        }
        f.get(4)?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_locks() {
        let t = "1: POSIX  ADVISORY  WRITE 77 00:19:12 0 EOF\n2: FLOCK  ADVISORY  WRITE 4242 00:23:5678 0 EOF\n";
        assert_eq!(holder_pid(t, 5678), Some(4242));
        assert_eq!(holder_pid(t, 12), None);
    }

    #[test]
    fn second_lock_names_holder() {
        let dir = std::env::temp_dir().join(format!("bypass-lock-{}", std::process::id()));
        let first = PinDirLock::acquire(&dir).unwrap();
        // flock locks belong to the open file description, so a second open conflicts
        // even within one process.
        let err = PinDirLock::acquire(&dir).unwrap_err().to_string();
        assert!(err.contains("another bypass-agent"), "{err}");
        assert!(err.contains(&std::process::id().to_string()), "{err}");
        drop(first);
        drop(PinDirLock::acquire(&dir).unwrap());
        std::fs::remove_dir(&dir).unwrap();
    }
}
