//! A NetworkPolicy change moves the bypassed connections of its namespace's pods back
//! to TCP, where the CNI enforces it.

use std::time::Duration;

use anyhow::{Result, ensure};
use testbed::TwoPods;

use super::{
    cluster::{Cluster, PodOpts},
    support::{addrs, free_port, node_name, start_agent, wait_addrs},
};
use crate::support::{HoldPair, Steps, grew, hold_pair, num, probe_report};

/// A connection between two pods of one namespace sends a first chunk, redirected;
/// then a NetworkPolicy is created in the namespace; once the agent says it cut the
/// namespace's connections, the client sends a second chunk: it takes TCP (over the
/// veths), nothing more is redirected, and the server reads both, byte-exact.
pub fn k8s_network_policy_change_cuts_bypassed_connections() -> Result<()> {
    let pods = TwoPods::new()?;
    let c = Cluster::start()?;
    let node = node_name(&pods, "np");
    c.node(&node, &[&pods.pod_cidr_v4(), &pods.pod_cidr_v6()], &[])?;
    c.namespace("bk-pol", &[])?;
    let (a4, b4) = (pods.a.ipv4().to_string(), pods.b.ipv4().to_string());
    c.pod("bk-pol", "a", &node, &[&a4], PodOpts::default())?;
    c.pod("bk-pol", "b", &node, &[&b4], PodOpts::default())?;
    let agent = start_agent(&c, &pods, &node, free_port()?, &[])?;
    wait_addrs(agent.pin_dir(), "pods a and b in", &addrs(&[&a4, &b4]))?;

    let steps = Steps::new(&pods, "policy")?;
    let chunk = 1u64 << 20;
    let port = 5140;
    let HoldPair {
        server,
        client,
        redirected: mid,
    } = hold_pair(&pods, &agent, &steps, port, chunk)?;
    c.network_policy("bk-pol", "allow-same-namespace")?;
    let deadline = std::time::Instant::now() + testbed::steps::NET;
    while !agent.stderr().contains("NetworkPolicies changed") {
        ensure!(
            std::time::Instant::now() < deadline,
            "the agent did not cut the namespace's connections: {}",
            agent.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let wire0 = pods.wire_bytes()?;
    steps.touch("more")?;
    let c_report = probe_report(client)?;
    let s_report = server.wait()?;
    let after = agent.stats()?;
    let wire = pods.wire_bytes()? - wire0;
    eprintln!(
        "after the policy: redirected +{} B, passed +{} B, cut seen +{}, wire {wire} B",
        grew(&mid, &after, |s| s.counters.redirected_bytes),
        grew(&mid, &after, |s| s.counters.passed_bytes),
        grew(&mid, &after, |s| s.counters.cut_seen)
    );
    ensure!(
        s_report["ok"] == true && num(&s_report, "received") == 2 * chunk,
        "the server lost or reordered bytes: {s_report} (client {c_report})"
    );
    ensure!(
        grew(&mid, &after, |s| s.counters.redirected_bytes) == 0
            && grew(&mid, &after, |s| s.counters.passed_bytes) >= chunk
            && grew(&mid, &after, |s| s.counters.cut_seen) >= 1,
        "the connection was not moved to TCP by the policy change: {mid:?} -> {after:?}"
    );
    ensure!(
        wire >= chunk,
        "the second chunk did not cross the veths: {wire} B"
    );
    Ok(())
}
