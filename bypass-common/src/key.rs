//! The SockHash key: one socket's view of its connection.

use crate::addr::IpKey;

/// Key of a socket in [`crate::names::MAP_SOCKETS`]: its local and remote address and
/// port. The peer of the socket with key `k` has key [`SockKey::peer`]`(k)`.
///
/// Ports are in host byte order. 40 bytes, no padding (checked below), so the kernel
/// hashes no uninitialised bytes.
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
}

const _: () = assert!(core::mem::size_of::<SockKey>() == 40);
const _: () = assert!(core::mem::align_of::<SockKey>() == 4);

impl SockKey {
    /// The key under which the other end of this connection is stored.
    #[inline(always)]
    pub const fn peer(&self) -> Self {
        Self {
            local_ip: self.remote_ip,
            remote_ip: self.local_ip,
            local_port: self.remote_port,
            remote_port: self.local_port,
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
        };
        assert_eq!(k.peer().peer(), k);
        assert_eq!(k.peer().local_port, 40000);
        assert_eq!(k.peer().remote_ip, [1, 2, 3, 4]);
    }

    #[test]
    fn remote_port_decoding() {
        // The memory the kernel writes for port 8080.
        let raw = u32::from_ne_bytes([0, 0, 0x1f, 0x90]);
        assert_eq!(remote_port_from_ctx(raw), 8080);
    }
}
