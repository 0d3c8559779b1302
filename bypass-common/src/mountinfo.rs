//! Reading `/proc/<pid>/mountinfo` (pure, from its text): where each filesystem is
//! mounted. The agent finds cgroup2 and bpffs with it; xtask finds what a cluster run
//! left mounted.

extern crate std;

use std::{path::PathBuf, string::String, vec::Vec};

/// One mount: where, and of which filesystem type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
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
        let point = left.split_whitespace().nth(4)?;
        Some(Mount {
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
                    point: PathBuf::from("/mnt/my cgroup"),
                    fstype: "cgroup2".into()
                },
                Mount {
                    point: PathBuf::from("/run/s\\p"),
                    fstype: "tmpfs".into()
                },
            ]
        );
    }
}
