//! Pin layout under the pin directory, and removing pins.

use std::{
    cell::Cell,
    path::{Path, PathBuf},
};

use bypass_common::names::{PIN_LINKS_SUBDIR, PIN_MAPS_SUBDIR, PIN_PROGS_SUBDIR};

use crate::error::AgentError;

/// Paths of everything the agent pins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinLayout {
    root: PathBuf,
}

impl PinLayout {
    /// Layout under `root`.
    pub fn new(root: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
        }
    }

    /// The pin directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where map `name` is pinned.
    pub fn map(&self, name: &str) -> PathBuf {
        self.root.join(PIN_MAPS_SUBDIR).join(name)
    }

    /// Where program `name` is pinned.
    pub fn prog(&self, name: &str) -> PathBuf {
        self.root.join(PIN_PROGS_SUBDIR).join(name)
    }

    /// Where link `name` is pinned.
    pub fn link(&self, name: &str) -> PathBuf {
        self.root.join(PIN_LINKS_SUBDIR).join(name)
    }

    fn subdirs(&self) -> [PathBuf; 3] {
        [PIN_LINKS_SUBDIR, PIN_PROGS_SUBDIR, PIN_MAPS_SUBDIR].map(|d| self.root.join(d))
    }

    /// Creates the sub-directories (the root exists: the lock holds it).
    pub fn create_dirs(&self) -> Result<(), AgentError> {
        for dir in self.subdirs() {
            std::fs::create_dir_all(&dir).map_err(|source| AgentError::Io {
                action: "create pin directory",
                path: dir.clone(),
                source,
            })?;
        }
        Ok(())
    }
}

/// Whether a complete datapath is pinned (the control map is pinned last).
pub fn complete(layout: &PinLayout) -> bool {
    layout.map(bypass_common::names::MAP_CONTROL).exists()
        && layout.prog(bypass_common::names::PROG_SOCKOPS).exists()
        && layout.prog(bypass_common::names::PROG_SKMSG).exists()
        && layout.prog(bypass_common::names::PROG_SOCKOPT).exists()
}

/// Removes pins in the sub-directories (links first, so the datapath detaches before
/// its maps go) and the empty sub-directories; the root stays (it carries the lock).
/// Returns what was removed.
pub fn remove_stale(layout: &PinLayout) -> Result<Vec<PathBuf>, AgentError> {
    let mut removed = Vec::new();
    for dir in layout.subdirs() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => {
                return Err(AgentError::Io {
                    action: "read pin directory",
                    path: dir,
                    source,
                });
            }
        };
        let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for path in paths {
            std::fs::remove_file(&path).map_err(|source| AgentError::Io {
                action: "remove pin",
                path: path.clone(),
                source,
            })?;
            removed.push(path);
        }
        std::fs::remove_dir(&dir).map_err(|source| AgentError::Io {
            action: "remove pin directory",
            path: dir.clone(),
            source,
        })?;
    }
    Ok(removed)
}

/// Removes every pin and the pin directory itself.
pub fn remove_all(layout: &PinLayout) -> Result<Vec<PathBuf>, AgentError> {
    let removed = remove_stale(layout)?;
    match std::fs::remove_dir(layout.root()) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(AgentError::Io {
                action: "remove pin directory",
                path: layout.root().to_path_buf(),
                source,
            });
        }
    }
    Ok(removed)
}

/// Removes the pins made so far if loading fails half-way.
pub struct PinGuard {
    layout: PinLayout,
    armed: Cell<bool>,
}

impl PinGuard {
    /// Guard over `layout`, armed or not.
    pub fn new(layout: PinLayout, armed: bool) -> Self {
        Self {
            layout,
            armed: Cell::new(armed),
        }
    }

    /// Loading succeeded: keep the pins.
    pub fn disarm(self) {
        self.armed.set(false);
    }
}

impl Drop for PinGuard {
    fn drop(&mut self) {
        if self.armed.get()
            && let Err(e) = remove_all(&self.layout)
        {
            tracing::warn!(error = %e, "cleaning up after a failed load");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_paths() {
        let l = PinLayout::new(Path::new("/sys/fs/bpf/bypass"));
        assert_eq!(
            l.map("BYPASS_SOCKETS"),
            Path::new("/sys/fs/bpf/bypass/maps/BYPASS_SOCKETS")
        );
        assert_eq!(l.prog("p"), Path::new("/sys/fs/bpf/bypass/progs/p"));
        assert_eq!(l.link("l"), Path::new("/sys/fs/bpf/bypass/links/l"));
    }

    #[test]
    fn remove_all_on_plain_dirs() {
        let root = std::env::temp_dir().join(format!("bypass-pins-{}", std::process::id()));
        let l = PinLayout::new(&root);
        std::fs::create_dir_all(&root).unwrap();
        l.create_dirs().unwrap();
        std::fs::write(l.map("A"), b"").unwrap();
        std::fs::write(l.link("B"), b"").unwrap();
        let removed = remove_all(&l).unwrap();
        assert_eq!(removed.len(), 2);
        assert!(
            removed[0].ends_with("links/B"),
            "links go first: {removed:?}"
        );
        assert!(!root.exists());
    }
}
