//! Pod CIDRs: parsing and validation (pure), and their form as LPM trie keys.

use std::{fmt, net::IpAddr, str::FromStr};

use bypass_common::addr::{ip_key, key_bytes, trie_prefix_len};

/// A pod CIDR such as `10.244.1.0/24` or `fd00:10:244:1::/64`, host bits zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodCidr {
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

impl PodCidr {
    /// Builds a CIDR, rejecting host bits.
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
        Ok(Self { addr, prefix })
    }

    /// `(prefix length, bytes)` of the LPM trie key.
    pub fn trie_key(&self) -> (u32, [u8; 16]) {
        (
            trie_prefix_len(self.addr.is_ipv4(), self.prefix),
            key_bytes(ip_key(self.addr)),
        )
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

impl FromStr for PodCidr {
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

impl fmt::Display for PodCidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_families() {
        let v4: PodCidr = "10.244.1.0/24".parse().unwrap();
        assert_eq!(v4.to_string(), "10.244.1.0/24");
        let v6: PodCidr = "fd00:10:244:1::/64".parse().unwrap();
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
            let err = input.parse::<PodCidr>().unwrap_err().to_string();
            assert!(err.contains(want), "{input}: {err}");
            assert!(err.contains(input.split('/').next().unwrap()), "{err}");
        }
    }

    #[test]
    fn edge_prefixes() {
        assert_eq!("0.0.0.0/0".parse::<PodCidr>().unwrap().trie_key().0, 96);
        assert_eq!("10.0.0.1/32".parse::<PodCidr>().unwrap().trie_key().0, 128);
        assert_eq!("::/0".parse::<PodCidr>().unwrap().trie_key().0, 0);
    }

    #[test]
    fn v4_trie_key_is_mapped() {
        let (len, bytes) = "10.244.0.0/16".parse::<PodCidr>().unwrap().trie_key();
        assert_eq!(len, 112);
        assert_eq!(&bytes[10..14], &[0xff, 0xff, 10, 244]);
    }
}
