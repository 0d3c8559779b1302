//! `TwoPods`: the same-node topology the datapath is for. A bridge, two namespaces on
//! it with an IPv4 /24 and an IPv6 /64 address each, each namespace in its own child
//! cgroup of one parent test cgroup (the agent attaches to the parent).

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};

use crate::{
    agent::AgentOpts,
    cgroup::CgroupGuard,
    link::{Bridge, LinkCounters, Veth},
    names,
    netns::Netns,
    spawn,
};

/// The interface name inside each pod.
pub const POD_IFNAME: &str = "eth0";

/// One pod: a namespace with a veth on the bridge, in its own cgroup.
#[derive(Debug)]
pub struct Pod {
    // Drop order: processes killed, then the link, then the namespace.
    cgroup: CgroupGuard,
    veth: Veth,
    netns: Netns,
    name: String,
    ipv4: Ipv4Addr,
    ipv6: Ipv6Addr,
}

impl Pod {
    /// Its label (`a` or `b`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its IPv4 address.
    pub fn ipv4(&self) -> Ipv4Addr {
        self.ipv4
    }

    /// Its IPv6 address.
    pub fn ipv6(&self) -> Ipv6Addr {
        self.ipv6
    }

    /// `ipv4:port`.
    pub fn v4_addr(&self, port: u16) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(self.ipv4), port)
    }

    /// `[ipv6]:port`.
    pub fn v6_addr(&self, port: u16) -> SocketAddr {
        SocketAddr::new(IpAddr::V6(self.ipv6), port)
    }

    /// Its namespace.
    pub fn netns(&self) -> &Netns {
        &self.netns
    }

    /// Its cgroup.
    pub fn cgroup(&self) -> &CgroupGuard {
        &self.cgroup
    }

    /// The host end of its veth.
    pub fn veth(&self) -> &Veth {
        &self.veth
    }

    /// Counters of the host end of its veth: `rx` is what the pod sent.
    pub fn counters(&self) -> Result<LinkCounters> {
        self.veth.counters()
    }

    /// Runs `ip args...` inside the pod.
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        self.netns.ip(args)
    }

    /// Adds an address (`ADDR/PREFIX`) to the pod's interface; IPv6 without DAD, so it
    /// is usable at once.
    pub fn add_addr(&self, cidr: &str) -> Result<()> {
        let mut args = vec!["addr", "add", cidr, "dev", POD_IFNAME];
        if cidr.contains(':') {
            args.push("nodad");
        }
        self.ip(&args)?;
        Ok(())
    }

    /// Waits until no IPv6 address of the pod's interface is tentative. An address added
    /// without DAD is still tentative while the link has no carrier, and a veth's carrier
    /// comes up only once the kernel's link watch has seen both ends up (deferred, up to
    /// a second apart under load): until then a bind to the address fails with
    /// `EADDRNOTAVAIL`.
    fn wait_addresses_usable(&self) -> Result<()> {
        let deadline = std::time::Instant::now() + crate::steps::NET;
        loop {
            let tentative = self.ip(&["-6", "addr", "show", "dev", POD_IFNAME, "tentative"])?;
            if tentative.trim().is_empty() {
                return Ok(());
            }
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "{}'s addresses still tentative after {:?}: {tentative}",
                self.name,
                crate::steps::NET
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// Routes `cidr` out of the pod's interface (on-link).
    pub fn add_route(&self, cidr: &str) -> Result<()> {
        self.ip(&["route", "add", cidr, "dev", POD_IFNAME])?;
        Ok(())
    }
}

impl spawn::Place for Pod {
    fn label(&self) -> &str {
        &self.name
    }

    fn cgroup(&self) -> &CgroupGuard {
        &self.cgroup
    }

    fn netns_path(&self) -> Option<PathBuf> {
        Some(self.netns.path())
    }
}

/// Processes that are not a pod of the bridge, in their own child cgroup of the pods'
/// parent (so the agent's programs see their sockets): either in a network namespace of
/// their own, off the bridge (what any pod can make where user namespaces are allowed:
/// an attacker's), or in the host's (a hostNetwork pod, kubelet).
#[derive(Debug)]
pub struct Sandbox {
    // Drop order: processes killed, then the namespace.
    cgroup: CgroupGuard,
    netns: Option<Netns>,
    label: String,
}

impl Sandbox {
    /// Its network namespace; `None` for the host's.
    pub fn netns(&self) -> Option<&Netns> {
        self.netns.as_ref()
    }

    /// Runs `ip args...` inside its namespace (the host's for a host sandbox).
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        match &self.netns {
            Some(ns) => ns.ip(args),
            None => xtask_lib::cmd::ip(args),
        }
    }
}

impl spawn::Place for Sandbox {
    fn label(&self) -> &str {
        &self.label
    }

    fn cgroup(&self) -> &CgroupGuard {
        &self.cgroup
    }

    fn netns_path(&self) -> Option<PathBuf> {
        self.netns.as_ref().map(Netns::path)
    }
}

/// Two pods on one bridge. Addresses are `10.88.<k>.1`/`.2` and `fd88:0:0:<k>::1`/`::2`
/// with `k` from the instance tag; two instances are on different bridges, so even
/// equal addresses could not meet.
#[derive(Debug)]
pub struct TwoPods {
    /// Pod `a` (`.1`).
    pub a: Pod,
    /// Pod `b` (`.2`).
    pub b: Pod,
    bridge: Bridge,
    cgroup: CgroupGuard,
    tag: String,
    subnet: u8,
}

impl TwoPods {
    /// Builds the topology. Everything built so far is undone if a step fails.
    pub fn new() -> Result<Self> {
        crate::reap::dead_runs();
        let tag = names::unique_tag();
        let subnet = subnet_of(&tag);
        let cgroup = CgroupGuard::create(&names::resource(&tag, "cg"))?;
        let bridge = Bridge::create(&names::ifname("-br", &tag).map_err(anyhow::Error::msg)?)?;
        let a = make_pod(&tag, "a", 1, subnet, &bridge, &cgroup)?;
        let b = make_pod(&tag, "b", 2, subnet, &bridge, &cgroup)?;
        Ok(Self {
            a,
            b,
            bridge,
            cgroup,
            tag,
            subnet,
        })
    }

    /// The unique tag in every name of this instance.
    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// The parent cgroup both pods are in (attach the agent here).
    pub fn cgroup(&self) -> &Path {
        self.cgroup.path()
    }

    /// The bridge.
    pub fn bridge(&self) -> &Bridge {
        &self.bridge
    }

    /// The pods' IPv4 network, e.g. `10.88.7.0/24`.
    pub fn pod_cidr_v4(&self) -> String {
        format!("10.88.{}.0/24", self.subnet)
    }

    /// The pods' IPv6 network, e.g. `fd88:0:0:7::/64`.
    pub fn pod_cidr_v6(&self) -> String {
        format!("fd88:0:0:{:x}::/64", self.subnet)
    }

    /// An IPv4 network outside the pod CIDRs, for addresses that must not be
    /// bypassed, e.g. `10.99.7.0/24`.
    pub fn outside_cidr_v4(&self) -> String {
        format!("10.99.{}.0/24", self.subnet)
    }

    /// An IPv4 Service (ClusterIP) range of this instance, apart from the pod and the
    /// outside networks, e.g. `10.96.7.0/24`.
    pub fn service_cidr_v4(&self) -> String {
        format!("10.96.{}.0/24", self.subnet)
    }

    /// An IPv6 Service range of this instance, e.g. `fd96:0:0:7::/112`.
    pub fn service_cidr_v6(&self) -> String {
        format!("fd96:0:0:{:x}::/112", self.subnet)
    }

    /// Another "node" on the bridge: a namespace labelled `label` (one character) whose
    /// addresses are `10.99.<k>.<host>/24` (in [`TwoPods::outside_cidr_v4`]) and
    /// `fd99:0:0:<k>::<host>/64`, outside every pod CIDR, with on-link routes to the
    /// pods. Its cgroup is not below [`TwoPods::cgroup`], so an agent attached there
    /// sees none of its sockets.
    pub fn outside_node(&self, label: &str, host: u8) -> Result<Pod> {
        let cgroup = CgroupGuard::create(&names::resource(&self.tag, &format!("node-{label}")))?;
        self.on_the_bridge(label, host, cgroup)
    }

    /// A third pod: as [`TwoPods::outside_node`] (its addresses in
    /// [`TwoPods::outside_cidr_v4`], which an agent must be given as a pod CIDR to
    /// treat them as a pod's), but in a child cgroup of the pods', so the agent sees
    /// its sockets.
    pub fn third_pod(&self, label: &str, host: u8) -> Result<Pod> {
        let cgroup = self.cgroup.child(&format!("pod-{label}"))?;
        self.on_the_bridge(label, host, cgroup)
    }

    fn on_the_bridge(&self, label: &str, host: u8, cgroup: CgroupGuard) -> Result<Pod> {
        let netns = Netns::create(&names::resource(&self.tag, label))?;
        let host_if = names::ifname(&format!("-{label}"), &self.tag).map_err(anyhow::Error::msg)?;
        let veth = Veth::create(&host_if, &self.bridge, &netns, POD_IFNAME)?;
        let ipv4 = Ipv4Addr::new(10, 99, self.subnet, host);
        let ipv6 = Ipv6Addr::new(
            0xfd99,
            0,
            0,
            u16::from(self.subnet),
            0,
            0,
            0,
            u16::from(host),
        );
        let node = Pod {
            cgroup,
            veth,
            netns,
            name: label.to_owned(),
            ipv4,
            ipv6,
        };
        node.add_addr(&format!("{ipv4}/24"))
            .and_then(|()| node.add_addr(&format!("{ipv6}/64")))
            .and_then(|()| node.add_route(&self.pod_cidr_v4()))
            .and_then(|()| node.add_route(&self.pod_cidr_v6()))
            .and_then(|()| node.wait_addresses_usable())
            .with_context(|| format!("address node {label}"))?;
        Ok(node)
    }

    /// A network namespace of its own, not on the bridge (only `lo`, up), whose
    /// processes run in a child cgroup `label` of the pods' parent.
    pub fn private_namespace(&self, label: &str) -> Result<Sandbox> {
        let cgroup = self.cgroup.child(&format!("private-{label}"))?;
        let netns = Netns::create(&names::resource(&self.tag, label))?;
        Ok(Sandbox {
            cgroup,
            netns: Some(netns),
            label: format!("private namespace {label}"),
        })
    }

    /// Processes in the host's network namespace, in a child cgroup `label` of the
    /// pods' parent: a hostNetwork pod.
    pub fn host_network(&self, label: &str) -> Result<Sandbox> {
        Ok(Sandbox {
            cgroup: self.cgroup.child(&format!("host-{label}"))?,
            netns: None,
            label: format!("host network {label}"),
        })
    }

    /// A fresh bpffs pin directory name for an agent of this instance (not created).
    pub fn pin_dir(&self, what: &str) -> PathBuf {
        PathBuf::from("/sys/fs/bpf").join(names::resource(&self.tag, what))
    }

    /// Agent options: both pod CIDRs, this parent cgroup, pin dir `pins`.
    pub fn agent_opts(&self) -> AgentOpts {
        AgentOpts {
            pod_cidrs: vec![self.pod_cidr_v4(), self.pod_cidr_v6()],
            pod_ips: Vec::new(),
            cgroup: self.cgroup().to_path_buf(),
            pin_dir: self.pin_dir("pins"),
            extra_args: Vec::new(),
            env: Vec::new(),
            allow_unguarded: true,
            binary: None,
        }
    }

    /// Bytes the two pods put on the wire so far (sum of the host veth ends' rx).
    pub fn wire_bytes(&self) -> Result<u64> {
        Ok(self.a.counters()?.rx_bytes + self.b.counters()?.rx_bytes)
    }
}

fn make_pod(
    tag: &str,
    label: &str,
    host: u8,
    subnet: u8,
    bridge: &Bridge,
    parent: &CgroupGuard,
) -> Result<Pod> {
    let netns = Netns::create(&names::resource(tag, label))?;
    let host_if = names::ifname(&format!("-{label}"), tag).map_err(anyhow::Error::msg)?;
    let veth = Veth::create(&host_if, bridge, &netns, POD_IFNAME)?;
    let cgroup = parent.child(&format!("pod-{label}"))?;
    let ipv4 = Ipv4Addr::new(10, 88, subnet, host);
    let ipv6 = Ipv6Addr::new(0xfd88, 0, 0, u16::from(subnet), 0, 0, 0, u16::from(host));
    let pod = Pod {
        cgroup,
        veth,
        netns,
        name: label.to_owned(),
        ipv4,
        ipv6,
    };
    pod.add_addr(&format!("{ipv4}/24"))
        .and_then(|()| pod.add_addr(&format!("{ipv6}/64")))
        .and_then(|()| pod.wait_addresses_usable())
        .with_context(|| format!("address pod {label}"))?;
    Ok(pod)
}

/// A subnet octet in 1..=250 from the tag, so concurrent instances differ.
fn subnet_of(tag: &str) -> u8 {
    let h = tag.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    (h % 250) as u8 + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subnets_in_range_and_spread() {
        let s: std::collections::BTreeSet<u8> =
            (0..50).map(|i| subnet_of(&format!("abcx{i}"))).collect();
        assert!(s.iter().all(|&k| (1..=250).contains(&k)));
        assert!(s.len() > 30, "{s:?}");
    }
}
