//! Service CIDRs follow the ServiceCIDR objects (with the `--service-cidr` flags); a
//! malformed one does not stop pod sync; without RBAC for them the agent falls back to
//! the flags and recovers once granted.

use std::time::Duration;

use anyhow::{Result, ensure};
use serde_json::json;
use testbed::{
    Agent,
    agent::{http_get, metric},
};

use super::{
    cluster::PodOpts,
    support::{
        addrs, cluster_with_node, free_port, kube_agent_opts, log_lines, seen, set, start_agent,
        strings, wait_addrs, wait_for, wait_service_cidrs,
    },
};
use crate::support::privileged;

#[test]
fn k8s_service_cidrs_follow_the_api() -> Result<()> {
    privileged!();
    let (pods, c, node) = cluster_with_node("n", &["10.33.1.0/24"], "bk-apps")?;
    let port = free_port()?;
    let flags = [
        "--service-cidr",
        "10.96.0.0/16",
        "--service-cidr",
        "fd00:96::/112",
    ];
    let agent = start_agent(&c, &pods, &node, port, &flags)?;
    let pin = agent.pin_dir().to_path_buf();
    // The default ServiceCIDR `kubernetes` (the API server's --service-cluster-ip-range)
    // and the flags.
    let mut want = strings(&["10.0.0.0/24", "10.96.0.0/16", "fd00:96::/112"]);
    wait_service_cidrs(&pin, "default ServiceCIDR and the flags", &want)?;
    ensure!(
        seen(&pin)?.pod_cidrs.is_empty(),
        "node podCIDRs must not enter the trie"
    );

    // Added: counts at once, Ready or not (no controller here sets Ready), dual-stack.
    c.service_cidr("bk-extra", &["10.1.0.0/16", "fd00:1::/112"])?;
    want.extend(strings(&["10.1.0.0/16", "fd00:1::/112"]));
    wait_service_cidrs(&pin, "added ServiceCIDR in", &want)?;
    // One equal to a flag, then deleted: the flag's range stays.
    // (One watch stream delivers in order: once bk-extra is seen gone, so is bk-same.)
    c.service_cidr("bk-same", &["10.96.0.0/16"])?;
    c.delete_service_cidr("bk-same")?;
    c.delete_service_cidr("bk-extra")?;
    want.remove("10.1.0.0/16");
    want.remove("fd00:1::/112");
    wait_service_cidrs(&pin, "deleted ServiceCIDRs out, flags kept", &want)?;

    // Malformed, as an older API server could have stored it: the bad range is
    // rejected (logged once, counted), the object's other range counts, and pod sync
    // goes on.
    let before = metric(port, "bypass_reconcile_errors_total{kind=\"service_cidr\"}")?;
    c.service_cidr_in_etcd("bk-legacy", &["10.9.0.5/16", "fd00:9::/112"])?;
    want.insert("fd00:9::/112".to_owned());
    wait_service_cidrs(&pin, "legacy ServiceCIDR's good range in", &want)?;
    c.pod("bk-apps", "web", &node, &["10.33.1.5"], PodOpts::default())?;
    wait_addrs(&pin, "pod sync goes on", &addrs(&["10.33.1.5"]))?;
    c.delete_service_cidr("bk-legacy")?;
    want.remove("fd00:9::/112");
    wait_service_cidrs(&pin, "legacy ServiceCIDR deleted", &want)?;
    ensure!(
        log_lines(
            &agent,
            &["rejected", "servicecidr bk-legacy", "10.9.0.5/16"]
        ) == 1,
        "the malformed range is not logged once: {}",
        agent.stderr()
    );
    ensure!(
        metric(port, "bypass_reconcile_errors_total{kind=\"service_cidr\"}")? == before + 1.0,
        "the malformed range is not counted once"
    );
    ensure!(http_get(port, "/readyz")?.0 == 200, "not ready");
    Ok(())
}

#[test]
fn k8s_service_cidrs_forbidden_fall_back_to_the_flags() -> Result<()> {
    privileged!();
    let (pods, c, node) = cluster_with_node("n", &[], "bk-apps")?;
    c.pod("bk-apps", "a", &node, &["10.34.0.5"], PodOpts::default())?;
    // What deploy/rbac.yaml granted before ServiceCIDRs: nodes, pods, namespaces; and
    // Services and EndpointSlices, so that ServiceCIDRs are the only thing forbidden.
    let user = "bk-core";
    let kubeconfig = c.env.user_kubeconfig(user, &[])?;
    c.grant(
        "bk-core",
        user,
        json!([
            {"apiGroups": [""], "resources": ["nodes", "pods", "namespaces", "services"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
        ]),
    )?;
    let port = free_port()?;
    let agent = Agent::start(&kube_agent_opts(
        &pods,
        &node,
        &kubeconfig,
        port,
        &["--service-cidr", "10.96.0.0/16"],
    ))?;
    let pin = agent.pin_dir().to_path_buf();
    wait_service_cidrs(&pin, "the flag alone", &strings(&["10.96.0.0/16"]))?;
    wait_addrs(&pin, "pods synced regardless", &addrs(&["10.34.0.5"]))?;
    ensure!(http_get(port, "/readyz")?.0 == 200, "not ready");
    // The agent retries (0.5 s, 1 s, 2 s, ...); the warning comes once, and is the only
    // line about them: once it is there (a net), a few retries' time for a second one
    // to show.
    let warning = ["forbids listing ServiceCIDRs", "deploy/rbac.yaml"];
    let deadline = std::time::Instant::now() + testbed::steps::NET;
    while log_lines(&agent, &warning) == 0 {
        ensure!(
            std::time::Instant::now() < deadline,
            "no warning: {}",
            agent.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_secs(3));
    ensure!(
        log_lines(&agent, &warning) == 1 && log_lines(&agent, &["servicecidrs"]) == 1,
        "not warned exactly once: {}",
        agent.stderr()
    );
    ensure!(
        metric(port, "bypass_reconcile_errors_total{kind=\"forbidden\"}")? == 1.0,
        "not counted once"
    );

    // Granted later: picked up without a restart, at the watcher's next retry.
    c.grant(
        "bk-servicecidrs",
        user,
        json!([{"apiGroups": ["networking.k8s.io"], "resources": ["servicecidrs"], "verbs": ["list", "watch"]}]),
    )?;
    wait_for(
        &pin,
        testbed::steps::NET,
        "ServiceCIDRs once RBAC allows them",
        |s| set(&s.service_cidrs) == strings(&["10.0.0.0/24", "10.96.0.0/16"]),
    )?;
    ensure!(
        log_lines(&agent, &["ServiceCIDRs listed"]) == 1,
        "{}",
        agent.stderr()
    );
    Ok(())
}
