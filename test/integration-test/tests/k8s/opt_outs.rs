//! Opt-outs (pod annotation, namespace label) judged by traffic: an opted-out pod's
//! bytes are never redirected, and an established connection leaves the bypass when its
//! pod opts out.

use std::collections::BTreeSet;

use anyhow::{Result, ensure};
use testbed::{
    Agent, AgentStatus, ClientArgs, PeerClient, PeerServer, Proxy, ProxyOpts, TwoPods,
    iptables::{self, Family},
    run_client,
};

use super::{
    cluster::{Cluster, PodOpts},
    support::{
        EXCLUDE, TwoPodNode, addrs, free_port, node_name, seen, set, start_agent, wait_addrs,
        wait_cut_logged,
    },
};
use crate::support::{
    HoldPair, Steps, ensure_second_chunk_by_tcp,
    exchange::{
        BOUND_ABOVE_PAYLOAD, assert_byte_exact, exchange, exchange_bypassed, exchange_exact,
    },
    loopback_hold_forgotten, privileged, probe_report,
};

/// Growth of the counters over `f`, with the wire bytes the pods put on the veths.
fn measured<T>(
    pods: &TwoPods,
    agent: &Agent,
    f: impl FnOnce() -> Result<T>,
) -> Result<(T, AgentStatus, AgentStatus, u64)> {
    let before = agent.stats()?;
    let wire0 = pods.wire_bytes()?;
    let out = f()?;
    Ok((out, before, agent.stats()?, pods.wire_bytes()? - wire0))
}

/// Not one byte redirected and no socket inserted between the two readings.
fn ensure_untouched(what: &str, before: &AgentStatus, after: &AgentStatus) -> Result<()> {
    let g = |f: fn(&AgentStatus) -> u64| f(after).saturating_sub(f(before));
    ensure!(
        g(|s| s.counters.redirected_bytes) == 0
            && g(|s| s.counters.sockets_inserted) == 0
            && g(|s| s.counters.paired_loopback) == 0
            && g(|s| s.counters.paired_translated) == 0,
        "{what}: an opted-out pod's bytes were redirected: {before:?} -> {after:?}"
    );
    Ok(())
}

/// Opt-outs judged by traffic, in the ordinary cluster case: the node's podCIDR holds
/// every pod's address. Pod b is annotated `bypass.dev/exclude: "true"`: its bytes take
/// the veths, pod to pod, over loopback inside it, and through a sidecar REDIRECT into
/// it; no socket of its is inserted. Without the annotation the same exchange is
/// bypassed (so the test can tell); with its namespace labelled, not again.
#[test]
fn k8s_opt_outs_hold_by_traffic() -> Result<()> {
    privileged!();
    let pods = TwoPods::new()?;
    let c = Cluster::start()?;
    let node = node_name(&pods, "n");
    c.node(&node, &[&pods.pod_cidr_v4(), &pods.pod_cidr_v6()], &[])?;
    c.namespace("bk-apps", &[])?;
    let (a4, b4) = (pods.a.ipv4().to_string(), pods.b.ipv4().to_string());
    c.pod("bk-apps", "a", &node, &[&a4], PodOpts::default())?;
    c.pod(
        "bk-apps",
        "b",
        &node,
        &[&b4],
        PodOpts {
            annotations: &[(EXCLUDE, "true")],
            ..PodOpts::default()
        },
    )?;
    let port = free_port()?;
    let agent = start_agent(&c, &pods, &node, port, &BOUND_ABOVE_PAYLOAD)?;
    let pin = agent.pin_dir().to_path_buf();
    wait_addrs(&pin, "pod a in, opted-out b out", &addrs(&[&a4]))?;
    let bulk = ClientArgs::bulk(8 << 20);
    let payload = 2 * (8 << 20);

    // Pod to pod.
    let x = exchange_exact(&pods, &agent, pods.b.v4_addr(5130), &bulk)?;
    ensure_untouched("pod a -> opted-out pod b", &x.before, &x.after)?;
    ensure!(x.wire >= payload, "the veths carried only {} B", x.wire);
    ensure!(
        set(&seen(&pin)?.excluded_addresses) == addrs(&[&b4]),
        "{:#?}",
        seen(&pin)?
    );

    // Loopback inside the opted-out pod (which has just used its pod address).
    let lo = "127.0.0.1:5131".parse()?;
    let ((c1, s1), before, after, _) = measured(&pods, &agent, || {
        let server = PeerServer::start(&pods.b, lo, 1)?;
        let client = run_client(&pods.b, lo, &bulk)?;
        Ok((client, server.wait()?))
    })?;
    ensure!(c1.ok && s1.ok, "loopback: {c1:#?} {s1:#?}");
    ensure_untouched("loopback inside opted-out pod b", &before, &after)?;

    // A sidecar's inbound capture in the opted-out pod: a -> b:5132 is REDIRECTed to a
    // proxy on 15006 in b, which reaches the app on 127.0.0.1:5132.
    iptables::apply(
        pods.b.netns(),
        Family::V4,
        &iptables::sidecar_inbound(5132, 15006),
    )?;
    let proxy = Proxy::start(
        &pods.b,
        &ProxyOpts::new("0.0.0.0:15006".parse()?, "127.0.0.1:5132".parse()?),
    )?;
    let y = exchange(
        &pods,
        &agent,
        "0.0.0.0:5132".parse()?,
        pods.b.v4_addr(5132),
        &bulk,
    )?;
    drop(proxy);
    assert_byte_exact(&y, &bulk)?;
    ensure_untouched("sidecar hops into opted-out pod b", &y.before, &y.after)?;

    // Without the annotation: bypassed, the same exchange.
    c.annotate_pod("bk-apps", "b", EXCLUDE, None)?;
    wait_addrs(&pin, "pod b in", &addrs(&[&a4, &b4]))?;
    exchange_bypassed(&pods, &agent, pods.b.v4_addr(5133), &bulk)?;

    // An established connection streaming when the opt-out lands (the namespace label)
    // leaves the bypass too: its link is cut, both sides take TCP, byte-exact.
    let flow = ClientArgs {
        send: 6 << 20,
        recv: 6 << 20,
        msg_size: 16 << 10,
        rate: 3 << 20,
        ..ClientArgs::default()
    };
    let before = agent.stats()?;
    let server = PeerServer::start(&pods.b, pods.b.v4_addr(5135), flow.total_connections())?;
    let client = PeerClient::spawn(&pods.a, pods.b.v4_addr(5135), &flow)?;
    agent.wait_for(
        testbed::steps::NET,
        "bytes redirected before the opt-out",
        |s| s.counters.redirected_bytes > before.counters.redirected_bytes,
    )?;
    c.label_namespace("bk-apps", EXCLUDE, Some("true"))?;
    wait_addrs(&pin, "namespace opted out", &BTreeSet::new())?;
    let wire_cut = pods.wire_bytes()?;
    let (client, server) = (client.wait()?, server.wait()?);
    let after = agent.stats()?;
    ensure!(
        client.ok && server.ok && server.bytes_received == 6 << 20,
        "{client:#?} {server:#?}"
    );
    ensure!(
        after.counters.redirected_bytes > before.counters.redirected_bytes
            && after.counters.passed_bytes > before.counters.passed_bytes
            && pods.wire_bytes()? > wire_cut + (1 << 20),
        "the established connection did not leave the bypass when its pod opted out: \
         {before:?} -> {after:?}"
    );
    ensure!(
        agent.stderr().contains("moved to TCP"),
        "no log of the cut: {}",
        agent.stderr()
    );
    let w = exchange_exact(&pods, &agent, pods.b.v4_addr(5134), &bulk)?;
    ensure_untouched("namespace opted out", &w.before, &w.after)?;
    ensure!(w.wire >= payload, "the veths carried only {} B", w.wire);
    Ok(())
}

/// An opt-out cuts the pod's loopback connections even when the datapath's record of
/// the pod's namespace is gone: `BYPASS_POD_NETNS` is an LRU that pod churn on the node
/// evicts from, and the cut finds a pod's loopback links by their namespace. A loopback
/// `hold` connection inside pod b sends a first chunk, redirected; the map's entries
/// are removed (as eviction would); pod b opts out; once the agent says it cut, the
/// client sends a second chunk: it takes TCP, nothing more is redirected, and the
/// server reads both, byte-exact.
#[test]
fn k8s_opt_out_cuts_loopback_whose_namespace_the_datapath_forgot() -> Result<()> {
    privileged!();
    let TwoPodNode { pods, c, agent, a4 } = TwoPodNode::start("lru", "bk-lru")?;
    let pin = agent.pin_dir().to_path_buf();
    // Pod b's namespace learned by the datapath (a connection established on its
    // address), so that its loopback connections are bypassed.
    exchange_bypassed(
        &pods,
        &agent,
        pods.b.v4_addr(5150),
        &ClientArgs::bulk(1 << 20),
    )?;

    let steps = Steps::new(&pods, "lru")?;
    let chunk = 1u64 << 20;
    let HoldPair {
        server,
        client,
        redirected: mid,
    } = loopback_hold_forgotten(&pods, &agent, &steps, 5151, chunk)?;
    c.annotate_pod("bk-lru", "b", EXCLUDE, Some("true"))?;
    wait_addrs(&pin, "pod b opted out", &addrs(&[&a4]))?;
    wait_cut_logged(
        &agent,
        "opted-out pods' connections moved to TCP",
        "opted-out pod b's loopback connection (bypassed)",
    )?;
    steps.touch("more")?;
    let c_report = probe_report(client)?;
    let s_report = server.wait()?;
    ensure_second_chunk_by_tcp(
        "the loopback connection, by the opt-out,",
        chunk,
        &mid,
        &agent.stats()?,
        &s_report,
        &c_report,
    )
}
