//! Per-pod counters: `bypass_pod_redirected_bytes_total{namespace,pod,owner}` and
//! `bypass_pod_connections_total{namespace,pod,owner}`, from the datapath's own counts
//! by pod network namespace (`PinnedView::pod_totals`), named by the pods of this node
//! the agent tracks. One series per such pod; a pod that goes takes its series with it.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    sync::Mutex,
};

use bypass_common::PodCounts;

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

/// Each pod's counts (pure): every network namespace in `totals` whose addresses
/// (`netns_addrs`) name a pod: in Kubernetes mode (`identities`) a tracked pod's, else
/// (standalone) the namespace's lowest address, with no namespace and no owner. A
/// namespace that names no pod (its pod gone, not tracked, or not observed) has no
/// series.
pub fn pod_series(
    totals: &BTreeMap<u64, PodCounts>,
    netns_addrs: &BTreeMap<u64, BTreeSet<IpAddr>>,
    identities: Option<&BTreeMap<IpAddr, PodIdentity>>,
) -> BTreeMap<PodIdentity, PodCounts> {
    let mut out: BTreeMap<PodIdentity, PodCounts> = BTreeMap::new();
    for (netns, counts) in totals {
        let Some(addrs) = netns_addrs.get(netns) else {
            continue;
        };
        let id = match identities {
            Some(ids) => addrs.iter().find_map(|ip| ids.get(ip)).cloned(),
            None => addrs.iter().next().map(|ip| PodIdentity {
                pod: ip.to_string(),
                ..PodIdentity::default()
            }),
        };
        let Some(id) = id else { continue };
        let e = out.entry(id).or_default();
        e.bytes = e.bytes.wrapping_add(counts.bytes);
        e.connections = e.connections.wrapping_add(counts.connections);
    }
    out
}

/// Network namespace → its pod addresses (pure), from the observed owners (address →
/// namespace) where the agent observes them, else from the namespaces' learned pod
/// addresses (namespace → address, `--netns-owners=any`).
pub fn netns_addrs(
    owners: Option<&BTreeMap<IpAddr, u64>>,
    learned: &BTreeMap<u64, IpAddr>,
) -> BTreeMap<u64, BTreeSet<IpAddr>> {
    let mut out: BTreeMap<u64, BTreeSet<IpAddr>> = BTreeMap::new();
    match owners {
        Some(owners) => {
            for (ip, netns) in owners {
                out.entry(*netns).or_default().insert(ip.to_canonical());
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

/// Keeps each series monotonic: a reading may miss a side that closed between the
/// datapath's two reads (it is then in neither), or hold a send claimed and then undone;
/// a series never shows less than it showed, and catches up once the datapath's count
/// passes it again. A series not in a reading (its pod gone) is forgotten.
#[derive(Debug, Default)]
pub struct Monotonic(BTreeMap<PodIdentity, PodCounts>);

impl Monotonic {
    /// The series to show for `now`.
    pub fn update(
        &mut self,
        now: BTreeMap<PodIdentity, PodCounts>,
    ) -> BTreeMap<PodIdentity, PodCounts> {
        let shown: BTreeMap<PodIdentity, PodCounts> = now
            .into_iter()
            .map(|(id, c)| {
                let last = self.0.get(&id).copied().unwrap_or_default();
                let c = PodCounts {
                    bytes: c.bytes.max(last.bytes),
                    connections: c.connections.max(last.connections),
                };
                (id, c)
            })
            .collect();
        self.0 = shown.clone();
        shown
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
        let totals = BTreeMap::from([(1, c(10, 1)), (2, c(20, 2)), (3, c(30, 3))]);
        let owners = BTreeMap::from([(ip("10.0.0.1"), 1), (ip("fd00::1"), 1), (ip("10.0.0.2"), 2)]);
        let addrs = netns_addrs(Some(&owners), &BTreeMap::new());
        assert_eq!(addrs[&1], BTreeSet::from([ip("10.0.0.1"), ip("fd00::1")]));
        let ids = BTreeMap::from([
            (ip("fd00::1"), id("shop", "web-1", "Deployment/web")),
            (ip("10.0.0.1"), id("shop", "web-1", "Deployment/web")),
        ]);
        // Namespace 2's address is no tracked pod's, 3 owns none: no series.
        assert_eq!(
            pod_series(&totals, &addrs, Some(&ids)),
            BTreeMap::from([(id("shop", "web-1", "Deployment/web"), c(10, 1))])
        );
        // Standalone: the lowest address names the namespace's pod.
        assert_eq!(
            pod_series(&totals, &addrs, None),
            BTreeMap::from([
                (id("", "10.0.0.1", ""), c(10, 1)),
                (id("", "10.0.0.2", ""), c(20, 2))
            ])
        );
        // Where no owners are observed, the learned addresses.
        let learned = BTreeMap::from([(3, ip("10.0.0.3"))]);
        assert_eq!(
            pod_series(&totals, &netns_addrs(None, &learned), None),
            BTreeMap::from([(id("", "10.0.0.3", ""), c(30, 3))])
        );
    }

    #[test]
    fn series_never_go_back_and_gone_pods_are_forgotten() {
        let mut m = Monotonic::default();
        let a = id("ns", "a", "");
        let b = id("ns", "b", "");
        assert_eq!(
            m.update(BTreeMap::from([(a.clone(), c(100, 2))]))[&a],
            c(100, 2)
        );
        // A close between the two reads: missed for this reading.
        assert_eq!(
            m.update(BTreeMap::from([(a.clone(), c(60, 1))]))[&a],
            c(100, 2)
        );
        assert_eq!(
            m.update(BTreeMap::from([(a.clone(), c(150, 3))]))[&a],
            c(150, 3)
        );
        // a's pod goes: its series with it; b's comes.
        let shown = m.update(BTreeMap::from([(b.clone(), c(5, 1))]));
        assert_eq!(shown, BTreeMap::from([(b.clone(), c(5, 1))]));
        assert_eq!(
            m.update(BTreeMap::from([(a.clone(), c(1, 1))]))[&a],
            c(1, 1)
        );
    }
}
