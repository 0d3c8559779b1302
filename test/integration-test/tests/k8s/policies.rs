//! A NetworkPolicy change moves the bypassed connections of its namespace's pods back
//! to TCP, where the CNI enforces it.

use anyhow::{Result, ensure};

use super::cluster::{Cluster, PodOpts};
use super::support::{
    TwoPodNode, addrs, free_port, node_name, start_agent, wait_addrs, wait_cut_logged,
};
use crate::support::ensure_second_chunk_by_tcp;
use crate::support::{HoldPair, Steps, ensure_logged, grew, hold_pair, privileged, probe_report};

/// A connection between two pods of one namespace sends a first chunk, redirected;
/// then a NetworkPolicy is created in the namespace; once the agent says it cut the
/// namespace's connections, the client sends a second chunk: it takes TCP (over the
/// veths), nothing more is redirected, and the server reads both, byte-exact.
#[test]
fn k8s_network_policy_change_cuts_bypassed_connections() -> Result<()> {
    privileged!();
    let TwoPodNode { pods, c, agent, .. } = TwoPodNode::start("np", "bk-pol")?;
    let steps = Steps::new(&pods, "policy")?;
    let chunk = 1u64 << 20;
    let port = 5140;
    let hold = hold_pair(&pods, &agent, &steps, port, chunk)?;
    c.network_policy("bk-pol", "allow-same-namespace")?;
    wait_cut_logged(
        &agent,
        "NetworkPolicies changed",
        "the namespace's connections",
    )?;
    second_chunk_over_the_veths(
        &pods,
        &agent,
        &steps,
        hold,
        chunk,
        "the connection, by the policy change,",
    )
}

/// A NetworkPolicy created while no agent runs on the node is cut all the same: an agent
/// that leaves its datapath attached when it stops (an upgrade in place, a crash) has
/// recorded the policies it cut for; the next compares its first listing with that
/// record and cuts the connections of every namespace holding a policy now. The client's
/// second chunk takes TCP, over the veths, and the server reads both, byte-exact.
#[test]
fn k8s_network_policy_change_while_no_agent_runs_is_cut_at_start() -> Result<()> {
    privileged!();
    let ns = "bk-pol-gap";
    let pods = testbed::TwoPods::new()?;
    let c = Cluster::start()?;
    let node = node_name(&pods, "npgap");
    c.node(&node, &[&pods.pod_cidr_v4(), &pods.pod_cidr_v6()], &[])?;
    c.namespace(ns, &[])?;
    let (a4, b4) = (pods.a.ipv4().to_string(), pods.b.ipv4().to_string());
    c.pod(ns, "a", &node, &[&a4], PodOpts::default())?;
    c.pod(ns, "b", &node, &[&b4], PodOpts::default())?;
    let keep = ["--detach-on-exit=false"];
    // Kept to the end: dropping an agent removes the pins it leaves.
    let mut before = start_agent(&c, &pods, &node, free_port()?, &keep)?;
    wait_addrs(before.pin_dir(), "pods a and b in", &addrs(&[&a4, &b4]))?;
    let steps = Steps::new(&pods, "policy-gap")?;
    let chunk = 1u64 << 20;
    let hold = hold_pair(&pods, &before, &steps, 5141, chunk)?;
    ensure_logged(
        &before,
        "NetworkPolicies recorded",
        "the agent before did not record the policies",
    )?;
    before.stop_cleanly("the agent before")?;
    c.network_policy(ns, "allow-same-namespace")?;
    let next = start_agent(&c, &pods, &node, free_port()?, &keep)?;
    wait_cut_logged(
        &next,
        "NetworkPolicies changed while no agent ran",
        "the namespace's connections",
    )?;
    // Said when the change is seen; the cut follows with the next pass.
    ensure!(
        crate::support::wait_for_log_line(&next, &["NetworkPolicies changed:", "moved to TCP"])
            .is_some(),
        "the next agent saw the change and did not cut: {}",
        next.stderr()
    );
    second_chunk_over_the_veths(
        &pods,
        &next,
        &steps,
        hold,
        chunk,
        "the connection, by the policy made while no agent ran,",
    )
}

/// Lets the held connection's client send its second `chunk` (`more` in `steps`) once
/// `agent` cut it: it takes TCP, over the veths, nothing more is redirected, and the
/// server reads both chunks, byte-exact. `what` names the connection and its cut.
fn second_chunk_over_the_veths(
    pods: &testbed::TwoPods,
    agent: &testbed::Agent,
    steps: &Steps,
    hold: HoldPair,
    chunk: u64,
    what: &str,
) -> Result<()> {
    let HoldPair {
        server,
        client,
        redirected: mid,
    } = hold;
    let wire0 = pods.wire_bytes()?;
    steps.touch("more")?;
    let c_report = probe_report(client)?;
    let s_report = server.wait()?;
    let after = agent.stats()?;
    let wire = pods.wire_bytes()? - wire0;
    eprintln!(
        "{what}: redirected +{} B, passed +{} B, cut seen +{}, wire {wire} B",
        grew(&mid, &after, |s| s.counters.redirected_bytes),
        grew(&mid, &after, |s| s.counters.passed_bytes),
        grew(&mid, &after, |s| s.counters.cut_seen)
    );
    ensure_second_chunk_by_tcp(what, chunk, &mid, &after, &s_report, &c_report)?;
    ensure!(
        wire >= chunk,
        "the second chunk did not cross the veths: {wire} B"
    );
    Ok(())
}
