//! Pod addresses follow Pod objects into and out of the maps within a second (IPv4 and
//! IPv6); ineligible pods (host network, another node, opted out) never enter.

use std::{collections::BTreeSet, net::IpAddr, time::Duration};

use anyhow::{Result, ensure};
use bypass_agent::toggle::{EnabledBy, LabelValue};
use kube::api::{Patch, PatchParams};
use serde_json::json;
use testbed::{
    TwoPods,
    agent::{http_get, metric},
};

use super::{
    cluster::{Cluster, PodOpts},
    support::{
        EXCLUDE, PROPAGATION, addrs, free_port, node_name, seen, set, start_agent, wait_addrs,
        wait_for,
    },
};
use crate::support::privileged;

#[test]
fn k8s_pod_addresses_follow_the_api() -> Result<()> {
    privileged!();
    let pods = TwoPods::new()?;
    let c = Cluster::start()?;
    let node = node_name(&pods, "n1");
    let other = node_name(&pods, "n2");
    c.node(&node, &["10.77.1.0/24", "fd77:1::/64"], &[])?;
    c.node(&other, &["10.77.2.0/24"], &[])?;
    c.namespace("bk-apps", &[])?;
    c.namespace("bk-quiet", &[(EXCLUDE, "true")])?;
    let port = free_port()?;
    let agent = start_agent(&c, &pods, &node, port, &[])?;
    let pin = agent.pin_dir().to_path_buf();
    wait_for(&pin, PROPAGATION, "attached by default", |s| {
        s.attached && s.enabled_by == Some(EnabledBy::Default)
    })?;
    let s = seen(&pin)?;
    ensure!(s.label_value == Some(LabelValue::Absent), "{s:#?}");
    // The node's podCIDRs never enter the trie: an address there is a pod's only once
    // a Pod object of this node says so (not opted out, not on the host network).
    ensure!(s.pod_cidrs.is_empty(), "node podCIDRs in the trie: {s:#?}");
    ensure!(http_get(port, "/readyz")?.0 == 200, "not ready");
    ensure!(http_get(port, "/healthz")?.0 == 200, "not healthy");

    // Dual-stack pod: both addresses in; an address change moves them.
    c.pod(
        "bk-apps",
        "web",
        &node,
        &["10.77.1.5", "fd77:1::5"],
        PodOpts::default(),
    )?;
    wait_addrs(
        &pin,
        "v4+v6 pod addresses in",
        &addrs(&["10.77.1.5", "fd77:1::5"]),
    )?;
    c.pod_ips("bk-apps", "web", &["10.77.1.6", "fd77:1::6"], "Running")?;
    wait_addrs(
        &pin,
        "changed addresses moved",
        &addrs(&["10.77.1.6", "fd77:1::6"]),
    )?;
    c.pod(
        "bk-apps",
        "v6only",
        &node,
        &["fd77:1::7"],
        PodOpts::default(),
    )?;
    wait_addrs(
        &pin,
        "IPv6-only pod in",
        &addrs(&["10.77.1.6", "fd77:1::6", "fd77:1::7"]),
    )?;

    // Pods that must never enter; a sentinel after them proves they were processed.
    c.pod(
        "bk-apps",
        "host",
        &node,
        &["192.0.2.10"],
        PodOpts {
            host_network: true,
            ..PodOpts::default()
        },
    )?;
    c.pod(
        "bk-apps",
        "elsewhere",
        &other,
        &["10.77.2.5"],
        PodOpts::default(),
    )?;
    c.pod(
        "bk-apps",
        "optout",
        &node,
        &["10.77.1.8"],
        PodOpts {
            annotations: &[(EXCLUDE, "true")],
            ..PodOpts::default()
        },
    )?;
    c.pod(
        "bk-quiet",
        "quiet",
        &node,
        &["10.77.1.9"],
        PodOpts::default(),
    )?;
    // Legacy validation lets the API server store an IPv4 with leading zeros; the
    // agent rejects that one address (logged, counted) and keeps the pod's other one.
    c.pod(
        "bk-apps",
        "odd",
        &node,
        &["10.77.1.010", "fd77:1::10"],
        PodOpts::default(),
    )?;
    c.pod(
        "bk-apps",
        "sentinel",
        &node,
        &["10.77.1.11"],
        PodOpts::default(),
    )?;
    let mut want = addrs(&[
        "10.77.1.6",
        "fd77:1::6",
        "fd77:1::7",
        "fd77:1::10",
        "10.77.1.11",
    ]);
    wait_addrs(&pin, "sentinel in, ineligible pods out", &want)?;
    // Opted-out and host-network pods' addresses are excluded whatever CIDR covers
    // them; the other node's pod is simply not this node's business.
    ensure!(
        set(&seen(&pin)?.excluded_addresses) == addrs(&["192.0.2.10", "10.77.1.8", "10.77.1.9"]),
        "excluded addresses: {:#?}",
        seen(&pin)?
    );
    ensure!(
        metric(port, "bypass_reconcile_errors_total{kind=\"pod_address\"}")? >= 1.0,
        "malformed address not counted"
    );
    ensure!(metric(port, "bypass_pods_tracked")? == 4.0, "pods_tracked");

    // Opt-out by annotation and by namespace label, live, and back.
    c.annotate_pod("bk-apps", "web", EXCLUDE, Some("true"))?;
    let without_web: BTreeSet<IpAddr> = want
        .difference(&addrs(&["10.77.1.6", "fd77:1::6"]))
        .copied()
        .collect();
    wait_addrs(&pin, "annotated pod out", &without_web)?;
    ensure!(
        seen(&pin)?
            .excluded_addresses
            .contains(&"10.77.1.6".parse()?),
        "annotated pod not excluded"
    );
    c.annotate_pod("bk-apps", "web", EXCLUDE, None)?;
    wait_addrs(&pin, "annotation removed, pod back", &want)?;
    c.label_namespace("bk-apps", EXCLUDE, Some("true"))?;
    wait_addrs(&pin, "namespace opted out", &BTreeSet::new())?;
    c.label_namespace("bk-quiet", EXCLUDE, Some("false"))?;
    c.label_namespace("bk-apps", EXCLUDE, None)?;
    want.insert("10.77.1.9".parse()?);
    wait_addrs(&pin, "namespaces opted in", &want)?;

    // Finished and deleted pods leave.
    c.pod_ips("bk-apps", "sentinel", &["10.77.1.11"], "Succeeded")?;
    want.remove(&"10.77.1.11".parse()?);
    wait_addrs(&pin, "finished pod out", &want)?;
    c.delete_pod("bk-apps", "v6only")?;
    want.remove(&"fd77:1::7".parse()?);
    wait_addrs(&pin, "deleted pod out", &want)?;

    // A node edit changes no map.
    c.block(c.nodes().patch(
        &node,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
    ))?;
    std::thread::sleep(Duration::from_millis(200));
    let s = seen(&pin)?;
    ensure!(
        s.pod_cidrs.is_empty() && set(&s.pod_addresses) == want,
        "maps changed by a label edit: {s:#?}"
    );
    Ok(())
}
