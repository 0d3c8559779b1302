//! The node label switches the bypass off and on: traffic between two netns "pods"
//! whose addresses come only from Pod objects is redirected, and no byte is lost across
//! switches; what connections closed while off left behind is swept at the next attach.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Result, ensure};
use bypass_agent::toggle::{EnabledBy, LabelValue};
use testbed::{
    ClientArgs, PeerClient, PeerServer, TwoPods,
    agent::{http_get, metric},
};

use super::{
    cluster::{Cluster, PodOpts},
    support::{
        LABEL, PROPAGATION, addrs, cluster_with_node, free_port, node_name, node_with_pods_a_b,
        seen, start_agent, wait_addrs, wait_for,
    },
};
use crate::support::{
    exchange::{BOUND_ABOVE_PAYLOAD, exchange_bypassed, exchange_exact},
    privileged,
};

#[test]
fn k8s_traffic_from_pod_objects_and_label_toggle_lose_no_byte() -> Result<()> {
    privileged!();
    // No pod CIDRs on the node, none on the command line: only Pod objects count.
    let (pods, c, node) = cluster_with_node("n", &[], "bk-apps")?;
    let (a4, a6, b4, b6) = (
        pods.a.ipv4().to_string(),
        pods.a.ipv6().to_string(),
        pods.b.ipv4().to_string(),
        pods.b.ipv6().to_string(),
    );
    c.pod("bk-apps", "a", &node, &[&a4, &a6], PodOpts::default())?;
    c.pod("bk-apps", "b", &node, &[&b4, &b6], PodOpts::default())?;
    let port = free_port()?;
    let agent = start_agent(&c, &pods, &node, port, &BOUND_ABOVE_PAYLOAD)?;
    let pin = agent.pin_dir().to_path_buf();
    wait_addrs(
        &pin,
        "both pods' addresses in",
        &addrs(&[&a4, &a6, &b4, &b6]),
    )?;
    ensure!(seen(&pin)?.pod_cidrs.is_empty(), "no CIDRs expected");
    ensure!(
        metric(port, "bypass_pod_addresses")? == 4.0,
        "map size metric"
    );
    ensure!(metric(port, "bypass_pod_cidrs")? == 0.0, "trie size metric");
    ensure!(
        metric(port, "bypass_pods_tracked")? == 2.0,
        "pods tracked metric"
    );
    ensure!(metric(port, "bypass_synced")? == 1.0, "synced metric");

    let bulk = ClientArgs::bulk(16 << 20);
    exchange_bypassed(&pods, &agent, pods.b.v4_addr(5101), &bulk)?;
    exchange_bypassed(&pods, &agent, pods.b.v6_addr(5102), &bulk)?;

    ensure!(metric(port, "bypass_attached")? == 1.0, "attached metric");
    ensure!(
        metric(port, "bypass_redirected_bytes_total{kind=\"pod\"}")? >= f64::from(4 * (16 << 20)),
        "redirected bytes metric"
    );

    // Label off: the normal path, byte-exact.
    c.label_node(&node, LABEL, Some("false"))?;
    wait_for(&pin, PROPAGATION, "label=false detaches", |s| {
        !s.attached
            && s.enabled_by == Some(EnabledBy::Label)
            && s.label_value == Some(LabelValue::False)
    })?;
    ensure!(
        http_get(port, "/readyz")?.0 == 200,
        "deliberately off must still be ready"
    );
    ensure!(
        metric(port, "bypass_attached")? == 0.0,
        "attached metric while off"
    );
    let x = exchange_exact(&pods, &agent, pods.b.v4_addr(5103), &bulk)?;
    ensure!(
        x.grew(|s| s.counters.redirected_bytes) == 0,
        "redirected while off: {x:#?}"
    );
    ensure!(
        x.wire >= 2 * (16 << 20),
        "off, yet the wire carried only {} B",
        x.wire
    );

    // Label on again: redirected again.
    c.label_node(&node, LABEL, Some("true"))?;
    wait_for(&pin, PROPAGATION, "label=true attaches", |s| {
        s.attached && s.enabled_by == Some(EnabledBy::Label)
    })?;
    exchange_bypassed(&pods, &agent, pods.b.v4_addr(5104), &bulk)?;

    // A bad value is logged and counted, and the state is kept.
    c.label_node(&node, LABEL, Some("maybe"))?;
    wait_for(&pin, PROPAGATION, "bad label value seen", |s| {
        s.label_value == Some(LabelValue::Invalid)
    })?;
    ensure!(
        seen(&pin)?.attached,
        "a bad label value must keep the bypass on"
    );
    ensure!(
        metric(port, "bypass_reconcile_errors_total{kind=\"label_value\"}")? == 1.0,
        "bad label not counted once"
    );
    c.label_node(&node, LABEL, None)?;
    wait_for(&pin, PROPAGATION, "label removed: default", |s| {
        s.attached && s.enabled_by == Some(EnabledBy::Default)
    })?;

    // Switch off and on while bytes flow, both ways, on live connections: none lost.
    let flow = ClientArgs {
        send: 24 << 20,
        recv: 24 << 20,
        streams: 2,
        msg_size: 16 << 10,
        rate: 8 << 20,
        ..ClientArgs::default()
    };
    let before = agent.stats()?;
    let server = PeerServer::start(&pods.b, pods.b.v4_addr(5105), flow.total_connections())?;
    let client = PeerClient::spawn(&pods.a, pods.b.v4_addr(5105), &flow)?;
    let mut seen_at = before.counters;
    for value in ["false", "true", "false", "true"] {
        // Bytes flow in the current state (what the test observes) before each switch.
        let was_on = value == "false";
        seen_at = agent
            .wait_for(PROPAGATION, "bytes flowing before the switch", |s| {
                if was_on {
                    s.counters.redirected_bytes > seen_at.redirected_bytes
                } else {
                    s.counters.passed_bytes > seen_at.passed_bytes
                }
            })?
            .counters;
        c.label_node(&node, LABEL, Some(value))?;
        let on = value == "true";
        wait_for(
            &pin,
            PROPAGATION,
            &format!("label={value} while streaming"),
            |s| s.attached == on,
        )?;
    }
    let client = client.wait()?;
    let server = server.wait()?;
    ensure!(
        client.ok && server.ok,
        "bytes lost or corrupted across switches: {client:#?} {server:#?}"
    );
    let n = flow.total_connections();
    ensure!(
        server.bytes_received == n * flow.send && client.bytes_received == n * flow.recv,
        "short: {client:#?} {server:#?}"
    );
    // The live connections really switched: part redirected, part (after the first
    // switch off) on the TCP path.
    let after = agent.stats()?;
    ensure!(
        after.counters.redirected_bytes > before.counters.redirected_bytes,
        "nothing redirected: {after:?}"
    );
    ensure!(
        after.counters.passed_bytes > before.counters.passed_bytes,
        "nothing took the TCP path: {after:?}"
    );

    // And new connections are bypassed after the last switch on.
    exchange_bypassed(&pods, &agent, pods.b.v6_addr(5106), &bulk)
}

/// What a connection published for its peer (a connector, a link) is removed by the
/// sock_ops state callback when it closes, which only runs while sock_ops is attached.
/// Connections that close while the node label has the bypass off leave theirs; the
/// next attach sweeps every entry whose socket is no longer in the SockHash, before
/// sock_ops can insert anything again, so nothing stale stays for a later connection
/// with the same key to find. Their counts go to their pods' counters
/// (`bypass_pod_*_total`): no close of theirs was seen to add them.
#[test]
fn k8s_entries_of_connections_closed_while_off_are_swept() -> Result<()> {
    privileged!();
    let pods = TwoPods::new()?;
    let c = Cluster::start()?;
    let node = node_name(&pods, "n");
    node_with_pods_a_b(&c, &pods, &node)?;
    let (a4, b4) = (pods.a.ipv4().to_string(), pods.b.ipv4().to_string());
    let port = free_port()?;
    let agent = start_agent(&c, &pods, &node, port, &[])?;
    let pin = agent.pin_dir().to_path_buf();
    wait_addrs(&pin, "both pods in", &addrs(&[&a4, &b4]))?;
    let start = seen(&pin)?.counters.redirected_bytes;
    let pairing = |pin: &Path| -> Result<(usize, usize)> {
        let s = seen(pin)?;
        Ok((s.connectors, s.links))
    };
    // Four connections, slow enough to outlive the switch-off.
    let flow = ClientArgs {
        send: 3 << 20,
        recv: 3 << 20,
        streams: 4,
        msg_size: 16 << 10,
        rate: 2 << 20,
        ..ClientArgs::default()
    };
    let server = PeerServer::start(&pods.b, pods.b.v4_addr(5120), flow.total_connections())?;
    let client = PeerClient::spawn(&pods.a, pods.b.v4_addr(5120), &flow)?;
    let deadline = Instant::now() + testbed::steps::NET;
    while pairing(&pin)? != (4, 4) {
        ensure!(
            Instant::now() < deadline,
            "four paired connections expected: {:?}",
            pairing(&pin)?
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    c.label_node(&node, LABEL, Some("false"))?;
    wait_for(&pin, PROPAGATION, "label=false detaches", |s| !s.attached)?;
    let (client, server) = (client.wait()?, server.wait()?);
    ensure!(client.ok && server.ok, "{client:#?} {server:#?}");
    ensure!(
        pairing(&pin)? == (4, 4),
        "closed while detached: the state callback did not run, the entries stay until \
         the next attach: {:?}",
        pairing(&pin)?
    );
    c.label_node(&node, LABEL, Some("true"))?;
    wait_for(&pin, PROPAGATION, "label=true attaches", |s| s.attached)?;
    ensure!(
        pairing(&pin)? == (0, 0),
        "the attach did not sweep the closed connections' entries: {:?}",
        pairing(&pin)?
    );
    ensure!(
        agent.stderr().contains("removed pairing entries"),
        "no log of the sweep: {}",
        agent.stderr()
    );
    // Read first now (no earlier reading to hold them up): the swept links' counts are
    // in their pods' entries, all the node redirected, four connections each.
    let pod = |name: &str, series: &str| {
        metric(
            port,
            &format!("{series}{{namespace=\"bk-apps\",pod=\"{name}\",owner=\"\"}}"),
        )
    };
    let (a_bytes, b_bytes) = (
        pod("a", "bypass_pod_redirected_bytes_total")?,
        pod("b", "bypass_pod_redirected_bytes_total")?,
    );
    let node_bytes = seen(&pin)?.counters.redirected_bytes - start;
    ensure!(
        a_bytes > 0.0 && b_bytes > 0.0 && (a_bytes + b_bytes) as u64 == node_bytes,
        "per-pod bytes after the sweep: a {a_bytes}, b {b_bytes}, the node's {node_bytes}"
    );
    for name in ["a", "b"] {
        let n = pod(name, "bypass_pod_connections_total")?;
        ensure!(n == 4.0, "pod {name}: {n} connections after the sweep");
    }
    Ok(())
}
