//! cgroup v2: where it is mounted (from /proc/self/mountinfo, never assumed), and a
//! directory guard that kills what is left inside and removes itself on drop.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

/// The mount point of the first `fstype` mount in a mountinfo text: the agent's own
/// parser.
pub use bypass_common::mountinfo::find_mount;

/// Where cgroup2 is mounted here (`/sys/fs/cgroup` or, on hybrid hosts,
/// `/sys/fs/cgroup/unified`).
pub fn cgroup2_mount() -> Result<PathBuf> {
    let text =
        std::fs::read_to_string("/proc/self/mountinfo").context("read /proc/self/mountinfo")?;
    find_mount(&text, "cgroup2")
        .context("no cgroup2 file system is mounted (see /proc/self/mountinfo)")
}

/// A cgroup v2 directory we created. On drop, every process left inside (and in its
/// descendants) is killed and the directory removed; drop children first.
#[derive(Debug)]
pub struct CgroupGuard {
    path: PathBuf,
}

impl CgroupGuard {
    /// Creates `<cgroup2 mount>/<name>`.
    pub fn create(name: &str) -> Result<Self> {
        Self::create_at(&cgroup2_mount()?.join(name))
    }

    /// Creates `<self>/<name>`.
    pub fn child(&self, name: &str) -> Result<Self> {
        Self::create_at(&self.path.join(name))
    }

    fn create_at(path: &Path) -> Result<Self> {
        std::fs::create_dir(path).with_context(|| format!("create cgroup {}", path.display()))?;
        Ok(Self {
            path: path.to_path_buf(),
        })
    }

    /// The cgroup at `path` that exists already, to empty and remove on drop (what a
    /// killed run left, [`crate::reap`]).
    pub(crate) fn existing(path: &Path) -> Self {
        Self {
            path: path.to_path_buf(),
        }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its `cgroup.procs` file (write a pid to move that process in).
    pub fn procs_file(&self) -> PathBuf {
        self.path.join("cgroup.procs")
    }

    /// Pids directly in this cgroup.
    pub fn pids(&self) -> Result<Vec<i32>> {
        let p = self.procs_file();
        let text = std::fs::read_to_string(&p).with_context(|| format!("read {}", p.display()))?;
        Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
    }

    /// Whether any process is in this cgroup or below (`cgroup.events`).
    pub fn populated(&self) -> Result<bool> {
        let p = self.path.join("cgroup.events");
        let text = std::fs::read_to_string(&p).with_context(|| format!("read {}", p.display()))?;
        Ok(text.lines().any(|l| l.trim() == "populated 1"))
    }

    /// Kills everything in this cgroup and below, and waits until it is empty.
    pub fn kill_all(&self, timeout: Duration) -> Result<()> {
        let kill_file = self.path.join("cgroup.kill");
        let deadline = Instant::now() + timeout;
        while self.populated()? {
            if kill_file.exists() {
                // Kernel >= 5.14: SIGKILL to the whole subtree.
                std::fs::write(&kill_file, "1")
                    .with_context(|| format!("write {}", kill_file.display()))?;
            } else {
                for pid in self.pids()? {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "cgroup {} still has processes after {timeout:?}",
                    self.path.display()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }
}

impl Drop for CgroupGuard {
    fn drop(&mut self) {
        if let Err(e) = self.kill_all(crate::steps::NET) {
            eprintln!("testbed: cleanup: {e:#}");
        }
        // rmdir can briefly fail with EBUSY while killed tasks finish exiting.
        let mut last = None;
        for _ in 0..100 {
            match std::fs::remove_dir(&self.path) {
                Ok(()) => return,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
                Err(e) => last = Some(e),
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if let Some(e) = last {
            eprintln!(
                "testbed: cleanup: remove cgroup {}: {e}",
                self.path.display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_hybrid_and_unified_mounts() {
        let hybrid = "\
33 25 0:28 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
34 33 0:29 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
";
        assert_eq!(
            find_mount(hybrid, "cgroup2"),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        let unified = "29 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            find_mount(unified, "cgroup2"),
            Some(PathBuf::from("/sys/fs/cgroup"))
        );
        assert_eq!(
            find_mount("35 33 0:30 / /a rw - cgroup cgroup rw\n", "cgroup2"),
            None
        );
        let spaced = "34 33 0:29 / /mnt/my\\040cg rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            find_mount(spaced, "cgroup2"),
            Some(PathBuf::from("/mnt/my cg"))
        );
    }
}
