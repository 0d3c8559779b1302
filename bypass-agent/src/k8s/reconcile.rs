//! The reconcile: one pass makes the datapath match the watch stores. The pure core
//! computes what the maps should hold (`sync`) and what the node label means
//! (`toggle`); the difference is applied to the maps (`apply`), the links of pods that
//! just opted out or whose namespace's NetworkPolicies changed are cut, and the bypass
//! is attached or detached. Rejected input is logged and counted once, failures on
//! every pass; the next pass retries.

use std::{collections::BTreeSet, sync::Arc};

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
    toggle::{self, Action, EnabledBy, LabelValue, Recorded},
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
        self.telemetry.agent.reconciles.inc();
        let node = self.node(stores);
        let desired = self.desired(stores, listed);
        self.apply_maps(&desired, dp);
        self.toggle(dp, node.as_deref());
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
        let metrics = &self.telemetry.agent;
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
            let mut backends = self.statics.service_backends.clone();
            backends.extend(sync::service_backends(
                services.iter().map(AsRef::as_ref),
                slices.iter().map(AsRef::as_ref),
                &desired.addrs,
            ));
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
        desired
    }

    /// Takes the maps from what they hold to `desired` (`sync::plan`, `apply`), and moves
    /// the connections of pods that just opted out to TCP.
    fn apply_maps(&self, desired: &Desired, dp: &mut Datapath) {
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
            dp.refused(),
            &features,
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
            label: LabelValue::of(
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
