//! Loopback in pods: identical tuples in two pods do not collide, loopback is bypassed
//! only once the namespace is known as a pod's, and no longer once it lost its address.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use testbed::{
    Agent, AgentStatus, ClientArgs, PeerClient, PeerServer, Proxy, ProxyOpts, Report, TwoPods,
    require::preflight_iptables,
};

use super::support::{grew, growth, keys_with_port};
use crate::support::{
    HoldPair, Steps, ensure_second_chunk_by_tcp,
    exchange::{ensure_one_exact, exchange_exact},
    loopback_hold_forgotten, privileged, probe_report, wait_for_log_line,
};

/// Identical loopback tuples in two pods, at once: in each pod a client reaches a
/// proxy on the pod's own address (a pod-address connection, which is also what tells
/// the datapath this namespace is a pod's), and the proxy dials 127.0.0.1:5901 from
/// 127.0.0.1:40123, the same tuple in both pods. Each pod's server must get its own
/// pod's stream (they differ in content and length), both loopback hops redirected,
/// and the SockHash must hold four distinct loopback keys, two per namespace.
#[test]
fn loopback_tuples_in_two_pods_do_not_collide() -> Result<()> {
    privileged!(preflight_iptables);
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
    let deadline = Instant::now() + testbed::steps::NET;
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

/// Loopback is bypassed only in a namespace the datapath knows as a pod's, which it
/// learns from a socket there with a pod address: a loopback connection in a pod that
/// has made none stays on the normal path; after one pod-address connection, the same
/// loopback connection is bypassed.
#[test]
fn loopback_bypassed_once_namespace_known_as_pod() -> Result<()> {
    privileged!(preflight_iptables);
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
        ensure_one_exact(&client, &server, &args).context("loopback run")?;
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
    exchange_exact(
        &pods,
        &agent,
        pods.b.v4_addr(5922),
        &ClientArgs::bulk(64 << 10),
    )?;

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

/// Pod b's namespace, learned by the datapath from a connection to b's address.
fn learned_pod_b(pods: &TwoPods, agent: &Agent, port: u16) -> Result<IpAddr> {
    exchange_exact(
        pods,
        agent,
        pods.b.v4_addr(port),
        &ClientArgs::bulk(64 << 10),
    )?;
    Ok(IpAddr::V4(pods.b.ipv4()))
}

/// Removes pod b's address from its interface, waits (a net) until the agent says the
/// address lost its owner, and checks that this cut at least `cut` connections.
fn pod_b_loses_its_address(pods: &TwoPods, agent: &Agent, b: IpAddr, cut: usize) -> Result<()> {
    pods.b
        .ip(&["addr", "del", &format!("{b}/24"), "dev", "eth0"])?;
    let lost = format!("lost=[{b}]");
    let Some(line) = wait_for_log_line(agent, &["pod address owners changed", &lost]) else {
        bail!(
            "the agent did not say that pod b's address lost its owner: {}",
            agent.stderr()
        );
    };
    let n = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("connections_cut="))
        .and_then(|n| n.parse::<usize>().ok());
    ensure!(
        n.is_some_and(|n| n >= cut),
        "the loss of pod b's address should cut at least {cut} connections: {line}"
    );
    Ok(())
}

/// A pod's loopback connections are cut when its address loses its owner, though the
/// datapath's record of the pod's namespace was evicted and the owners map no longer
/// names it: a loopback `hold` connection in pod b sends a first chunk, redirected;
/// that record is emptied (as pod churn evicts from it); b's address is removed; once
/// the agent has cut, the second chunk takes TCP, and the server reads both,
/// byte-exact.
#[test]
fn a_lost_address_cuts_loopback_whose_namespace_the_datapath_forgot() -> Result<()> {
    privileged!();
    let pods = TwoPods::new()?;
    let agent = Agent::start(&pods.agent_opts())?;
    let b = learned_pod_b(&pods, &agent, 5931)?;
    let steps = Steps::new(&pods, "lost-lo")?;
    let chunk = 1u64 << 20;
    let HoldPair {
        server,
        client,
        redirected: mid,
    } = loopback_hold_forgotten(&pods, &agent, &steps, 5932, chunk)?;
    pod_b_loses_its_address(&pods, &agent, b, 1)?;
    steps.touch("more")?;
    let c_report = probe_report(client)?;
    let s_report = server.wait()?;
    ensure_second_chunk_by_tcp(
        "pod b's loopback connection, by the loss of b's address,",
        chunk,
        &mid,
        &agent.stats()?,
        &s_report,
        &c_report,
    )
}

/// A namespace that lost its pod address is no longer a pod's, though the datapath's
/// record of the address it learned there stays until evicted: a loopback connection
/// in pod b is bypassed while b owns its address, and one made after b lost it keeps
/// TCP (a later cut of that address could not find the namespace once the record
/// evicted it).
#[test]
fn a_namespace_that_lost_its_address_no_longer_bypasses_loopback() -> Result<()> {
    privileged!();
    let pods = TwoPods::new()?;
    let agent = Agent::start(&pods.agent_opts())?;
    let b = learned_pod_b(&pods, &agent, 5935)?;
    let lo = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 5936);
    let args = ClientArgs::bulk(1 << 20);
    let loopback_in_b = || -> Result<(AgentStatus, AgentStatus)> {
        let before = agent.stats()?;
        let server = PeerServer::start(&pods.b, lo, 1)?;
        let client = testbed::run_client(&pods.b, lo, &args)?;
        ensure_one_exact(&client, &server.wait()?, &args)?;
        Ok((before, agent.stats()?))
    };
    let (before, after) = loopback_in_b()?;
    ensure!(
        grew(&before, &after, |s| s.counters.paired_loopback) == 1,
        "loopback in pod b, which owns its address, was not bypassed: {}",
        growth(&before, &after)
    );
    pod_b_loses_its_address(&pods, &agent, b, 0)?;
    let (before, after) = loopback_in_b()?;
    ensure!(
        grew(&before, &after, |s| s.counters.paired_loopback) == 0
            && grew(&before, &after, |s| s.counters.redirected_bytes) == 0,
        "loopback in a namespace that no longer owns its pod address was bypassed: {}",
        growth(&before, &after)
    );
    Ok(())
}
