//! CIDRs, the pod CIDRs (`--pod-cidr`) and the Service CIDRs (`--service-cidr`, the
//! ServiceCIDR objects) alike: parsing and validation (pure), and their form as LPM trie
//! keys.

use std::{
    fmt,
    net::{IpAddr, Ipv6Addr},
    str::FromStr,
};

use bypass_common::addr::{ip_key, key_bytes, trie_prefix_len};

/// A CIDR such as `10.244.1.0/24` or `fd00:10:244:1::/64`, host bits zero: a pod CIDR
/// or a Service CIDR.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

/// Why a CIDR was rejected; the message names the input and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    /// No `/`.
    #[error("'{0}' is not a CIDR: write ADDRESS/PREFIX, e.g. 10.244.1.0/24 or fd00::/64")]
    NoPrefix(String),
    /// The address part does not parse.
    #[error("'{0}' has no valid IP address before the '/': write e.g. 10.244.1.0/24")]
    BadAddress(String),
    /// The prefix is not a number in range.
    #[error("'{input}' has a prefix length outside 0..={max}")]
    BadPrefix {
        /// The input.
        input: String,
        /// 32 or 128.
        max: u8,
    },
    /// Bits set beyond the prefix.
    #[error("'{input}' has host bits set: did you mean {canonical}?")]
    HostBits {
        /// The input.
        input: String,
        /// The network the user probably meant.
        canonical: String,
    },
}

impl Cidr {
    /// Builds a CIDR, rejecting host bits. An IPv6 network inside the IPv4-mapped range
    /// (`::ffff:0:0/96`, prefix 96 or more) is the IPv4 network it maps
    /// (`::ffff:10.0.0.0/104` is `10.0.0.0/8`): the trie keys IPv4 in that mapped form,
    /// so both spellings are one key, and the CIDR read back from the trie
    /// ([`Cidr::from_trie_key`]) must equal the one written. A network with a
    /// shorter prefix never has a mapped address once its host bits are zero (the
    /// `ffff` lies past its prefix); it stays IPv6, and where it contains the mapped
    /// range (`::/80`, `::/0`) it covers every IPv4 address too, as the trie sees them.
    pub fn new(addr: IpAddr, prefix: u8) -> Result<Self, CidrError> {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let input = format!("{addr}/{prefix}");
        if prefix > max {
            return Err(CidrError::BadPrefix { input, max });
        }
        let masked = mask(addr, prefix);
        if masked != addr {
            return Err(CidrError::HostBits {
                input,
                canonical: format!("{masked}/{prefix}"),
            });
        }
        Ok(match addr {
            IpAddr::V6(v6) if prefix >= 96 => match v6.to_ipv4_mapped() {
                Some(v4) => Self {
                    addr: IpAddr::V4(v4),
                    prefix: prefix - 96,
                },
                None => Self { addr, prefix },
            },
            _ => Self { addr, prefix },
        })
    }

    /// `(prefix length, bytes)` of the LPM trie key.
    pub fn trie_key(&self) -> (u32, [u8; 16]) {
        (
            trie_prefix_len(self.addr.is_ipv4(), self.prefix),
            key_bytes(ip_key(self.addr)),
        )
    }

    /// The CIDR of an LPM trie key, the inverse of [`Cidr::trie_key`]; `None` for a
    /// key no CIDR makes (a prefix over 128, bits set past it).
    pub fn from_trie_key(len: u32, bytes: [u8; 16]) -> Option<Self> {
        Self::new(IpAddr::V6(Ipv6Addr::from(bytes)), u8::try_from(len).ok()?).ok()
    }
}

fn mask(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let m = if prefix == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(prefix))
            };
            IpAddr::V4((bits & m).into())
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let m = if prefix == 0 {
                0
            } else {
                u128::MAX << (128 - u32::from(prefix))
            };
            IpAddr::V6((bits & m).into())
        }
    }
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let (addr, prefix) = s
            .split_once('/')
            .ok_or_else(|| CidrError::NoPrefix(s.to_owned()))?;
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| CidrError::BadAddress(s.to_owned()))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix: u8 = prefix.parse().map_err(|_| CidrError::BadPrefix {
            input: s.to_owned(),
            max,
        })?;
        Self::new(addr, prefix)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_families() {
        let v4: Cidr = "10.244.1.0/24".parse().unwrap();
        assert_eq!(v4.to_string(), "10.244.1.0/24");
        let v6: Cidr = "fd00:10:244:1::/64".parse().unwrap();
        assert_eq!(v6.to_string(), "fd00:10:244:1::/64");
        assert_eq!(v6.trie_key().0, 64);
        assert_eq!(v4.trie_key().0, 96 + 24);
    }

    #[test]
    fn rejects_malformed_with_fix() {
        let cases = [
            ("10.244.1.0", "ADDRESS/PREFIX"),
            ("10.244.1/24", "no valid IP address"),
            ("10.244.1.0/33", "outside 0..=32"),
            ("fd00::/129", "outside 0..=128"),
            ("10.244.1.0/x", "prefix length"),
            ("10.244.1.5/24", "did you mean 10.244.1.0/24"),
            ("fd00::1/64", "did you mean fd00::/64"),
        ];
        for (input, want) in cases {
            let err = input.parse::<Cidr>().unwrap_err().to_string();
            assert!(err.contains(want), "{input}: {err}");
            assert!(err.contains(input.split('/').next().unwrap()), "{err}");
        }
    }

    #[test]
    fn edge_prefixes() {
        assert_eq!("0.0.0.0/0".parse::<Cidr>().unwrap().trie_key().0, 96);
        assert_eq!("10.0.0.1/32".parse::<Cidr>().unwrap().trie_key().0, 128);
        assert_eq!("::/0".parse::<Cidr>().unwrap().trie_key().0, 0);
    }

    #[test]
    fn mapped_networks_are_ipv4() {
        for (mapped, v4) in [
            ("::ffff:10.0.0.0/104", "10.0.0.0/8"),
            ("::ffff:0:0/96", "0.0.0.0/0"),
            ("::ffff:10.244.1.0/120", "10.244.1.0/24"),
            ("::ffff:10.1.2.3/128", "10.1.2.3/32"),
        ] {
            let c: Cidr = mapped.parse().unwrap();
            assert_eq!(c, v4.parse().unwrap(), "{mapped}");
            assert_eq!(c.to_string(), v4);
            assert_eq!(c.trie_key(), v4.parse::<Cidr>().unwrap().trie_key());
        }
        // Host bits are judged on the form written, and the fix names that form.
        let err = "::ffff:10.0.0.1/104".parse::<Cidr>().unwrap_err();
        assert!(
            err.to_string().contains("did you mean ::ffff:10.0.0.0/104"),
            "{err}"
        );
        // A shorter prefix cannot hold the mapped range's ffff: it is host bits.
        assert!(matches!(
            "::ffff:0:0/95".parse::<Cidr>(),
            Err(CidrError::HostBits { .. })
        ));
    }

    #[test]
    fn trie_keys_round_trip() {
        for s in [
            "10.244.1.0/24",
            "fd00:10:244::/48",
            "0.0.0.0/0",
            "::/0",
            "10.1.2.3/32",
            "fd00::1/128",
            // Shorter than the mapped range and containing it: IPv6, both ways.
            "::/80",
            "::/95",
            // Mapped forms come back as the IPv4 network they are.
            "::ffff:10.0.0.0/104",
            "::ffff:0:0/96",
        ] {
            let c: Cidr = s.parse().unwrap();
            let (len, bytes) = c.trie_key();
            assert_eq!(Cidr::from_trie_key(len, bytes), Some(c), "{s}");
        }
        assert!("::/80".parse::<Cidr>().unwrap().addr.is_ipv6());
        assert_eq!(Cidr::from_trie_key(129, [0; 16]), None);
        assert_eq!(Cidr::from_trie_key(8, [0xff; 16]), None);
    }

    #[test]
    fn v4_trie_key_is_mapped() {
        let (len, bytes) = "10.244.0.0/16".parse::<Cidr>().unwrap().trie_key();
        assert_eq!(len, 112);
        assert_eq!(&bytes[10..14], &[0xff, 0xff, 10, 244]);
    }
}
