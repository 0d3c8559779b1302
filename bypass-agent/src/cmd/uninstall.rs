//! `uninstall`: removes what is pinned, says what went, and (`--wait`) stays until told
//! to stop. `--all` finds every bypass datapath pinned on the bpffs mount, whatever pin
//! directory its agent was given, so a node is clean even when the uninstaller does not
//! know the agent's `--pin-dir`.

use std::path::{Path, PathBuf};

use bypass_common::names::{MAP_CONTROL, PIN_MAPS_SUBDIR};

use crate::{cli::UninstallOpts, datapath, error::AgentError};

/// How deep under the bpffs mount a pin directory is looked for.
const DEPTH: usize = 3;

/// The pin directories under `root` (at most `DEPTH` levels down) that hold a bypass
/// datapath: a `maps/BYPASS_CONTROL` pin, sorted.
pub fn pinned_datapaths(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![(root.to_path_buf(), 0)];
    while let Some((dir, depth)) = dirs.pop() {
        if dir.join(PIN_MAPS_SUBDIR).join(MAP_CONTROL).exists() {
            found.push(dir);
            continue;
        }
        if depth == DEPTH {
            continue;
        }
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                dirs.push((entry.path(), depth + 1));
            }
        }
    }
    found.sort();
    found
}

/// Removes the pins under `--pin-dir` (or, with `--all`, of every datapath on the
/// bpffs mount) and prints each one removed.
pub fn uninstall(opts: &UninstallOpts) -> Result<(), AgentError> {
    let dirs = if opts.all {
        pinned_datapaths(&opts.bpffs)
    } else {
        vec![opts.pins.pin_dir.clone()]
    };
    let mut removed = Vec::new();
    for dir in &dirs {
        removed.extend(datapath::uninstall(dir)?);
    }
    for path in &removed {
        println!("removed {}", path.display());
    }
    if removed.is_empty() {
        if opts.all {
            println!("no bypass datapath pinned under {}", opts.bpffs.display());
        } else {
            println!("nothing pinned under {}", opts.pins.pin_dir.display());
            // A node is not reported clean without saying what else is pinned (an
            // agent given another --pin-dir).
            for other in pinned_datapaths(&opts.bpffs) {
                println!(
                    "but a bypass datapath is pinned at {}: pass --pin-dir {} (or --all) to remove it",
                    other.display(),
                    other.display()
                );
            }
        }
    }
    if opts.wait {
        wait_for_termination();
    }
    Ok(())
}

/// Blocks until SIGTERM or SIGINT (`uninstall --wait`).
fn wait_for_termination() {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGINT);
    if set.thread_block().is_ok() {
        let _ = std::io::Write::flush(&mut std::io::stdout());
        let _ = set.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_datapaths_wherever_they_are_pinned() {
        let root = std::env::temp_dir().join(format!("bypass-uninstall-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for dir in ["bypass", "team/custom", "a/b/c/too-deep-x"] {
            let maps = root.join(dir).join(PIN_MAPS_SUBDIR);
            std::fs::create_dir_all(&maps).unwrap();
            std::fs::write(maps.join(MAP_CONTROL), b"").unwrap();
        }
        std::fs::create_dir_all(root.join("other/maps")).unwrap();
        assert_eq!(
            pinned_datapaths(&root),
            [root.join("bypass"), root.join("team/custom")]
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
