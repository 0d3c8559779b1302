//! Service-mesh and Service traffic (issue 6), with real iptables rules made by the test
//! inside the pods' network namespaces:
//!
//! - the sidecar chain app → proxy → proxy → app behind Istio-style REDIRECTs, over
//!   IPv4 and IPv6: byte-exact, every hop paired and redirected (two translated hops,
//!   one loopback hop), the veth nearly idle;
//! - identical loopback tuples in two pods at once: four distinct SockHash keys (the
//!   network namespace is in the key), each pod gets its own bytes;
//! - a ClusterIP written as kube-proxy writes it (DNAT to a pod of this node), IPv4 and
//!   IPv6: paired across the translation, redirected both ways;
//! - the same DNAT to a backend on another "node" (outside the pod CIDRs): normal path;
//! - a port in `--skip-ports` (Istio's 15021 by default) is left alone, and `none`
//!   bypasses it;
//! - a client kube-proxy masquerades (`--random-fully`): byte-exact, never mispaired;
//! - a source NAT onto the address and port of another live connection: the accepting
//!   side's candidate fails the sequence-number check, normal path, byte-exact;
//! - 300 short connections through the chain, each writing at once: all paired, the
//!   maps empty afterwards; egress to an outside address: that hop not watched;
//!   loopback bypassed only once the namespace is known as a pod's.
//!
//! The proxies are `bypass-proxy` (src/bin/bypass-proxy.rs); the rules come from
//! `testbed::iptables` and vanish with the namespaces.

mod common;

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, ensure};
use bypass_common::{
    Endpoint, SockKey,
    names::{MAP_CONNECTORS, MAP_LINKS, MAP_SOCKETS},
};
use common::{Exchange, assert_byte_exact, exchange};
use testbed::{
    Agent, AgentOpts, AgentStatus, ClientArgs, PeerClient, PeerServer, Proxy, ProxyOpts, Report,
    TwoPods,
    iptables::{self, ClusterIp, Family},
    mapkeys,
    topology::Pod,
};

/// The application's port (the client dials it, the server listens on it).
const APP_PORT: u16 = 5801;
/// The sidecar's outbound listener (Istio: 15001).
const OUTBOUND_PORT: u16 = 15001;
/// The sidecar's inbound listener (Istio: 15006).
const INBOUND_PORT: u16 = 15006;
/// SO_MARK of the outbound proxy's upstream sockets, exempt from its REDIRECT (Istio
/// exempts its proxy by uid; a mark is the same idea without a second user).
const PROXY_MARK: u32 = 0x539;
/// A port of the default `--skip-ports` (Istio's health port).
const ISTIO_HEALTH_PORT: u16 = 15021;

/// The usual preflight, and iptables/ip6tables must work.
fn mesh_preflight(test: &str) -> Result<bool> {
    testbed::require::preflight_iptables(test)
}

/// The agent on `pods` with extra `run` flags.
fn agent_with(pods: &TwoPods, extra: &[&str]) -> Result<Agent> {
    Agent::start(&AgentOpts {
        extra_args: extra.iter().map(|s| (*s).to_owned()).collect(),
        ..pods.agent_opts()
    })
}

fn grew(before: &AgentStatus, after: &AgentStatus, f: impl Fn(&AgentStatus) -> u64) -> u64 {
    f(after).saturating_sub(f(before))
}

/// The counters this file cares about, grown between two readings, for messages.
fn growth(before: &AgentStatus, after: &AgentStatus) -> String {
    let g = |f: fn(&AgentStatus) -> u64| grew(before, after, f);
    format!(
        "paired pod/loopback/translated +{}/+{}/+{}, redirected bytes pod/loopback/translated \
         +{}/+{}/+{} (all +{}), passed bytes +{}, inserted +{}, skipped +{}, pair_rejected +{}, \
         skipped_ports +{}, insert_failures +{}",
        g(|s| s.counters.paired_pod),
        g(|s| s.counters.paired_loopback),
        g(|s| s.counters.paired_translated),
        g(|s| s.counters.redirected_bytes_pod),
        g(|s| s.counters.redirected_bytes_loopback),
        g(|s| s.counters.redirected_bytes_translated),
        g(|s| s.counters.redirected_bytes),
        g(|s| s.counters.passed_bytes),
        g(|s| s.counters.sockets_inserted),
        g(|s| s.counters.sockets_skipped),
        g(|s| s.counters.pair_rejected),
        g(|s| s.counters.skipped_ports),
        g(|s| s.counters.insert_failures),
    )
}

/// The nat tables of both pods, for a failure message.
fn nat_tables(pods: &TwoPods, family: Family) -> String {
    format!(
        "pod a nat:\n{}\npod b nat:\n{}",
        iptables::dump(pods.a.netns(), family),
        iptables::dump(pods.b.netns(), family)
    )
}

fn ip_of(pod: &Pod, family: Family) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(pod.ipv4()),
        Family::V6 => IpAddr::V6(pod.ipv6()),
    }
}

fn loopback(family: Family) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::LOCALHOST),
        Family::V6 => IpAddr::V6(Ipv6Addr::LOCALHOST),
    }
}

fn any(family: Family) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        Family::V6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    }
}

/// Bytes each way of a ping-pong run: every message and its echo arrived, verified.
fn assert_pingpong_exact(x: &Exchange, rounds: u64, size: usize) -> Result<()> {
    let bytes = rounds * size as u64;
    ensure!(x.client.ok, "client saw failures: {:#?}", x.client.failures);
    ensure!(x.server.ok, "server saw failures: {:#?}", x.server.failures);
    ensure!(
        x.client.bytes_sent == bytes && x.client.bytes_received == bytes,
        "client sent {} and got back {} of {bytes}",
        x.client.bytes_sent,
        x.client.bytes_received
    );
    ensure!(
        x.server.bytes_received == bytes,
        "server verified {} of {bytes}",
        x.server.bytes_received
    );
    Ok(())
}

/// Every hop of one connection through the sidecar chain was paired and redirected:
/// app → outbound proxy and outbound proxy → inbound proxy are translated (REDIRECT),
/// inbound proxy → app is loopback; each hop carries the whole `payload`, and the
/// veth almost nothing.
fn assert_chain_bypassed(x: &Exchange, payload: u64) -> Result<()> {
    let (b, a) = (&x.before, &x.after);
    let why = growth(b, a);
    ensure!(
        grew(b, a, |s| s.counters.paired_translated) == 2,
        "paired_translated should grow by 2 (app -> outbound proxy, proxy -> proxy): {why}"
    );
    ensure!(
        grew(b, a, |s| s.counters.paired_loopback) == 1,
        "paired_loopback should grow by 1 (inbound proxy -> app): {why}"
    );
    ensure!(
        grew(b, a, |s| s.counters.paired_pod) == 0,
        "no hop is plain pod to pod: {why}"
    );
    ensure!(
        grew(b, a, |s| s.counters.redirected_bytes_translated) >= 2 * payload * 99 / 100,
        "two translated hops should redirect ~{} B: {why}",
        2 * payload
    );
    ensure!(
        grew(b, a, |s| s.counters.redirected_bytes_loopback) >= payload * 99 / 100,
        "the loopback hop should redirect ~{payload} B: {why}"
    );
    ensure!(
        x.wire * 100 < payload,
        "the veth carried {} B of a {payload} B payload (>= 1%): the proxy-to-proxy hop was \
         not bypassed ({why})",
        x.wire
    );
    ensure!(
        grew(b, a, |s| s.counters.insert_failures) == 0,
        "insert failures: {why}"
    );
    Ok(())
}

/// Pod a's app dials pod b's app port; pod a's sidecar captures it (OUTPUT REDIRECT to
/// :15001, its own upstream sockets exempt by mark), dials pod b, whose sidecar
/// captures that (PREROUTING REDIRECT to :15006) and dials the app over loopback.
fn sidecar_chain(family: Family) -> Result<()> {
    let pods = TwoPods::new()?;
    iptables::apply(
        pods.a.netns(),
        family,
        &iptables::sidecar_outbound(APP_PORT, PROXY_MARK, OUTBOUND_PORT),
    )?;
    iptables::apply(
        pods.b.netns(),
        family,
        &iptables::sidecar_inbound(APP_PORT, INBOUND_PORT),
    )?;
    let agent = Agent::start(&pods.agent_opts())?;
    let b_app = SocketAddr::new(ip_of(&pods.b, family), APP_PORT);
    let outbound = Proxy::start(
        &pods.a,
        &ProxyOpts {
            mark: PROXY_MARK,
            ..ProxyOpts::new(SocketAddr::new(any(family), OUTBOUND_PORT), b_app)
        },
    )?;
    let inbound = Proxy::start(
        &pods.b,
        &ProxyOpts::new(
            SocketAddr::new(any(family), INBOUND_PORT),
            SocketAddr::new(loopback(family), APP_PORT),
        ),
    )?;
    let listen = SocketAddr::new(any(family), APP_PORT);
    let context = |what: &str| {
        format!(
            "{what}\n{}\noutbound proxy: {}\ninbound proxy: {}",
            nat_tables(&pods, family),
            outbound.stderr().trim(),
            inbound.stderr().trim()
        )
    };

    let bulk = ClientArgs::bulk(16 << 20);
    let x = exchange(&pods, &agent, listen, b_app, &bulk)?;
    eprintln!("sidecar chain, bulk: {}", growth(&x.before, &x.after));
    assert_byte_exact(&x, &bulk).with_context(|| context("bulk"))?;
    assert_chain_bypassed(&x, bulk.send + bulk.recv).with_context(|| context("bulk"))?;

    let (rounds, size) = (2000, 1000);
    let pp = ClientArgs::pingpong(rounds, size);
    let y = exchange(&pods, &agent, listen, b_app, &pp)?;
    eprintln!(
        "sidecar chain, ping-pong: {} (rtt {:?})",
        growth(&y.before, &y.after),
        y.client.rtt
    );
    assert_pingpong_exact(&y, rounds, size).with_context(|| context("ping-pong"))?;
    assert_chain_bypassed(&y, 2 * rounds * size as u64).with_context(|| context("ping-pong"))
}

/// Many short connections through the chain, each writing at once, 8 at a time: the
/// pairing at establishment races the first sends on every hop; all byte-exact, every
/// hop of every connection paired, and the maps empty afterwards.
#[test]
fn sidecar_chain_short_connections_exact() -> Result<()> {
    if !mesh_preflight("sidecar_chain_short_connections_exact")? {
        return Ok(());
    }
    const CONNECTIONS: u64 = 300;
    let pods = TwoPods::new()?;
    iptables::apply(
        pods.a.netns(),
        Family::V4,
        &iptables::sidecar_outbound(APP_PORT, PROXY_MARK, OUTBOUND_PORT),
    )?;
    iptables::apply(
        pods.b.netns(),
        Family::V4,
        &iptables::sidecar_inbound(APP_PORT, INBOUND_PORT),
    )?;
    let agent = Agent::start(&pods.agent_opts())?;
    let b_app = pods.b.v4_addr(APP_PORT);
    let _outbound = Proxy::start(
        &pods.a,
        &ProxyOpts {
            mark: PROXY_MARK,
            ..ProxyOpts::new(SocketAddr::new(any(Family::V4), OUTBOUND_PORT), b_app)
        },
    )?;
    let _inbound = Proxy::start(
        &pods.b,
        &ProxyOpts::new(
            SocketAddr::new(any(Family::V4), INBOUND_PORT),
            SocketAddr::new(loopback(Family::V4), APP_PORT),
        ),
    )?;
    let args = ClientArgs {
        send: 4096,
        recv: 4096,
        streams: 8,
        connections: CONNECTIONS,
        msg_size: 1024,
        ..ClientArgs::default()
    };
    let x = exchange(
        &pods,
        &agent,
        SocketAddr::new(any(Family::V4), APP_PORT),
        b_app,
        &args,
    )?;
    let why = growth(&x.before, &x.after);
    eprintln!("sidecar chain, {CONNECTIONS} short connections: {why}");
    assert_byte_exact(&x, &args)?;
    ensure!(
        x.grew(|s| s.counters.paired_translated) == 2 * CONNECTIONS
            && x.grew(|s| s.counters.paired_loopback) == CONNECTIONS,
        "every hop of every connection should be paired: {why}"
    );
    ensure!(
        x.grew(|s| s.counters.insert_failures) == 0,
        "insert failures: {why}"
    );
    // Closed connections leave the map (the proxies close both ends of a hop).
    let deadline = Instant::now() + Duration::from_secs(2);
    while agent.stats()?.sockets != 0 {
        ensure!(
            Instant::now() < deadline,
            "{} sockets still in the map after every connection closed",
            agent.stats()?.sockets
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // So does the per-connection pairing state (the LRU maps would only hide a leak).
    for (map, key_size) in [
        (MAP_CONNECTORS, size_of::<Endpoint>()),
        (MAP_LINKS, size_of::<SockKey>()),
    ] {
        let left = mapkeys::pinned_map_keys(&agent.pin_dir().join("maps").join(map), key_size)?;
        ensure!(
            left.is_empty(),
            "{map} still holds {} entries after every connection closed",
            left.len()
        );
    }
    Ok(())
}

#[test]
fn sidecar_chain_ipv4_every_hop_bypassed() -> Result<()> {
    if !mesh_preflight("sidecar_chain_ipv4_every_hop_bypassed")? {
        return Ok(());
    }
    sidecar_chain(Family::V4)
}

#[test]
fn sidecar_chain_ipv6_every_hop_bypassed() -> Result<()> {
    if !mesh_preflight("sidecar_chain_ipv6_every_hop_bypassed")? {
        return Ok(());
    }
    sidecar_chain(Family::V6)
}

/// A SockHash key as the kernel holds it (the layout of [`SockKey`], native endian).
fn decode_key(b: &[u8]) -> Option<SockKey> {
    if b.len() != size_of::<SockKey>() {
        return None;
    }
    let word = |i: usize| u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let ip = |at: usize| [word(at), word(at + 4), word(at + 8), word(at + 12)];
    let mut netns = [0u8; 8];
    netns.copy_from_slice(&b[40..48]);
    Some(SockKey {
        local_ip: ip(0),
        remote_ip: ip(16),
        local_port: word(32),
        remote_port: word(36),
        netns: u64::from_ne_bytes(netns),
    })
}

/// The SockHash keys with `port` at either end.
fn keys_with_port(agent: &Agent, port: u16) -> Result<Vec<SockKey>> {
    let pin = agent.pin_dir().join("maps").join(MAP_SOCKETS);
    let keys = mapkeys::pinned_map_keys(&pin, size_of::<SockKey>())?;
    Ok(keys
        .iter()
        .filter_map(|k| decode_key(k))
        .filter(|k| k.local_port == u32::from(port) || k.remote_port == u32::from(port))
        .collect())
}

/// Identical loopback tuples in two pods, at once: in each pod a client reaches a
/// proxy on the pod's own address (a pod-address connection, which is also what tells
/// the datapath this namespace is a pod's), and the proxy dials 127.0.0.1:5901 from
/// 127.0.0.1:40123, the same tuple in both pods. Each pod's server must get its own
/// pod's stream (they differ in content and length), both loopback hops redirected,
/// and the SockHash must hold four distinct loopback keys, two per namespace.
#[test]
fn loopback_tuples_in_two_pods_do_not_collide() -> Result<()> {
    if !mesh_preflight("loopback_tuples_in_two_pods_do_not_collide")? {
        return Ok(());
    }
    const SERVER_PORT: u16 = 5901;
    const FRONT_PORT: u16 = 5902;
    const CLIENT_PORT: u16 = 40123;
    let pods = TwoPods::new()?;
    let agent = Agent::start(&pods.agent_opts())?;
    let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
    // Different lengths and stream ids, so a server that got the other pod's stream
    // shows it; rate-limited so the connections stay open while the map is read.
    let args = [
        ClientArgs {
            send: 6 << 20,
            recv: 3 << 20,
            rate: 4 << 20,
            stream_base: 100,
            ..ClientArgs::default()
        },
        ClientArgs {
            send: 4 << 20,
            recv: 5 << 20,
            rate: 4 << 20,
            stream_base: 200,
            ..ClientArgs::default()
        },
    ];
    let before = agent.stats()?;
    let mut servers = Vec::new();
    let mut proxies = Vec::new();
    for pod in [&pods.a, &pods.b] {
        servers.push(PeerServer::start(pod, SocketAddr::new(lo, SERVER_PORT), 1)?);
        proxies.push(Proxy::start(
            pod,
            &ProxyOpts {
                upstream_bind: Some(SocketAddr::new(lo, CLIENT_PORT)),
                ..ProxyOpts::new(pod.v4_addr(FRONT_PORT), SocketAddr::new(lo, SERVER_PORT))
            },
        )?);
    }
    let clients = [
        PeerClient::spawn(&pods.a, pods.a.v4_addr(FRONT_PORT), &args[0])?,
        PeerClient::spawn(&pods.b, pods.b.v4_addr(FRONT_PORT), &args[1])?,
    ];

    // While both streams run: the loopback keys, by namespace.
    let deadline = Instant::now() + Duration::from_secs(3);
    let keys = loop {
        let keys = keys_with_port(&agent, CLIENT_PORT)?;
        if keys.len() >= 4 || Instant::now() > deadline {
            break keys;
        }
        std::thread::sleep(Duration::from_millis(10));
    };

    let [ca, cb] = clients;
    let client_reports = [ca.wait()?, cb.wait()?];
    let mut server_reports = Vec::new();
    for s in servers {
        server_reports.push(s.wait()?);
    }
    let after = agent.stats()?;
    let why = growth(&before, &after);
    eprintln!("loopback collision: {why}; keys {keys:#?}");

    for (i, pod) in ["a", "b"].iter().enumerate() {
        let (c, s, a): (&Report, &Report, &ClientArgs) =
            (&client_reports[i], &server_reports[i], &args[i]);
        ensure!(c.ok, "pod {pod} client saw failures: {:#?}", c.failures);
        ensure!(s.ok, "pod {pod} server saw failures: {:#?}", s.failures);
        ensure!(
            s.bytes_received == a.send && c.bytes_received == a.recv,
            "pod {pod}'s server verified {} B (its client sent {}), its client {} B (asked {}): \
             a stream crossed pods",
            s.bytes_received,
            a.send,
            c.bytes_received,
            a.recv
        );
    }
    ensure!(
        keys.len() == 4,
        "want 4 loopback keys with port {CLIENT_PORT} (2 per pod), found {}: {keys:#?}",
        keys.len()
    );
    let mut netns: Vec<u64> = keys.iter().map(|k| k.netns).collect();
    netns.sort_unstable();
    netns.dedup();
    ensure!(
        netns.len() == 2 && !netns.contains(&0),
        "the keys should carry two distinct, non-zero namespace cookies: {keys:#?}"
    );
    for k in &keys {
        ensure!(k.is_loopback(), "not a loopback key: {k:?}");
        ensure!(
            keys.iter().any(|o| o.mirrors(k) && o.netns == k.netns),
            "key {k:?} has no peer key in its namespace: {keys:#?}"
        );
    }
    ensure!(
        grew(&before, &after, |s| s.counters.paired_loopback) == 2,
        "paired_loopback should grow by 2: {why}"
    );
    ensure!(
        grew(&before, &after, |s| s.counters.paired_pod) == 2,
        "the client-to-proxy hops are pod to pod (2): {why}"
    );
    let payload: u64 = args.iter().map(|a| a.send + a.recv).sum();
    ensure!(
        grew(&before, &after, |s| s.counters.redirected_bytes_loopback) >= payload * 99 / 100,
        "the loopback hops should redirect ~{payload} B: {why}"
    );
    ensure!(
        grew(&before, &after, |s| s.counters.insert_failures) == 0,
        "insert failures: {why}"
    );
    drop(proxies);
    Ok(())
}

/// A ClusterIP Service, kube-proxy style, in pod a's nat table.
fn cluster_ip(pods: &TwoPods, vip: SocketAddr, backend: SocketAddr) -> ClusterIp {
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

/// The 10th address of a service CIDR such as `10.96.7.0/24` or `fd96:0:0:7::/112`.
fn vip_in(cidr: &str, port: u16) -> Result<SocketAddr> {
    let base: IpAddr = cidr
        .split('/')
        .next()
        .unwrap_or_default()
        .parse()
        .with_context(|| format!("service CIDR {cidr}"))?;
    let ip = match base {
        IpAddr::V4(v4) => IpAddr::V4(Ipv4Addr::from(u32::from(v4) + 10)),
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) + 0x10)),
    };
    Ok(SocketAddr::new(ip, port))
}

/// A pod dials a ClusterIP; kube-proxy's chains DNAT it to a pod of this node, from a
/// cluster address, so without SNAT. The client's socket sees the VIP, the server's
/// sees the client: paired as translated, redirected both ways.
fn clusterip_to_local_pod(family: Family) -> Result<()> {
    const TARGET_PORT: u16 = 5701;
    let pods = TwoPods::new()?;
    let svc_cidr = match family {
        Family::V4 => pods.service_cidr_v4(),
        Family::V6 => pods.service_cidr_v6(),
    };
    let vip = vip_in(&svc_cidr, 8080)?;
    let backend = SocketAddr::new(ip_of(&pods.b, family), TARGET_PORT);
    // kube-proxy's nodes route the Service range; here an on-link route will do (the
    // DNAT reroutes the packet to the pod).
    pods.a.add_route(&svc_cidr)?;
    iptables::apply(
        pods.a.netns(),
        family,
        &iptables::kube_proxy_rules(&cluster_ip(&pods, vip, backend)),
    )?;
    let agent = agent_with(&pods, &["--service-cidr", &svc_cidr])?;
    let args = ClientArgs::bulk(16 << 20);
    let x = exchange(
        &pods,
        &agent,
        SocketAddr::new(any(family), TARGET_PORT),
        vip,
        &args,
    )?;
    let why = growth(&x.before, &x.after);
    eprintln!("clusterip {vip} -> {backend}: {why}");
    let context = || nat_tables(&pods, family);
    assert_byte_exact(&x, &args).with_context(context)?;
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
    if !mesh_preflight("clusterip_dnat_to_local_pod_ipv4_bypassed_both_ways")? {
        return Ok(());
    }
    clusterip_to_local_pod(Family::V4)
}

#[test]
fn clusterip_dnat_to_local_pod_ipv6_bypassed_both_ways() -> Result<()> {
    if !mesh_preflight("clusterip_dnat_to_local_pod_ipv6_bypassed_both_ways")? {
        return Ok(());
    }
    clusterip_to_local_pod(Family::V6)
}

/// A client kube-proxy masquerades (its address is outside the cluster CIDR it was
/// given, so `KUBE-MARK-MASQ` marks it and `MASQUERADE --random-fully` picks a new
/// source port): byte-exact, and either cleanly on the normal path (the server's view
/// of its client matches no connecting socket) or, if the port happened to be kept,
/// paired as the same connection; never rejected, never half-redirected.
#[test]
fn clusterip_masqueraded_client_exact() -> Result<()> {
    if !mesh_preflight("clusterip_masqueraded_client_exact")? {
        return Ok(());
    }
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
    let agent = agent_with(&pods, &["--service-cidr", &svc_cidr])?;
    let args = ClientArgs::bulk(8 << 20);
    let payload = args.send + args.recv;
    let x = exchange(
        &pods,
        &agent,
        SocketAddr::new(any(Family::V4), TARGET_PORT),
        vip,
        &args,
    )?;
    let why = growth(&x.before, &x.after);
    eprintln!("masqueraded client of {vip}: {why}");
    assert_byte_exact(&x, &args).with_context(|| nat_tables(&pods, Family::V4))?;
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
    if !mesh_preflight("clusterip_dnat_to_other_node_stays_on_normal_path")? {
        return Ok(());
    }
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
    let agent = agent_with(&pods, &["--service-cidr", &svc_cidr])?;
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

/// Istio's health port 15021 is in the default `--skip-ports`: a pod-to-pod connection
/// on it stays on the normal path and is counted; with `--skip-ports none` the same
/// connection is bypassed.
#[test]
fn skip_ports_default_and_none() -> Result<()> {
    if !mesh_preflight("skip_ports_default_and_none")? {
        return Ok(());
    }
    let pods = TwoPods::new()?;
    let target = pods.b.v4_addr(ISTIO_HEALTH_PORT);
    let args = ClientArgs::bulk(4 << 20);
    let payload = args.send + args.recv;

    let mut agent = Agent::start(&pods.agent_opts())?;
    let x = exchange(&pods, &agent, target, target, &args)?;
    let why = growth(&x.before, &x.after);
    assert_byte_exact(&x, &args)?;
    ensure!(
        x.grew(|s| s.counters.skipped_ports) >= 1,
        "skipped_ports should grow: {why}"
    );
    ensure!(
        x.grew(|s| s.counters.redirected_bytes) == 0 && x.grew(|s| s.counters.paired_pod) == 0,
        "port {ISTIO_HEALTH_PORT} must not be bypassed by default: {why}"
    );
    ensure!(
        x.wire >= payload,
        "the wire carried {} B of {payload} B",
        x.wire
    );
    agent.stop()?;
    drop(agent);

    let agent = Agent::start(&AgentOpts {
        pin_dir: pods.pin_dir("noskip"),
        extra_args: vec!["--skip-ports".to_owned(), "none".to_owned()],
        ..pods.agent_opts()
    })?;
    let y = exchange(&pods, &agent, target, target, &args)?;
    let why = growth(&y.before, &y.after);
    assert_byte_exact(&y, &args)?;
    ensure!(
        y.grew(|s| s.counters.skipped_ports) == 0,
        "skipped_ports grew with --skip-ports none: {why}"
    );
    ensure!(
        y.grew(|s| s.counters.paired_pod) == 1
            && y.grew(|s| s.counters.redirected_bytes_pod) >= payload,
        "with --skip-ports none the connection should be bypassed: {why}"
    );
    ensure!(
        y.wire * 100 < payload,
        "the veth carried {} B of {payload} B: {why}",
        y.wire
    );
    Ok(())
}

/// A source NAT onto the address and port of another live connection: pod a's
/// connection 1 leaves from 10.88.k.1:40500 (a proxy bound there) and stays open; its
/// connection 2, to another port of pod b, is SNATed to the same 10.88.k.1:40500. Pod
/// b's accepting socket of connection 2 finds connection 1's socket under its client's
/// address and port, but their sequence numbers do not cross: rejected, the normal
/// path, byte-exact; connection 1 is unaffected.
#[test]
fn snat_onto_a_live_source_port_is_rejected() -> Result<()> {
    if !mesh_preflight("snat_onto_a_live_source_port_is_rejected")? {
        return Ok(());
    }
    const PORT_1: u16 = 5751;
    const PORT_2: u16 = 5752;
    const FRONT_PORT: u16 = 5753;
    const SOURCE_PORT: u16 = 40500;
    let pods = TwoPods::new()?;
    let source = pods.a.v4_addr(SOURCE_PORT);
    iptables::apply(
        pods.a.netns(),
        Family::V4,
        &[[
            "-t",
            "nat",
            "-A",
            "POSTROUTING",
            "-p",
            "tcp",
            "-d",
            &pods.b.ipv4().to_string(),
            "--dport",
            &PORT_2.to_string(),
            "-j",
            "SNAT",
            "--to-source",
            &source.to_string(),
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect::<Vec<_>>()],
    )?;
    let agent = Agent::start(&pods.agent_opts())?;

    // Connection 1: client -> proxy (pod a's own address) -> pod b, from SOURCE_PORT,
    // slow enough to stay open through connection 2.
    let long = ClientArgs {
        send: 3 << 20,
        recv: 3 << 20,
        rate: 1 << 20,
        stream_base: 1,
        ..ClientArgs::default()
    };
    let server1 = PeerServer::start(&pods.b, pods.b.v4_addr(PORT_1), 1)?;
    let _proxy = Proxy::start(
        &pods.a,
        &ProxyOpts {
            upstream_bind: Some(source),
            ..ProxyOpts::new(pods.a.v4_addr(FRONT_PORT), pods.b.v4_addr(PORT_1))
        },
    )?;
    let client1 = PeerClient::spawn(&pods.a, pods.a.v4_addr(FRONT_PORT), &long)?;
    // Wait until connection 1's proxy-to-b hop is in the map.
    let deadline = Instant::now() + Duration::from_secs(3);
    while keys_with_port(&agent, SOURCE_PORT)?.len() < 2 {
        ensure!(
            Instant::now() < deadline,
            "connection 1 from {source} never reached the SockHash: {:?}",
            agent.stats()?
        );
        std::thread::sleep(Duration::from_millis(10));
    }

    // Connection 2, SNATed onto connection 1's source.
    let short = ClientArgs {
        stream_base: 2,
        ..ClientArgs::bulk(2 << 20)
    };
    let before = agent.stats()?;
    let server2 = PeerServer::start(&pods.b, pods.b.v4_addr(PORT_2), 1)?;
    let c2 = testbed::run_client(&pods.a, pods.b.v4_addr(PORT_2), &short)?;
    let s2 = server2.wait()?;
    let after = agent.stats()?;
    let why = growth(&before, &after);
    eprintln!("snat onto a live source: {why}");

    let c1 = client1.wait()?;
    let s1 = server1.wait()?;
    ensure!(c2.ok && s2.ok, "connection 2: {c2:#?} {s2:#?}");
    ensure!(
        s2.bytes_received == short.send && c2.bytes_received == short.recv,
        "connection 2 lost bytes: {c2:#?} {s2:#?}"
    );
    ensure!(c1.ok && s1.ok, "connection 1: {c1:#?} {s1:#?}");
    ensure!(
        s1.bytes_received == long.send && c1.bytes_received == long.recv,
        "connection 1 lost bytes: {c1:#?} {s1:#?}"
    );
    ensure!(
        grew(&before, &after, |s| s.counters.pair_rejected) >= 1,
        "pair_rejected should grow: {why}\n{}",
        nat_tables(&pods, Family::V4)
    );
    ensure!(
        grew(&before, &after, |s| s.counters.paired_translated) == 0,
        "connection 2 must not be paired: {why}"
    );
    ensure!(
        grew(&before, &after, |s| s.counters.passed_bytes) >= short.send,
        "connection 2's bytes should take the normal path: {why}"
    );
    Ok(())
}

/// The sidecar captures the app's connection to an address outside the pod and Service
/// ranges (an external IP): that hop is not watched, so it stays on the normal path;
/// the proxy's own connection to a pod of this node is an ordinary pod-to-pod hop and
/// is bypassed. Byte-exact end to end.
#[test]
fn egress_to_outside_address_first_hop_normal_path() -> Result<()> {
    if !mesh_preflight("egress_to_outside_address_first_hop_normal_path")? {
        return Ok(());
    }
    let pods = TwoPods::new()?;
    let external = vip_in(&pods.outside_cidr_v4(), APP_PORT)?;
    // The app needs a route to dial it; the REDIRECT then keeps it on the node.
    pods.a.add_route(&pods.outside_cidr_v4())?;
    iptables::apply(
        pods.a.netns(),
        Family::V4,
        &iptables::sidecar_outbound(APP_PORT, PROXY_MARK, OUTBOUND_PORT),
    )?;
    let agent = Agent::start(&pods.agent_opts())?;
    let b_app = pods.b.v4_addr(APP_PORT);
    let _outbound = Proxy::start(
        &pods.a,
        &ProxyOpts {
            mark: PROXY_MARK,
            ..ProxyOpts::new(SocketAddr::new(any(Family::V4), OUTBOUND_PORT), b_app)
        },
    )?;
    let args = ClientArgs::bulk(8 << 20);
    let payload = args.send + args.recv;
    let x = exchange(&pods, &agent, b_app, external, &args)?;
    let why = growth(&x.before, &x.after);
    eprintln!("egress to {external}: {why}");
    assert_byte_exact(&x, &args).with_context(|| nat_tables(&pods, Family::V4))?;
    let (b, a) = (&x.before, &x.after);
    ensure!(
        grew(b, a, |s| s.counters.paired_translated) == 0
            && grew(b, a, |s| s.counters.redirected_bytes_translated) == 0
            && grew(b, a, |s| s.counters.paired_loopback) == 0,
        "the app-to-proxy hop (to {external}) must not be paired: {why}"
    );
    ensure!(
        grew(b, a, |s| s.counters.paired_pod) == 1
            && grew(b, a, |s| s.counters.redirected_bytes_pod) >= payload * 99 / 100,
        "the proxy-to-pod hop should be bypassed: {why}"
    );
    ensure!(
        x.wire * 100 < payload,
        "the veth carried {} B of {payload} B: {why}",
        x.wire
    );
    Ok(())
}

/// Loopback is bypassed only in a namespace the datapath knows as a pod's, which it
/// learns from a socket there with a pod address: a loopback connection in a pod that
/// has made none stays on the normal path; after one pod-address connection, the same
/// loopback connection is bypassed.
#[test]
fn loopback_bypassed_once_namespace_known_as_pod() -> Result<()> {
    if !mesh_preflight("loopback_bypassed_once_namespace_known_as_pod")? {
        return Ok(());
    }
    const LO_PORT: u16 = 5921;
    let pods = TwoPods::new()?;
    let agent = Agent::start(&pods.agent_opts())?;
    let lo = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), LO_PORT);
    let args = ClientArgs::bulk(4 << 20);
    let payload = args.send + args.recv;
    let loopback_run = || -> Result<(AgentStatus, AgentStatus)> {
        let before = agent.stats()?;
        let server = PeerServer::start(&pods.a, lo, 1)?;
        let client = testbed::run_client(&pods.a, lo, &args)?;
        let server = server.wait()?;
        ensure!(
            client.ok
                && server.ok
                && server.bytes_received == args.send
                && client.bytes_received == args.recv,
            "loopback run: {client:#?} {server:#?}"
        );
        Ok((before, agent.stats()?))
    };

    let (b, a) = loopback_run()?;
    let why = growth(&b, &a);
    eprintln!("loopback in an unknown namespace: {why}");
    ensure!(
        grew(&b, &a, |s| s.counters.paired_loopback) == 0
            && grew(&b, &a, |s| s.counters.redirected_bytes) == 0,
        "loopback in a namespace with no pod-address socket yet must not be bypassed: {why}"
    );

    // One pod-address connection from pod a (to pod b) makes its namespace a pod's.
    let x = exchange(
        &pods,
        &agent,
        pods.b.v4_addr(5922),
        pods.b.v4_addr(5922),
        &ClientArgs::bulk(64 << 10),
    )?;
    assert_byte_exact(&x, &ClientArgs::bulk(64 << 10))?;

    let (b, a) = loopback_run()?;
    let why = growth(&b, &a);
    eprintln!("loopback in pod a: {why}");
    ensure!(
        grew(&b, &a, |s| s.counters.paired_loopback) == 1
            && grew(&b, &a, |s| s.counters.redirected_bytes_loopback) >= payload * 99 / 100,
        "loopback in a known pod namespace should be bypassed: {why}"
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
    let agent = agent_with(&pods, &["--service-cidr", &svc_cidr])?;
    let args = ClientArgs::bulk(8 << 20);
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
    ensure!(
        client.ok
            && server.ok
            && server.bytes_received == args.send
            && client.bytes_received == args.recv,
        "not byte-exact: {client:#?} {server:#?}"
    );
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
    if !mesh_preflight("clusterip_dnat_in_client_pod_output_bypassed")? {
        return Ok(());
    }
    for family in [Family::V4, Family::V6] {
        for to_self in [false, true] {
            output_dnat(family, to_self)
                .with_context(|| format!("{family:?}, to itself: {to_self}"))?;
        }
    }
    Ok(())
}
