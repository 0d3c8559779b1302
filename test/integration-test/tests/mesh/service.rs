//! ClusterIP Services as kube-proxy writes them, and a DNAT in the client pod's own
//! OUTPUT chain: to a pod of this node (paired across the translation), to another
//! "node" (normal path), and from a masqueraded client.

use std::net::SocketAddr;

use anyhow::{Context as _, Result, ensure};
use testbed::{
    ClientArgs, PeerServer, TwoPods,
    iptables::{self, ClusterIp, Family},
    require::preflight_iptables,
};

use super::support::{agent_with, any, grew, growth, ip_of, nat_tables, vip_in};
use crate::support::{
    exchange::{ABOVE_PAYLOAD, Exchange, assert_byte_exact, ensure_one_exact, exchange},
    privileged,
};

/// A ClusterIP Service, kube-proxy style, in pod a's nat table.
pub fn cluster_ip(pods: &TwoPods, vip: SocketAddr, backend: SocketAddr) -> ClusterIp {
    ClusterIp {
        name: "default/web:http".to_owned(),
        vip,
        backends: vec![backend],
        cluster_cidr: if vip.is_ipv4() {
            pods.pod_cidr_v4()
        } else {
            pods.pod_cidr_v6()
        },
    }
}

/// A Service in `family` whose VIP (port 8080) kube-proxy's chains in pod a DNAT to pod
/// b's `target_port`: its Service CIDR, VIP and backend.
fn service_to_b(
    pods: &TwoPods,
    family: Family,
    target_port: u16,
) -> Result<(String, SocketAddr, SocketAddr)> {
    let svc_cidr = match family {
        Family::V4 => pods.service_cidr_v4(),
        Family::V6 => pods.service_cidr_v6(),
    };
    let vip = vip_in(&svc_cidr, 8080)?;
    let backend = SocketAddr::new(ip_of(&pods.b, family), target_port);
    // kube-proxy's nodes route the Service range; here an on-link route will do (the
    // DNAT reroutes the packet to the pod).
    pods.a.add_route(&svc_cidr)?;
    iptables::apply(
        pods.a.netns(),
        family,
        &iptables::kube_proxy_rules(&cluster_ip(pods, vip, backend)),
    )?;
    Ok((svc_cidr, vip, backend))
}

/// The agent, told the Service CIDR and one backend of `vip`.
fn service_agent(
    pods: &TwoPods,
    svc_cidr: &str,
    vip: SocketAddr,
    backend: SocketAddr,
) -> Result<testbed::Agent> {
    agent_with(
        pods,
        &[
            "--service-cidr",
            svc_cidr,
            "--service-backend",
            &format!("{vip}={backend}"),
            "--max-queued-bytes",
            ABOVE_PAYLOAD,
        ],
    )
}

/// Pod a dials `vip`, pod b serves on `port` (the DNAT's target): the exchange,
/// byte-exact, and which counters grew.
fn through_vip(
    pods: &TwoPods,
    agent: &testbed::Agent,
    family: Family,
    port: u16,
    vip: SocketAddr,
    args: &ClientArgs,
) -> Result<(Exchange, String)> {
    let x = exchange(pods, agent, SocketAddr::new(any(family), port), vip, args)?;
    let why = growth(&x.before, &x.after);
    assert_byte_exact(&x, args).with_context(|| format!("{why}\n{}", nat_tables(pods, family)))?;
    Ok((x, why))
}

/// A pod dials a ClusterIP; kube-proxy's chains DNAT it to a pod of this node, from a
/// cluster address, so without SNAT. The client's socket sees the VIP, the server's
/// sees the client: paired as translated, redirected both ways.
fn clusterip_to_local_pod(family: Family) -> Result<()> {
    const TARGET_PORT: u16 = 5701;
    let pods = TwoPods::new()?;
    let (svc_cidr, vip, backend) = service_to_b(&pods, family, TARGET_PORT)?;
    let agent = service_agent(&pods, &svc_cidr, vip, backend)?;
    let args = ClientArgs::bulk(16 << 20);
    let (x, why) = through_vip(&pods, &agent, family, TARGET_PORT, vip, &args)?;
    eprintln!("clusterip {vip} -> {backend}: {why}");
    let context = || nat_tables(&pods, family);
    let payload = args.send + args.recv;
    let (b, a) = (&x.before, &x.after);
    ensure!(
        grew(b, a, |s| s.counters.paired_translated) == 1,
        "paired_translated should grow by 1: {why}\n{}",
        context()
    );
    ensure!(
        grew(b, a, |s| s.counters.redirected_bytes_translated) >= payload * 99 / 100,
        "both directions (~{payload} B) should be redirected as translated: {why}"
    );
    ensure!(
        grew(b, a, |s| s.counters.passed_bytes) * 100 < payload,
        "passed bytes should stay ~unchanged: {why}"
    );
    ensure!(
        x.wire * 100 < payload,
        "the veth carried {} B of {payload} B: {why}",
        x.wire
    );
    ensure!(
        grew(b, a, |s| s.counters.pair_rejected) == 0,
        "pair_rejected: {why}"
    );
    Ok(())
}

#[test]
fn clusterip_dnat_to_local_pod_ipv4_bypassed_both_ways() -> Result<()> {
    privileged!(preflight_iptables);
    clusterip_to_local_pod(Family::V4)
}

#[test]
fn clusterip_dnat_to_local_pod_ipv6_bypassed_both_ways() -> Result<()> {
    privileged!(preflight_iptables);
    clusterip_to_local_pod(Family::V6)
}

/// The same Service, but what the agent knows as its backend is another port of the
/// pod: a server that is no backend of the address its client dialled is never paired
/// with it, whatever the sequence numbers say (a pod's own listener, fed a handshake
/// crafted with a victim client's numbers, looks exactly like this one). Byte-exact on
/// TCP, counted as `pair_unreachable` and as a pairing refusal of the server's
/// address.
#[test]
fn clusterip_dnat_to_a_pod_not_its_backend_stays_on_tcp() -> Result<()> {
    privileged!(preflight_iptables);
    const TARGET_PORT: u16 = 5704;
    let pods = TwoPods::new()?;
    let (svc_cidr, vip, backend) = service_to_b(&pods, Family::V4, TARGET_PORT)?;
    let listed = pods.b.v4_addr(TARGET_PORT + 1);
    let agent = service_agent(&pods, &svc_cidr, vip, listed)?;
    let args = ClientArgs::bulk(8 << 20);
    let (x, why) = through_vip(&pods, &agent, Family::V4, TARGET_PORT, vip, &args)?;
    eprintln!("clusterip {vip} -> {backend}, listed {listed}: {why}");
    let (b, a) = (&x.before, &x.after);
    ensure!(
        grew(b, a, |s| s.counters.paired_translated) == 0
            && grew(b, a, |s| s.counters.redirected_bytes) == 0,
        "paired with a server that is no backend of {vip}: {why}"
    );
    ensure!(
        grew(b, a, |s| s.counters.pair_unreachable) == 1,
        "pair_unreachable should grow by 1: {why}"
    );
    let pod_b = backend.ip();
    let refusals = a
        .refusals
        .iter()
        .find(|r| r.address == pod_b)
        .map_or(0, |r| r.pairing);
    ensure!(
        refusals >= 1,
        "no pairing refusal for {pod_b}: {:?}",
        a.refusals
    );
    let payload = args.send + args.recv;
    ensure!(
        x.wire >= payload,
        "the veth carried {} B of {payload} B",
        x.wire
    );
    Ok(())
}

/// A client kube-proxy masquerades (its address is outside the cluster CIDR it was
/// given, so `KUBE-MARK-MASQ` marks it and `MASQUERADE --random-fully` picks a new
/// source port): byte-exact, and either cleanly on the normal path (the server's view
/// of its client matches no connecting socket) or, if the port happened to be kept,
/// paired as the same connection; never rejected, never half-redirected.
#[test]
fn clusterip_masqueraded_client_exact() -> Result<()> {
    privileged!(preflight_iptables);
    const TARGET_PORT: u16 = 5703;
    let pods = TwoPods::new()?;
    let svc_cidr = pods.service_cidr_v4();
    let vip = vip_in(&svc_cidr, 8080)?;
    let backend = pods.b.v4_addr(TARGET_PORT);
    pods.a.add_route(&svc_cidr)?;
    let svc = ClusterIp {
        // A cluster CIDR that does not hold pod a: its connections are masqueraded.
        cluster_cidr: "10.250.0.0/16".to_owned(),
        ..cluster_ip(&pods, vip, backend)
    };
    iptables::apply(
        pods.a.netns(),
        Family::V4,
        &iptables::kube_proxy_rules(&svc),
    )?;
    let agent = service_agent(&pods, &svc_cidr, vip, backend)?;
    let args = ClientArgs::bulk(8 << 20);
    let payload = args.send + args.recv;
    let (x, why) = through_vip(&pods, &agent, Family::V4, TARGET_PORT, vip, &args)?;
    eprintln!("masqueraded client of {vip}: {why}");
    let (b, a) = (&x.before, &x.after);
    let normal = grew(b, a, |s| s.counters.paired_translated) == 0
        && grew(b, a, |s| s.counters.redirected_bytes) == 0
        && x.wire >= payload;
    let same_connection = grew(b, a, |s| s.counters.paired_translated) == 1
        && grew(b, a, |s| s.counters.redirected_bytes_translated) >= payload * 99 / 100;
    ensure!(
        normal || same_connection,
        "neither the normal path nor a clean pairing: wire {} B, {why}",
        x.wire
    );
    ensure!(
        grew(b, a, |s| s.counters.pair_rejected) == 0,
        "nothing to reject: {why}"
    );
    Ok(())
}

/// The same Service with its endpoint on another "node" (a namespace on the bridge,
/// outside the pod CIDRs and the agent's cgroup): the normal path, byte-exact.
#[test]
fn clusterip_dnat_to_other_node_stays_on_normal_path() -> Result<()> {
    privileged!(preflight_iptables);
    const TARGET_PORT: u16 = 5702;
    let pods = TwoPods::new()?;
    let node = pods.outside_node("n", 3)?;
    let svc_cidr = pods.service_cidr_v4();
    let vip = vip_in(&svc_cidr, 8080)?;
    let backend = node.v4_addr(TARGET_PORT);
    pods.a.add_route(&svc_cidr)?;
    pods.a.add_route(&pods.outside_cidr_v4())?;
    iptables::apply(
        pods.a.netns(),
        Family::V4,
        &iptables::kube_proxy_rules(&cluster_ip(&pods, vip, backend)),
    )?;
    let agent = agent_with(
        &pods,
        &[
            "--service-cidr",
            &svc_cidr,
            "--max-queued-bytes",
            ABOVE_PAYLOAD,
        ],
    )?;
    let args = ClientArgs::bulk(8 << 20);
    let before = agent.stats()?;
    let wire0 = pods.a.counters()?.rx_bytes + node.counters()?.rx_bytes;
    let server = PeerServer::start(&node, SocketAddr::new(any(Family::V4), TARGET_PORT), 1)?;
    let client = testbed::run_client(&pods.a, vip, &args)?;
    let server = server.wait()?;
    let wire = (pods.a.counters()?.rx_bytes + node.counters()?.rx_bytes).saturating_sub(wire0);
    let after = agent.stats()?;
    let why = growth(&before, &after);
    eprintln!("clusterip {vip} -> other node {backend}: wire {wire} B, {why}");
    let x = Exchange {
        client,
        server,
        wire,
        before,
        after,
        secs: 0.0,
    };
    assert_byte_exact(&x, &args).with_context(|| nat_tables(&pods, Family::V4))?;
    let payload = args.send + args.recv;
    let (b, a) = (&x.before, &x.after);
    ensure!(
        grew(b, a, |s| s.counters.redirected_bytes) == 0,
        "nothing may be redirected: {why}"
    );
    ensure!(
        grew(b, a, |s| s.counters.paired_translated) == 0
            && grew(b, a, |s| s.counters.paired_pod) == 0,
        "nothing may be paired: {why}"
    );
    ensure!(
        x.wire >= payload,
        "the wire carried {} B of {payload} B",
        x.wire
    );
    Ok(())
}

/// A `DNAT` in the client pod's own OUTPUT chain (what some sidecars and CNIs write):
/// the client dials a Service address, its own namespace rewrites the destination to a
/// pod of this node — another pod, or itself reached through its Service. The client's
/// socket sees the VIP, the server's the client: paired as translated, both ways
/// redirected, byte-exact. (A review reported this one not bypassed; it is tested here
/// in all four shapes.)
fn output_dnat(family: Family, to_self: bool) -> Result<()> {
    const VIP_PORT: u16 = 80;
    const TARGET_PORT: u16 = 7001;
    let pods = TwoPods::new()?;
    let svc_cidr = match family {
        Family::V4 => pods.service_cidr_v4(),
        Family::V6 => pods.service_cidr_v6(),
    };
    let vip = vip_in(&svc_cidr, VIP_PORT)?;
    let server_pod = if to_self { &pods.a } else { &pods.b };
    let target = SocketAddr::new(ip_of(server_pod, family), TARGET_PORT);
    pods.a.add_route(&svc_cidr)?;
    let rule: Vec<String> = [
        "-t",
        "nat",
        "-A",
        "OUTPUT",
        "-d",
        &vip.ip().to_string(),
        "-p",
        "tcp",
        "--dport",
        &VIP_PORT.to_string(),
        "-j",
        "DNAT",
        "--to-destination",
        &target.to_string(),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    iptables::apply(pods.a.netns(), family, &[rule])?;
    // Into another pod the translation is paired only to a backend of the VIP; into
    // the client's own namespace always.
    let backend = format!("{vip}={target}");
    let mut flags = vec![
        "--service-cidr",
        &svc_cidr,
        "--max-queued-bytes",
        ABOVE_PAYLOAD,
    ];
    if !to_self {
        flags.extend(["--service-backend", &backend]);
    }
    let agent = agent_with(&pods, &flags)?;
    // Every byte redirected: each client sends once its server's side is paired.
    let args = ClientArgs::bulk(8 << 20).greeted();
    let before = agent.stats()?;
    let server = PeerServer::start(
        server_pod,
        SocketAddr::new(any(family), TARGET_PORT),
        args.total_connections(),
    )?;
    let client = testbed::run_client(&pods.a, vip, &args)?;
    let server = server.wait()?;
    let after = agent.stats()?;
    let why = growth(&before, &after);
    eprintln!("output DNAT {vip} -> {target}: {why}");
    ensure_one_exact(&client, &server, &args)?;
    ensure!(
        grew(&before, &after, |s| s.counters.paired_translated) == 1,
        "not paired across the DNAT: {why}\n{}",
        nat_tables(&pods, family)
    );
    ensure!(
        grew(&before, &after, |s| s.counters.redirected_bytes_translated) >= args.send + args.recv,
        "not redirected both ways: {why}"
    );
    Ok(())
}

#[test]
fn clusterip_dnat_in_client_pod_output_bypassed() -> Result<()> {
    privileged!(preflight_iptables);
    for family in [Family::V4, Family::V6] {
        for to_self in [false, true] {
            output_dnat(family, to_self)
                .with_context(|| format!("{family:?}, to itself: {to_self}"))?;
        }
    }
    Ok(())
}
