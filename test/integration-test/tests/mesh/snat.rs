//! A source NAT onto the address and port of another live connection: the accepting
//! side's candidate fails the sequence-number check, normal path, byte-exact.

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use anyhow::{Result, ensure};
use testbed::{
    Agent, ClientArgs, PeerServer, Proxy, ProxyOpts, TwoPods,
    iptables::{self, Family},
    require::preflight_iptables,
};

use super::support::{grew, growth, keys_with_port, nat_tables};
use crate::support::{ProbeServer, Steps, privileged, probe_report, spawn_probe_client};

/// A source NAT onto the address and port of another live connection: pod a's
/// connection 1 leaves from 10.88.k.1:40500 (a proxy bound there) and stays open; its
/// connection 2, to another port of pod b, is SNATed to the same 10.88.k.1:40500. Pod
/// b's accepting socket of connection 2 finds connection 1's socket under its client's
/// address and port, but their sequence numbers do not cross: rejected, the normal
/// path, byte-exact; connection 1 is unaffected.
#[test]
fn snat_onto_a_live_source_port_is_rejected() -> Result<()> {
    privileged!(preflight_iptables);
    const PORT_1: u16 = 5751;
    const PORT_2: u16 = 5752;
    const FRONT_PORT: u16 = 5753;
    const SOURCE_PORT: u16 = 40500;
    let pods = TwoPods::new()?;
    let source = pods.a.v4_addr(SOURCE_PORT);
    iptables::apply(
        pods.a.netns(),
        Family::V4,
        &iptables::snat_onto(IpAddr::V4(pods.b.ipv4()), PORT_2, source),
    )?;
    let agent = Agent::start(&pods.agent_opts())?;

    // Connection 1: client -> proxy (pod a's own address) -> pod b, from SOURCE_PORT,
    // held open until connection 2 is done (a `hold` probe: its first megabyte sent,
    // then nothing until the test says), whatever the machine's speed.
    let steps = Steps::new(&pods, "snat")?;
    let hold = ["--case".to_owned(), "hold".to_owned()];
    let server1 = ProbeServer::start(&pods.b, pods.b.v4_addr(PORT_1), &hold)?;
    let _proxy = Proxy::start(
        &pods.a,
        &ProxyOpts {
            upstream_bind: Some(source),
            ..ProxyOpts::new(pods.a.v4_addr(FRONT_PORT), pods.b.v4_addr(PORT_1))
        },
    )?;
    let mut args = hold.to_vec();
    args.extend([
        "--bytes".to_owned(),
        "1M".to_owned(),
        "--mark-file".to_owned(),
        steps.arg("sent"),
        "--go-file".to_owned(),
        steps.arg("more"),
    ]);
    let client1 = spawn_probe_client(&pods.a, pods.a.v4_addr(FRONT_PORT), &args)?;
    steps.wait("sent")?;
    // Connection 1's proxy-to-b hop is in the map.
    let deadline = Instant::now() + testbed::steps::NET;
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
    ensure!(
        keys_with_port(&agent, SOURCE_PORT)?.len() >= 2,
        "connection 1 was no longer open when connection 2 ran"
    );

    steps.touch("more")?;
    let c1 = probe_report(client1)?;
    let s1 = server1.wait()?;
    ensure!(c2.ok && s2.ok, "connection 2: {c2:#?} {s2:#?}");
    ensure!(
        s2.bytes_received == short.send && c2.bytes_received == short.recv,
        "connection 2 lost bytes: {c2:#?} {s2:#?}"
    );
    ensure!(
        s1["ok"] == true && s1["received"] == 2 << 20 && c1["sent"] == 2 << 20,
        "connection 1 lost bytes: {c1} {s1}"
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
