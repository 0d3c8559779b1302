//! Which cgroup layout this host has (pure, from `/proc/self/mountinfo`): kubelet and
//! runc must agree on it, and Kubernetes 1.35's kubelet must be told to accept v1.

use anyhow::{Result, bail};

/// The cgroup layouts kubelet meets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupLayout {
    /// cgroup2 only, mounted at `/sys/fs/cgroup`.
    Unified,
    /// cgroup v1 controllers, plus cgroup2 elsewhere (e.g. `/sys/fs/cgroup/unified`).
    Hybrid,
    /// cgroup v1 controllers only.
    Legacy,
}

impl CgroupLayout {
    /// Reads this host's layout.
    pub fn detect() -> Result<Self> {
        let text = std::fs::read_to_string("/proc/self/mountinfo")?;
        Self::from_mountinfo(&text)
    }

    /// The layout a mountinfo text describes.
    pub fn from_mountinfo(mountinfo: &str) -> Result<Self> {
        let mut v1 = false;
        let mut v2_at_root = false;
        let mut v2 = false;
        for line in mountinfo.lines() {
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let mount_point = left.split_whitespace().nth(4).unwrap_or("");
            let fstype = right.split_whitespace().next().unwrap_or("");
            match fstype {
                "cgroup2" => {
                    v2 = true;
                    v2_at_root |= mount_point == "/sys/fs/cgroup";
                }
                "cgroup" => v1 = true,
                _ => {}
            }
        }
        Ok(match (v1, v2, v2_at_root) {
            (false, true, true) => Self::Unified,
            (true, true, _) => Self::Hybrid,
            (true, false, _) => Self::Legacy,
            (false, true, false) => {
                bail!(
                    "cgroup2 is mounted, but not at /sys/fs/cgroup and no cgroup v1 controller is: kubelet cannot run here; mount cgroup2 at /sys/fs/cgroup"
                )
            }
            (false, false, _) => {
                bail!("no cgroup filesystem is mounted: mount cgroup2 at /sys/fs/cgroup")
            }
        })
    }

    /// Whether kubelet runs on cgroup v2 (anything else is v1 to kubelet).
    pub fn is_unified(self) -> bool {
        self == Self::Unified
    }

    /// The cgroup driver kubelet and runc share: `cgroupfs`. kubelet and runc are
    /// configured together here, and this cluster's daemons are not systemd units.
    pub fn driver(self) -> &'static str {
        "cgroupfs"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
30 24 0:25 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755
31 30 0:26 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw,nsdelegate
32 30 0:27 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
";

    #[test]
    fn layouts() {
        assert_eq!(
            CgroupLayout::from_mountinfo(HYBRID).unwrap(),
            CgroupLayout::Hybrid
        );
        let unified = "29 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            CgroupLayout::from_mountinfo(unified).unwrap(),
            CgroupLayout::Unified
        );
        let legacy = "32 30 0:27 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n";
        assert_eq!(
            CgroupLayout::from_mountinfo(legacy).unwrap(),
            CgroupLayout::Legacy
        );
        assert!(CgroupLayout::from_mountinfo("").is_err());
        assert!(CgroupLayout::Unified.is_unified() && !CgroupLayout::Hybrid.is_unified());
    }
}
