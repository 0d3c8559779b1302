//! Which network namespace owns each pod address. sock_ops inserts a socket whose local
//! address is a pod address only in the namespace that owns it
//! (`bypass_common::names::MAP_NETNS_OWNERS`), so another namespace holding copies of a
//! pod's addresses, ports and sequence numbers can never pose as that pod.
//!
//! The agent observes ownership from the node's side of the pod network: a namespace
//! claims the pod addresses it holds on an interface that is up and whose peer or
//! lower device is in the node's own namespace (a pod's veth, netkit or ipvlan end).
//! Only the node's administrator (the CNI) can make such an interface: a pod can create
//! namespaces and interfaces of its own, but none reaching the node's namespace. Only
//! addresses that are pod addresses now count (in Kubernetes mode: in a Pod's status),
//! so a pod that puts an address nobody holds yet on its interface does not own it
//! when the CNI hands it to a new pod: both hold it then, and an address claimed by
//! two namespaces is nobody's (its connections keep TCP, where the CNI decides). An
//! address whose owner goes (its interface down or deleted, its pod gone) or changes
//! has its connections cut: they finish on TCP.
//!
//! [`resolve`] and [`plan`] are pure; [`scan`] reads the namespaces; [`Events`] wakes
//! the pass when a link or an address changes.

mod events;
pub mod netlink;
mod scan;
mod watch;

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

pub use events::{Events, QUIET};
pub use scan::{HostNamespace, Scan, scan};
pub use watch::{INTERVAL, POLL_ENV, Report, Watcher, poll_interval};

use crate::{datapath::Datapath, error::AgentError};

/// Once per start, before anything else is cut: every link whose sides no longer stand
/// where sock_ops paired them, against the pod maps now ([`Datapath::cut_links_astray`]).
/// The losses and opt-outs an agent cuts are those it saw change; what an earlier agent
/// wrote into the pinned maps and had not cut when it stopped (killed, upgraded in place,
/// its cut failing until then) no pass sees as a change. Logs what it cut.
pub fn cut_astray(dp: &mut Datapath) -> Result<usize, AgentError> {
    let pods = PodAddresses::of(dp);
    let astray = dp.cut_links_astray(&|ip| pods.contains(ip))?;
    if astray > 0 {
        tracing::info!(
            connections_cut = astray,
            "connections whose pods no longer hold their addresses were cut at start (the agent before stopped before it cut them)"
        );
    }
    Ok(astray)
}

/// [`cut_astray`] for a caller that tries again on its next pass: a failure is logged
/// and gives `None`.
pub fn cut_astray_or_retry(dp: &mut Datapath) -> Option<usize> {
    cut_astray(dp)
        .inspect_err(|e| {
            tracing::warn!(error = %e, "could not check the connections the agent before left for cuts it did not make; retrying on the next pass");
        })
        .ok()
}

/// An address held by namespace `netns` on an interface that reaches the node's
/// namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Claim {
    /// The namespace's cookie (`SO_NETNS_COOKIE`, what sock_ops reads).
    pub netns: u64,
    /// The address, in canonical form (IPv4-mapped IPv6 as IPv4).
    pub addr: IpAddr,
}

/// The most pod addresses one namespace may own. A pod holds one or two (one per
/// family), a few more with extra interfaces; a namespace holding more is not a pod as
/// the CNI made it, and owns none of them: otherwise one tenant could fill the owners
/// map (`bypass_common::names::DEFAULT_MAX_ADDRS`) and no new pod of the node would be
/// bypassed.
pub const MAX_OWNED_PER_NAMESPACE: usize = 64;

/// The claimant that stands for the node's own namespace in [`resolve`]: never a
/// namespace's cookie (they start at 1).
const NODE: u64 = 0;

/// Owners decided from a set of claims.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Owners {
    /// Each address claimed by exactly one namespace, and that namespace.
    pub owned: BTreeMap<IpAddr, u64>,
    /// Addresses claimed by more than one namespace (the node's own among them): nobody's.
    pub contested: BTreeSet<IpAddr>,
    /// Namespaces claiming more than [`MAX_OWNED_PER_NAMESPACE`] pod addresses, with how
    /// many: they own none.
    pub crowded: BTreeMap<u64, usize>,
}

/// The owner of each pod address (`is_pod`): its only claimant. Loopback,
/// unspecified, multicast and link-local addresses are never a pod's and are left out.
/// The node's own addresses (`node`: the bridge's, the node's) are claims of the node's
/// namespace, which owns none: a pod putting the gateway's address on its interface
/// contests it and does not own it. A namespace claiming more than
/// [`MAX_OWNED_PER_NAMESPACE`] pod addresses contests them and owns none either.
pub fn resolve(
    claims: impl IntoIterator<Item = Claim>,
    node: &BTreeSet<IpAddr>,
    is_pod: impl Fn(IpAddr) -> bool,
) -> Owners {
    let mut by_addr: BTreeMap<IpAddr, BTreeSet<u64>> = BTreeMap::new();
    let node = node.iter().map(|&addr| Claim { netns: NODE, addr });
    for c in claims.into_iter().chain(node) {
        let addr = c.addr.to_canonical();
        if !could_be_a_pod(addr) || !is_pod(addr) {
            continue;
        }
        by_addr.entry(addr).or_default().insert(c.netns);
    }
    let mut per_namespace: BTreeMap<u64, usize> = BTreeMap::new();
    for netns in by_addr.values().flatten() {
        *per_namespace.entry(*netns).or_default() += 1;
    }
    let mut out = Owners {
        crowded: per_namespace
            .into_iter()
            .filter(|&(netns, n)| netns != NODE && n > MAX_OWNED_PER_NAMESPACE)
            .collect(),
        ..Owners::default()
    };
    for (addr, namespaces) in by_addr {
        match namespaces.iter().next() {
            Some(&only) if namespaces.len() == 1 => {
                if only != NODE && !out.crowded.contains_key(&only) {
                    out.owned.insert(addr, only);
                }
            }
            _ => {
                out.contested.insert(addr);
            }
        }
    }
    out
}

fn could_be_a_pod(addr: IpAddr) -> bool {
    if addr.is_loopback() || addr.is_unspecified() || addr.is_multicast() {
        return false;
    }
    match addr {
        IpAddr::V4(v4) => !v4.is_link_local() && !v4.is_broadcast(),
        IpAddr::V6(v6) => !v6.is_unicast_link_local(),
    }
}

/// The pod addresses the maps hold now: exact addresses and CIDRs, less the excluded.
#[derive(Debug, Clone, Default)]
pub struct PodAddresses {
    /// Exact pod addresses.
    pub addrs: BTreeSet<IpAddr>,
    /// Pod CIDRs, as `(prefix length, bytes)` of their trie keys.
    pub cidrs: Vec<(u32, [u8; 16])>,
    /// Addresses that are never a pod's.
    pub excluded: BTreeSet<IpAddr>,
}

impl PodAddresses {
    /// The pod addresses `dp`'s pod maps hold now.
    pub fn of(dp: &mut Datapath) -> Self {
        let maps = dp.pod_maps();
        Self {
            addrs: maps.addrs(),
            cidrs: maps
                .cidrs()
                .iter()
                .map(crate::cidr::Cidr::trie_key)
                .collect(),
            excluded: maps.excluded(),
        }
    }

    /// Whether `ip` is a pod address, as sock_ops would judge it.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        if self.excluded.contains(&ip) {
            return false;
        }
        if self.addrs.contains(&ip) {
            return true;
        }
        let bytes = bypass_common::addr::key_bytes(bypass_common::addr::ip_key(ip));
        self.cidrs
            .iter()
            .any(|(len, net)| prefix_matches(&bytes, net, *len))
    }
}

/// Whether the first `len` bits of `a` and `b` agree.
fn prefix_matches(a: &[u8; 16], b: &[u8; 16], len: u32) -> bool {
    let len = len.min(128) as usize;
    let (whole, rest) = (len / 8, len % 8);
    if a[..whole] != b[..whole] {
        return false;
    }
    if rest == 0 {
        return true;
    }
    let mask = 0xffu8 << (8 - rest);
    a[whole] & mask == b[whole] & mask
}

/// Changes that take the owners map from `current` to `desired`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnerPlan {
    /// Entries to write (new addresses, and addresses whose owner changed).
    pub set: Vec<(IpAddr, u64)>,
    /// Entries to delete.
    pub remove: Vec<IpAddr>,
    /// Addresses whose owner went or changed, each with the namespace that owned it:
    /// their established connections are cut, that namespace's loopback ones too.
    pub lost: BTreeMap<IpAddr, u64>,
}

impl OwnerPlan {
    /// Whether nothing changes.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.remove.is_empty()
    }
}

/// The plan from `current` to `desired`.
pub fn plan(current: &BTreeMap<IpAddr, u64>, desired: &BTreeMap<IpAddr, u64>) -> OwnerPlan {
    let mut p = OwnerPlan::default();
    for (addr, netns) in desired {
        match current.get(addr) {
            Some(have) if have == netns => {}
            Some(had) => {
                p.set.push((*addr, *netns));
                p.lost.insert(*addr, *had);
            }
            None => p.set.push((*addr, *netns)),
        }
    }
    for (addr, had) in current {
        if !desired.contains_key(addr) {
            p.remove.push(*addr);
            p.lost.insert(*addr, *had);
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;

    fn v4(d: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 244, 0, d))
    }

    fn claim(netns: u64, addr: IpAddr) -> Claim {
        Claim { netns, addr }
    }

    fn any(_: IpAddr) -> bool {
        true
    }

    #[test]
    fn an_address_claimed_once_is_owned_twice_is_nobodys() {
        let o = resolve(
            [
                claim(1, v4(2)),
                claim(2, v4(3)),
                claim(3, v4(3)),
                // The same namespace twice (two interfaces) is one claimant.
                claim(1, v4(4)),
                claim(1, v4(4)),
            ],
            &BTreeSet::new(),
            any,
        );
        assert_eq!(o.owned, BTreeMap::from([(v4(2), 1), (v4(4), 1)]));
        assert_eq!(o.contested, BTreeSet::from([v4(3)]));
    }

    #[test]
    fn mapped_addresses_are_canonical_and_non_pod_addresses_left_out() {
        let mapped = IpAddr::V6(Ipv4Addr::new(10, 244, 0, 9).to_ipv6_mapped());
        let o = resolve(
            [
                claim(1, mapped),
                claim(1, IpAddr::V4(Ipv4Addr::LOCALHOST)),
                claim(1, IpAddr::V4(Ipv4Addr::new(169, 254, 1, 1))),
                claim(1, IpAddr::V6(Ipv6Addr::LOCALHOST)),
                claim(1, IpAddr::V6("fe80::1".parse().unwrap())),
                claim(1, IpAddr::V6("fd00::5".parse().unwrap())),
            ],
            &BTreeSet::new(),
            any,
        );
        assert_eq!(
            o.owned.keys().copied().collect::<Vec<_>>(),
            vec![v4(9), IpAddr::V6("fd00::5".parse().unwrap())]
        );
    }

    #[test]
    fn only_pod_addresses_are_owned() {
        let pods = PodAddresses {
            addrs: BTreeSet::from([IpAddr::V4(Ipv4Addr::new(192, 168, 9, 9))]),
            cidrs: vec![crate::cidr::Cidr::new(v4(0), 24).unwrap().trie_key()],
            excluded: BTreeSet::from([v4(7)]),
        };
        assert!(pods.contains(v4(200)) && pods.contains(IpAddr::V4(Ipv4Addr::new(192, 168, 9, 9))));
        assert!(!pods.contains(v4(7)), "excluded");
        assert!(
            !pods.contains(IpAddr::V4(Ipv4Addr::new(10, 244, 1, 1))),
            "outside the CIDR"
        );
        // A pod holding addresses nobody has yet (not pod addresses) owns none of them;
        // its own, and one another pod holds too, are its and nobody's.
        let o = resolve(
            [
                claim(1, v4(2)),
                claim(1, IpAddr::V4(Ipv4Addr::new(10, 244, 1, 1))),
                claim(1, v4(3)),
                claim(2, v4(3)),
            ],
            &BTreeSet::new(),
            |ip| pods.contains(ip),
        );
        assert_eq!(o.owned, BTreeMap::from([(v4(2), 1)]));
        assert_eq!(o.contested, BTreeSet::from([v4(3)]));
    }

    #[test]
    fn the_nodes_own_addresses_are_nobodys() {
        // The gateway (the bridge's address, inside the pod CIDR): the node's alone is
        // not owned; a pod holding it too contests it.
        let o = resolve(
            [claim(1, v4(2)), claim(2, v4(3)), claim(2, v4(1))],
            &BTreeSet::from([v4(1), v4(4), IpAddr::V4(Ipv4Addr::LOCALHOST)]),
            any,
        );
        assert_eq!(o.owned, BTreeMap::from([(v4(2), 1), (v4(3), 2)]));
        assert_eq!(o.contested, BTreeSet::from([v4(1)]));
        assert!(o.crowded.is_empty());
    }

    #[test]
    fn a_namespace_holding_more_addresses_than_a_pod_owns_none() {
        // Address `i` of group `g`, held by namespace `netns`.
        let held = |netns, g, i: usize| {
            let i = u16::try_from(i).unwrap();
            claim(
                netns,
                IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, g, i)),
            )
        };
        let many = (1..=MAX_OWNED_PER_NAMESPACE + 1).map(|i| held(7, 1, i));
        let at_most = (1..=MAX_OWNED_PER_NAMESPACE).map(|i| held(8, 2, i));
        let theirs = IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 1, 1));
        let o = resolve(
            many.chain(at_most)
                .chain([claim(1, v4(2)), claim(1, theirs)]),
            &BTreeSet::new(),
            any,
        );
        assert_eq!(
            o.crowded,
            BTreeMap::from([(7, MAX_OWNED_PER_NAMESPACE + 1)])
        );
        // The crowded namespace owns nothing; one at the bound owns all it holds; an
        // address both hold stays contested.
        assert!(o.owned.values().all(|&n| n != 7));
        assert_eq!(
            o.owned.values().filter(|&&n| n == 8).count(),
            MAX_OWNED_PER_NAMESPACE
        );
        assert_eq!(o.owned.get(&v4(2)), Some(&1));
        assert_eq!(o.contested, BTreeSet::from([theirs]));
    }

    #[test]
    fn plan_writes_new_and_changed_removes_gone_and_cuts_both() {
        let current = BTreeMap::from([(v4(1), 1), (v4(2), 2), (v4(3), 3)]);
        let desired = BTreeMap::from([(v4(1), 1), (v4(2), 9), (v4(4), 4)]);
        let p = plan(&current, &desired);
        assert_eq!(p.set, vec![(v4(2), 9), (v4(4), 4)]);
        assert_eq!(p.remove, vec![v4(3)]);
        assert_eq!(p.lost, BTreeMap::from([(v4(2), 2), (v4(3), 3)]));
        assert!(plan(&desired, &desired).is_empty());
    }
}
