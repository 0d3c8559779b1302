//! Address encoding shared by both sides: every address is 16 bytes, IPv4 as an
//! IPv4-mapped IPv6 address (`::ffff:a.b.c.d`), so that an IPv4 client and the
//! dual-stack listener that accepted it (which sees `::ffff:a.b.c.d`) produce the same
//! key, and one LPM trie holds both families.
//!
//! The four words are in network byte order, exactly as the kernel exposes
//! `local_ip6`/`remote_ip6` in `bpf_sock_ops` and `sk_msg_md`.

/// A 16-byte address as four network-order words.
pub type IpKey = [u32; 4];

/// `::ffff:a.b.c.d` from an IPv4 address given as a network-order word
/// (`local_ip4`/`remote_ip4` in the kernel contexts).
#[inline(always)]
pub const fn mapped_v4(ip4_be: u32) -> IpKey {
    [0, 0, 0x0000_ffff_u32.to_be(), ip4_be]
}

/// Whether a key is a loopback address: `127.0.0.0/8` (as `::ffff:127.0.0.0/104`) or
/// `::1`.
#[inline(always)]
pub const fn is_loopback(ip: &IpKey) -> bool {
    if ip[0] != 0 || ip[1] != 0 {
        return false;
    }
    if ip[2] == 0 {
        return ip[3] == 1u32.to_be();
    }
    ip[2] == 0x0000_ffff_u32.to_be() && u32::from_be(ip[3]) >> 24 == 127
}

/// The key form of a user-space address.
pub const fn ip_key(ip: core::net::IpAddr) -> IpKey {
    match ip {
        core::net::IpAddr::V4(v4) => mapped_v4(u32::from_ne_bytes(v4.octets())),
        core::net::IpAddr::V6(v6) => {
            let o = v6.octets();
            [
                u32::from_ne_bytes([o[0], o[1], o[2], o[3]]),
                u32::from_ne_bytes([o[4], o[5], o[6], o[7]]),
                u32::from_ne_bytes([o[8], o[9], o[10], o[11]]),
                u32::from_ne_bytes([o[12], o[13], o[14], o[15]]),
            ]
        }
    }
}

/// The address a key stands for; IPv4-mapped keys come back as IPv4.
pub fn ip_from_key(key: IpKey) -> core::net::IpAddr {
    let v6 = core::net::Ipv6Addr::from(key_bytes(key));
    match v6.to_ipv4_mapped() {
        Some(v4) => core::net::IpAddr::V4(v4),
        None => core::net::IpAddr::V6(v6),
    }
}

/// Prefix length in the trie for a CIDR of `prefix` bits in its own family.
pub const fn trie_prefix_len(is_v4: bool, prefix: u8) -> u32 {
    if is_v4 {
        96 + prefix as u32
    } else {
        prefix as u32
    }
}

/// The bytes of a key as they sit in memory (the LPM trie matches on bytes).
pub const fn key_bytes(key: IpKey) -> [u8; 16] {
    let mut o = [0u8; 16];
    let mut i = 0;
    while i < 4 {
        let b = key[i].to_ne_bytes();
        o[i * 4] = b[0];
        o[i * 4 + 1] = b[1];
        o[i * 4 + 2] = b[2];
        o[i * 4 + 3] = b[3];
        i += 1;
    }
    o
}

#[cfg(test)]
mod tests {
    use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    use super::*;

    #[test]
    fn v4_is_mapped_v6() {
        let v4 = IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3));
        let mapped = IpAddr::V6(Ipv4Addr::new(10, 1, 2, 3).to_ipv6_mapped());
        assert_eq!(ip_key(v4), ip_key(mapped));
        assert_eq!(
            key_bytes(ip_key(v4)),
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 1, 2, 3]
        );
    }

    #[test]
    fn kernel_word_matches_user_encoding() {
        // The kernel hands `local_ip4` as the address bytes in memory order.
        let word = u32::from_ne_bytes([192, 168, 7, 9]);
        assert_eq!(
            mapped_v4(word),
            ip_key(IpAddr::V4(Ipv4Addr::new(192, 168, 7, 9)))
        );
    }

    #[test]
    fn round_trip() {
        for ip in [
            IpAddr::V4(Ipv4Addr::new(10, 244, 0, 7)),
            IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0x17)),
            IpAddr::V6(Ipv6Addr::LOCALHOST),
        ] {
            assert_eq!(ip_from_key(ip_key(ip)), ip);
        }
    }

    #[test]
    fn loopback() {
        for (ip, lo) in [
            (IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)), true),
            (IpAddr::V4(Ipv4Addr::new(127, 0, 0, 6)), true),
            (IpAddr::V4(Ipv4Addr::new(127, 255, 1, 2)), true),
            (IpAddr::V4(Ipv4Addr::new(128, 0, 0, 1)), false),
            (IpAddr::V4(Ipv4Addr::new(10, 127, 0, 1)), false),
            (IpAddr::V4(Ipv4Addr::new(0, 0, 0, 1)), false),
            (IpAddr::V6(Ipv6Addr::LOCALHOST), true),
            (IpAddr::V6(Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 2)), false),
            (
                IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1)),
                false,
            ),
            (IpAddr::V6(Ipv6Addr::UNSPECIFIED), false),
        ] {
            assert_eq!(is_loopback(&ip_key(ip)), lo, "{ip}");
        }
    }

    #[test]
    fn prefix_lengths() {
        assert_eq!(trie_prefix_len(true, 24), 120);
        assert_eq!(trie_prefix_len(false, 64), 64);
    }
}
