//! The Kubernetes agent against a real kube-apiserver and etcd (built and started by
//! the `kube-testenv` crate, one pair per test): pod addresses follow Pod objects into
//! and out of the maps within a second (IPv4 and IPv6), ineligible pods never enter,
//! traffic between two netns "pods" whose addresses come only from Pod objects is
//! redirected, the node label switches it off and on without losing a byte, the
//! datapath survives the API server going away and the maps match the API when it is
//! back, bad input fails clearly, and every manifest in `deploy/` is accepted. Service
//! CIDRs follow the ServiceCIDR objects (with the `--service-cidr` flags), a malformed
//! one (written to etcd, as an older API server could have stored it) does not stop pod
//! sync, and without RBAC for them the agent falls back to the flags and recovers.
//! Service backends follow the Services and EndpointSlices (with the
//! `--service-backend` flags).
//!
//! Objects are made as a kubelet and controllers would: status through the status
//! subresource, pods force-deleted, the `default` ServiceAccount created by hand.

use crate::support::privileged;

// The scenarios by topic, one file each under tests/k8s/; the tests below name them,
// so every test keeps its name in the harness (filters, `--skip`, the kernel table).
pub mod bad_input;
pub mod cluster;
pub mod deploy;
pub mod opt_outs;
pub mod outage;
pub mod pods;
pub mod policies;
pub mod service_backends;
pub mod service_cidrs;
pub mod support;
pub mod toggle;

use anyhow::Result;

// -------------------------------------------------------------------------------------
// Pod addresses from Pod objects (tests/k8s/pods.rs).

#[test]
fn k8s_pod_addresses_follow_the_api() -> Result<()> {
    privileged!();
    pods::k8s_pod_addresses_follow_the_api()
}

// -------------------------------------------------------------------------------------
// The node label (tests/k8s/toggle.rs).

#[test]
fn k8s_traffic_from_pod_objects_and_label_toggle_lose_no_byte() -> Result<()> {
    privileged!();
    toggle::k8s_traffic_from_pod_objects_and_label_toggle_lose_no_byte()
}

#[test]
fn k8s_entries_of_connections_closed_while_off_are_swept() -> Result<()> {
    privileged!();
    toggle::k8s_entries_of_connections_closed_while_off_are_swept()
}

// -------------------------------------------------------------------------------------
// Opt-outs, by traffic (tests/k8s/opt_outs.rs).

#[test]
fn k8s_opt_outs_hold_by_traffic() -> Result<()> {
    privileged!();
    opt_outs::k8s_opt_outs_hold_by_traffic()
}

#[test]
fn k8s_opt_out_cuts_loopback_whose_namespace_the_datapath_forgot() -> Result<()> {
    privileged!();
    opt_outs::k8s_opt_out_cuts_loopback_whose_namespace_the_datapath_forgot()
}

// -------------------------------------------------------------------------------------
// NetworkPolicy changes (tests/k8s/policies.rs).

#[test]
fn k8s_network_policy_change_cuts_bypassed_connections() -> Result<()> {
    privileged!();
    policies::k8s_network_policy_change_cuts_bypassed_connections()
}

#[test]
fn k8s_network_policy_change_while_no_agent_runs_is_cut_at_start() -> Result<()> {
    privileged!();
    policies::k8s_network_policy_change_while_no_agent_runs_is_cut_at_start()
}

// -------------------------------------------------------------------------------------
// The API server away (tests/k8s/outage.rs).

#[test]
fn k8s_api_server_outage_keeps_datapath_then_resyncs() -> Result<()> {
    privileged!();
    outage::k8s_api_server_outage_keeps_datapath_then_resyncs()
}

#[test]
fn k8s_agent_waits_for_an_absent_api_server() -> Result<()> {
    privileged!();
    outage::k8s_agent_waits_for_an_absent_api_server()
}

// -------------------------------------------------------------------------------------
// Bad input and RBAC (tests/k8s/bad_input.rs).

#[test]
fn k8s_bad_input_fails_with_the_fix_and_deploy_rbac_suffices() -> Result<()> {
    privileged!();
    bad_input::k8s_bad_input_fails_with_the_fix_and_deploy_rbac_suffices()
}

// -------------------------------------------------------------------------------------
// Service CIDRs (tests/k8s/service_cidrs.rs).

#[test]
fn k8s_service_cidrs_follow_the_api() -> Result<()> {
    privileged!();
    service_cidrs::k8s_service_cidrs_follow_the_api()
}

#[test]
fn k8s_service_cidrs_forbidden_fall_back_to_the_flags() -> Result<()> {
    privileged!();
    service_cidrs::k8s_service_cidrs_forbidden_fall_back_to_the_flags()
}

// -------------------------------------------------------------------------------------
// Service backends (tests/k8s/service_backends.rs).

#[test]
fn k8s_service_backends_follow_endpointslices() -> Result<()> {
    privileged!();
    service_backends::k8s_service_backends_follow_endpointslices()
}

#[test]
fn k8s_service_backends_one_namespace_cannot_fill_the_map() -> Result<()> {
    privileged!();
    service_backends::k8s_service_backends_one_namespace_cannot_fill_the_map()
}

#[test]
fn k8s_tenant_annotations_cost_the_agent_no_memory() -> Result<()> {
    privileged!();
    service_backends::k8s_tenant_annotations_cost_the_agent_no_memory()
}

// -------------------------------------------------------------------------------------
// The manifests in deploy/ (tests/k8s/deploy.rs).

#[test]
fn k8s_deploy_manifests_accepted_by_the_api_server() -> Result<()> {
    // No netns or BPF here, but the same tools and root policy as the others.
    privileged!();
    deploy::k8s_deploy_manifests_accepted_by_the_api_server()
}
