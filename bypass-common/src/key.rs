//! The SockHash key: one socket's view of its connection.

use crate::addr::{IpKey, is_loopback};

/// Key of a socket in [`crate::names::MAP_SOCKETS`]: its local and remote address and
/// port, and the cookie of the network namespace it lives in.
///
/// The namespace makes a key unique to one socket on the node: a socket in another
/// namespace (a private one any pod can make where user namespaces are allowed, or with
/// `TCP_REPAIR` an established socket without a packet) can hold the same addresses and
/// ports as a pod's connection, but never its key, so it can neither take, displace nor
/// receive that connection's entries. Inside one namespace the kernel keeps established
/// 4-tuples unique. Ports are in host byte order. 48 bytes, no padding (checked below),
/// so the kernel hashes no uninitialised bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct SockKey {
    /// Local address, [`crate::addr`] encoding.
    pub local_ip: IpKey,
    /// Remote address, [`crate::addr`] encoding.
    pub remote_ip: IpKey,
    /// Local port, host byte order.
    pub local_port: u32,
    /// Remote port, host byte order.
    pub remote_port: u32,
    /// Cookie of the socket's network namespace.
    pub netns: u64,
}

const _: () = assert!(core::mem::size_of::<SockKey>() == 48);
const _: () = assert!(core::mem::align_of::<SockKey>() == 8);

/// One end of a connection as the other end sees it: an address and port, scoped to a
/// network namespace when the address is loopback. Indexes connecting sockets by their
/// local end, so that the accepting side of a translated connection (iptables REDIRECT
/// or DNAT: the client sees one destination, the server another) finds its client.
///
/// 32 bytes, no padding (checked below).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Endpoint {
    /// Address, [`crate::addr`] encoding.
    pub ip: IpKey,
    /// Port, host byte order.
    pub port: u32,
    /// Zero.
    pub reserved: u32,
    /// Network namespace cookie when `ip` is loopback, else 0.
    pub netns: u64,
}

const _: () = assert!(core::mem::size_of::<Endpoint>() == 32);
const _: () = assert!(core::mem::align_of::<Endpoint>() == 8);

impl SockKey {
    /// The key of a socket in network namespace `netns` (its cookie).
    #[inline(always)]
    pub const fn new(
        local_ip: IpKey,
        remote_ip: IpKey,
        local_port: u32,
        remote_port: u32,
        netns: u64,
    ) -> Self {
        Self {
            local_ip,
            remote_ip,
            local_port,
            remote_port,
            netns,
        }
    }

    /// Whether an end is a loopback address.
    #[inline(always)]
    pub const fn is_loopback(&self) -> bool {
        is_loopback(&self.local_ip) || is_loopback(&self.remote_ip)
    }

    /// Whether `other` sees the same connection from the other end with nothing
    /// translated in between: its local end is this key's remote end and the other way
    /// round (namespaces aside: two pods live in two).
    #[inline(always)]
    pub const fn mirrors(&self, other: &SockKey) -> bool {
        self.local_port == other.remote_port
            && self.remote_port == other.local_port
            && ip_eq(&self.local_ip, &other.remote_ip)
            && ip_eq(&self.remote_ip, &other.local_ip)
    }

    /// This socket's local end, as its peer sees it as remote when nothing translated
    /// the connection's source.
    #[inline(always)]
    pub const fn local_end(&self) -> Endpoint {
        Endpoint::scoped(self.local_ip, self.local_port, self.netns)
    }

    /// This socket's remote end.
    #[inline(always)]
    pub const fn remote_end(&self) -> Endpoint {
        Endpoint::scoped(self.remote_ip, self.remote_port, self.netns)
    }
}

#[inline(always)]
const fn ip_eq(a: &IpKey, b: &IpKey) -> bool {
    a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3]
}

impl Endpoint {
    /// An end in network namespace `netns`, the cookie kept only for loopback.
    #[inline(always)]
    pub const fn scoped(ip: IpKey, port: u32, netns: u64) -> Self {
        Self {
            ip,
            port,
            reserved: 0,
            netns: if is_loopback(&ip) { netns } else { 0 },
        }
    }

    /// Whether `other` is the same end (usable in `const` code).
    #[inline(always)]
    pub const fn same(&self, other: &Endpoint) -> bool {
        ip_eq(&self.ip, &other.ip) && self.port == other.port && self.netns == other.netns
    }
}

/// Host-order port from the kernel's `remote_port` field of `bpf_sock_ops` and
/// `sk_msg_md`: the field's memory holds `[0, 0, port_hi, port_lo]` (on little-endian
/// net/core/filter.c loads the big-endian `skc_dport` and shifts it left by 16), so the
/// word read as big-endian is the port.
#[inline(always)]
pub const fn remote_port_from_ctx(raw: u32) -> u32 {
    u32::from_be(raw)
}

/// Key of [`crate::names::MAP_SERVICE_BACKENDS`]: a Service address and port, and a
/// pod address and port that the node's translation (kube-proxy's DNAT) may land a
/// connection to it on. A connection translated on its way is paired across network
/// namespaces only to a server on such a backend: no other pod can pose as the server
/// of a connection whose packets could never reach it. Ports in host byte order.
/// 40 bytes, no padding (checked below).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct ServiceBackend {
    /// The address the client dialled ([`crate::addr`] encoding).
    pub vip: IpKey,
    /// The backend's pod address.
    pub target: IpKey,
    /// The port the client dialled.
    pub vip_port: u32,
    /// The backend's port.
    pub target_port: u32,
}

const _: () = assert!(core::mem::size_of::<ServiceBackend>() == 40);

#[cfg(feature = "user")]
// SAFETY: `SockKey` is `repr(C)`, has no padding (asserted above) and every bit
// pattern is valid.
unsafe impl aya::Pod for SockKey {}

#[cfg(feature = "user")]
// SAFETY: `Endpoint` is `repr(C)`, has no padding (asserted above) and every bit
// pattern is valid.
unsafe impl aya::Pod for Endpoint {}

#[cfg(feature = "user")]
// SAFETY: `ServiceBackend` is `repr(C)`, has no padding (asserted above) and every bit
// pattern is valid.
unsafe impl aya::Pod for ServiceBackend {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirrors_ignores_namespaces() {
        let k = SockKey::new([1, 2, 3, 4], [5, 6, 7, 8], 80, 40000, 11);
        let m = SockKey::new([5, 6, 7, 8], [1, 2, 3, 4], 40000, 80, 22);
        assert!(k.mirrors(&m) && m.mirrors(&k));
        assert!(!k.mirrors(&SockKey {
            local_port: 40001,
            ..m
        }));
        assert!(!k.mirrors(&k));
    }

    #[test]
    fn endpoints_scope_only_loopback() {
        use crate::addr::ip_key;
        use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};
        let pod_a = ip_key(IpAddr::V4(Ipv4Addr::new(10, 244, 0, 7)));
        let lo4 = ip_key(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 6)));
        let lo6 = ip_key(IpAddr::V6(Ipv6Addr::LOCALHOST));
        let k = SockKey::new(pod_a, lo4, 5, 6, 9);
        assert_eq!(k.netns, 9, "every key carries its namespace");
        assert_eq!(
            k.local_end().netns,
            0,
            "a pod address is unique on the node"
        );
        assert_eq!(k.remote_end().netns, 9, "loopback repeats in every pod");
        assert_eq!(k.remote_end().port, 6);
        assert_eq!(SockKey::new(lo6, pod_a, 1, 2, 4).local_end().netns, 4);
    }

    #[test]
    fn remote_port_decoding() {
        // The memory the kernel writes for port 8080.
        let raw = u32::from_ne_bytes([0, 0, 0x1f, 0x90]);
        assert_eq!(remote_port_from_ctx(raw), 8080);
    }
}
