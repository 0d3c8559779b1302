//! Reading `/proc/<pid>/mountinfo` (pure, from its text): where each filesystem is
//! mounted. The agent finds cgroup2 and bpffs with it; xtask finds what a cluster run
//! left mounted.

extern crate std;

use std::{path::PathBuf, string::String, vec::Vec};

/// One mount: where, and of which filesystem type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    /// The directory of the filesystem mounted there (`/` for a whole one; for cgroup2
    /// in a cgroup namespace, relative to its root), escapes undone.
    pub root: String,
    /// The mount point, with mountinfo's escapes undone.
    pub point: PathBuf,
    /// The filesystem type (`cgroup2`, `bpf`, `tmpfs`, ...).
    pub fstype: String,
}

/// The mounts of a mountinfo text, in its order; lines that do not parse are skipped.
pub fn mounts(mountinfo: &str) -> impl Iterator<Item = Mount> + '_ {
    mountinfo.lines().filter_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let fstype = right.split_whitespace().next()?;
        let mut fields = left.split_whitespace().skip(3);
        let root = fields.next()?;
        let point = fields.next()?;
        Some(Mount {
            root: unescape(root),
            point: PathBuf::from(unescape(point)),
            fstype: fstype.into(),
        })
    })
}

/// The mount point of the first mount of `fstype`.
pub fn find_mount(mountinfo: &str, fstype: &str) -> Option<PathBuf> {
    mounts(mountinfo)
        .find(|m| m.fstype == fstype)
        .map(|m| m.point)
}

/// Where this process's own cgroup v2 directory is, from its `/proc/self/cgroup` and
/// `/proc/self/mountinfo` texts: the `0::PATH` line (relative to its cgroup namespace's
/// root, `/` in a container's own namespace) under a cgroup2 mount whose root holds
/// it. `None` without a cgroup2 line or a mount that shows it.
pub fn own_cgroup2(proc_cgroup: &str, mountinfo: &str) -> Option<PathBuf> {
    let path = proc_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))?
        .trim();
    mounts(mountinfo)
        .filter(|m| m.fstype == "cgroup2")
        .find_map(|m| {
            let root = m.root.trim_end_matches('/');
            let rest = path.strip_prefix(root)?;
            if !(rest.is_empty() || rest.starts_with('/')) {
                return None;
            }
            Some(m.point.join(rest.trim_start_matches('/')))
        })
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8)
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use std::vec;

    #[test]
    fn own_cgroup_on_a_host_and_in_a_container() {
        let host = "30 23 0:26 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw\n";
        assert_eq!(
            super::own_cgroup2("1:name=systemd:/x\n0::/user.slice/s-1.scope\n", host),
            Some(PathBuf::from("/sys/fs/cgroup/unified/user.slice/s-1.scope"))
        );
        assert_eq!(
            super::own_cgroup2("0::/\n", host),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        // A container in its own cgroup namespace: its root is its cgroup.
        let ctr = "600 590 0:26 / /sys/fs/cgroup ro,nosuid - cgroup2 cgroup rw\n";
        assert_eq!(
            super::own_cgroup2("0::/\n", ctr),
            Some(PathBuf::from("/sys/fs/cgroup"))
        );
        // A mount of a subtree shows only what lies under its root.
        let sub = "600 590 0:26 /kubepods/pod1 /sys/fs/cgroup ro - cgroup2 cgroup rw\n";
        assert_eq!(
            super::own_cgroup2("0::/kubepods/pod1/ctr\n", sub),
            Some(PathBuf::from("/sys/fs/cgroup/ctr"))
        );
        assert_eq!(super::own_cgroup2("0::/other\n", sub), None);
        assert_eq!(super::own_cgroup2("0::/kubepods/pod10\n", sub), None);
        assert_eq!(super::own_cgroup2("1:cpu:/x\n", host), None, "no v2 line");
    }

    use super::*;

    const HYBRID: &str = "\
25 30 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
33 25 0:28 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
34 33 0:29 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
35 33 0:30 / /sys/fs/cgroup/cpu rw,relatime shared:11 - cgroup cgroup rw,cpu
40 25 0:35 / /sys/fs/bpf rw,nosuid,nodev,noexec,relatime shared:14 - bpf bpf rw,mode=700
";

    #[test]
    fn finds_hybrid_cgroup2_and_bpffs() {
        assert_eq!(
            find_mount(HYBRID, "cgroup2"),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        assert_eq!(
            find_mount(HYBRID, "bpf"),
            Some(PathBuf::from("/sys/fs/bpf"))
        );
    }

    #[test]
    fn finds_unified_and_none() {
        let unified = "29 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n";
        assert_eq!(
            find_mount(unified, "cgroup2"),
            Some(PathBuf::from("/sys/fs/cgroup"))
        );
        let v1_only = "35 33 0:30 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n";
        assert_eq!(find_mount(v1_only, "cgroup2"), None);
        assert_eq!(find_mount("garbage line\n\n", "cgroup2"), None);
    }

    #[test]
    fn every_mount_in_order_escapes_undone() {
        let text = "\
34 33 0:29 / /mnt/my\\040cgroup rw - cgroup2 cgroup2 rw
garbage
4 1 0:4 / /run/s\\134p rw - tmpfs tmpfs rw
";
        let got: Vec<Mount> = mounts(text).collect();
        assert_eq!(
            got,
            vec![
                Mount {
                    root: "/".into(),
                    point: PathBuf::from("/mnt/my cgroup"),
                    fstype: "cgroup2".into()
                },
                Mount {
                    root: "/".into(),
                    point: PathBuf::from("/run/s\\p"),
                    fstype: "tmpfs".into()
                },
            ]
        );
    }
}
