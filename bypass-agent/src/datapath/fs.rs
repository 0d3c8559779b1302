//! The two file systems the datapath needs: cgroup v2 (where sock_ops attaches) and
//! bpffs (where pins live). Finding mounts is a pure parse of /proc/self/mountinfo.

use std::{
    fs::File,
    path::{Path, PathBuf},
};

pub use bypass_common::mountinfo::find_mount;
use nix::sys::statfs::{
    BPF_FS_MAGIC, CGROUP_SUPER_MAGIC, CGROUP2_SUPER_MAGIC, FsType, SYSFS_MAGIC, TMPFS_MAGIC, statfs,
};

use crate::error::AgentError;

/// This process's `/proc/self/mountinfo`.
fn read_mountinfo() -> Result<String, AgentError> {
    const MOUNTINFO: &str = "/proc/self/mountinfo";
    std::fs::read_to_string(MOUNTINFO).map_err(|source| AgentError::Io {
        action: "read",
        path: MOUNTINFO.into(),
        source,
    })
}

/// Where cgroup2 is mounted on this machine (`/sys/fs/cgroup` on unified hosts,
/// `/sys/fs/cgroup/unified` on hybrid ones).
pub fn find_cgroup2_mount() -> Result<PathBuf, AgentError> {
    let text = read_mountinfo()?;
    find_mount(&text, "cgroup2").ok_or(AgentError::NoCgroup2Mount)
}

/// This process's own cgroup v2 directory, where the kernel self-test attaches its
/// programs (its sockets belong to the agent's cgroup), as its mount namespace shows it:
/// in a container, its cgroup namespace's root.
pub fn own_cgroup2_dir() -> Result<PathBuf, AgentError> {
    const CGROUP: &str = "/proc/self/cgroup";
    let cgroup = std::fs::read_to_string(CGROUP).map_err(|source| AgentError::Io {
        action: "read",
        path: CGROUP.into(),
        source,
    })?;
    bypass_common::mountinfo::own_cgroup2(&cgroup, &read_mountinfo()?)
        .ok_or(AgentError::NoCgroup2Mount)
}

/// Where the cgroup2 hierarchy is in a host's `/sys/fs/cgroup` (pure): the directory
/// itself on unified hosts; on hybrid ones (cgroup v1 controllers) the child that is
/// cgroup2, `unified` first (systemd's name). `is_cgroup2` says whether a path is the
/// root of a cgroup2 mount.
pub fn cgroup2_in(
    dir: &Path,
    children: &[PathBuf],
    is_cgroup2: impl Fn(&Path) -> bool,
) -> Option<PathBuf> {
    if is_cgroup2(dir) {
        return Some(dir.to_path_buf());
    }
    let unified = dir.join("unified");
    std::iter::once(&unified)
        .chain(children.iter())
        .find(|c| is_cgroup2(c))
        .cloned()
}

/// `cgroup2_in` on the host's `/sys/fs/cgroup` mounted at `dir` (`--host-cgroupfs`):
/// an agent in a container finds the host's cgroup2 root whatever the host's layout,
/// where its own `/sys/fs/cgroup` is only its cgroup namespace's view.
pub fn find_host_cgroup2(dir: &Path) -> Result<PathBuf, AgentError> {
    if !dir.is_dir() {
        return Err(AgentError::CgroupMissing {
            path: dir.to_path_buf(),
        });
    }
    let mut children: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|source| AgentError::Io {
            action: "list",
            path: dir.to_path_buf(),
            source,
        })?
        .flatten()
        .map(|e| e.path())
        .collect();
    children.sort();
    cgroup2_in(dir, &children, |p| {
        fs_magic(p).is_ok_and(|m| m == CGROUP2_SUPER_MAGIC)
    })
    .ok_or(AgentError::NoCgroup2Mount)
}

fn fs_magic(path: &Path) -> std::io::Result<FsType> {
    Ok(statfs(path)?.filesystem_type())
}

fn fs_name(magic: FsType) -> &'static str {
    match magic {
        CGROUP_SUPER_MAGIC => "cgroup v1",
        TMPFS_MAGIC => "tmpfs",
        SYSFS_MAGIC => "sysfs",
        BPF_FS_MAGIC => "bpffs",
        CGROUP2_SUPER_MAGIC => "cgroup2",
        _ => "non-cgroup",
    }
}

/// Opens a cgroup v2 directory for attaching, or says what is wrong with the path.
pub fn open_cgroup2_dir(path: &Path) -> Result<File, AgentError> {
    if !path.exists() {
        return Err(AgentError::CgroupMissing {
            path: path.to_path_buf(),
        });
    }
    let magic = fs_magic(path).map_err(|source| AgentError::Io {
        action: "statfs",
        path: path.to_path_buf(),
        source,
    })?;
    if magic != CGROUP2_SUPER_MAGIC || !path.is_dir() {
        return Err(AgentError::NotCgroup2 {
            path: path.to_path_buf(),
            found: if path.is_dir() {
                fs_name(magic)
            } else {
                "non-directory"
            },
        });
    }
    File::open(path).map_err(|source| AgentError::Io {
        action: "open cgroup",
        path: path.to_path_buf(),
        source,
    })
}

/// Where bpffs is mounted by convention, and where [`ensure_bpffs`] mounts it.
const CONVENTIONAL_BPFFS: &str = "/sys/fs/bpf";

/// Refuses a pin directory that is the root of a mounted file system, such as
/// /sys/fs/bpf, or that would become one when [`ensure_bpffs`] mounts bpffs there. The
/// agent takes its pin directory as its own: it restricts it to root (0700) and, unless
/// its own complete datapath is pinned there, removes every pin under its `maps/`,
/// `progs/` and `links/`; a mount's root is where every other tool pins too. Checked
/// before anything is created, mounted or changed.
pub fn ensure_pin_dir_not_mount_root(pin_dir: &Path) -> Result<(), AgentError> {
    let refused = || AgentError::PinDirIsMountRoot {
        path: pin_dir.to_path_buf(),
    };
    // A path that does not exist yet is no mount point; one that does is compared as
    // mountinfo shows it (absolute, symbolic links and `..` resolved).
    let dir = std::fs::canonicalize(pin_dir)
        .unwrap_or_else(|_| pin_dir.components().collect::<PathBuf>());
    if dir == Path::new(CONVENTIONAL_BPFFS) {
        return Err(refused());
    }
    let text = read_mountinfo()?;
    if is_mount_root(&text, &dir) {
        return Err(refused());
    }
    Ok(())
}

/// Whether the mount visible at `dir` (the last one mounted there) is a whole file
/// system, from a mountinfo text (pure): its root, the fourth field, is `/`. A bind
/// mount of a directory inside one (root `/bypass`, a hostPath of the agent's own
/// directory) is not.
pub fn is_mount_root(mountinfo: &str, dir: &Path) -> bool {
    let point = mountinfo_escape(dir);
    mountinfo
        .lines()
        .rev()
        .find_map(|line| {
            let mut fields = line.split_whitespace().skip(3);
            let (root, at) = (fields.next()?, fields.next()?);
            (at == point).then_some(root == "/")
        })
        .unwrap_or(false)
}

/// A path as mountinfo writes it: space, tab, newline and backslash as `\ooo`
/// (fs/proc_namespace.c, show_mountinfo).
fn mountinfo_escape(path: &Path) -> String {
    let text = path.to_string_lossy();
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            ' ' | '\t' | '\n' | '\\' => out.push_str(&format!("\\{:03o}", c as u32)),
            _ => out.push(c),
        }
    }
    out
}

/// Makes sure `pin_dir` can live on bpffs: its nearest existing ancestor must be
/// bpffs; if that ancestor is the conventional /sys/fs/bpf and bpffs is not mounted
/// there, mount it.
pub fn ensure_bpffs(pin_dir: &Path) -> Result<(), AgentError> {
    let existing = pin_dir
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("/"));
    if fs_magic(existing).is_ok_and(|m| m == BPF_FS_MAGIC) {
        return Ok(());
    }
    let conventional = Path::new(CONVENTIONAL_BPFFS);
    if pin_dir.starts_with(conventional) && existing.starts_with("/sys") {
        mount_bpffs(conventional)?;
        tracing::info!(path = %conventional.display(), "mounted bpffs");
        return Ok(());
    }
    Err(AgentError::NotBpffs {
        path: pin_dir.to_path_buf(),
    })
}

fn mount_bpffs(at: &Path) -> Result<(), AgentError> {
    if !at.exists() {
        std::fs::create_dir_all(at).map_err(|source| AgentError::BpffsMount {
            path: at.to_path_buf(),
            source,
        })?;
    }
    nix::mount::mount(
        Some("bpf"),
        at,
        Some("bpf"),
        nix::mount::MsFlags::empty(),
        Some("mode=0700"),
    )
    .map_err(|errno| AgentError::BpffsMount {
        path: at.to_path_buf(),
        source: errno.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTS: &str = "\
25 30 0:23 / /sys rw,nosuid - sysfs sysfs rw
40 25 0:35 / /sys/fs/bpf rw,relatime shared:14 - bpf bpf rw,mode=700
41 30 0:35 /bypass /host/bypass rw,relatime - bpf bpf rw,mode=700
42 30 0:40 / /tmp/my\\040bpf rw - bpf bpf rw
43 30 0:41 / /mnt/stacked rw - bpf bpf rw
44 30 0:35 /own /mnt/stacked rw - bpf bpf rw
";

    #[test]
    fn mount_roots_are_told_from_directories_under_them() {
        for (dir, root) in [
            ("/sys/fs/bpf", true),
            ("/sys/fs/bpf/bypass", false),
            ("/tmp/my bpf", true),
            // A bind mount of a directory inside a bpffs: the agent's own.
            ("/host/bypass", false),
            // The last mount at a point is the one seen there.
            ("/mnt/stacked", false),
            ("/sys", true),
            ("/nowhere", false),
        ] {
            assert_eq!(is_mount_root(MOUNTS, Path::new(dir)), root, "{dir}");
        }
    }

    #[test]
    fn conventional_mount_point_refused_even_unmounted() {
        for dir in ["/sys/fs/bpf", "/sys/fs/bpf/", "/sys/fs/./bpf"] {
            let err = ensure_pin_dir_not_mount_root(Path::new(dir))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("root of a mounted file system") && err.contains("/bypass"),
                "{dir}: {err}"
            );
        }
    }

    #[test]
    fn host_cgroup2_unified_hybrid_or_none() {
        let dir = Path::new("/host/sys/fs/cgroup");
        let unified = |p: &Path| p == dir;
        assert_eq!(cgroup2_in(dir, &[], unified), Some(dir.to_path_buf()));
        let children = [dir.join("cpu"), dir.join("memory"), dir.join("unified")];
        let hybrid = |p: &Path| p == dir.join("unified");
        assert_eq!(
            cgroup2_in(dir, &children, hybrid),
            Some(dir.join("unified"))
        );
        let elsewhere = |p: &Path| p == dir.join("memory");
        assert_eq!(
            cgroup2_in(dir, &children, elsewhere),
            Some(dir.join("memory"))
        );
        assert_eq!(cgroup2_in(dir, &children, |_| false), None);
    }

    /// Why `open_cgroup2_dir` refuses `dir`.
    fn cgroup_error(dir: &str) -> String {
        open_cgroup2_dir(Path::new(dir)).unwrap_err().to_string()
    }

    #[test]
    fn missing_cgroup_path_is_named() {
        let err = cgroup_error("/nonexistent/cg");
        assert!(
            err.contains("/nonexistent/cg") && err.contains("--cgroup"),
            "{err}"
        );
    }

    #[test]
    fn non_cgroup_path_is_named() {
        let err = cgroup_error("/proc");
        assert!(err.contains("not a cgroup v2 directory"), "{err}");
    }
}
