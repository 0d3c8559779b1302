//! The datapath between two pods on one node: bulk bytes each way over IPv4, IPv6 and a
//! dual-stack listener go socket to socket, byte-exact; connections with an end outside
//! the pod addresses are left alone; `--pod-ip` alone works; short connections that
//! send at once survive the insertion race.

use crate::support::privileged;

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use crate::support::exchange::{
    ABOVE_PAYLOAD, MIB64, assert_bypassed, assert_byte_exact, exchange, exchange_bypassed,
    exchange_exact,
};
use anyhow::{Result, ensure};
use testbed::{Agent, AgentOpts, ClientArgs, TwoPods};

#[test]
fn ipv4_64mib_each_way_bypassed() -> Result<()> {
    privileged!("ipv4_64mib_each_way_bypassed");
    let pods = TwoPods::new()?;
    let agent = Agent::start(&pods.agent_opts().max_queued(ABOVE_PAYLOAD))?;
    let args = ClientArgs::bulk(MIB64);
    exchange_bypassed(&pods, &agent, pods.b.v4_addr(5001), &args)
}

#[test]
fn ipv6_64mib_each_way_bypassed() -> Result<()> {
    privileged!("ipv6_64mib_each_way_bypassed");
    let pods = TwoPods::new()?;
    let agent = Agent::start(&pods.agent_opts().max_queued(ABOVE_PAYLOAD))?;
    let args = ClientArgs::bulk(MIB64);
    exchange_bypassed(&pods, &agent, pods.b.v6_addr(5002), &args)
}

#[test]
fn dual_stack_listener_ipv4_client_bypassed() -> Result<()> {
    privileged!("dual_stack_listener_ipv4_client_bypassed");
    let pods = TwoPods::new()?;
    let agent = Agent::start(&pods.agent_opts().max_queued(ABOVE_PAYLOAD))?;
    let args = ClientArgs::bulk(MIB64).greeted();
    // [::]:port accepts IPv4 as ::ffff:a.b.c.d; the key encoding must meet the client's.
    let listen = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 5003);
    let x = exchange(&pods, &agent, listen, pods.b.v4_addr(5003), &args)?;
    assert_byte_exact(&x, &args)?;
    assert_bypassed(&x, &args)
}

#[test]
fn outside_pod_cidr_not_inserted_and_exact() -> Result<()> {
    privileged!("outside_pod_cidr_not_inserted_and_exact");
    let pods = TwoPods::new()?;
    // Pod b also answers on an address in no --pod-cidr; pod a reaches it on-link from
    // its pod address, so one end of the connection is a pod and the other is not.
    let outside = pods.outside_cidr_v4();
    let b_outside = outside.replace(".0/24", ".2");
    pods.b.add_addr(&format!("{b_outside}/24"))?;
    pods.a.add_route(&outside)?;
    let agent = Agent::start(&pods.agent_opts())?;
    let args = ClientArgs::bulk(16 << 20);
    let connect: SocketAddr = format!("{b_outside}:5004").parse()?;
    let x = exchange(&pods, &agent, connect, connect, &args)?;
    assert_byte_exact(&x, &args)?;
    ensure!(
        x.grew(|s| s.counters.sockets_skipped) == 2,
        "sockets_skipped: {:?} -> {:?}",
        x.before,
        x.after
    );
    ensure!(
        x.grew(|s| s.counters.sockets_inserted) == 0,
        "inserted: {:?}",
        x.after
    );
    ensure!(
        x.grew(|s| s.counters.redirected_bytes) == 0,
        "redirected: {:?}",
        x.after
    );
    ensure!(x.after.sockets == 0, "sockets in the map: {:?}", x.after);
    let payload = args.send + args.recv;
    ensure!(
        x.wire >= payload,
        "the wire carried {} B of {payload} B",
        x.wire
    );
    Ok(())
}

#[test]
fn pod_ip_alone_redirects() -> Result<()> {
    privileged!("pod_ip_alone_redirects");
    let pods = TwoPods::new()?;
    let opts = AgentOpts {
        pod_cidrs: Vec::new(),
        pod_ips: vec![pods.a.ipv4().to_string(), pods.b.ipv4().to_string()],
        ..pods.agent_opts().max_queued(ABOVE_PAYLOAD)
    };
    let agent = Agent::start(&opts)?;
    let st = agent.stats()?;
    ensure!(
        st.pod_cidrs.is_empty() && st.pod_addresses.len() == 2,
        "status: {st:?}"
    );
    let args = ClientArgs::bulk(16 << 20);
    exchange_bypassed(&pods, &agent, pods.b.v4_addr(5005), &args)?;
    // The IPv6 addresses are not pod addresses here: not inserted.
    let y = exchange_exact(
        &pods,
        &agent,
        pods.b.v6_addr(5006),
        &ClientArgs::bulk(1 << 20),
    )?;
    ensure!(
        y.grew(|s| s.counters.sockets_inserted) == 0 && y.grew(|s| s.counters.sockets_skipped) == 2,
        "{y:?}"
    );
    Ok(())
}

#[test]
fn thousand_short_connections_send_at_once() -> Result<()> {
    privileged!("thousand_short_connections_send_at_once");
    let pods = TwoPods::new()?;
    let agent = Agent::start(&pods.agent_opts())?;
    let args = ClientArgs {
        send: 4096,
        recv: 4096,
        streams: 16,
        connections: 1000,
        msg_size: 1024,
        ..ClientArgs::default()
    };
    let x = exchange_exact(&pods, &agent, pods.b.v4_addr(5007), &args)?;
    ensure!(
        x.grew(|s| s.counters.sockets_inserted) == 2000,
        "inserted: {:?}",
        x.after
    );
    ensure!(
        x.grew(|s| s.counters.insert_failures) == 0,
        "insert failures: {:?}",
        x.after
    );
    // Closed connections leave the map.
    let left = agent.stats()?.sockets;
    ensure!(
        left == 0,
        "{left} sockets still in the map after every connection closed"
    );
    Ok(())
}
