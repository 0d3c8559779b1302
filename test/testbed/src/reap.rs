//! What killed runs left behind. A test process that is killed (SIGKILL, a CI job's
//! timeout) runs none of its guards: its pods' namespaces, processes and veths, their
//! bridge, cgroups, agents and pin directories stay. The agent of a later run reads the
//! addresses of every namespace on the node, so a dead run's pods with the same /24 (the
//! subnet comes from the tag's hash, [`crate::topology`]) look like foreign owners of
//! the new pods' addresses. Every name carries its run's tag, which starts with the
//! creating process's pid ([`crate::names::tag_pid`]); [`dead_runs`]
//! removes what no live process made, once per process, before the first pods.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    sync::OnceLock,
};

use anyhow::Result;
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

use crate::{Bridge, CgroupGuard, Netns, names};

/// Whether the process the tag was made by is gone (a live process, even an unrelated
/// one that reused the pid, keeps it; a name that is not a tag is never reaped).
fn dead(tag: &str) -> bool {
    names::tag_pid(tag).is_some_and(|pid| !Path::new("/proc").join(pid.to_string()).exists())
}

/// The tag of the resource `name` (`<prefix>-<tag>-<what>`) under `prefix`.
fn resource_tag<'a>(name: &'a str, prefix: &str) -> Option<&'a str> {
    let rest = name.strip_prefix(prefix)?.strip_prefix('-')?;
    let (tag, what) = rest.split_once('-')?;
    (!tag.is_empty() && !what.is_empty()).then_some(tag)
}

/// The tag of the bridge `name` (`<prefix>-br<tag>`) under `prefix`.
fn bridge_tag<'a>(name: &'a str, prefix: &str) -> Option<&'a str> {
    let rest = name.strip_prefix(prefix)?;
    rest.strip_prefix("-br")
        .or_else(|| rest.strip_prefix(crate::link::DOWN_KIND))
        .filter(|t| !t.is_empty())
}

/// What [`dead_runs`] removed, by name.
#[derive(Debug, Default)]
pub struct Reaped {
    /// Processes killed (agents and tools of dead runs), by pid.
    pub processes: Vec<i32>,
    /// Cgroups, namespaces, bridges and pin directories removed.
    pub resources: Vec<String>,
}

/// Removes, once per process, what dead runs under this process's prefix left
/// ([`reap`]); what it removed is logged on stderr.
pub fn dead_runs() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| match reap(names::prefix()) {
        Ok(r) if r.processes.is_empty() && r.resources.is_empty() => {}
        Ok(r) => eprintln!(
            "testbed: removed what killed runs left: {} (processes {:?})",
            r.resources.join(", "),
            r.processes
        ),
        Err(e) => eprintln!("testbed: could not look for what killed runs left: {e:#}"),
    });
}

/// Removes what dead runs under `prefix` left: their agents and other processes (those
/// in their cgroups, and any whose command line names one of their pin directories),
/// then their cgroups, namespaces (with the pods' veths), bridges and pin directories.
pub fn reap(prefix: &str) -> Result<Reaped> {
    let mut reaped = Reaped::default();
    let cgroup_root = crate::cgroup::cgroup2_mount()?;
    let bpffs = Path::new("/sys/fs/bpf");
    let resource_names = |dir: &Path| -> Vec<String> {
        std::fs::read_dir(dir)
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.file_name().into_string().ok())
                    .filter(|n| resource_tag(n, prefix).is_some_and(dead))
                    .collect()
            })
            .unwrap_or_default()
    };
    // Processes first: an agent keeps its pins attached, a pod's process its namespace.
    let pin_dirs: Vec<String> = resource_names(bpffs);
    let pin_paths: BTreeSet<String> = pin_dirs
        .iter()
        .map(|n| bpffs.join(n).display().to_string())
        .collect();
    for pid in processes_naming(&pin_paths) {
        if kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok() {
            reaped.processes.push(pid);
        }
    }
    for name in resource_names(&cgroup_root) {
        let path = cgroup_root.join(&name);
        reaped.processes.extend(cgroup_pids(&path));
        remove_cgroup_tree(&path);
        reaped.resources.push(format!("cgroup {name}"));
    }
    for name in resource_names(Path::new("/run/netns")) {
        drop(Netns::existing(&name));
        reaped.resources.push(format!("netns {name}"));
    }
    for name in links()? {
        if bridge_tag(&name, prefix).is_some_and(dead) {
            drop(Bridge::existing(&name));
            reaped.resources.push(format!("link {name}"));
        }
    }
    for name in pin_dirs {
        crate::agent::remove_pins(&bpffs.join(&name))?;
        reaped.resources.push(format!("pins {name}"));
    }
    Ok(reaped)
}

/// The pids in the cgroup at `path` and below.
fn cgroup_pids(path: &Path) -> Vec<i32> {
    let mut pids: Vec<i32> = std::fs::read_to_string(path.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    if let Ok(d) = std::fs::read_dir(path) {
        for e in d.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                pids.extend(cgroup_pids(&e.path()));
            }
        }
    }
    pids
}

/// Kills everything in the cgroup at `path` and removes it with every cgroup below it,
/// the deepest first (the guards' own cleanup, one cgroup at a time).
fn remove_cgroup_tree(path: &Path) {
    let children: Vec<PathBuf> = std::fs::read_dir(path)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default();
    for child in children {
        remove_cgroup_tree(&child);
    }
    drop(CgroupGuard::existing(path));
}

/// Pids of the processes whose command line has one of `needles` as an argument.
fn processes_naming(needles: &BTreeSet<String>) -> Vec<i32> {
    if needles.is_empty() {
        return Vec::new();
    }
    let Ok(proc_dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    proc_dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                c.split(|&b| b == 0)
                    .any(|arg| std::str::from_utf8(arg).is_ok_and(|a| needles.contains(a)))
            })
        })
        .collect()
}

/// The names of the host's links.
fn links() -> Result<Vec<String>> {
    Ok(std::fs::read_dir("/sys/class/net")?
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_read_from_names_and_their_pid_back() {
        assert_eq!(resource_tag("br-2n9cx0-a", "br"), Some("2n9cx0"));
        assert_eq!(resource_tag("br-2n9cx0-node-a", "br"), Some("2n9cx0"));
        assert_eq!(resource_tag("bt-2n9cx0-a", "br"), None);
        assert_eq!(resource_tag("br-2n9cx0", "br"), None);
        assert_eq!(bridge_tag("br-br2n9cx0", "br"), Some("2n9cx0"));
        assert_eq!(bridge_tag("br-a2n9cx0", "br"), None);
        assert_eq!(bridge_tag("br-dn2n9cx0", "br"), Some("2n9cx0"));
        assert_eq!(names::tag_pid(&names::tag(1234, 5)), Some(1234));
        assert_eq!(
            names::tag_pid(&names::tag(4_194_303, 1088)),
            Some(4_194_303)
        );
        assert_eq!(names::tag(4_194_303, 1088).len(), 8);
        assert_eq!(
            names::tag_pid("2xn9cx0"),
            None,
            "a base-36 tag with an x in its pid"
        );
        assert_eq!(names::tag_pid("pins"), None);
        assert!(!dead(&names::unique_tag()), "this process is alive");
    }
}
