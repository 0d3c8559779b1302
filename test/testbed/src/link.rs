//! Host-side plumbing: a bridge, veth pairs from the bridge into a namespace, and the
//! byte counters of an interface (`/sys/class/net/<if>/statistics`).

use std::path::Path;

use anyhow::{Context as _, Result};
use xtask_lib::cmd;

use crate::netns::Netns;

/// A Linux bridge in the host namespace, deleted on drop. No address: pods talk to
/// each other through it at layer 2, nothing is routed by the host.
#[derive(Debug)]
pub struct Bridge {
    name: String,
}

impl Bridge {
    /// Creates and brings up `name` (at most 15 characters).
    pub fn create(name: &str) -> Result<Self> {
        cmd::ip(&["link", "add", name, "type", "bridge"])?;
        let br = Self {
            name: name.to_owned(),
        };
        // No IPv6 on host-side links: no router solicitations or MLD reports adding
        // bytes to the counters we compare.
        disable_ipv6(name)?;
        cmd::ip(&["link", "set", name, "up"])?;
        Ok(br)
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The bridge `name` that exists already, to delete on drop (what a killed run left,
    /// [`crate::reap`]).
    pub(crate) fn existing(name: &str) -> Self {
        Self {
            name: name.to_owned(),
        }
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        if let Err(e) = cmd::ip(&["link", "delete", &self.name]) {
            eprintln!("testbed: cleanup: {e:#}");
        }
    }
}

/// The kind in a [`DownLink`] device's name (`names::ifname`): the reaper finds it by it.
pub const DOWN_KIND: &str = "-dn";

/// A device in the host's namespace that stays down and answers no ARP, as IPVS's dummy
/// `kube-ipvs0` does (a bridge: not every kernel has the dummy driver), deleted on drop.
#[derive(Debug)]
pub struct DownLink {
    name: String,
}

impl DownLink {
    /// Creates the device of run `tag`.
    pub fn create(tag: &str) -> Result<Self> {
        let name = crate::names::ifname(DOWN_KIND, tag).map_err(anyhow::Error::msg)?;
        cmd::ip(&["link", "add", &name, "type", "bridge"])?;
        let link = Self { name };
        cmd::ip(&["link", "set", &link.name, "arp", "off"])?;
        Ok(link)
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for DownLink {
    fn drop(&mut self) {
        if let Err(e) = cmd::ip(&["link", "delete", &self.name]) {
            eprintln!("testbed: cleanup: {e:#}");
        }
    }
}

/// A veth pair: `host` end enslaved to a bridge, the other end moved into a namespace
/// as `inner`. Deleting the host end (on drop) deletes both.
#[derive(Debug)]
pub struct Veth {
    host: String,
    inner: String,
}

impl Veth {
    /// Creates the pair, attaches `host` to `bridge`, puts `inner` into `ns`, brings
    /// both up.
    pub fn create(host: &str, bridge: &Bridge, ns: &Netns, inner: &str) -> Result<Self> {
        cmd::ip(&[
            "link",
            "add",
            host,
            "type",
            "veth",
            "peer",
            "name",
            inner,
            "netns",
            ns.name(),
        ])?;
        let veth = Self {
            host: host.to_owned(),
            inner: inner.to_owned(),
        };
        disable_ipv6(host)?;
        cmd::ip(&["link", "set", host, "master", bridge.name()])?;
        cmd::ip(&["link", "set", host, "up"])?;
        ns.ip(&["link", "set", inner, "up"])?;
        Ok(veth)
    }

    /// The host end's name (its counters are readable from the host).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The name inside the namespace.
    pub fn inner(&self) -> &str {
        &self.inner
    }

    /// The host end's counters. Its `rx` is what the pod sent, its `tx` what the pod
    /// was sent.
    pub fn counters(&self) -> Result<LinkCounters> {
        LinkCounters::read(&self.host)
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        if let Err(e) = cmd::ip(&["link", "delete", &self.host]) {
            eprintln!("testbed: cleanup: {e:#}");
        }
    }
}

/// Byte and packet counters of one interface.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkCounters {
    /// Bytes received.
    pub rx_bytes: u64,
    /// Bytes transmitted.
    pub tx_bytes: u64,
    /// Packets received.
    pub rx_packets: u64,
    /// Packets transmitted.
    pub tx_packets: u64,
}

impl LinkCounters {
    /// Reads the counters of host interface `ifname`.
    pub fn read(ifname: &str) -> Result<Self> {
        let dir = Path::new("/sys/class/net").join(ifname).join("statistics");
        let get = |f: &str| -> Result<u64> {
            let p = dir.join(f);
            let t = std::fs::read_to_string(&p).with_context(|| format!("read {}", p.display()))?;
            t.trim()
                .parse()
                .with_context(|| format!("{} is not a number: {t:?}", p.display()))
        };
        Ok(Self {
            rx_bytes: get("rx_bytes")?,
            tx_bytes: get("tx_bytes")?,
            rx_packets: get("rx_packets")?,
            tx_packets: get("tx_packets")?,
        })
    }

    /// The growth from `earlier` to `self`.
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            rx_bytes: self.rx_bytes.saturating_sub(earlier.rx_bytes),
            tx_bytes: self.tx_bytes.saturating_sub(earlier.tx_bytes),
            rx_packets: self.rx_packets.saturating_sub(earlier.rx_packets),
            tx_packets: self.tx_packets.saturating_sub(earlier.tx_packets),
        }
    }
}

/// Turns IPv6 off on a host interface.
fn disable_ipv6(ifname: &str) -> Result<()> {
    let p = Path::new("/proc/sys/net/ipv6/conf")
        .join(ifname)
        .join("disable_ipv6");
    if p.exists() {
        std::fs::write(&p, "1").with_context(|| format!("write {}", p.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_counters_read_and_subtract() {
        let a = LinkCounters::read("lo").unwrap();
        let b = LinkCounters {
            rx_bytes: a.rx_bytes + 10,
            ..a
        };
        assert_eq!(b.since(&a).rx_bytes, 10);
        assert_eq!(a.since(&b).rx_bytes, 0);
        assert!(LinkCounters::read("bt-no-such-if").is_err());
    }
}
