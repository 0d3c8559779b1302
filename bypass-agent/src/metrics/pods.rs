//! Per-pod counters: `bypass_pod_redirected_bytes_total{namespace,pod,owner}` and
//! `bypass_pod_connections_total{namespace,pod,owner}`, from the datapath's own counts
//! by pod network namespace (`PinnedView::pod_totals`), named by the pods of this node
//! the agent tracks. One series per such pod; a pod that goes takes its series with it.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    sync::Mutex,
};

use bypass_common::{PodCounts, status::AddressOwner};

use crate::sync::PodIdentity;

/// Which pod each tracked address is, as the reconciler last saw the Pod objects; not
/// set in standalone mode, where a pod is named by its lowest address.
#[derive(Debug, Default)]
pub struct PodDirectory(Mutex<Option<BTreeMap<IpAddr, PodIdentity>>>);

impl PodDirectory {
    /// Replaces what is known (Kubernetes mode, at every reconcile).
    pub fn set(&self, identities: BTreeMap<IpAddr, PodIdentity>) {
        if let Ok(mut d) = self.0.lock() {
            *d = Some(identities);
        }
    }

    /// What is known: `None` in standalone mode.
    pub(super) fn get(&self) -> Option<BTreeMap<IpAddr, PodIdentity>> {
        self.0.lock().ok().and_then(|d| d.clone())
    }
}

/// The pod network namespace `netns` is (pure), by its addresses (`netns_addrs`): in
/// Kubernetes mode (`identities`) a tracked pod's, else (standalone) its lowest address,
/// with no namespace and no owner. `None`: it names no pod (its pod gone, not tracked,
/// or not observed).
pub fn pod_name(
    netns: u64,
    netns_addrs: &BTreeMap<u64, BTreeSet<IpAddr>>,
    identities: Option<&BTreeMap<IpAddr, PodIdentity>>,
) -> Option<PodIdentity> {
    let addrs = netns_addrs.get(&netns)?;
    match identities {
        Some(ids) => addrs.iter().find_map(|ip| ids.get(ip)).cloned(),
        None => addrs.iter().next().map(|ip| PodIdentity {
            pod: ip.to_string(),
            ..PodIdentity::default()
        }),
    }
}

/// Network namespace → its pod addresses (pure), from the observed owners (address →
/// namespace) where the agent observes them, else from the namespaces' learned pod
/// addresses (namespace → address, `--netns-owners=any`).
pub fn netns_addrs(
    owners: Option<&[AddressOwner]>,
    learned: &BTreeMap<u64, IpAddr>,
) -> BTreeMap<u64, BTreeSet<IpAddr>> {
    let mut out: BTreeMap<u64, BTreeSet<IpAddr>> = BTreeMap::new();
    match owners {
        Some(owners) => {
            for o in owners {
                out.entry(o.netns)
                    .or_default()
                    .insert(o.address.to_canonical());
            }
        }
        None => {
            for (netns, ip) in learned {
                out.entry(*netns).or_default().insert(ip.to_canonical());
            }
        }
    }
    out
}

/// What each network namespace was first shown as, and the most it showed.
///
/// A namespace keeps the pod it was first named as: an owner reference edited, or
/// another pod's address taken later, renames nothing, so no bytes move between series.
/// Its counts never show less than they showed (a reading may miss a side that closed
/// between the datapath's two reads, or hold a send claimed and then undone) and catch
/// up once the datapath's count passes them again. A namespace gone from the datapath's
/// counts (gone from the node) is forgotten; a series is the sum of its namespaces, so a
/// pod recreated under the same name adds to it, and the series starts again once the
/// old namespace goes (a counter reset to Prometheus, which then counts the new one
/// whole).
#[derive(Debug, Default)]
pub struct Monotonic(BTreeMap<u64, (PodIdentity, PodCounts)>);

impl Monotonic {
    /// The series to show for `totals` (network namespace → its counts now), naming a
    /// namespace not seen before by `name` (skipped while that gives none).
    pub fn update(
        &mut self,
        totals: &BTreeMap<u64, PodCounts>,
        name: impl Fn(u64) -> Option<PodIdentity>,
    ) -> BTreeMap<PodIdentity, PodCounts> {
        let mut next = BTreeMap::new();
        for (netns, c) in totals {
            let (id, last) = match self.0.get(netns) {
                Some((id, last)) => (id.clone(), *last),
                None => match name(*netns) {
                    Some(id) => (id, PodCounts::default()),
                    None => continue,
                },
            };
            let c = PodCounts {
                bytes: c.bytes.max(last.bytes),
                connections: c.connections.max(last.connections),
            };
            next.insert(*netns, (id, c));
        }
        self.0 = next;
        let mut out: BTreeMap<PodIdentity, PodCounts> = BTreeMap::new();
        for (id, c) in self.0.values() {
            let e = out.entry(id.clone()).or_default();
            e.bytes = e.bytes.wrapping_add(c.bytes);
            e.connections = e.connections.wrapping_add(c.connections);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn id(ns: &str, pod: &str, owner: &str) -> PodIdentity {
        PodIdentity {
            namespace: ns.into(),
            pod: pod.into(),
            owner: owner.into(),
        }
    }

    fn c(bytes: u64, connections: u64) -> PodCounts {
        PodCounts { bytes, connections }
    }

    #[test]
    fn namespaces_are_named_by_their_pods() {
        let owners =
            [("10.0.0.1", 1), ("fd00::1", 1), ("10.0.0.2", 2)].map(|(a, netns)| AddressOwner {
                address: ip(a),
                netns,
            });
        let addrs = netns_addrs(Some(&owners), &BTreeMap::new());
        assert_eq!(addrs[&1], BTreeSet::from([ip("10.0.0.1"), ip("fd00::1")]));
        let ids = BTreeMap::from([
            (ip("fd00::1"), id("shop", "web-1", "Deployment/web")),
            (ip("10.0.0.1"), id("shop", "web-1", "Deployment/web")),
        ]);
        assert_eq!(
            pod_name(1, &addrs, Some(&ids)),
            Some(id("shop", "web-1", "Deployment/web"))
        );
        // Namespace 2's address is no tracked pod's, 3 owns none: no name.
        assert_eq!(pod_name(2, &addrs, Some(&ids)), None);
        assert_eq!(pod_name(3, &addrs, Some(&ids)), None);
        // Standalone: the lowest address names the namespace's pod.
        assert_eq!(pod_name(1, &addrs, None), Some(id("", "10.0.0.1", "")));
        assert_eq!(pod_name(2, &addrs, None), Some(id("", "10.0.0.2", "")));
        // Where no owners are observed, the learned addresses.
        let learned = BTreeMap::from([(3, ip("10.0.0.3"))]);
        assert_eq!(
            pod_name(3, &netns_addrs(None, &learned), None),
            Some(id("", "10.0.0.3", ""))
        );
    }

    #[test]
    fn series_never_go_back_keep_their_first_name_and_go_with_their_namespace() {
        let mut m = Monotonic::default();
        let a = id("ns", "a", "Deployment/a");
        let named = |ns: u64, who: &PodIdentity| {
            let who = who.clone();
            move |n: u64| (n == ns).then(|| who.clone())
        };
        let t = |v: &[(u64, PodCounts)]| v.iter().copied().collect::<BTreeMap<_, _>>();
        assert_eq!(m.update(&t(&[(1, c(100, 2))]), named(1, &a))[&a], c(100, 2));
        // A close between the two reads: missed for this reading.
        assert_eq!(m.update(&t(&[(1, c(60, 1))]), named(1, &a))[&a], c(100, 2));
        assert_eq!(m.update(&t(&[(1, c(150, 3))]), named(1, &a))[&a], c(150, 3));
        // Its owner edited, or another pod's name given to it: it keeps its first name.
        let other = id("ns", "victim", "Deployment/v");
        let shown = m.update(&t(&[(1, c(160, 3))]), named(1, &other));
        assert_eq!(shown, BTreeMap::from([(a.clone(), c(160, 3))]));
        // The pod recreated under the same name (a new namespace) while the old one is
        // still there: the series adds the new one's, never hides it.
        let shown = m.update(&t(&[(1, c(160, 3)), (2, c(40, 1))]), named(2, &a));
        assert_eq!(shown[&a], c(200, 4));
        // The old namespace goes: the series starts again (a counter reset).
        let shown = m.update(&t(&[(2, c(50, 1))]), named(2, &a));
        assert_eq!(shown[&a], c(50, 1));
        // A namespace that names no pod: no series.
        assert!(m.update(&t(&[(3, c(5, 1))]), |_| None).is_empty());
    }
}
