//! A NetworkPolicy change moves the bypassed connections of its namespace's pods back
//! to TCP, where the CNI enforces it.

use anyhow::{Result, ensure};

use super::support::{TwoPodNode, wait_cut_logged};
use crate::support::ensure_second_chunk_by_tcp;
use crate::support::{HoldPair, Steps, grew, hold_pair, probe_report};

/// A connection between two pods of one namespace sends a first chunk, redirected;
/// then a NetworkPolicy is created in the namespace; once the agent says it cut the
/// namespace's connections, the client sends a second chunk: it takes TCP (over the
/// veths), nothing more is redirected, and the server reads both, byte-exact.
pub fn k8s_network_policy_change_cuts_bypassed_connections() -> Result<()> {
    let TwoPodNode { pods, c, agent, .. } = TwoPodNode::start("np", "bk-pol")?;
    let steps = Steps::new(&pods, "policy")?;
    let chunk = 1u64 << 20;
    let port = 5140;
    let HoldPair {
        server,
        client,
        redirected: mid,
    } = hold_pair(&pods, &agent, &steps, port, chunk)?;
    c.network_policy("bk-pol", "allow-same-namespace")?;
    wait_cut_logged(
        &agent,
        "NetworkPolicies changed",
        "the namespace's connections",
    )?;
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
    ensure_second_chunk_by_tcp(
        "the connection, by the policy change,",
        chunk,
        &mid,
        &after,
        &s_report,
        &c_report,
    )?;
    ensure!(
        wire >= chunk,
        "the second chunk did not cross the veths: {wire} B"
    );
    Ok(())
}
