//! What the cluster changes on the host, and how `down` takes each back: the node's
//! link, `ip_forward`, kubelet's and containerd's mounts, the pods' network
//! namespaces, the CNI bridge, kube-proxy's and kubelet's iptables chains, kubelet's
//! cgroups. The decisions (which mounts, chains, cgroups) are pure parses.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result};
use bypass_common::mountinfo::mounts;
use xtask_lib::cmd;

use super::config::{BRIDGE, NODE_IP, NODE_IP6, NODE_LINK};

const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";

/// Adds the node's link (a bridge without ports) with [`NODE_IP`] (idempotent).
pub fn add_node_link() -> Result<()> {
    if !Path::new("/sys/class/net").join(NODE_LINK).exists() {
        cmd::output(Command::new("ip").args(["link", "add", NODE_LINK, "type", "bridge"]))?;
    }
    let addrs = cmd::output(Command::new("ip").args(["-o", "addr", "show", "dev", NODE_LINK]))?;
    if !addrs.contains(&format!("{NODE_IP}/32")) {
        cmd::output(Command::new("ip").args([
            "addr",
            "add",
            &format!("{NODE_IP}/32"),
            "dev",
            NODE_LINK,
        ]))?;
    }
    // The node's IPv6 address too (a dual-stack node: status.hostIPs has both), so the
    // agent's metrics are served and tested on an IPv6 node address. `nodad`: the link
    // has no port, no neighbour could answer a duplicate-address probe.
    let _ = std::fs::write(
        format!("/proc/sys/net/ipv6/conf/{NODE_LINK}/disable_ipv6"),
        "0",
    );
    if !addrs.contains(&format!("{NODE_IP6}/128")) {
        cmd::output(Command::new("ip").args([
            "-6",
            "addr",
            "add",
            &format!("{NODE_IP6}/128"),
            "dev",
            NODE_LINK,
            "nodad",
        ]))?;
    }
    cmd::output(Command::new("ip").args(["link", "set", NODE_LINK, "up"]))?;
    Ok(())
}

/// Turns on IPv4 forwarding (a Service's DNAT to a pod is routed by the node); returns
/// the value to restore.
pub fn enable_forwarding() -> Result<String> {
    let before = std::fs::read_to_string(IP_FORWARD)
        .with_context(|| format!("read {IP_FORWARD}"))?
        .trim()
        .to_owned();
    std::fs::write(IP_FORWARD, "1").with_context(|| format!("write {IP_FORWARD}"))?;
    Ok(before)
}

/// Sets `ip_forward` back.
pub fn restore_forwarding(value: &str) -> Result<()> {
    std::fs::write(IP_FORWARD, value).with_context(|| format!("write {IP_FORWARD}"))
}

/// Whether the mount at `mount_point` has shared propagation (a `shared:N` optional
/// field), from a mountinfo text (pure); `None` when nothing is mounted there.
pub fn is_shared(mountinfo: &str, mount_point: &str) -> Option<bool> {
    mountinfo.lines().rev().find_map(|l| {
        let (left, _) = l.split_once(" - ")?;
        let mut fields = left.split_whitespace();
        (fields.nth(4)? == mount_point).then(|| fields.skip(1).any(|f| f.starts_with("shared:")))
    })
}

/// Makes `/sys/fs/bpf` a shared mount (the agent's Bidirectional bpffs volume needs it;
/// systemd hosts have it so already). Returns whether it was private before.
pub fn share_bpffs() -> Result<bool> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    match is_shared(&text, BPFFS) {
        Some(true) => Ok(false),
        Some(false) => {
            nix::mount::mount(
                None::<&str>,
                BPFFS,
                None::<&str>,
                nix::mount::MsFlags::MS_SHARED,
                None::<&str>,
            )
            .with_context(|| format!("make {BPFFS} a shared mount"))?;
            Ok(true)
        }
        None => {
            anyhow::bail!("bpffs is not mounted at {BPFFS}: mount it (mount -t bpf bpf {BPFFS})")
        }
    }
}

/// Makes `/sys/fs/bpf` private again.
pub fn unshare_bpffs() -> Result<()> {
    nix::mount::mount(
        None::<&str>,
        BPFFS,
        None::<&str>,
        nix::mount::MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .with_context(|| format!("make {BPFFS} private again"))
}

const BPFFS: &str = "/sys/fs/bpf";

/// Mount points at or below any of `roots`, deepest first (pure, from mountinfo).
pub fn mounts_below(mountinfo: &str, roots: &[&Path]) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = mounts(mountinfo)
        .map(|m| m.point)
        .filter(|p| roots.iter().any(|r| p.starts_with(r)))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    found
}

/// Unmounts everything at or below `roots` (lazily if busy).
pub fn unmount_below(roots: &[&Path]) -> Result<Vec<PathBuf>> {
    let mut done = Vec::new();
    // Stacked mounts show once per layer: repeat until none is left.
    for _ in 0..5 {
        let text = std::fs::read_to_string("/proc/self/mountinfo")?;
        let mounts = mounts_below(&text, roots);
        if mounts.is_empty() {
            break;
        }
        for m in mounts {
            if nix::mount::umount2(&m, nix::mount::MntFlags::empty()).is_err() {
                nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH)
                    .with_context(|| format!("unmount {}", m.display()))?;
            }
            done.push(m);
        }
    }
    Ok(done)
}

/// The `cni-*` network namespaces under /run/netns (containerd 1.6 names pods' so).
pub fn cni_netns() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/run/netns")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with("cni-"))
        .collect();
    names.sort();
    names
}

/// Removes the named network namespaces (their veths go with them).
pub fn remove_netns(names: &[String]) -> Result<()> {
    for n in names {
        let path = Path::new("/run/netns").join(n);
        let _ = nix::mount::umount2(&path, nix::mount::MntFlags::MNT_DETACH);
        std::fs::remove_file(&path).with_context(|| format!("remove {}", path.display()))?;
    }
    Ok(())
}

/// Deletes the CNI bridge and the node link when present.
pub fn remove_links() -> Result<Vec<&'static str>> {
    let mut done = Vec::new();
    for link in [BRIDGE, NODE_LINK] {
        if Path::new("/sys/class/net").join(link).exists() {
            cmd::output(Command::new("ip").args(["link", "del", link]))?;
            done.push(link);
        }
    }
    Ok(done)
}

/// The chains of `iptables -t TABLE -S` output whose name has one of `prefixes`, and the
/// rules of other chains that jump to them as `(chain, rule number)`, highest number
/// first so deleting them in order keeps the others' numbers (pure).
pub fn chains_to_remove(rules: &str, prefixes: &[&str]) -> (Vec<String>, Vec<(String, usize)>) {
    let ours = |name: &str| prefixes.iter().any(|p| name.starts_with(p));
    let mut chains = Vec::new();
    let mut jumps = Vec::new();
    let mut numbers: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for line in rules.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["-N", name] if ours(name) => chains.push((*name).to_owned()),
            ["-A", chain, rest @ ..] => {
                let n = numbers.entry((*chain).to_owned()).or_default();
                *n += 1;
                let target = rest
                    .windows(2)
                    .find(|w| w[0] == "-j" || w[0] == "-g")
                    .map(|w| w[1]);
                if !ours(chain) && target.is_some_and(ours) {
                    jumps.push(((*chain).to_owned(), *n));
                }
            }
            _ => {}
        }
    }
    jumps.sort_by_key(|j| std::cmp::Reverse(j.1));
    (chains, jumps)
}

/// Removes kube-proxy's and kubelet's (`KUBE-`) and CNI's (`CNI-`) chains from every
/// table of iptables and ip6tables; returns what it removed.
pub fn remove_chains() -> Result<Vec<String>> {
    let mut removed = Vec::new();
    for tool in ["iptables", "ip6tables"] {
        for table in ["filter", "nat", "mangle", "raw"] {
            let Ok(rules) = cmd::output(Command::new(tool).args(["-w", "-t", table, "-S"])) else {
                continue;
            };
            let (chains, jumps) = chains_to_remove(&rules, &["KUBE-", "CNI-"]);
            for (chain, number) in jumps {
                cmd::output(
                    Command::new(tool)
                        .args(["-w", "-t", table, "-D", &chain])
                        .arg(number.to_string()),
                )?;
            }
            for c in &chains {
                cmd::output(Command::new(tool).args(["-w", "-t", table, "-F", c]))?;
            }
            for c in &chains {
                cmd::output(Command::new(tool).args(["-w", "-t", table, "-X", c]))?;
                removed.push(format!("{tool} {table} {c}"));
            }
        }
    }
    Ok(removed)
}

/// The cgroup mount points of a mountinfo text (v1 and v2), pure.
pub fn cgroup_mounts(mountinfo: &str) -> Vec<PathBuf> {
    mounts(mountinfo)
        .filter(|m| m.fstype == "cgroup" || m.fstype == "cgroup2")
        .map(|m| m.point)
        .collect()
}

/// Removes kubelet's `kubepods` cgroup trees (deepest first) in every hierarchy.
pub fn remove_kubelet_cgroups() -> Result<Vec<PathBuf>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    let mut removed = Vec::new();
    for mount in cgroup_mounts(&text) {
        for top in ["kubepods", "kubepods.slice"] {
            let root = mount.join(top);
            if root.is_dir() {
                remove_cgroup_tree(&root)?;
                removed.push(root);
            }
        }
    }
    Ok(removed)
}

fn remove_cgroup_tree(dir: &Path) -> Result<()> {
    for entry in std::fs::read_dir(dir)?.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_cgroup_tree(&entry.path())?;
        }
    }
    std::fs::remove_dir(dir).with_context(|| format!("remove cgroup {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mounts_below_roots_deepest_first() {
        let mi = "\
1 0 0:1 / / rw - ext4 /dev/vda rw
2 1 0:2 / /var/lib/bypass-cluster/kubelet/pods/x/volumes/a rw - tmpfs tmpfs rw
3 1 0:3 / /var/lib/bypass-cluster/containerd/x rw - overlay overlay rw
4 1 0:4 / /run/bypass-cluster/containerd/s\\040p rw - tmpfs tmpfs rw
5 1 0:5 / /var/lib/other rw - tmpfs tmpfs rw
";
        let m = mounts_below(
            mi,
            &[
                Path::new("/var/lib/bypass-cluster"),
                Path::new("/run/bypass-cluster"),
            ],
        );
        assert_eq!(
            m,
            [
                PathBuf::from("/var/lib/bypass-cluster/kubelet/pods/x/volumes/a"),
                PathBuf::from("/var/lib/bypass-cluster/containerd/x"),
                PathBuf::from("/run/bypass-cluster/containerd/s p"),
            ]
        );
    }

    #[test]
    fn only_our_chains_and_the_jumps_to_them() {
        let rules = "\
-P PREROUTING ACCEPT
-N KUBE-SERVICES
-N KUBE-SVC-ABC
-N OTHER
-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-A PREROUTING -j OTHER
-A PREROUTING -j KUBE-SVC-ABC
-A KUBE-SERVICES -j KUBE-SVC-ABC
";
        let (chains, jumps) = chains_to_remove(rules, &["KUBE-", "CNI-"]);
        assert_eq!(chains, ["KUBE-SERVICES", "KUBE-SVC-ABC"]);
        assert_eq!(
            jumps,
            [("PREROUTING".to_owned(), 3), ("PREROUTING".to_owned(), 1)]
        );
    }

    #[test]
    fn shared_propagation() {
        let mi = "\
40 24 0:33 / /sys/fs/bpf rw,relatime - bpf bpf rw,mode=700
41 24 0:34 / /sys/fs/x rw,relatime shared:12 - tmpfs tmpfs rw
";
        assert_eq!(is_shared(mi, "/sys/fs/bpf"), Some(false));
        assert_eq!(is_shared(mi, "/sys/fs/x"), Some(true));
        assert_eq!(is_shared(mi, "/nope"), None);
    }

    #[test]
    fn cgroup_mount_points() {
        let mi = "\
31 30 0:26 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
32 30 0:27 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
33 1 0:3 / /proc rw - proc proc rw
";
        assert_eq!(
            cgroup_mounts(mi),
            [
                PathBuf::from("/sys/fs/cgroup/unified"),
                PathBuf::from("/sys/fs/cgroup/memory")
            ]
        );
    }
}
