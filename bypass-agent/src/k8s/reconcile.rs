//! The reconcile: one pass makes the datapath match the watch stores. The pure core
//! computes what the maps should hold (`sync`) and what the node label means
//! (`toggle`); the difference is applied to the maps (`apply`), the links of pods that
//! just opted out or whose namespace's NetworkPolicies changed are cut, and the bypass
//! is attached or detached. Rejected input is logged and counted once, failures on
//! every pass; the next pass retries.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector::ObjectRef;
use tracing::{debug, error, info, warn};

use super::{
    Settings,
    watch::{Listed, Stores},
};
use crate::{
    apply,
    datapath::Datapath,
    metrics::{ErrorKind, Telemetry},
    sync::{self, Desired, Policy, Rejection, RejectionKind, Statics},
    toggle::{self, Action, EnabledBy, Recorded},
};

/// What the reconcile remembers between passes, and what it needs to decide.
pub(super) struct Reconciler<'a> {
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
    /// The namespaces whose Service backends were left out, as last logged.
    left_out: BTreeMap<String, usize>,
    /// Addresses of pods that opted out whose connections could not be cut yet: tried
    /// again on every pass until the cut holds.
    uncut_opt_outs: BTreeSet<std::net::IpAddr>,
}

impl<'a> Reconciler<'a> {
    /// A reconciler for `settings`' node; `enabled_by` is what an adopted datapath
    /// recorded, kept until the first pass decides.
    pub(super) fn new(
        settings: &'a Settings,
        statics: Statics,
        telemetry: Arc<Telemetry>,
        enabled_by: Option<EnabledBy>,
    ) -> Self {
        Self {
            policy: Policy {
                node: settings.node.clone(),
                exclude_annotation: settings.exclude_annotation.clone(),
                exclude_namespace_label: settings.exclude_namespace_label.clone(),
                include_namespace_label: settings.include_namespace_label.clone(),
            },
            settings,
            statics,
            telemetry,
            reported: BTreeSet::new(),
            last_bad_label: None,
            enabled_by,
            node_seen: None,
            left_out: BTreeMap::new(),
            uncut_opt_outs: BTreeSet::new(),
        }
    }

    /// Cuts the bypassed connections of pods in namespaces whose NetworkPolicies
    /// changed: they continue on TCP, where the CNI enforces the policies.
    pub(super) fn cut_policy_changes(
        &mut self,
        stores: &Stores,
        changed: &mut BTreeSet<String>,
        dp: &mut Datapath,
    ) {
        if changed.is_empty() {
            return;
        }
        let pods = stores.pods.state();
        let addrs = sync::addrs_in_namespaces(pods.iter().map(AsRef::as_ref), changed);
        if addrs.is_empty() {
            changed.clear();
            return;
        }
        match dp.cut_links(&addrs) {
            Ok(n) => {
                info!(namespaces = ?changed, connections = n,
                    "NetworkPolicies changed: these namespaces' pods' bypassed connections moved to TCP");
                changed.clear();
            }
            Err(e) => {
                self.telemetry.agent.error(ErrorKind::MapUpdate);
                error!(error = %e, "could not cut the connections of pods whose NetworkPolicies changed; retrying on the next pass");
            }
        }
    }

    /// Makes the maps and the toggle match the stores. Failures are logged and counted;
    /// the next pass retries.
    pub(super) fn reconcile(&mut self, stores: &Stores, listed: &Listed, dp: &mut Datapath) {
        let start = std::time::Instant::now();
        self.telemetry.agent.reconciles.inc();
        let node = self.node(stores);
        let desired = self.desired(stores, listed);
        self.apply_maps(&desired, dp);
        self.toggle(dp, node.as_deref());
        self.telemetry
            .agent
            .reconcile_seconds
            .observe(start.elapsed().as_secs_f64());
    }

    /// This node, from its store; its absence is logged when it starts.
    fn node(&mut self, stores: &Stores) -> Option<Arc<Node>> {
        let node = stores.nodes.get(&ObjectRef::new(&self.policy.node));
        if self.node_seen != Some(node.is_some()) {
            if node.is_none() {
                warn!(node = %self.policy.node,
                    "node not found in the API: --default-enabled decides");
            }
            self.node_seen = Some(node.is_some());
        }
        node
    }

    /// What the maps should hold, from the stores (the pure core, `sync`): the Service
    /// CIDRs once the ServiceCIDRs are known, the Service backends once the Services and
    /// EndpointSlices are (`--service-backend` alone when RBAC forbids them). New
    /// rejections are logged and counted, each once; the tracked pods are gauged.
    fn desired(&mut self, stores: &Stores, listed: &Listed) -> Desired {
        let metrics = Arc::clone(&self.telemetry.agent);
        let pods = stores.pods.state();
        let namespaces = stores.namespaces.state();
        let service_cidrs = stores.service_cidrs.state();
        let mut desired = sync::desired(
            pods.iter().map(AsRef::as_ref),
            namespaces.iter().map(AsRef::as_ref),
            listed
                .service_cidrs_known()
                .then(|| service_cidrs.iter().map(AsRef::as_ref)),
            &self.policy,
            &self.statics,
        );
        if listed.backends_known() {
            let services = stores.services.state();
            let slices = stores.endpoint_slices.state();
            let by_namespace = sync::service_backends(
                services.iter().map(AsRef::as_ref),
                slices.iter().map(AsRef::as_ref),
                &desired.addrs,
            );
            // The flags' first; the API's share what the map has left.
            let mut backends = self.statics.service_backends.clone();
            let room = (bypass_common::names::MAX_SERVICE_BACKENDS as usize)
                .saturating_sub(backends.len());
            let share = sync::fair_share(room, &by_namespace);
            backends.extend(share.chosen);
            self.report_left_out(share.left_out);
            desired.service_backends = Some(backends);
        } else if listed.backends_forbidden() {
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
        self.telemetry.pods.set(desired.identities.clone());
        desired
    }

    /// Sets `bypass_service_backends_left_out` and, when the namespaces over their share
    /// change, says which and by how many.
    fn report_left_out(&mut self, left_out: BTreeMap<String, usize>) {
        let total: usize = left_out.values().sum();
        self.telemetry
            .agent
            .service_backends_left_out
            .set(i64::try_from(total).unwrap_or(i64::MAX));
        if left_out == self.left_out {
            return;
        }
        if left_out.is_empty() {
            info!("every Service backend on this node's pods is in the backend map again");
        } else {
            warn!(namespaces = ?left_out, capacity = bypass_common::names::MAX_SERVICE_BACKENDS,
                "the backend map cannot hold every Service backend on this node's pods: these \
                 namespaces give more than an equal share of it, and the connections to their \
                 backends left out take TCP (other namespaces keep all of theirs); fewer Service \
                 ports or EndpointSlices naming this node's pods in them bring them back");
        }
        self.left_out = left_out;
    }

    /// Takes the maps from what they hold to `desired` (`sync::plan`, `apply`), and moves
    /// the connections of pods that just opted out to TCP.
    fn apply_maps(&mut self, desired: &Desired, dp: &mut Datapath) {
        let metrics = &self.telemetry.agent;
        let maps = dp.pod_maps();
        let plan = sync::plan(&apply::current(maps), desired);
        if !plan.is_empty() {
            debug!(?plan, "applying");
        }
        let failed = apply::apply(maps, &plan, |e| {
            metrics.error(ErrorKind::MapUpdate);
            error!(error = %e, "map update failed; retrying on the next pass");
        });
        // Connections already established with a pod that just opted out leave the
        // bypass too (each side's next send takes TCP); a cut that failed is tried again
        // on every pass until it holds.
        self.uncut_opt_outs
            .extend(plan.add_excluded.iter().copied());
        if !self.uncut_opt_outs.is_empty() {
            match dp.cut_links(&self.uncut_opt_outs) {
                Ok(n) => {
                    if n > 0 {
                        info!(connections = n, "opted-out pods' connections moved to TCP");
                    }
                    self.uncut_opt_outs.clear();
                }
                Err(e) => {
                    metrics.error(ErrorKind::MapUpdate);
                    error!(error = %e, "could not end opted-out pods' links; retrying on the next pass");
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
    }

    /// What this node's status object should say now.
    pub(super) fn node_status(&self, dp: &Datapath) -> super::node_status::NodeStatus {
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
            dp.refused().map(|r| r.why.as_str()),
            &features,
            dp.kernel_checks().results,
            &why_off,
        )
    }

    /// What the node label asks of a datapath that is `attached` or not (the pure
    /// core, `toggle`), remembering where the decision came from; a bad value is logged
    /// and counted once.
    fn toggle_action(&mut self, node: Option<&Node>, attached: bool) -> Action {
        let decision = toggle::decide(
            &self.policy.node,
            node.and_then(|n| n.metadata.labels.as_ref()),
            &self.settings.node_label,
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
                    self.telemetry.agent.error(ErrorKind::LabelValue);
                    warn!(node = %bad.node, key = %bad.key, value = %bad.value, "{bad}");
                    self.last_bad_label = Some(bad.value.clone());
                }
            }
        }
        toggle::action(attached, &decision)
    }

    /// Applies what the node label means, and records it for `status`.
    fn toggle(&mut self, dp: &mut Datapath, node: Option<&Node>) {
        let result = match self.toggle_action(node, dp.is_attached()) {
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
                self.telemetry.agent.error(ErrorKind::Toggle);
                error!(error = %e, "switching the bypass failed; retrying on the next pass");
            }
        }
        let recorded = Recorded {
            enabled_by: self.enabled_by,
            label: toggle::label_value(
                node.and_then(|n| n.metadata.labels.as_ref()),
                &self.settings.node_label,
            ),
            synced: true,
        };
        if let Err(e) = dp.set_agent_state(recorded.encode()) {
            warn!(error = %e, "recording the toggle state for `status`");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{net::IpAddr, path::Path, time::Duration};

    use futures::StreamExt as _;
    use serde_json::{Value, json};
    use tokio::sync::mpsc;

    use super::*;
    use crate::{
        backend::Backend,
        cidr::Cidr,
        datapath::PinLayout,
        k8s::{
            fixtures::{Answer, ApiServer},
            watch::{WatchState, Watches},
        },
        metrics::ErrorLabels,
    };

    const NODE: &str = "node-a";
    const NODE_SELECTOR: &str = "fieldSelector=metadata.name%3Dnode-a";
    const POD_SELECTOR: &str = "fieldSelector=spec.nodeName%3Dnode-a";

    fn settings() -> Settings {
        Settings {
            node: NODE.into(),
            kubeconfig: None,
            node_label: "bypass.dev/enabled".into(),
            default_enabled: false,
            exclude_annotation: "bypass.dev/exclude".into(),
            exclude_namespace_label: "bypass.dev/exclude".into(),
            include_namespace_label: None,
            metrics_addrs: Vec::new(),
            resync: Duration::from_secs(60),
            pod: None,
        }
    }

    /// `--service-cidr 10.100.0.0/16 --service-backend 10.96.0.20:443=10.244.1.8:8443`.
    fn statics() -> Statics {
        Statics {
            service_cidrs: [cidr("10.100.0.0/16")].into(),
            service_backends: [backend("10.96.0.20:443", "10.244.1.8:8443")].into(),
            ..Statics::default()
        }
    }

    fn cidr(s: &str) -> Cidr {
        s.parse().unwrap()
    }

    fn backend(vip: &str, target: &str) -> Backend {
        Backend::new(vip.parse().unwrap(), target.parse().unwrap())
    }

    fn ips(list: &[&str]) -> BTreeSet<IpAddr> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    fn node(labels: Value) -> Value {
        json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": { "name": NODE, "labels": labels },
            // Never used: only Pod objects make addresses a pod's.
            "spec": { "podCIDRs": ["10.244.1.0/24"] },
        })
    }

    fn namespace(name: &str, labels: Value) -> Value {
        json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": { "name": name, "labels": labels },
        })
    }

    /// A running pod of this node with addresses `ips`.
    fn pod(namespace: &str, name: &str, ips: &[&str]) -> Value {
        let pod_ips: Vec<Value> = ips.iter().map(|ip| json!({ "ip": ip })).collect();
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": { "namespace": namespace, "name": name },
            "spec": { "nodeName": NODE, "containers": [{ "name": "app" }] },
            "status": { "phase": "Running", "podIPs": pod_ips },
        })
    }

    fn service_cidr(name: &str, cidrs: &[&str]) -> Value {
        json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR",
            "metadata": { "name": name },
            "spec": { "cidrs": cidrs },
        })
    }

    /// Service `default/web`, ClusterIP 10.96.0.10, port 80 named `http`.
    fn service() -> Value {
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": { "namespace": "default", "name": "web" },
            "spec": {
                "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"],
                "ports": [{ "name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080 }],
            },
        })
    }

    /// Its slice: one endpoint on this node's `default/web`, one on another node.
    fn endpoint_slice() -> Value {
        json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {
                "namespace": "default", "name": "web-x7k2p",
                "labels": { "kubernetes.io/service-name": "web" },
            },
            "addressType": "IPv4",
            "endpoints": [{ "addresses": ["10.244.1.7"] }, { "addresses": ["10.244.2.3"] }],
            "ports": [{ "name": "http", "port": 8080, "protocol": "TCP" }],
        })
    }

    /// The mock API server with the node's routes; the Service side is the caller's.
    fn api_server(node: Value, pods: Vec<Value>) -> ApiServer {
        ApiServer::default()
            .route("/api/v1/nodes", &[NODE_SELECTOR], Answer::List(vec![node]))
            .route("/api/v1/pods", &[POD_SELECTOR], Answer::List(pods))
            .route(
                "/api/v1/namespaces",
                &[],
                Answer::List(vec![
                    namespace("default", json!({})),
                    namespace("quiet", json!({ "bypass.dev/exclude": "true" })),
                ]),
            )
    }

    fn telemetry() -> Arc<Telemetry> {
        Arc::new(Telemetry::new(PinLayout::new(Path::new(
            "/nonexistent/bypass-test",
        ))))
    }

    fn errors(telemetry: &Telemetry, kind: ErrorKind) -> u64 {
        telemetry
            .agent
            .errors
            .get_or_create(&ErrorLabels { kind })
            .get()
    }

    /// Feeds the watch events to `state` until everything the first pass reads is
    /// known: the node, pods and namespaces listed, the ServiceCIDRs listed or known not
    /// to come, the Service backends listed or forbidden. Fails on a request the mock
    /// API server does not expect, and (rather than hang) when the listings never
    /// complete: the mock answers at once, so the bound is never what ends a good run.
    /// Returns the watches and their state, with [`Telemetry`] `telemetry`.
    async fn until_known(
        client: &kube::Client,
        telemetry: &Arc<Telemetry>,
        unexpected: &mut mpsc::UnboundedReceiver<String>,
    ) -> (Watches, WatchState) {
        let mut watches = Watches::new(client, NODE);
        let mut state = WatchState::new(telemetry.clone(), &statics(), 0);
        let known = |l: &Listed| {
            l.core() && l.service_cidrs_known() && (l.backends_known() || l.backends_forbidden())
        };
        let listing = async {
            while !known(&state.listed) {
                tokio::select! {
                    item = watches.events.next() => state.note(item.expect("the watches never end")),
                    Some(request) = unexpected.recv() => panic!("unexpected request: {request}"),
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(30), listing)
            .await
            .expect("the listings never completed");
        assert_eq!(unexpected.try_recv().ok(), None);
        (watches, state)
    }

    #[tokio::test]
    async fn the_api_objects_become_the_desired_maps_and_toggle() {
        let mut opted_out = pod("default", "opted", &["10.244.1.9"]);
        opted_out["metadata"]["annotations"] = json!({ "bypass.dev/exclude": "true" });
        let mut host = pod("default", "host", &["192.168.0.5"]);
        host["spec"]["hostNetwork"] = json!(true);
        let mut finished = pod("default", "done", &["10.244.1.11"]);
        finished["status"]["phase"] = json!("Succeeded");
        let pods = vec![
            pod("default", "web", &["10.244.1.7"]),
            pod("default", "db", &["10.244.1.8", "fd00::8"]),
            opted_out,
            pod("quiet", "app", &["10.244.1.10"]),
            host,
            finished,
            pod("default", "bad", &["10.244.1.300"]),
        ];
        let (client, mut unexpected) =
            api_server(node(json!({ "bypass.dev/enabled": "true" })), pods)
                .route(
                    "/apis/networking.k8s.io/v1/servicecidrs",
                    &[],
                    Answer::List(vec![
                        service_cidr("kubernetes", &["10.96.0.0/16", "fd00:96::/112"]),
                        service_cidr("extra", &["10.97.0.0/16", "10.98.0.1/16"]),
                    ]),
                )
                .route("/api/v1/services", &[], Answer::List(vec![service()]))
                .route(
                    "/apis/discovery.k8s.io/v1/endpointslices",
                    &[],
                    Answer::List(vec![endpoint_slice()]),
                )
                .start();
        let telemetry = telemetry();
        let settings = settings();
        let (watches, state) = until_known(&client, &telemetry, &mut unexpected).await;

        let mut reconciler = Reconciler::new(&settings, statics(), telemetry.clone(), None);
        let desired = reconciler.desired(&watches.stores, &state.listed);
        assert_eq!(
            desired.cidrs,
            BTreeSet::new(),
            "the node's podCIDRs are not used"
        );
        assert_eq!(desired.addrs, ips(&["10.244.1.7", "10.244.1.8", "fd00::8"]));
        assert_eq!(
            desired.excluded,
            ips(&["10.244.1.9", "10.244.1.10", "192.168.0.5"]),
            "opted out by annotation, by namespace label, on the host network"
        );
        assert_eq!(
            desired.service_cidrs,
            Some(
                [
                    "10.96.0.0/16",
                    "fd00:96::/112",
                    "10.97.0.0/16",
                    "10.100.0.0/16"
                ]
                .map(cidr)
                .into()
            )
        );
        assert_eq!(
            desired.service_backends,
            Some(
                [
                    backend("10.96.0.10:80", "10.244.1.7:8080"),
                    backend("10.96.0.20:443", "10.244.1.8:8443"),
                ]
                .into()
            ),
            "the endpoint on this node's pod, and --service-backend"
        );
        assert_eq!(desired.pods_tracked, 2);
        let rejected: Vec<(&str, &str)> = desired
            .rejections
            .iter()
            .map(|r| (r.object.as_str(), r.value.as_str()))
            .collect();
        assert_eq!(
            rejected,
            [
                ("pod default/bad", "10.244.1.300"),
                ("servicecidr extra", "10.98.0.1/16")
            ]
        );
        // A standing rejection is counted once, not on every pass.
        reconciler.desired(&watches.stores, &state.listed);
        assert_eq!(errors(&telemetry, ErrorKind::PodAddress), 1);
        assert_eq!(errors(&telemetry, ErrorKind::ServiceCidr), 1);
        assert_eq!(telemetry.agent.pods_tracked.get(), 2);

        let node = reconciler.node(&watches.stores);
        assert!(node.is_some(), "this node, from its store");
        assert_eq!(
            reconciler.toggle_action(node.as_deref(), false),
            Action::Attach
        );
        assert_eq!(
            reconciler.toggle_action(node.as_deref(), true),
            Action::Keep
        );
        assert_eq!(reconciler.enabled_by, Some(EnabledBy::Label));
    }

    #[tokio::test]
    async fn a_missing_api_and_forbidden_backends_leave_the_flags_alone() {
        let (client, mut unexpected) = api_server(
            node(json!({})),
            vec![pod("default", "web", &["10.244.1.7"])],
        )
        .route(
            "/apis/networking.k8s.io/v1/servicecidrs",
            &[],
            Answer::Status(404),
        )
        .route("/api/v1/services", &[], Answer::List(vec![service()]))
        .route(
            "/apis/discovery.k8s.io/v1/endpointslices",
            &[],
            Answer::Status(403),
        )
        .start();
        let telemetry = telemetry();
        let settings = settings();
        let (watches, state) = until_known(&client, &telemetry, &mut unexpected).await;
        assert!(state.listed.backends_forbidden());

        let mut reconciler = Reconciler::new(&settings, statics(), telemetry.clone(), None);
        let desired = reconciler.desired(&watches.stores, &state.listed);
        assert_eq!(desired.addrs, ips(&["10.244.1.7"]));
        assert_eq!(
            desired.service_cidrs,
            Some(statics().service_cidrs),
            "no ServiceCIDR API: --service-cidr alone"
        );
        assert_eq!(
            desired.service_backends,
            Some(statics().service_backends),
            "EndpointSlices forbidden: --service-backend alone, not what the map held"
        );
        assert_eq!(errors(&telemetry, ErrorKind::Forbidden), 1);
        assert_eq!(errors(&telemetry, ErrorKind::Watch), 1, "the missing API");

        // No label: --default-enabled=false decides.
        let node = reconciler.node(&watches.stores);
        assert_eq!(
            reconciler.toggle_action(node.as_deref(), true),
            Action::Detach
        );
        assert_eq!(reconciler.enabled_by, Some(EnabledBy::Default));
    }
}
