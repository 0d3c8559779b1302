//! The sidecar chain app → proxy → proxy → app behind Istio-style REDIRECTs: every hop
//! paired and redirected, many short connections, and egress to an outside address.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, ensure};
use bypass_common::{
    Connector, Endpoint, Link, SockKey,
    names::{MAP_CONNECTORS, MAP_LINKS},
};
use testbed::{
    Agent, ClientArgs, Proxy, ProxyOpts, TwoPods,
    iptables::{self, Family},
    mapkeys,
    require::preflight_iptables,
};

use super::support::{
    APP_PORT, INBOUND_PORT, OUTBOUND_PORT, PROXY_MARK, any, grew, growth, ip_of, loopback,
    nat_tables, vip_in,
};
use crate::support::{
    exchange::{ABOVE_PAYLOAD, Exchange, assert_byte_exact, exchange},
    privileged,
};

/// Pod a's capture: its app's connections to the app port go to the outbound sidecar.
fn capture_outbound(pods: &TwoPods, family: Family) -> Result<()> {
    iptables::apply(
        pods.a.netns(),
        family,
        &iptables::sidecar_outbound(APP_PORT, PROXY_MARK, OUTBOUND_PORT),
    )
}

/// Pod b's capture: connections to its app port go to the inbound sidecar.
fn capture_inbound(pods: &TwoPods, family: Family) -> Result<()> {
    iptables::apply(
        pods.b.netns(),
        family,
        &iptables::sidecar_inbound(APP_PORT, INBOUND_PORT),
    )
}

/// Pod a's outbound sidecar: dials `upstream` from sockets marked exempt from the capture.
fn outbound_sidecar(pods: &TwoPods, family: Family, upstream: SocketAddr) -> Result<Proxy> {
    Proxy::start(
        &pods.a,
        &ProxyOpts {
            mark: PROXY_MARK,
            ..ProxyOpts::new(SocketAddr::new(any(family), OUTBOUND_PORT), upstream)
        },
    )
}

/// Pod b's inbound sidecar: dials its app over loopback.
fn inbound_sidecar(pods: &TwoPods, family: Family) -> Result<Proxy> {
    Proxy::start(
        &pods.b,
        &ProxyOpts::new(
            SocketAddr::new(any(family), INBOUND_PORT),
            SocketAddr::new(loopback(family), APP_PORT),
        ),
    )
}

/// Bytes each way of a ping-pong run: every message and its echo arrived, verified.
pub fn assert_pingpong_exact(x: &Exchange, rounds: u64, size: usize) -> Result<()> {
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
pub fn assert_chain_bypassed(x: &Exchange, payload: u64) -> Result<()> {
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
    capture_outbound(&pods, family)?;
    capture_inbound(&pods, family)?;
    let agent = Agent::start(&pods.agent_opts().max_queued(ABOVE_PAYLOAD))?;
    let b_app = SocketAddr::new(ip_of(&pods.b, family), APP_PORT);
    let outbound = outbound_sidecar(&pods, family, b_app)?;
    let inbound = inbound_sidecar(&pods, family)?;
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

#[test]
fn sidecar_chain_ipv4_every_hop_bypassed() -> Result<()> {
    privileged!(preflight_iptables);
    sidecar_chain(Family::V4)
}

#[test]
fn sidecar_chain_ipv6_every_hop_bypassed() -> Result<()> {
    privileged!(preflight_iptables);
    sidecar_chain(Family::V6)
}

/// Many short connections through the chain, each writing at once, 8 at a time: the
/// pairing at establishment races the first sends on every hop; all byte-exact, every
/// hop of every connection paired, and the maps empty afterwards.
#[test]
fn sidecar_chain_short_connections_exact() -> Result<()> {
    privileged!(preflight_iptables);
    const CONNECTIONS: u64 = 300;
    let pods = TwoPods::new()?;
    capture_outbound(&pods, Family::V4)?;
    capture_inbound(&pods, Family::V4)?;
    let agent = Agent::start(&pods.agent_opts().max_queued(ABOVE_PAYLOAD))?;
    let b_app = pods.b.v4_addr(APP_PORT);
    let _outbound = outbound_sidecar(&pods, Family::V4, b_app)?;
    let _inbound = inbound_sidecar(&pods, Family::V4)?;
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
    let deadline = Instant::now() + testbed::steps::NET;
    while agent.stats()?.sockets != 0 {
        ensure!(
            Instant::now() < deadline,
            "{} sockets still in the map after every connection closed",
            agent.stats()?.sockets
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // So does the per-connection pairing state (the LRU maps would only hide a leak).
    let maps = agent.pin_dir().join("maps");
    let left = [
        (
            MAP_CONNECTORS,
            mapkeys::pinned_hash_keys::<Endpoint, Connector>(&maps.join(MAP_CONNECTORS))?.len(),
        ),
        (
            MAP_LINKS,
            mapkeys::pinned_hash_keys::<SockKey, Link>(&maps.join(MAP_LINKS))?.len(),
        ),
    ];
    for (map, left) in left {
        ensure!(
            left == 0,
            "{map} still holds {left} entries after every connection closed"
        );
    }
    Ok(())
}

/// The sidecar captures the app's connection to an address outside the pod and Service
/// ranges (an external IP): that hop is not watched, so it stays on the normal path;
/// the proxy's own connection to a pod of this node is an ordinary pod-to-pod hop and
/// is bypassed. Byte-exact end to end.
#[test]
fn egress_to_outside_address_first_hop_normal_path() -> Result<()> {
    privileged!(preflight_iptables);
    let pods = TwoPods::new()?;
    let external = vip_in(&pods.outside_cidr_v4(), APP_PORT)?;
    // The app needs a route to dial it; the REDIRECT then keeps it on the node.
    pods.a.add_route(&pods.outside_cidr_v4())?;
    capture_outbound(&pods, Family::V4)?;
    let agent = Agent::start(&pods.agent_opts().max_queued(ABOVE_PAYLOAD))?;
    let b_app = pods.b.v4_addr(APP_PORT);
    let _outbound = outbound_sidecar(&pods, Family::V4, b_app)?;
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
