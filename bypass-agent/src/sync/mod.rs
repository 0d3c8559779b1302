//! Pure: which pod CIDRs, pod addresses, excluded addresses, Service CIDRs and Service
//! backends belong in the maps, computed from the pods on the node, the namespaces, the
//! ServiceCIDR objects and (`backends`) the Services and EndpointSlices, and the changes
//! that take the maps from what they hold to that. The Kubernetes watchers only feed
//! these functions and apply the plan.
//!
//! A pod is a pod here only once its Pod object says so: the node's `spec.podCIDRs` are
//! not used, because every address in them (an opted-out pod's, one whose Pod object
//! the agent has not seen yet, the bridge gateway's) would count as a pod's.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    net::IpAddr,
};

use k8s_openapi::api::{
    core::v1::{Namespace, Pod},
    networking::v1::ServiceCIDR,
};

use crate::{backend::Backend, cidr::Cidr, toggle};

pub mod backends;
#[cfg(any(test, feature = "fuzz"))]
pub mod properties;
pub mod workload;

pub use backends::{Share, fair_share, service_backends};
pub use workload::{PodIdentity, workload_owner};

/// Which pods count, and how workloads opt out.
#[derive(Debug, Clone)]
pub struct Policy {
    /// This node's name: pods scheduled elsewhere never count.
    pub node: String,
    /// A pod annotation that opts the pod out when `"true"`.
    pub exclude_annotation: String,
    /// A namespace label that opts every pod of the namespace out when `"true"`.
    pub exclude_namespace_label: String,
    /// A namespace label that, when set, is the only way in: only pods of namespaces
    /// labelled `"true"` count (a canary rollout); `None`: every namespace is in unless
    /// it opts out.
    pub include_namespace_label: Option<String>,
}

/// Pod annotations of the CNI bandwidth plugin (`kubernetes.io/ingress-bandwidth`,
/// `kubernetes.io/egress-bandwidth`): it shapes traffic on the pod's veth, which
/// redirected bytes never cross, so such pods keep the veth path and their limits.
pub const BANDWIDTH_ANNOTATIONS: [&str; 2] = [
    "kubernetes.io/ingress-bandwidth",
    "kubernetes.io/egress-bandwidth",
];

/// Entries given on the command line, always kept.
#[derive(Debug, Clone, Default)]
pub struct Statics {
    /// `--pod-cidr`.
    pub cidrs: BTreeSet<Cidr>,
    /// `--pod-ip`.
    pub addrs: BTreeSet<IpAddr>,
    /// `--service-cidr`.
    pub service_cidrs: BTreeSet<Cidr>,
    /// `--service-backend`.
    pub service_backends: BTreeSet<Backend>,
}

/// Why a pod contributes no address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// Scheduled on another node (or not yet scheduled).
    OtherNode,
    /// Shares the node's network namespace: its address is the node's.
    HostNetwork,
    /// Phase `Succeeded` or `Failed`: its address may already belong to another pod.
    Finished,
    /// Opted out by the pod annotation.
    Excluded,
    /// Opted out by its namespace's label, or (namespace opt-in) its namespace is
    /// not opted in.
    NamespaceExcluded,
    /// Carries a bandwidth-plugin annotation: its limits apply on the veth only.
    Bandwidth,
    /// No address yet, or none that parses.
    NoAddress,
}

impl Skip {
    /// A short stable name, for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Skip::OtherNode => "other_node",
            Skip::HostNetwork => "host_network",
            Skip::Finished => "finished",
            Skip::Excluded => "excluded",
            Skip::NamespaceExcluded => "namespace_excluded",
            Skip::Bandwidth => "bandwidth",
            Skip::NoAddress => "no_address",
        }
    }
}

/// An input value that was not used, and why: logged and counted by the caller.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Rejection {
    /// What kind of problem, a short stable name for the metric label.
    pub kind: RejectionKind,
    /// The object: `pod NAMESPACE/NAME`, `node NAME`, `namespace NAME` or
    /// `servicecidr NAME`.
    pub object: String,
    /// The field that held the value.
    pub field: String,
    /// The value.
    pub value: String,
    /// Why it was not used, and what to do.
    pub reason: String,
}

/// Kinds of [`Rejection`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RejectionKind {
    /// A pod address that is not an IP address, or not a unicast one.
    PodAddress,
    /// An opt-out annotation or label whose value is neither `true` nor `false`.
    OptOutValue,
    /// A ServiceCIDR's `spec.cidrs` entry that is malformed.
    ServiceCidr,
}

impl RejectionKind {
    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PodAddress => "pod_address",
            Self::OptOutValue => "opt_out_value",
            Self::ServiceCidr => "service_cidr",
        }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}: {:?} ignored: {}",
            self.object, self.field, self.value, self.reason
        )
    }
}

/// What the maps should hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Desired {
    /// Pod CIDRs: `--pod-cidr` (never the node's `spec.podCIDRs`).
    pub cidrs: BTreeSet<Cidr>,
    /// Exact addresses: every address of every eligible pod, and `--pod-ip`.
    pub addrs: BTreeSet<IpAddr>,
    /// Addresses that are never a pod's whatever CIDR holds them: every address of a
    /// pod of this node that is opted out (annotation or namespace label) or on the
    /// host network. An address both here and in [`Desired::addrs`] is only here.
    pub excluded: BTreeSet<IpAddr>,
    /// Service CIDRs: `--service-cidr` and the `spec.cidrs` of every ServiceCIDR object;
    /// `None` while the objects are not known yet, which leaves the trie as it is (an
    /// adopted datapath keeps the previous agent's until the first listing).
    pub service_cidrs: Option<BTreeSet<Cidr>>,
    /// Service backends on this node's pods: `--service-backend`, and in Kubernetes
    /// mode those of the Services and EndpointSlices; `None` while they are not known
    /// yet, which leaves the map as it is.
    pub service_backends: Option<BTreeSet<Backend>>,
    /// Pods that contribute at least one address.
    pub pods_tracked: usize,
    /// Each address of those pods, and which pod it is (the per-pod counters' labels).
    pub identities: BTreeMap<IpAddr, PodIdentity>,
    /// Pods by what became of them, for logs: `tracked`, or why they were skipped
    /// ([`Skip::as_str`]).
    pub pods: BTreeMap<&'static str, usize>,
    /// Values that were not used.
    pub rejections: BTreeSet<Rejection>,
}

/// Changes to the maps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// CIDRs to insert.
    pub add_cidrs: Vec<Cidr>,
    /// CIDRs to remove.
    pub remove_cidrs: Vec<Cidr>,
    /// Addresses to insert.
    pub add_addrs: Vec<IpAddr>,
    /// Addresses to remove.
    pub remove_addrs: Vec<IpAddr>,
    /// Excluded addresses to insert.
    pub add_excluded: Vec<IpAddr>,
    /// Excluded addresses to remove.
    pub remove_excluded: Vec<IpAddr>,
    /// Service CIDRs to insert.
    pub add_service_cidrs: Vec<Cidr>,
    /// Service CIDRs to remove.
    pub remove_service_cidrs: Vec<Cidr>,
    /// Service backends to insert.
    pub add_service_backends: Vec<Backend>,
    /// Service backends to remove.
    pub remove_service_backends: Vec<Backend>,
}

impl Plan {
    /// Whether the maps already match.
    pub fn is_empty(&self) -> bool {
        self.add_cidrs.is_empty()
            && self.remove_cidrs.is_empty()
            && self.add_addrs.is_empty()
            && self.remove_addrs.is_empty()
            && self.add_excluded.is_empty()
            && self.remove_excluded.is_empty()
            && self.add_service_cidrs.is_empty()
            && self.remove_service_cidrs.is_empty()
            && self.add_service_backends.is_empty()
            && self.remove_service_backends.is_empty()
    }
}

/// What the maps hold now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Current {
    /// The pod CIDR trie.
    pub cidrs: BTreeSet<Cidr>,
    /// The pod address map.
    pub addrs: BTreeSet<IpAddr>,
    /// The excluded address map.
    pub excluded: BTreeSet<IpAddr>,
    /// The Service CIDR trie.
    pub service_cidrs: BTreeSet<Cidr>,
    /// The Service backend map.
    pub service_backends: BTreeSet<Backend>,
}

/// What to add to `have` and what to remove from it to make it `want`, each in order.
pub fn diff<T: Ord + Copy>(have: &BTreeSet<T>, want: &BTreeSet<T>) -> (Vec<T>, Vec<T>) {
    (
        want.difference(have).copied().collect(),
        have.difference(want).copied().collect(),
    )
}

/// The changes that take `current` to `desired`.
pub fn plan(current: &Current, desired: &Desired) -> Plan {
    // The map stores IPv4 as IPv4-mapped IPv6 and reads it back as IPv4; compare in
    // that canonical form so a mapped address never churns.
    let current_addrs: BTreeSet<IpAddr> = current.addrs.iter().map(IpAddr::to_canonical).collect();
    let current_excluded: BTreeSet<IpAddr> =
        current.excluded.iter().map(IpAddr::to_canonical).collect();
    let (add_service_cidrs, remove_service_cidrs) = match &desired.service_cidrs {
        Some(want) => diff(&current.service_cidrs, want),
        None => (Vec::new(), Vec::new()),
    };
    let (add_service_backends, remove_service_backends) = match &desired.service_backends {
        Some(want) => diff(&current.service_backends, want),
        None => (Vec::new(), Vec::new()),
    };
    let (add_cidrs, remove_cidrs) = diff(&current.cidrs, &desired.cidrs);
    let (add_addrs, remove_addrs) = diff(&current_addrs, &desired.addrs);
    let (add_excluded, remove_excluded) = diff(&current_excluded, &desired.excluded);
    Plan {
        add_cidrs,
        remove_cidrs,
        add_addrs,
        remove_addrs,
        add_excluded,
        remove_excluded,
        add_service_cidrs,
        remove_service_cidrs,
        add_service_backends,
        remove_service_backends,
    }
}

/// The map contents the pods of this node, the namespaces and the ServiceCIDR objects
/// call for. `service_cidrs` is `None` while the ServiceCIDRs are not known yet; when the
/// API has none to give (no such API, or RBAC forbids it), pass an empty list: the
/// `--service-cidr` flags alone.
pub fn desired<'a>(
    pods: impl IntoIterator<Item = &'a Pod>,
    namespaces: impl IntoIterator<Item = &'a Namespace>,
    service_cidrs: Option<impl IntoIterator<Item = &'a ServiceCIDR>>,
    policy: &Policy,
    statics: &Statics,
) -> Desired {
    let mut out = Desired::from_statics(statics);
    out.service_cidrs = None;
    out.service_backends = None;
    if let Some(objects) = service_cidrs {
        let mut set = statics.service_cidrs.clone();
        for sc in objects {
            set.extend(service_cidr_ranges(sc, &mut out.rejections));
        }
        out.service_cidrs = Some(set);
    }
    let sets = namespace_sets(namespaces, policy, &mut out.rejections);
    for pod in pods {
        let verdict = pod_addrs(pod, policy, &sets, &mut out.rejections);
        *out.pods
            .entry(verdict.as_ref().map_or_else(|s| s.as_str(), |_| "tracked"))
            .or_insert(0) += 1;
        match verdict {
            Ok(addrs) => {
                out.pods_tracked += 1;
                let id = PodIdentity::of(pod);
                for ip in &addrs {
                    // Two pods listing one address (a moment of a reuse): the same one
                    // whatever the order of the objects.
                    out.identities
                        .entry(*ip)
                        .and_modify(|had| {
                            if id < *had {
                                *had = id.clone();
                            }
                        })
                        .or_insert_with(|| id.clone());
                }
                out.addrs.extend(addrs);
            }
            Err(Skip::Excluded | Skip::NamespaceExcluded | Skip::HostNetwork | Skip::Bandwidth) => {
                out.excluded.extend(status_addrs(pod, &mut out.rejections));
            }
            Err(_) => {}
        }
    }
    // An opt-out wins over a pod that (for a moment) shares the address.
    out.addrs = out.addrs.difference(&out.excluded).copied().collect();
    out.identities.retain(|ip, _| out.addrs.contains(ip));
    out
}

impl Desired {
    /// What the command line alone calls for (standalone mode).
    pub fn from_statics(statics: &Statics) -> Self {
        Self {
            cidrs: statics.cidrs.clone(),
            addrs: statics.addrs.iter().map(IpAddr::to_canonical).collect(),
            service_cidrs: Some(statics.service_cidrs.clone()),
            service_backends: Some(statics.service_backends.clone()),
            ..Self::default()
        }
    }
}

/// A ServiceCIDR's ranges (`spec.cidrs`, one per family). Every object counts, whatever
/// its status: one not yet Ready (nothing sets Ready on it but kube-controller-manager)
/// or being deleted (it stays until its last ClusterIP is gone) may still hold live
/// ClusterIPs, and a range too many costs only map slots for connections that are then
/// never paired. Malformed entries are rejected one by one; the others still count.
pub fn service_cidr_ranges(
    sc: &ServiceCIDR,
    rejections: &mut BTreeSet<Rejection>,
) -> BTreeSet<Cidr> {
    let values = sc
        .spec
        .as_ref()
        .and_then(|s| s.cidrs.as_ref())
        .map_or(&[][..], Vec::as_slice);
    let mut out = BTreeSet::new();
    for value in values {
        match value.parse::<Cidr>() {
            Ok(cidr) => {
                out.insert(cidr);
            }
            Err(e) => {
                rejections.insert(Rejection {
                    kind: RejectionKind::ServiceCidr,
                    object: format!("servicecidr {}", sc.metadata.name.as_deref().unwrap_or("")),
                    field: "spec.cidrs".to_owned(),
                    value: value.clone(),
                    reason: e.to_string(),
                });
            }
        }
    }
    out
}

/// Which namespaces' pods are out, from the namespaces' labels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamespaceSets {
    /// Namespaces that opted out.
    pub excluded: BTreeSet<String>,
    /// With namespace opt-in, the namespaces that opted in (and did not opt out);
    /// `None` without it.
    pub included: Option<BTreeSet<String>>,
}

impl NamespaceSets {
    /// Whether pods of `namespace` are out: opted out, or not opted in where opt-in
    /// is asked for (a namespace the agent has not seen yet is not in).
    pub fn excludes(&self, namespace: &str) -> bool {
        self.excluded.contains(namespace)
            || self
                .included
                .as_ref()
                .is_some_and(|inc| !inc.contains(namespace))
    }
}

/// The namespaces that opt out, and (namespace opt-in) those that opt in. Bad label
/// values are rejected: an unclear opt-out reads as out, an unclear opt-in as not in.
pub fn namespace_sets<'a>(
    namespaces: impl IntoIterator<Item = &'a Namespace>,
    policy: &Policy,
    rejections: &mut BTreeSet<Rejection>,
) -> NamespaceSets {
    let mut sets = NamespaceSets {
        included: policy
            .include_namespace_label
            .as_ref()
            .map(|_| BTreeSet::new()),
        ..NamespaceSets::default()
    };
    for ns in namespaces {
        let name = ns.metadata.name.clone().unwrap_or_default();
        if namespace_excluded(ns, policy, rejections) {
            sets.excluded.insert(name);
        } else if let (Some(key), Some(included)) =
            (&policy.include_namespace_label, sets.included.as_mut())
            && namespace_included(ns, key, rejections)
        {
            included.insert(name);
        }
    }
    sets
}

/// Whether a namespace opted in by label `key`: `"true"` is in; `"false"`, absent or
/// anything else (rejected) is not.
fn namespace_included(ns: &Namespace, key: &str, rejections: &mut BTreeSet<Rejection>) -> bool {
    let name = ns.metadata.name.as_deref().unwrap_or("");
    let Some(value) = ns.metadata.labels.as_ref().and_then(|l| l.get(key)) else {
        return false;
    };
    match toggle::parse_value(value) {
        Some(v) => v,
        None => {
            rejections.insert(Rejection {
                kind: RejectionKind::OptOutValue,
                object: format!("namespace {name}"),
                field: format!("metadata.labels[{key}]"),
                value: value.clone(),
                reason: "neither \"true\" nor \"false\"; treated as \"false\" (not opted in): set it to \"true\" or \"false\"".into(),
            });
            false
        }
    }
}

/// Whether a namespace opts its pods out.
fn namespace_excluded(
    ns: &Namespace,
    policy: &Policy,
    rejections: &mut BTreeSet<Rejection>,
) -> bool {
    let name = ns.metadata.name.as_deref().unwrap_or("");
    let value = ns
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(&policy.exclude_namespace_label));
    opt_out(
        value,
        || format!("namespace {name}"),
        || format!("metadata.labels[{}]", policy.exclude_namespace_label),
        rejections,
    )
}

/// An opt-out value: `"true"` opts out, `"false"` or absent does not. Anything else is
/// rejected and opts out too: the owner asked for something, and the safe reading of an
/// unclear opt-out is "out".
fn opt_out(
    value: Option<&String>,
    object: impl FnOnce() -> String,
    field: impl FnOnce() -> String,
    rejections: &mut BTreeSet<Rejection>,
) -> bool {
    let Some(value) = value else { return false };
    match toggle::parse_value(value) {
        Some(out) => out,
        None => {
            rejections.insert(Rejection {
                kind: RejectionKind::OptOutValue,
                object: object(),
                field: field(),
                value: value.clone(),
                reason: "neither \"true\" nor \"false\"; treated as \"true\" (opted out): set it to \"true\" or \"false\"".into(),
            });
            true
        }
    }
}

/// The addresses a pod contributes, or why it contributes none. Malformed addresses are
/// rejected one by one; the pod's other addresses still count.
pub fn pod_addrs(
    pod: &Pod,
    policy: &Policy,
    namespaces: &NamespaceSets,
    rejections: &mut BTreeSet<Rejection>,
) -> Result<BTreeSet<IpAddr>, Skip> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("");
    let name = pod.metadata.name.as_deref().unwrap_or("");
    let object = || format!("pod {namespace}/{name}");
    let spec = pod.spec.as_ref();
    if spec.and_then(|s| s.node_name.as_deref()) != Some(policy.node.as_str()) {
        return Err(Skip::OtherNode);
    }
    if spec.and_then(|s| s.host_network) == Some(true) {
        return Err(Skip::HostNetwork);
    }
    let status = pod.status.as_ref();
    if matches!(
        status.and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    ) {
        return Err(Skip::Finished);
    }
    let annotation = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(&policy.exclude_annotation));
    if opt_out(
        annotation,
        object,
        || format!("metadata.annotations[{}]", policy.exclude_annotation),
        rejections,
    ) {
        return Err(Skip::Excluded);
    }
    if namespaces.excludes(namespace) {
        return Err(Skip::NamespaceExcluded);
    }
    let annotations = pod.metadata.annotations.as_ref();
    if BANDWIDTH_ANNOTATIONS
        .iter()
        .any(|k| annotations.is_some_and(|a| a.contains_key(*k)))
    {
        return Err(Skip::Bandwidth);
    }
    let out = status_addrs(pod, rejections);
    if out.is_empty() {
        return Err(Skip::NoAddress);
    }
    Ok(out)
}

/// The addresses of the pods in `namespaces` (those whose NetworkPolicies changed):
/// their bypassed connections are cut, so the CNI decides on them again.
pub fn addrs_in_namespaces<'a>(
    pods: impl IntoIterator<Item = &'a Pod>,
    namespaces: &BTreeSet<String>,
) -> BTreeSet<IpAddr> {
    pods.into_iter()
        .filter(|p| {
            p.metadata
                .namespace
                .as_ref()
                .is_some_and(|ns| namespaces.contains(ns))
        })
        .flat_map(|p| status_addrs(p, &mut BTreeSet::new()))
        .collect()
}

/// The addresses in a pod's status (`status.podIPs`, or the older `status.podIP`).
/// Malformed addresses are rejected one by one.
fn status_addrs(pod: &Pod, rejections: &mut BTreeSet<Rejection>) -> BTreeSet<IpAddr> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("");
    let name = pod.metadata.name.as_deref().unwrap_or("");
    let status = pod.status.as_ref();
    let (field, values): (&str, Vec<&String>) = match status.and_then(|s| s.pod_ips.as_ref()) {
        Some(list) if !list.is_empty() => ("status.podIPs", list.iter().map(|p| &p.ip).collect()),
        _ => (
            "status.podIP",
            status.and_then(|s| s.pod_ip.as_ref()).into_iter().collect(),
        ),
    };
    let mut out = BTreeSet::new();
    for value in values {
        match parse_pod_ip(value) {
            Ok(ip) => {
                out.insert(ip);
            }
            Err(reason) => {
                rejections.insert(Rejection {
                    kind: RejectionKind::PodAddress,
                    object: format!("pod {namespace}/{name}"),
                    field: field.to_owned(),
                    value: value.clone(),
                    reason: reason.to_owned(),
                });
            }
        }
    }
    out
}

/// A pod address in canonical form (IPv4-mapped IPv6 as IPv4), or why not.
pub fn parse_pod_ip(value: &str) -> Result<IpAddr, &'static str> {
    let ip: IpAddr = value
        .parse()
        .map_err(|_| "not an IP address in canonical form (e.g. 10.244.1.7 or fd00::7; no leading zeros, no zone)")?;
    let ip = ip.to_canonical();
    if !is_unicast(ip) {
        return Err("not a unicast pod address (unspecified, loopback, multicast or broadcast)");
    }
    Ok(ip)
}

/// Whether `ip` (IPv4-mapped IPv6 read as IPv4) can be a pod's or a Service's address:
/// not unspecified, loopback, multicast or broadcast.
pub fn is_unicast(ip: IpAddr) -> bool {
    match ip.to_canonical() {
        IpAddr::V4(v4) => {
            !(v4.is_unspecified() || v4.is_loopback() || v4.is_multicast() || v4.is_broadcast())
        }
        IpAddr::V6(v6) => !(v6.is_unspecified() || v6.is_loopback() || v6.is_multicast()),
    }
}

/// Rejections in `now` that were not in `before`: the ones to log and count, so a
/// standing problem is reported once, not on every reconcile.
pub fn new_rejections<'a>(
    before: &'a BTreeSet<Rejection>,
    now: &'a BTreeSet<Rejection>,
) -> Vec<&'a Rejection> {
    now.difference(before).collect()
}

#[cfg(test)]
mod tests;
