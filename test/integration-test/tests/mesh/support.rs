//! What the mesh tests share: the sidecar's ports and mark, the agent with extra flags,
//! counter growth for messages, addresses by family, and the SockHash keys by port.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use anyhow::{Context as _, Result};
use bypass_common::{SockKey, names::MAP_SOCKETS};
use testbed::{
    Agent, TwoPods,
    iptables::{self, Family},
    mapkeys,
    topology::Pod,
};

/// The application's port (the client dials it, the server listens on it).
pub const APP_PORT: u16 = 5801;
/// The sidecar's outbound listener (Istio: 15001).
pub const OUTBOUND_PORT: u16 = 15001;
/// The sidecar's inbound listener (Istio: 15006).
pub const INBOUND_PORT: u16 = 15006;
/// SO_MARK of the outbound proxy's upstream sockets, exempt from its REDIRECT (Istio
/// exempts its proxy by uid; a mark is the same idea without a second user).
pub const PROXY_MARK: u32 = 0x539;
/// A port of the default `--skip-ports` (Istio's health port).
pub const ISTIO_HEALTH_PORT: u16 = 15021;

pub use crate::support::{agent_with, grew, growth};

/// The nat tables of both pods, for a failure message.
pub fn nat_tables(pods: &TwoPods, family: Family) -> String {
    format!(
        "pod a nat:\n{}\npod b nat:\n{}",
        iptables::dump(pods.a.netns(), family),
        iptables::dump(pods.b.netns(), family)
    )
}

pub fn ip_of(pod: &Pod, family: Family) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(pod.ipv4()),
        Family::V6 => IpAddr::V6(pod.ipv6()),
    }
}

pub fn loopback(family: Family) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::LOCALHOST),
        Family::V6 => IpAddr::V6(Ipv6Addr::LOCALHOST),
    }
}

pub fn any(family: Family) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        Family::V6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    }
}

/// The SockHash keys with `port` at either end.
pub fn keys_with_port(agent: &Agent, port: u16) -> Result<Vec<SockKey>> {
    let pin = agent.pin_dir().join("maps").join(MAP_SOCKETS);
    Ok(mapkeys::pinned_sockhash_keys(&pin)?
        .into_iter()
        .filter(|k| k.local_port == u32::from(port) || k.remote_port == u32::from(port))
        .collect())
}

/// The 10th address of a service CIDR such as `10.96.7.0/24` or `fd96:0:0:7::/112`.
pub fn vip_in(cidr: &str, port: u16) -> Result<SocketAddr> {
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
