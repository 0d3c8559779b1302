//! The SockHash key: one socket's view of its connection.

use crate::addr::{IpKey, is_loopback};

/// Key of a socket in [`crate::names::MAP_SOCKETS`]: its local and remote address and
/// port. The peer of the socket with key `k` has key [`SockKey::peer`]`(k)`.
///
/// Ports are in host byte order. `netns` is the network namespace's cookie when an end
/// is a loopback address (those tuples repeat in every pod), else 0 (a pod address is
/// unique on the node). 48 bytes, no padding (checked below), so the kernel hashes no
/// uninitialised bytes.
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
    /// Network namespace cookie for a connection with a loopback end, else 0
    /// ([`SockKey::scoped`]).
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
    /// The key under which the other end of this connection is stored.
    #[inline(always)]
    pub const fn peer(&self) -> Self {
        Self {
            local_ip: self.remote_ip,
            remote_ip: self.local_ip,
            local_port: self.remote_port,
            remote_port: self.local_port,
            netns: self.netns,
        }
    }

    /// The key of a socket in network namespace `netns` (its cookie): the cookie is
    /// kept only when an end is loopback.
    #[inline(always)]
    pub const fn scoped(
        local_ip: IpKey,
        remote_ip: IpKey,
        local_port: u32,
        remote_port: u32,
        netns: u64,
    ) -> Self {
        let netns = if is_loopback(&local_ip) || is_loopback(&remote_ip) {
            netns
        } else {
            0
        };
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

    /// This socket's local end, as its peer sees it as remote when nothing translated
    /// the connection's source.
    #[inline(always)]
    pub const fn local_end(&self, netns: u64) -> Endpoint {
        Endpoint::scoped(self.local_ip, self.local_port, netns)
    }

    /// This socket's remote end.
    #[inline(always)]
    pub const fn remote_end(&self, netns: u64) -> Endpoint {
        Endpoint::scoped(self.remote_ip, self.remote_port, netns)
    }
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
}

/// Host-order port from the kernel's `remote_port` field of `bpf_sock_ops` and
/// `sk_msg_md`: the field's memory holds `[0, 0, port_hi, port_lo]` (on little-endian
/// net/core/filter.c loads the big-endian `skc_dport` and shifts it left by 16), so the
/// word read as big-endian is the port.
#[inline(always)]
pub const fn remote_port_from_ctx(raw: u32) -> u32 {
    u32::from_be(raw)
}

#[cfg(feature = "user")]
// SAFETY: `SockKey` is `repr(C)`, has no padding (asserted above) and every bit
// pattern is valid.
unsafe impl aya::Pod for SockKey {}

#[cfg(feature = "user")]
// SAFETY: `Endpoint` is `repr(C)`, has no padding (asserted above) and every bit
// pattern is valid.
unsafe impl aya::Pod for Endpoint {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_is_involution() {
        let k = SockKey {
            local_ip: [1, 2, 3, 4],
            remote_ip: [5, 6, 7, 8],
            local_port: 80,
            remote_port: 40000,
            netns: 0,
        };
        assert_eq!(k.peer().peer(), k);
        assert_eq!(k.peer().local_port, 40000);
        assert_eq!(k.peer().remote_ip, [1, 2, 3, 4]);
    }

    #[test]
    fn netns_scopes_only_loopback() {
        use crate::addr::ip_key;
        use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};
        let pod_a = ip_key(IpAddr::V4(Ipv4Addr::new(10, 244, 0, 7)));
        let pod_b = ip_key(IpAddr::V4(Ipv4Addr::new(10, 244, 0, 8)));
        let lo4 = ip_key(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 6)));
        let lo6 = ip_key(IpAddr::V6(Ipv6Addr::LOCALHOST));
        assert_eq!(SockKey::scoped(pod_a, pod_b, 1, 2, 77).netns, 0);
        assert_eq!(SockKey::scoped(lo4, pod_b, 1, 2, 77).netns, 77);
        assert_eq!(SockKey::scoped(pod_a, lo6, 1, 2, 77).netns, 77);
        // The same loopback tuple in two namespaces: two keys.
        assert_ne!(
            SockKey::scoped(lo4, lo4, 1, 2, 77),
            SockKey::scoped(lo4, lo4, 1, 2, 78)
        );
        let k = SockKey::scoped(pod_a, lo4, 5, 6, 9);
        assert_eq!(k.peer().netns, 9);
        assert_eq!(
            k.local_end(9).netns,
            0,
            "a pod address is unique on the node"
        );
        assert_eq!(k.remote_end(9).netns, 9);
        assert_eq!(k.remote_end(9).port, 6);
    }

    #[test]
    fn remote_port_decoding() {
        // The memory the kernel writes for port 8080.
        let raw = u32::from_ne_bytes([0, 0, 0x1f, 0x90]);
        assert_eq!(remote_port_from_ctx(raw), 8080);
    }
}
