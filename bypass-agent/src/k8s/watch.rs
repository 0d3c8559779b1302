//! The watches: six reflectors (this Node, the Pods on it, all Namespaces, all
//! ServiceCIDRs, all Services, all EndpointSlices) merged into one stream of events, and
//! the NetworkPolicy watch; and what those events say ([`WatchState`]): which resources
//! are listed, which cannot be and why, which namespaces' NetworkPolicies changed. While
//! the API server is away the watchers retry with backoff and the stores stay as they
//! were; on return the watchers relist.
//!
//! ServiceCIDRs are optional: the first three must be listed before the first pass,
//! ServiceCIDRs never hold it up. Where the API is missing (Kubernetes < 1.33) or RBAC
//! forbids it, one warning says so and the Service CIDR trie holds `--service-cidr`
//! alone; a probe keeps retrying quietly (at most every 30 s) and starts the watch once
//! it succeeds, so granting RBAC later is picked up without a restart.
//!
//! Services and EndpointSlices never hold up the first pass either: until both are
//! listed the Service backend map stays as it is (empty on a fresh datapath, so a
//! connection translated to a pod of this node takes TCP); a Forbidden watch of them is
//! warned about once, naming the RBAC that fixes it, the map then holds
//! `--service-backend` alone (never what an earlier agent wrote), and the watcher keeps
//! retrying.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use futures::{
    StreamExt as _,
    stream::{BoxStream, SelectAll},
};
use k8s_openapi::api::{
    core::v1::{Namespace, Node, Pod, Service},
    discovery::v1::EndpointSlice,
    networking::v1::{NetworkPolicy, ServiceCIDR},
};
use kube::{
    Api, Client, Resource as _,
    api::ListParams,
    core::PartialObjectMeta,
    runtime::{
        WatchStreamExt as _,
        reflector::{self, Store},
        watcher,
    },
};
use tracing::{debug, error, info, warn};

use super::client::{Failure, classify, retry_delay};
use crate::{
    metrics::{ErrorKind, Telemetry},
    sync::Statics,
};

/// Which watcher an event came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    Node = 0,
    Pods = 1,
    Namespaces = 2,
    ServiceCidrs = 3,
    Services = 4,
    EndpointSlices = 5,
}

/// How many [`Source`]s there are.
const SOURCES: usize = 6;

impl Source {
    fn resource(self) -> &'static str {
        match self {
            Self::Node => "nodes",
            Self::Pods => "pods",
            Self::Namespaces => "namespaces",
            Self::ServiceCidrs => "servicecidrs",
            Self::Services => "services",
            Self::EndpointSlices => "endpointslices",
        }
    }

    /// Whether it feeds the Service backends (and so is not needed to start).
    fn backends(self) -> bool {
        matches!(self, Self::Services | Self::EndpointSlices)
    }
}

/// Which sources have completed a listing, and what is known of the ServiceCIDRs.
#[derive(Debug, Default)]
pub(super) struct Listed {
    /// By `Source as usize`.
    done: [bool; SOURCES],
    /// Why the ServiceCIDRs cannot be listed, once warned about; cleared by a listing.
    service_cidrs_unavailable: Option<Unavailable>,
    /// By `Source as usize`: a Forbidden watch of Services or EndpointSlices warned
    /// about; cleared by a listing.
    forbidden_warned: [bool; SOURCES],
}

/// Why the agent gets no ServiceCIDRs from the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unavailable {
    /// 404: no `networking.k8s.io/v1` ServiceCIDR (Kubernetes < 1.33).
    NoApi,
    /// 403: RBAC.
    Forbidden,
    /// Any other failure before the first listing.
    Failed,
}

impl Listed {
    /// The node, its pods and the namespaces are listed: reconciling may start.
    pub(super) fn core(&self) -> bool {
        self.done[..3].iter().all(|d| *d)
    }

    /// The ServiceCIDRs are known: listed, or known not to come (the flags alone).
    pub(super) fn service_cidrs_known(&self) -> bool {
        self.done[Source::ServiceCidrs as usize] || self.service_cidrs_unavailable.is_some()
    }

    /// The Services and EndpointSlices are listed: the Service backends are known.
    pub(super) fn backends_known(&self) -> bool {
        self.done[Source::Services as usize] && self.done[Source::EndpointSlices as usize]
    }

    /// RBAC forbids listing the Services or the EndpointSlices (not listed before): the
    /// map then holds `--service-backend` alone, never what an earlier agent wrote (an
    /// address it named may be another pod's by now).
    pub(super) fn backends_forbidden(&self) -> bool {
        [Source::Services, Source::EndpointSlices]
            .iter()
            .any(|s| self.forbidden_warned[*s as usize] && !self.done[*s as usize])
    }
}

/// A NetworkPolicy event, with the fingerprint of every policy known after it
/// ([`policies_fingerprint`]; 0 before the first listing completes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PolicyEvent {
    /// The namespace of a policy that changed (created, modified, deleted, or seen again
    /// by a relist).
    pub(super) changed: Option<String>,
    /// The first listing completed now: the namespaces holding a policy.
    pub(super) first_listing: Option<BTreeSet<String>>,
    pub(super) fingerprint: u32,
}

/// A NetworkPolicy event, or an error.
pub(super) type PolicyItem = Result<PolicyEvent, watcher::Error>;

/// Each policy's `(uid, generation)` by `(namespace, name)`.
type PolicyIndex = BTreeMap<(String, String), (String, i64)>;

/// The record of a change seen and not cut yet (`control::SLOT_POLICIES`): never a
/// fingerprint, so the next agent cuts whatever it lists.
pub(super) const POLICIES_PENDING: u32 = 1;

/// The fingerprint of a set of NetworkPolicies (`control::SLOT_POLICIES`): FNV-1a over
/// each one's namespace, name, uid and generation (which the API server bumps on each
/// change of its spec), in order, folded to 32 bits; never 0, which reads as none, nor
/// [`POLICIES_PENDING`].
pub(super) fn policies_fingerprint(index: &PolicyIndex) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    for ((ns, name), (uid, generation)) in index {
        for field in [ns.as_bytes(), name.as_bytes(), uid.as_bytes()] {
            eat(field);
            eat(&[0]);
        }
        eat(&generation.to_le_bytes());
    }
    match (h ^ (h >> 32)) as u32 {
        0 | POLICIES_PENDING => 2,
        f => f,
    }
}

/// The NetworkPolicy watch. Policies of the first listing are not changes (the
/// connections established before were allowed by them, or the record an agent before
/// left tells what changed since: [`WatchState::note_policy`]); any event after is.
fn watch_policies(api: Api<PartialObjectMeta<NetworkPolicy>>) -> BoxStream<'static, PolicyItem> {
    let mut policies = Policies::default();
    watcher(api, watcher::Config::default())
        .default_backoff()
        .map(move |e| Ok(policies.on(e?)))
        .boxed()
}

/// What the NetworkPolicy watch has seen (pure): every policy's identity and
/// generation, and whether the first listing is done.
#[derive(Debug, Default)]
struct Policies {
    listed: bool,
    index: PolicyIndex,
    /// A listing under way (the watcher's first, or a relist after a desync).
    relisting: Option<PolicyIndex>,
}

impl Policies {
    fn on(&mut self, e: watcher::Event<PartialObjectMeta<NetworkPolicy>>) -> PolicyEvent {
        let key = |p: &PartialObjectMeta<NetworkPolicy>| {
            let m = &p.metadata;
            (
                (
                    m.namespace.clone().unwrap_or_default(),
                    m.name.clone().unwrap_or_default(),
                ),
                (m.uid.clone().unwrap_or_default(), m.generation.unwrap_or(0)),
            )
        };
        let mut first_listing = None;
        let changed = match e {
            watcher::Event::Apply(p) => {
                let (k, v) = key(&p);
                self.index.insert(k, v);
                p.metadata.namespace
            }
            watcher::Event::Delete(p) => {
                self.index.remove(&key(&p).0);
                p.metadata.namespace
            }
            watcher::Event::Init => {
                self.relisting = Some(PolicyIndex::new());
                None
            }
            watcher::Event::InitApply(p) => {
                let (k, v) = key(&p);
                self.relisting.get_or_insert_default().insert(k, v);
                p.metadata.namespace.filter(|_| self.listed)
            }
            watcher::Event::InitDone => {
                self.index = self.relisting.take().unwrap_or_default();
                if !std::mem::replace(&mut self.listed, true) {
                    first_listing = Some(self.index.keys().map(|(ns, _)| ns.clone()).collect());
                }
                None
            }
        };
        PolicyEvent {
            changed,
            first_listing,
            fingerprint: if self.listed {
                policies_fingerprint(&self.index)
            } else {
                0
            },
        }
    }
}

/// One item of the merged watch streams: an event (whether it completed a listing), or
/// an error.
pub(super) type Item = (Source, Result<bool, watcher::Error>);

/// A reflector of `api`'s objects, each trimmed by `trim` before the store keeps it.
fn watch<K>(
    source: Source,
    api: Api<K>,
    config: watcher::Config,
    trim: fn(&mut K),
) -> (Store<K>, BoxStream<'static, Item>)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, config).default_backoff().modify(trim))
        .map(move |r| (source, r.map(|e| matches!(e, watcher::Event::InitDone))))
        .boxed();
    (store, stream)
}

/// The ServiceCIDR watch, behind a probe: a one-item list, retried with
/// [`retry_delay`] until it succeeds, each failure an item (so a missing API or RBAC is
/// warned about once by [`WatchState::note`], not by the watcher on every retry), and
/// then the reflector.
fn watch_service_cidrs(api: Api<ServiceCIDR>) -> (Store<ServiceCIDR>, BoxStream<'static, Item>) {
    let probe_api = api.clone();
    let probe = futures::stream::unfold(0u32, move |attempt| {
        let api = probe_api.clone();
        async move {
            if attempt > 0 {
                tokio::time::sleep(retry_delay(attempt - 1)).await;
            }
            match api.list(&ListParams::default().limit(1)).await {
                Ok(_) => None,
                Err(e) => Some((
                    (
                        Source::ServiceCidrs,
                        Err(watcher::Error::InitialListFailed(e)),
                    ),
                    attempt.saturating_add(1),
                )),
            }
        }
    });
    let (store, watch) = watch(
        Source::ServiceCidrs,
        api,
        watcher::Config::default(),
        trim_metadata,
    );
    (store, probe.chain(watch).boxed())
}

/// Drops what no pass reads and any client could make large: the managed fields, on
/// every object the agent keeps.
fn trim_metadata<K: kube::Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
}

/// A Service as [`crate::sync::backends`] reads it: its name, namespace, ClusterIPs and
/// ports. Any tenant may write Services in its namespace, and every agent keeps every
/// Service of the cluster: its annotations, labels, selector and status would be
/// memory a tenant chooses (up to the API's object size, for each object).
fn trim_service(svc: &mut Service) {
    let meta = svc.meta_mut();
    meta.managed_fields = None;
    meta.annotations = None;
    meta.labels = None;
    meta.owner_references = None;
    svc.status = None;
    if let Some(spec) = svc.spec.as_mut() {
        spec.selector = None;
        spec.external_ips = None;
        spec.load_balancer_source_ranges = None;
        spec.session_affinity_config = None;
    }
}

/// An EndpointSlice as [`crate::sync::backends`] reads it: its namespace, the label that
/// names its Service, its ports and its endpoints' addresses (for the same reason as
/// [`trim_service`]).
fn trim_slice(slice: &mut EndpointSlice) {
    let meta = slice.meta_mut();
    meta.managed_fields = None;
    meta.annotations = None;
    meta.owner_references = None;
    if let Some(labels) = meta.labels.as_mut() {
        labels.retain(|k, _| k == crate::sync::backends::SERVICE_NAME_LABEL);
    }
    for e in &mut slice.endpoints {
        *e = k8s_openapi::api::discovery::v1::Endpoint {
            addresses: std::mem::take(&mut e.addresses),
            ..Default::default()
        };
    }
}

/// What the reflectors hold: the objects the reconciler reads.
pub(super) struct Stores {
    /// This node (field selector `metadata.name`).
    pub(super) nodes: Store<Node>,
    /// The pods scheduled on it (field selector `spec.nodeName`).
    pub(super) pods: Store<Pod>,
    pub(super) namespaces: Store<Namespace>,
    pub(super) service_cidrs: Store<ServiceCIDR>,
    pub(super) services: Store<Service>,
    pub(super) endpoint_slices: Store<EndpointSlice>,
}

/// The running watches of node `node`: the stores, the merged stream of their events
/// (never ends while the client lives) and the NetworkPolicy events. Nothing is asked
/// of the API server until the streams are polled.
pub(super) struct Watches {
    pub(super) stores: Stores,
    pub(super) events: SelectAll<BoxStream<'static, Item>>,
    pub(super) policies: BoxStream<'static, PolicyItem>,
}

impl Watches {
    pub(super) fn new(client: &Client, node: &str) -> Self {
        let (nodes, node_events) = watch(
            Source::Node,
            Api::<Node>::all(client.clone()),
            watcher::Config::default().fields(&format!("metadata.name={node}")),
            trim_metadata,
        );
        let (pods, pod_events) = watch(
            Source::Pods,
            Api::<Pod>::all(client.clone()),
            watcher::Config::default().fields(&format!("spec.nodeName={node}")),
            trim_metadata,
        );
        let (namespaces, ns_events) = watch(
            Source::Namespaces,
            Api::<Namespace>::all(client.clone()),
            watcher::Config::default(),
            trim_metadata,
        );
        // Metadata only: what a policy says is the CNI's to read; a change is enough.
        let policies = watch_policies(Api::<PartialObjectMeta<NetworkPolicy>>::all(client.clone()));
        let (service_cidrs, sc_events) =
            watch_service_cidrs(Api::<ServiceCIDR>::all(client.clone()));
        let (services, svc_events) = watch(
            Source::Services,
            Api::<Service>::all(client.clone()),
            watcher::Config::default(),
            trim_service,
        );
        let (endpoint_slices, slice_events) = watch(
            Source::EndpointSlices,
            Api::<EndpointSlice>::all(client.clone()),
            watcher::Config::default(),
            trim_slice,
        );
        let events = futures::stream::select_all([
            node_events,
            pod_events,
            ns_events,
            sc_events,
            svc_events,
            slice_events,
        ]);
        Self {
            stores: Stores {
                nodes,
                pods,
                namespaces,
                service_cidrs,
                services,
                endpoint_slices,
            },
            events,
            policies,
        }
    }
}

/// What the watch events have said so far: the listings done, and the namespaces whose
/// NetworkPolicies changed since the last pass. Errors are logged and counted as they
/// come (the watchers retry by themselves with backoff); a missing API or RBAC the agent
/// can do without is warned about once.
pub(super) struct WatchState {
    /// Listings done, and the ServiceCIDR availability.
    pub(super) listed: Listed,
    /// Namespaces whose NetworkPolicies changed since the last pass.
    pub(super) policy_changed: BTreeSet<String>,
    /// The fingerprint of the NetworkPolicies known now (0: not listed yet), and the one
    /// recorded in the datapath (`control::SLOT_POLICIES`; 0: none).
    policies: u32,
    policies_recorded: u32,
    /// Whether a failing NetworkPolicy watch was warned about (cleared by an event).
    policy_warned: bool,
    telemetry: Arc<Telemetry>,
    /// `--service-cidr`, named when the ServiceCIDRs cannot be listed.
    service_cidr_flags: Vec<String>,
}

impl WatchState {
    /// `policies_recorded`: the datapath's record of the NetworkPolicies whose changes an
    /// agent cut (0: none).
    pub(super) fn new(
        telemetry: Arc<Telemetry>,
        statics: &Statics,
        policies_recorded: u32,
    ) -> Self {
        Self {
            listed: Listed::default(),
            policy_changed: BTreeSet::new(),
            policies: 0,
            policies_recorded,
            policy_warned: false,
            telemetry,
            service_cidr_flags: statics
                .service_cidrs
                .iter()
                .map(ToString::to_string)
                .collect(),
        }
    }

    /// Records a NetworkPolicy event; a failing watch is warned about once. On the first
    /// listing, policies that differ from the datapath's record changed while no agent
    /// ran (or the one before stopped before it cut a change: [`POLICIES_PENDING`]):
    /// every namespace holding a policy now is cut, as a change there would have been.
    /// A namespace left with no policy needs none: NetworkPolicy isolates none of its
    /// pods any more, so what they were allowed still is. No record (a fresh datapath,
    /// or one an older build loaded) cuts nothing.
    pub(super) fn note_policy(&mut self, item: PolicyItem) {
        match item {
            Ok(e) => {
                self.policy_warned = false;
                self.policy_changed.extend(e.changed);
                self.policies = e.fingerprint;
                if let Some(holding) = e.first_listing
                    && self.policies_recorded != 0
                    && self.policies_recorded != e.fingerprint
                    && !holding.is_empty()
                {
                    info!(namespaces = ?holding,
                        "NetworkPolicies changed while no agent ran: these namespaces' pods' bypassed connections move to TCP");
                    self.policy_changed.extend(holding);
                }
            }
            Err(e) => {
                self.telemetry.agent.error(ErrorKind::Watch);
                if !self.policy_warned {
                    self.policy_warned = true;
                    warn!(resource = "networkpolicies", error = %crate::error::chain(&e),
                        "watching NetworkPolicies failed (RBAC: list and watch networkpolicies, see deploy/rbac.yaml); retrying: until it works, a policy change does not move established bypassed connections back to the CNI");
                }
            }
        }
    }

    /// What to record in the datapath now, once listed: while a change waits for its cut,
    /// [`POLICIES_PENDING`] (an agent stopping before the cut leaves the next to make
    /// it); once every change seen is cut, the fingerprint. `None` when recorded already.
    pub(super) fn policies_to_record(&self) -> Option<u32> {
        if self.policies == 0 {
            return None;
        }
        let want = if self.policy_changed.is_empty() {
            self.policies
        } else {
            POLICIES_PENDING
        };
        (want != self.policies_recorded).then_some(want)
    }

    /// The datapath holds `fingerprint` now ([`Self::policies_to_record`]).
    pub(super) fn policies_recorded(&mut self, fingerprint: u32) {
        self.policies_recorded = fingerprint;
    }

    /// Records one watch item: a completed listing, or an error (logged and counted;
    /// the watcher retries by itself with backoff).
    pub(super) fn note(&mut self, (source, item): Item) {
        match item {
            Ok(true) => {
                debug!(resource = source.resource(), "listed");
                self.listed.done[source as usize] = true;
                if std::mem::take(&mut self.listed.forbidden_warned[source as usize]) {
                    info!(
                        resource = source.resource(),
                        "listed: Service backends come from the API"
                    );
                }
                if source == Source::ServiceCidrs
                    && self.listed.service_cidrs_unavailable.take().is_some()
                {
                    info!("ServiceCIDRs listed: Service CIDRs come from the API again");
                }
            }
            Ok(false) => {}
            Err(e) => {
                let inner = match &e {
                    watcher::Error::InitialListFailed(k)
                    | watcher::Error::WatchStartFailed(k)
                    | watcher::Error::WatchFailed(k) => Some(classify(k)),
                    _ => None,
                };
                if source == Source::ServiceCidrs {
                    self.service_cidrs_failed(inner, &e);
                } else if let (true, Some(Failure::Forbidden(detail))) = (source.backends(), &inner)
                {
                    // The agent works without them: once, not on every retry.
                    if !std::mem::replace(&mut self.listed.forbidden_warned[source as usize], true)
                    {
                        self.telemetry.agent.error(ErrorKind::Forbidden);
                        warn!(resource = source.resource(), %detail,
                            "the API server forbids watching {}: until it allows it, connections translated to a Service backend on this node are not bypassed (they take TCP); apply deploy/rbac.yaml (list, watch on services and discovery.k8s.io endpointslices)",
                            source.resource());
                    }
                } else if let Some(Failure::Forbidden(detail)) = inner {
                    self.telemetry.agent.error(ErrorKind::Forbidden);
                    error!(resource = source.resource(), %detail,
                        "the API server forbids watching {}: apply deploy/rbac.yaml (get, list, watch on nodes, pods, namespaces); keeping the datapath as it is",
                        source.resource());
                } else {
                    self.telemetry.agent.error(ErrorKind::Watch);
                    warn!(resource = source.resource(), error = %crate::error::chain(&e),
                        "watch failed; retrying with backoff, keeping the datapath as it is");
                }
            }
        }
    }

    /// A failed ServiceCIDR list or watch. A missing API or RBAC is warned about once
    /// (the watcher retries quietly); the trie then holds `--service-cidr` alone, or,
    /// if the objects were listed before, keeps what they gave.
    fn service_cidrs_failed(&mut self, failure: Option<Failure>, e: &watcher::Error) {
        let why = match &failure {
            Some(Failure::NotFound(_)) => Unavailable::NoApi,
            Some(Failure::Forbidden(_)) => Unavailable::Forbidden,
            _ => Unavailable::Failed,
        };
        let flags = &self.service_cidr_flags;
        let repeat = self.listed.service_cidrs_unavailable == Some(why);
        if why == Unavailable::Failed {
            // Like the other watchers: every failure is logged and counted.
            self.telemetry.agent.error(ErrorKind::Watch);
            warn!(resource = "servicecidrs", error = %crate::error::chain(e), service_cidrs = ?flags,
                "watch failed; retrying with backoff; Service CIDRs: --service-cidr and what was listed before");
        } else if !repeat {
            let detail = match &failure {
                Some(Failure::NotFound(d) | Failure::Forbidden(d)) => d.as_str(),
                _ => "",
            };
            if why == Unavailable::Forbidden {
                self.telemetry.agent.error(ErrorKind::Forbidden);
                warn!(resource = "servicecidrs", %detail, service_cidrs = ?flags,
                    "the API server forbids listing ServiceCIDRs: Service CIDRs come from --service-cidr alone; apply deploy/rbac.yaml (list, watch on networking.k8s.io servicecidrs)");
            } else {
                self.telemetry.agent.error(ErrorKind::Watch);
                warn!(resource = "servicecidrs", %detail, service_cidrs = ?flags,
                    "the API server has no networking.k8s.io/v1 ServiceCIDR (Kubernetes < 1.33): Service CIDRs come from --service-cidr alone; set it to the cluster's service range (kube-apiserver --service-cluster-ip-range)");
            }
        }
        // A definite answer replaces "failed"; "failed" never hides a definite answer.
        if why != Unavailable::Failed || self.listed.service_cidrs_unavailable.is_none() {
            self.listed.service_cidrs_unavailable = Some(why);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(ns: &str, name: &str, generation: i64) -> PartialObjectMeta<NetworkPolicy> {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": ns, "uid": format!("{ns}-{name}"),
                "generation": generation},
        }))
        .unwrap()
    }

    fn listed(p: &mut Policies, policies: &[PartialObjectMeta<NetworkPolicy>]) -> PolicyEvent {
        p.on(watcher::Event::Init);
        for x in policies {
            assert_eq!(
                p.on(watcher::Event::InitApply(x.clone())).fingerprint != 0,
                p.listed
            );
        }
        p.on(watcher::Event::InitDone)
    }

    #[test]
    fn the_policy_watch_tells_changes_from_its_first_listing_and_fingerprints_them() {
        let mut p = Policies::default();
        let first = listed(&mut p, &[policy("t1", "deny", 1), policy("t2", "allow", 3)]);
        assert_eq!(first.changed, None, "the first listing changes nothing");
        assert_eq!(
            first.first_listing,
            Some(BTreeSet::from(["t1".to_owned(), "t2".to_owned()]))
        );
        assert_ne!(first.fingerprint, 0);
        // The same policies, listed by another agent in another order: the same record.
        let mut other = Policies::default();
        let again = listed(
            &mut other,
            &[policy("t2", "allow", 3), policy("t1", "deny", 1)],
        );
        assert_eq!(again.fingerprint, first.fingerprint);
        // A new generation of one (its spec edited) is a change, with another record.
        let edited = p.on(watcher::Event::Apply(policy("t1", "deny", 2)));
        assert_eq!(edited.changed.as_deref(), Some("t1"));
        assert_eq!(edited.first_listing, None);
        assert_ne!(edited.fingerprint, first.fingerprint);
        // Deleted: the record goes back to what it was without it.
        let gone = p.on(watcher::Event::Delete(policy("t1", "deny", 2)));
        assert_eq!(gone.changed.as_deref(), Some("t1"));
        let only_t2 = listed(&mut Policies::default(), &[policy("t2", "allow", 3)]);
        assert_eq!(gone.fingerprint, only_t2.fingerprint);
        // A relist after a desync: each policy it lists is a change, and the record is
        // what it lists.
        let relisted = listed(&mut p, &[policy("t3", "x", 1)]);
        assert_eq!(relisted.first_listing, None);
        let alone = listed(&mut Policies::default(), &[policy("t3", "x", 1)]);
        assert_eq!(relisted.fingerprint, alone.fingerprint);
    }

    #[test]
    fn policies_changed_while_no_agent_ran_are_cut_and_recorded_once_cut() {
        let telemetry = Arc::new(Telemetry::new(crate::datapath::PinLayout::new(
            std::path::Path::new("/nonexistent/bypass-test"),
        )));
        let before = listed(&mut Policies::default(), &[policy("t1", "deny", 1)]);
        let mut now = Policies::default();
        let first = listed(
            &mut now,
            &[policy("t1", "deny", 2), policy("t2", "allow", 1)],
        );
        // No record (a fresh datapath, an older build's): nothing cut, the record due.
        let mut fresh = WatchState::new(telemetry.clone(), &Statics::default(), 0);
        fresh.note_policy(Ok(first.clone()));
        assert!(fresh.policy_changed.is_empty());
        assert_eq!(fresh.policies_to_record(), Some(first.fingerprint));
        // The record of the policies as they were: unchanged, nothing cut.
        let mut same = WatchState::new(telemetry.clone(), &Statics::default(), before.fingerprint);
        same.note_policy(Ok(listed(
            &mut Policies::default(),
            &[policy("t1", "deny", 1)],
        )));
        assert!(same.policy_changed.is_empty());
        assert_eq!(same.policies_to_record(), None, "recorded already");
        // Changed meanwhile: every namespace holding a policy now is cut, and the record
        // waits until the cut holds.
        let mut changed = WatchState::new(telemetry, &Statics::default(), before.fingerprint);
        changed.note_policy(Ok(first.clone()));
        assert_eq!(
            changed.policy_changed,
            BTreeSet::from(["t1".to_owned(), "t2".to_owned()])
        );
        assert_eq!(changed.policies_to_record(), Some(POLICIES_PENDING));
        changed.policies_recorded(POLICIES_PENDING);
        assert_eq!(changed.policies_to_record(), None);
        changed.policy_changed.clear();
        assert_eq!(changed.policies_to_record(), Some(first.fingerprint));
        changed.policies_recorded(first.fingerprint);
        assert_eq!(changed.policies_to_record(), None);
        // A live change: cut, then recorded.
        changed.note_policy(Ok(now.on(watcher::Event::Apply(policy("t2", "allow", 2)))));
        assert_eq!(changed.policy_changed, BTreeSet::from(["t2".to_owned()]));
        assert_eq!(changed.policies_to_record(), Some(POLICIES_PENDING));
        changed.policy_changed.clear();
        assert!(
            changed
                .policies_to_record()
                .is_some_and(|f| f != POLICIES_PENDING)
        );
        // An agent that stopped before its cut: the next cuts whatever it lists.
        let mut after_a_stop = WatchState::new(
            Arc::new(Telemetry::new(crate::datapath::PinLayout::new(
                std::path::Path::new("/nonexistent/bypass-test"),
            ))),
            &Statics::default(),
            POLICIES_PENDING,
        );
        after_a_stop.note_policy(Ok(before.clone()));
        assert_eq!(
            after_a_stop.policy_changed,
            BTreeSet::from(["t1".to_owned()])
        );
    }

    /// What the stores keep of a Service and an EndpointSlice a tenant wrote large is
    /// what the backends need, and gives the same backends.
    #[test]
    fn trimmed_objects_give_the_same_backends() {
        let pad = "x".repeat(4096);
        let mut svc: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "t",
                "annotations": {"pad": pad}, "labels": {"pad": "x"},
                "managedFields": [{"manager": "m", "operation": "Apply"}]},
            "spec": {"clusterIP": "10.0.0.5", "clusterIPs": ["10.0.0.5"],
                "selector": {"app": "web"},
                "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
        }))
        .unwrap();
        let mut slice: EndpointSlice = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-1", "namespace": "t",
                "annotations": {"pad": pad},
                "labels": {"kubernetes.io/service-name": "web", "pad": "x"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.33.1.7"], "nodeName": "n",
                "conditions": {"ready": false}, "hostname": pad,
                "targetRef": {"kind": "Pod", "name": "web"}}],
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        }))
        .unwrap();
        let local = BTreeSet::from(["10.33.1.7".parse().unwrap()]);
        let whole = crate::sync::backends::service_backends([&svc], [&slice], &local);
        trim_service(&mut svc);
        trim_slice(&mut slice);
        assert_eq!(
            crate::sync::backends::service_backends([&svc], [&slice], &local),
            whole
        );
        assert_eq!(whole.values().map(BTreeSet::len).sum::<usize>(), 1);
        let kept = serde_json::to_string(&(svc, slice)).unwrap();
        assert!(kept.len() < 1024, "{kept}");
    }

    #[test]
    fn service_cidrs_never_hold_up_the_first_pass() {
        let mut l = Listed::default();
        assert!(!l.core() && !l.service_cidrs_known());
        l.done[..3].fill(true);
        assert!(l.core(), "ServiceCIDRs are not needed to start");
        assert!(!l.service_cidrs_known(), "not listed: leave the trie alone");
        l.service_cidrs_unavailable = Some(Unavailable::Forbidden);
        assert!(l.service_cidrs_known(), "forbidden: the flags alone");
        l.service_cidrs_unavailable = None;
        l.done[Source::ServiceCidrs as usize] = true;
        assert!(l.service_cidrs_known());
    }

    #[test]
    fn services_and_endpointslices_never_hold_up_the_first_pass() {
        let mut l = Listed::default();
        l.done[..3].fill(true);
        assert!(l.core() && !l.backends_known());
        l.done[Source::Services as usize] = true;
        assert!(!l.backends_known(), "both are needed");
        l.done[Source::EndpointSlices as usize] = true;
        assert!(l.backends_known());
        assert!(Source::Services.backends() && Source::EndpointSlices.backends());
        assert!(!Source::Pods.backends() && !Source::ServiceCidrs.backends());
    }

    #[test]
    fn forbidden_backends_fall_back_to_the_flags_alone() {
        let mut l = Listed::default();
        assert!(!l.backends_forbidden(), "not known yet: the map stays");
        l.forbidden_warned[Source::EndpointSlices as usize] = true;
        assert!(l.backends_forbidden(), "forbidden: the flags alone");
        l.done[Source::EndpointSlices as usize] = true;
        assert!(!l.backends_forbidden(), "listed before: the store's");
    }
}
