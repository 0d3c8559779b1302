//! The reconcile loop: six reflectors (this Node, the Pods on it, all Namespaces, all
//! ServiceCIDRs, all Services, all EndpointSlices) feed one loop that, on every change,
//! computes the desired map contents and toggle state with the pure core (`sync`,
//! `toggle`) and applies the difference to the datapath. While the API server is away
//! the watchers retry with backoff and the stores, and so the datapath, stay as they
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

use std::{collections::BTreeSet, future::Future, sync::Arc, time::Duration};

use futures::{FutureExt as _, StreamExt as _, stream::BoxStream};
use k8s_openapi::api::{
    core::v1::{Namespace, Node, Pod, Service},
    discovery::v1::EndpointSlice,
    networking::v1::{NetworkPolicy, ServiceCIDR},
};
use kube::{
    Api, Client,
    api::ListParams,
    runtime::{
        WatchStreamExt as _,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use tracing::{debug, error, info, warn};

use super::{
    Settings,
    client::{Failure, classify},
};
use crate::{
    apply,
    datapath::Datapath,
    error::AgentError,
    metrics::{ErrorKind, Telemetry},
    sync::{self, Policy, Rejection, RejectionKind, Statics},
    toggle::{self, Action, EnabledBy, Recorded},
};

/// Which watcher an event came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
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
struct Listed {
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
    fn core(&self) -> bool {
        self.done[..3].iter().all(|d| *d)
    }

    /// The ServiceCIDRs are known: listed, or known not to come (the flags alone).
    fn service_cidrs_known(&self) -> bool {
        self.done[Source::ServiceCidrs as usize] || self.service_cidrs_unavailable.is_some()
    }

    /// The Services and EndpointSlices are listed: the Service backends are known.
    fn backends_known(&self) -> bool {
        self.done[Source::Services as usize] && self.done[Source::EndpointSlices as usize]
    }

    /// RBAC forbids listing the Services or the EndpointSlices (not listed before): the
    /// map then holds `--service-backend` alone, never what an earlier agent wrote (an
    /// address it named may be another pod's by now).
    fn backends_forbidden(&self) -> bool {
        [Source::Services, Source::EndpointSlices]
            .iter()
            .any(|s| self.forbidden_warned[*s as usize] && !self.done[*s as usize])
    }
}

/// A NetworkPolicy event: the namespace of a policy that changed (created, modified,
/// deleted, or seen again by a relist), none for the first listing, or an error.
type PolicyItem = Result<Option<String>, watcher::Error>;

/// The NetworkPolicy watch. Policies of the first listing are not changes (the
/// connections established before were allowed by them); any event after is.
fn watch_policies(api: Api<NetworkPolicy>) -> BoxStream<'static, PolicyItem> {
    let mut listed = false;
    watcher(api, watcher::Config::default())
        .default_backoff()
        .map(move |e| {
            Ok(match e? {
                watcher::Event::Apply(p) | watcher::Event::Delete(p) => p.metadata.namespace,
                watcher::Event::InitApply(p) if listed => p.metadata.namespace,
                watcher::Event::InitDone => {
                    listed = true;
                    None
                }
                watcher::Event::Init | watcher::Event::InitApply(_) => None,
            })
        })
        .boxed()
}

/// One item of the merged watch streams: an event (whether it completed a listing), or
/// an error.
type Item = (Source, Result<bool, watcher::Error>);

fn watch<K>(
    source: Source,
    api: Api<K>,
    config: watcher::Config,
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
    let stream = reflector::reflector(writer, watcher(api, config).default_backoff())
        .map(move |r| (source, r.map(|e| matches!(e, watcher::Event::InitDone))))
        .boxed();
    (store, stream)
}

/// The ServiceCIDR watch, behind a probe: a one-item list, retried with
/// [`retry_delay`] until it succeeds, each failure an item (so a missing API or RBAC is
/// warned about once by [`Reconciler::note`], not by the watcher on every retry), and
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
    let (store, watch) = watch(Source::ServiceCidrs, api, watcher::Config::default());
    (store, probe.chain(watch).boxed())
}

/// Runs until `shutdown` completes. Errors only when the datapath itself fails in a
/// way the loop cannot carry on from.
pub async fn run(
    client: Client,
    settings: &Settings,
    statics: Statics,
    dp: &mut Datapath,
    telemetry: Arc<Telemetry>,
    mut publisher: Option<&mut super::Publisher>,
    shutdown: impl Future<Output = &'static str>,
) -> Result<&'static str, AgentError> {
    let node = settings.node.clone();
    let (nodes, node_events) = watch(
        Source::Node,
        Api::<Node>::all(client.clone()),
        watcher::Config::default().fields(&format!("metadata.name={node}")),
    );
    let (pods, pod_events) = watch(
        Source::Pods,
        Api::<Pod>::all(client.clone()),
        watcher::Config::default().fields(&format!("spec.nodeName={node}")),
    );
    let (namespaces, ns_events) = watch(
        Source::Namespaces,
        Api::<Namespace>::all(client.clone()),
        watcher::Config::default(),
    );
    let mut policies = watch_policies(Api::<NetworkPolicy>::all(client.clone()));
    let (service_cidrs, sc_events) = watch_service_cidrs(Api::<ServiceCIDR>::all(client.clone()));
    let (services, svc_events) = watch(
        Source::Services,
        Api::<Service>::all(client.clone()),
        watcher::Config::default(),
    );
    let (endpoint_slices, slice_events) = watch(
        Source::EndpointSlices,
        Api::<EndpointSlice>::all(client),
        watcher::Config::default(),
    );
    let mut events = futures::stream::select_all([
        node_events,
        pod_events,
        ns_events,
        sc_events,
        svc_events,
        slice_events,
    ]);
    let mut ctl = Reconciler {
        policy: Policy {
            node: node.clone(),
            exclude_annotation: settings.exclude_annotation.clone(),
            exclude_namespace_label: settings.exclude_namespace_label.clone(),
            include_namespace_label: settings.include_namespace_label.clone(),
        },
        settings,
        statics,
        telemetry,
        reported: BTreeSet::new(),
        last_bad_label: None,
        // An adopted datapath keeps what the previous agent decided until the first pass.
        enabled_by: dp
            .agent_state()
            .ok()
            .and_then(Recorded::decode)
            .and_then(|r| r.enabled_by),
        node_seen: None,
        nodes,
        pods,
        namespaces,
        service_cidrs,
        services,
        endpoint_slices,
        listed: Listed::default(),
        policy_changed: BTreeSet::new(),
        policy_warned: false,
    };
    // A periodic pass repairs drift (an entry removed behind the agent's back) and
    // retries failed map updates.
    let mut resync = tokio::time::interval(settings.resync);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The node's namespaces are read on every wake-up and at least this often: a pod's
    // address is its own once its namespace holds it, and its connections are cut once
    // its network is down or gone.
    let mut owners = crate::owners::Watcher::new(dp)?;
    let mut owners_tick = tokio::time::interval(crate::owners::INTERVAL);
    owners_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let shutdown = shutdown.fuse();
    futures::pin_mut!(shutdown);
    info!(node = %node, "watching the node, its pods, namespaces, ServiceCIDRs, Services and EndpointSlices");
    loop {
        tokio::select! {
            signal = &mut shutdown => return Ok(signal),
            item = events.next() => match item {
                Some(item) => ctl.note(item),
                None => {
                    return Err(AgentError::WatchEnded);
                }
            },
            _ = resync.tick() => {}
            _ = owners_tick.tick(), if owners.is_some() => {}
            Some(item) = policies.next() => ctl.note_policy(item),
        }
        while let Some(Some(item)) = policies.next().now_or_never() {
            ctl.note_policy(item);
        }
        // Coalesce a burst (a relist delivers every object) into one reconcile.
        while let Some(Some(item)) = events.next().now_or_never() {
            ctl.note(item);
        }
        // Every wake-up (event or resync tick) is a full, level-triggered pass.
        if ctl.listed.core() {
            if !ctl.telemetry.health.ready() {
                info!("node, pods and namespaces listed; reconciling");
            }
            ctl.telemetry.health.set_synced(true);
            ctl.telemetry.agent.synced.set(1);
            ctl.reconcile(dp);
            ctl.cut_policy_changes(dp);
            if let Some(p) = publisher.as_deref_mut() {
                p.update(ctl.node_status(dp)).await;
            }
        }
        // After the reconcile, so a pod address added now is owned at once.
        if let Some(w) = owners.as_mut()
            && let Err(e) = w.pass(dp)
        {
            ctl.telemetry.agent.error(ErrorKind::MapUpdate);
            warn!(error = %e, "reading the pod network namespaces failed; retrying");
        }
    }
}

struct Reconciler<'a> {
    policy: Policy,
    settings: &'a Settings,
    statics: Statics,
    telemetry: Arc<Telemetry>,
    /// Rejections already logged and counted.
    reported: BTreeSet<Rejection>,
    /// The bad node label value already logged and counted.
    last_bad_label: Option<String>,
    /// Where the current on/off state came from.
    enabled_by: Option<EnabledBy>,
    /// Whether the node was in the store at the last reconcile (for logging changes).
    node_seen: Option<bool>,
    nodes: Store<Node>,
    pods: Store<Pod>,
    namespaces: Store<Namespace>,
    service_cidrs: Store<ServiceCIDR>,
    services: Store<Service>,
    endpoint_slices: Store<EndpointSlice>,
    /// Listings done, and the ServiceCIDR availability.
    listed: Listed,
    /// Namespaces whose NetworkPolicies changed since the last pass.
    policy_changed: BTreeSet<String>,
    /// Whether a failing NetworkPolicy watch was warned about (cleared by an event).
    policy_warned: bool,
}

impl Reconciler<'_> {
    /// Records one watch item: a completed listing, or an error (logged and counted;
    /// the watcher retries by itself with backoff).
    /// Records a NetworkPolicy event; a failing watch is warned about once.
    fn note_policy(&mut self, item: PolicyItem) {
        match item {
            Ok(Some(ns)) => {
                self.policy_warned = false;
                self.policy_changed.insert(ns);
            }
            Ok(None) => self.policy_warned = false,
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

    /// Cuts the bypassed connections of pods in namespaces whose NetworkPolicies
    /// changed: they continue on TCP, where the CNI enforces the policies.
    fn cut_policy_changes(&mut self, dp: &mut Datapath) {
        if self.policy_changed.is_empty() {
            return;
        }
        let pods = self.pods.state();
        let addrs = sync::addrs_in_namespaces(pods.iter().map(AsRef::as_ref), &self.policy_changed);
        if addrs.is_empty() {
            self.policy_changed.clear();
            return;
        }
        match dp.cut_links(&addrs) {
            Ok(n) => {
                info!(namespaces = ?self.policy_changed, connections = n,
                    "NetworkPolicies changed: these namespaces' pods' bypassed connections moved to TCP");
                self.policy_changed.clear();
            }
            Err(e) => {
                self.telemetry.agent.error(ErrorKind::MapUpdate);
                error!(error = %e, "could not cut the connections of pods whose NetworkPolicies changed; retrying on the next pass");
            }
        }
    }

    fn note(&mut self, (source, item): Item) {
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
        let flags: Vec<String> = self
            .statics
            .service_cidrs
            .iter()
            .map(ToString::to_string)
            .collect();
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

    /// Makes the maps and the toggle match the stores. Failures are logged and counted;
    /// the next pass retries.
    fn reconcile(&mut self, dp: &mut Datapath) {
        let metrics = self.telemetry.agent.clone();
        metrics.reconciles.inc();
        let node = self.nodes.get(&ObjectRef::new(&self.policy.node));
        if self.node_seen != Some(node.is_some()) {
            if node.is_none() {
                warn!(node = %self.policy.node,
                    "node not found in the API: --default-enabled decides");
            }
            self.node_seen = Some(node.is_some());
        }
        let pods = self.pods.state();
        let namespaces = self.namespaces.state();
        let service_cidrs = self.service_cidrs.state();
        let mut desired = sync::desired(
            pods.iter().map(AsRef::as_ref),
            namespaces.iter().map(AsRef::as_ref),
            self.listed
                .service_cidrs_known()
                .then(|| service_cidrs.iter().map(AsRef::as_ref)),
            &self.policy,
            &self.statics,
        );
        if self.listed.backends_known() {
            let services = self.services.state();
            let slices = self.endpoint_slices.state();
            let mut backends = self.statics.service_backends.clone();
            backends.extend(sync::service_backends(
                services.iter().map(AsRef::as_ref),
                slices.iter().map(AsRef::as_ref),
                &desired.addrs,
            ));
            desired.service_backends = Some(backends);
        } else if self.listed.backends_forbidden() {
            desired.service_backends = Some(self.statics.service_backends.clone());
        }
        for r in sync::new_rejections(&self.reported, &desired.rejections) {
            metrics.error(match r.kind {
                RejectionKind::PodAddress => ErrorKind::PodAddress,
                RejectionKind::OptOutValue => ErrorKind::OptOutValue,
                // Its own kind, `service_cidr`; the log line names the ServiceCIDR.
                RejectionKind::ServiceCidr => ErrorKind::ServiceCidr,
            });
            warn!(kind = r.kind.as_str(), object = %r.object, field = %r.field, value = %r.value,
                "rejected: {}", r.reason);
        }
        self.reported = desired.rejections.clone();
        metrics
            .pods_tracked
            .set(i64::try_from(desired.pods_tracked).unwrap_or(i64::MAX));

        let maps = dp.pod_maps();
        let plan = sync::plan(&apply::current(maps), &desired);
        if !plan.is_empty() {
            debug!(?plan, "applying");
        }
        let failed = apply::apply(maps, &plan, |e| {
            metrics.error(ErrorKind::MapUpdate);
            error!(error = %e, "map update failed; retrying on the next pass");
        });
        // Connections already established with a pod that just opted out leave the
        // bypass too (each side's next send takes TCP).
        if !plan.add_excluded.is_empty() {
            let newly: BTreeSet<std::net::IpAddr> = plan.add_excluded.iter().copied().collect();
            match dp.cut_links(&newly) {
                Ok(0) => {}
                Ok(n) => info!(connections = n, "opted-out pods' connections moved to TCP"),
                Err(e) => {
                    metrics.error(ErrorKind::MapUpdate);
                    error!(error = %e, "could not end opted-out pods' links");
                }
            }
        }
        if !plan.is_empty() {
            info!(
                added_cidrs = plan.add_cidrs.len(),
                removed_cidrs = plan.remove_cidrs.len(),
                added_addrs = plan.add_addrs.len(),
                removed_addrs = plan.remove_addrs.len(),
                added_excluded = plan.add_excluded.len(),
                removed_excluded = plan.remove_excluded.len(),
                added_service_cidrs = ?plan.add_service_cidrs.iter().map(ToString::to_string).collect::<Vec<_>>(),
                removed_service_cidrs = ?plan.remove_service_cidrs.iter().map(ToString::to_string).collect::<Vec<_>>(),
                added_service_backends = plan.add_service_backends.len(),
                removed_service_backends = plan.remove_service_backends.len(),
                failed,
                pods_tracked = desired.pods_tracked,
                pods = ?desired.pods,
                "maps updated"
            );
        }
        self.toggle(dp, node.as_deref());
    }

    /// What this node's status object should say now.
    fn node_status(&self, dp: &Datapath) -> super::node_status::NodeStatus {
        let features = dp.features();
        let why_off = match self.enabled_by {
            Some(toggle::EnabledBy::Label) => {
                format!("node label {}=false", self.settings.node_label)
            }
            Some(toggle::EnabledBy::Default) => format!(
                "no node label {} and --default-enabled=false",
                self.settings.node_label
            ),
            None => "not decided yet".to_owned(),
        };
        super::loaded_status(
            &self.policy.node,
            dp.is_attached(),
            dp.refused(),
            &features,
            &why_off,
        )
    }

    /// Applies what the node label means.
    fn toggle(&mut self, dp: &mut Datapath, node: Option<&Node>) {
        let metrics = self.telemetry.agent.clone();
        let labels = node.and_then(|n| n.metadata.labels.as_ref());
        let key = &self.settings.node_label;
        let attached = dp.is_attached();
        let decision = toggle::decide(
            &self.policy.node,
            labels,
            key,
            self.settings.default_enabled,
            attached,
        );
        match &decision {
            Ok(d) => {
                self.last_bad_label = None;
                self.enabled_by = Some(d.by);
            }
            Err(bad) => {
                if self.last_bad_label.as_deref() != Some(bad.value.as_str()) {
                    metrics.error(ErrorKind::LabelValue);
                    warn!(node = %bad.node, key = %bad.key, value = %bad.value, "{bad}");
                    self.last_bad_label = Some(bad.value.clone());
                }
            }
        }
        let result = match toggle::action(attached, &decision) {
            Action::Attach => dp
                .attach()
                .map(|()| info!(by = ?self.enabled_by, "bypass on")),
            Action::Detach => dp
                .detach()
                .map(|()| info!(by = ?self.enabled_by, "bypass off")),
            Action::Keep => Ok(()),
        };
        match result {
            Ok(()) => self.telemetry.health.set_settled(true),
            Err(e) => {
                metrics.error(ErrorKind::Toggle);
                error!(error = %e, "switching the bypass failed; retrying on the next pass");
            }
        }
        let recorded = Recorded {
            enabled_by: self.enabled_by,
            label: toggle::label_value(labels, key),
            synced: true,
        };
        if let Err(e) = dp.set_agent_state(recorded.encode()) {
            warn!(error = %e, "recording the toggle state for `status`");
        }
    }
}

/// How long to wait between start-up checks while the API server does not answer.
pub fn retry_delay(attempt: u32) -> Duration {
    Duration::from_millis(500u64.saturating_mul(1 << attempt.min(6))).min(Duration::from_secs(30))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delay_grows_and_caps() {
        assert_eq!(retry_delay(0), Duration::from_millis(500));
        assert_eq!(retry_delay(1), Duration::from_secs(1));
        assert_eq!(retry_delay(5), Duration::from_secs(16));
        assert_eq!(retry_delay(6), Duration::from_secs(30));
        assert_eq!(retry_delay(60), Duration::from_secs(30));
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
