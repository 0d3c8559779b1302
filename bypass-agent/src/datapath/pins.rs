//! Pin layout under the pin directory, and removing pins.
//!
//! ```text
//! <pin dir>/maps/ progs/ links/          the datapath this agent runs
//! <pin dir>/released/<n>/maps/ progs/ links/
//!                                        a datapath an upgrade or rollback released,
//!                                        kept while its connections drain (drain.rs)
//! ```

use std::{
    cell::Cell,
    path::{Path, PathBuf},
};

use bypass_common::names::{
    MAP_CONTROL, PIN_LINKS_SUBDIR, PIN_MAPS_SUBDIR, PIN_PROGS_SUBDIR, PIN_RELEASED_SUBDIR,
};

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
        SUBDIRS.map(|d| self.root.join(d))
    }

    /// Where released datapaths are kept while they drain (`<root>/released`).
    pub fn released_dir(&self) -> PathBuf {
        self.root.join(PIN_RELEASED_SUBDIR)
    }

    /// The layout of released datapath number `n` (`<root>/released/<n>`).
    pub fn released(&self, n: u32) -> PinLayout {
        PinLayout::new(&self.released_dir().join(n.to_string()))
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

/// A datapath's sub-directories, in the order they are removed and moved: links first
/// (removing a link's pin detaches it), maps last (the control map's pin marks a
/// complete datapath, pinned last by a load and moved last by a release).
const SUBDIRS: [&str; 3] = [PIN_LINKS_SUBDIR, PIN_PROGS_SUBDIR, PIN_MAPS_SUBDIR];

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

/// Removes every pin, the released datapaths' too, and the pin directory itself.
pub fn remove_all(layout: &PinLayout) -> Result<Vec<PathBuf>, AgentError> {
    let mut removed = remove_stale(layout)?;
    for (_, released) in released(layout)? {
        removed.extend(remove_released(&released)?);
    }
    remove_dir_if_there(&layout.released_dir())?;
    remove_dir_if_there(layout.root())?;
    Ok(removed)
}

/// Removes the pins of the datapath at `layout`'s root, and the pin directory if nothing
/// else is in it (released datapaths draining there are kept).
pub fn remove_current(layout: &PinLayout) -> Result<Vec<PathBuf>, AgentError> {
    let removed = remove_stale(layout)?;
    let empty = std::fs::read_dir(layout.root()).is_ok_and(|mut d| d.next().is_none());
    if empty {
        remove_dir_if_there(layout.root())?;
    }
    Ok(removed)
}

/// Removes the pins of a released datapath (links first: its programs detach) and its
/// directory; `released/` itself stays.
pub fn remove_released(released: &PinLayout) -> Result<Vec<PathBuf>, AgentError> {
    let removed = remove_stale(released)?;
    remove_dir_if_there(released.root())?;
    Ok(removed)
}

fn remove_dir_if_there(dir: &Path) -> Result<(), AgentError> {
    match std::fs::remove_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(AgentError::Io {
            action: "remove pin directory",
            path: dir.to_path_buf(),
            source,
        }),
    }
}

/// The released datapaths under `layout` (`released/<n>`), by number, oldest first.
/// Entries that are not numbers are not ours and are left alone.
pub fn released(layout: &PinLayout) -> Result<Vec<(u32, PinLayout)>, AgentError> {
    let dir = layout.released_dir();
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(AgentError::Io {
                action: "read pin directory",
                path: dir,
                source,
            });
        }
    };
    let mut found: Vec<(u32, PinLayout)> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .map(|n| (n, layout.released(n)))
        .collect();
    found.sort_by_key(|(n, _)| *n);
    Ok(found)
}

/// Whether a released datapath was moved whole (its maps are moved last).
pub fn released_complete(released: &PinLayout) -> bool {
    released.map(MAP_CONTROL).exists()
}

/// The number the next released datapath gets: one above the highest there (pure).
pub fn next_released(taken: &[u32]) -> u32 {
    taken.iter().max().map_or(1, |n| n.saturating_add(1))
}

/// Moves the datapath pinned at `layout`'s root under `released/<n>` (a new number), its
/// sub-directories one rename each in [`SUBDIRS`] order, and returns where it went.
/// bpffs renames in place (kernel/bpf/inode.c, `simple_rename`): every program, map and
/// link stays as it is, attached or not, and only its path changes. A move interrupted
/// half-way is finished by [`finish_interrupted_release`] at the next start.
pub fn move_to_released(layout: &PinLayout) -> Result<PinLayout, AgentError> {
    let taken: Vec<u32> = released(layout)?.into_iter().map(|(n, _)| n).collect();
    let target = layout.released(next_released(&taken));
    std::fs::create_dir_all(target.root()).map_err(|source| AgentError::Io {
        action: "create released pin directory",
        path: target.root().to_path_buf(),
        source,
    })?;
    move_subdirs(layout, &target)?;
    Ok(target)
}

/// Renames each of `from`'s sub-directories that `to` lacks into `to`, in [`SUBDIRS`]
/// order.
fn move_subdirs(from: &PinLayout, to: &PinLayout) -> Result<(), AgentError> {
    for (src, dst) in from.subdirs().into_iter().zip(to.subdirs()) {
        if !src.exists() || dst.exists() {
            continue;
        }
        std::fs::rename(&src, &dst).map_err(|source| AgentError::Io {
            action: "move a released datapath's pins to",
            path: dst.clone(),
            source,
        })?;
    }
    Ok(())
}

/// Finishes a release that an agent started and did not end (killed between two
/// renames of [`move_to_released`]): a released datapath without its maps gets the rest
/// of its sub-directories from the root, where they still are; one that had not started
/// (empty) is removed. Returns how many were finished.
pub fn finish_interrupted_release(layout: &PinLayout) -> Result<usize, AgentError> {
    let mut finished = 0;
    for (_, released) in released(layout)? {
        if released_complete(&released) {
            continue;
        }
        let started = released.subdirs().iter().any(|d| d.exists());
        if !started {
            remove_dir_if_there(released.root())?;
            continue;
        }
        // The root's links went first: a root that still has them is a datapath loaded
        // since, not the rest of this one.
        if layout.link_dir_exists() {
            continue;
        }
        move_subdirs(layout, &released)?;
        finished += 1;
    }
    Ok(finished)
}

impl PinLayout {
    fn link_dir_exists(&self) -> bool {
        self.root.join(PIN_LINKS_SUBDIR).exists()
    }
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
            && let Err(e) = remove_current(&self.layout)
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
    fn released_numbers_count_up_from_the_highest() {
        assert_eq!(next_released(&[]), 1);
        assert_eq!(next_released(&[1, 2]), 3);
        assert_eq!(next_released(&[3]), 4, "a gap below is not reused");
        let l = PinLayout::new(Path::new("/sys/fs/bpf/bypass"));
        assert_eq!(
            l.released(2).map("BYPASS_SOCKETS"),
            Path::new("/sys/fs/bpf/bypass/released/2/maps/BYPASS_SOCKETS")
        );
    }

    fn scratch(name: &str) -> PinLayout {
        let root = std::env::temp_dir().join(format!("bypass-pins-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        PinLayout::new(&root)
    }

    fn pin_datapath(l: &PinLayout) {
        l.create_dirs().unwrap();
        std::fs::write(l.map(MAP_CONTROL), b"").unwrap();
        std::fs::write(l.link("L"), b"").unwrap();
        std::fs::write(l.prog("P"), b"").unwrap();
    }

    #[test]
    fn a_release_moves_the_whole_datapath_under_a_new_number() {
        let l = scratch("release");
        pin_datapath(&l);
        let first = move_to_released(&l).unwrap();
        assert_eq!(first, l.released(1));
        assert!(released_complete(&first));
        assert!(first.link("L").exists() && first.prog("P").exists());
        assert!(!l.map(MAP_CONTROL).exists() && !l.link("L").exists());
        pin_datapath(&l);
        assert_eq!(move_to_released(&l).unwrap(), l.released(2));
        let listed: Vec<u32> = released(&l).unwrap().into_iter().map(|(n, _)| n).collect();
        assert_eq!(listed, vec![1, 2]);
        let removed = remove_all(&l).unwrap();
        assert_eq!(removed.len(), 6, "{removed:?}");
        assert!(!l.root().exists());
    }

    #[test]
    fn an_interrupted_release_is_finished_or_dropped() {
        let l = scratch("interrupted");
        pin_datapath(&l);
        // Killed after the links moved: the rest is still at the root.
        let target = l.released(1);
        std::fs::create_dir_all(target.root()).unwrap();
        std::fs::rename(
            l.root().join(PIN_LINKS_SUBDIR),
            target.root().join(PIN_LINKS_SUBDIR),
        )
        .unwrap();
        assert!(!released_complete(&target));
        assert_eq!(finish_interrupted_release(&l).unwrap(), 1);
        assert!(released_complete(&target) && target.prog("P").exists());
        assert!(!complete(&l) && !l.map(MAP_CONTROL).exists());
        // Killed before the first rename: an empty directory, removed; the root stays.
        pin_datapath(&l);
        std::fs::create_dir_all(l.released(2).root()).unwrap();
        assert_eq!(finish_interrupted_release(&l).unwrap(), 0);
        assert!(!l.released(2).root().exists());
        assert!(l.link("L").exists());
        // A failed load cleans the root only: the released datapath stays.
        remove_current(&l).unwrap();
        assert!(released_complete(&target) && l.root().exists());
        remove_all(&l).unwrap();
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
