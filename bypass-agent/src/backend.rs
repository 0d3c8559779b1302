//! A Service backend: an address and port a client dials and a pod address and port
//! of this node that the node's translation (kube-proxy's DNAT, or the client pod's own)
//! may land the connection on (`bypass_common::names::MAP_SERVICE_BACKENDS`). A
//! connection translated on its way is paired across network namespaces only to a
//! server on a backend of what its client dialled. From `--service-backend` and, in
//! Kubernetes mode, the Services and EndpointSlices.

use std::{fmt, net::SocketAddr, str::FromStr};

use bypass_common::{addr::ip_from_key, ip_key, key::ServiceBackend};

/// One Service address and port, and one backend of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Backend {
    /// What the client dials (a ClusterIP and a Service port).
    pub vip: SocketAddr,
    /// Where the connection lands (a pod address and its target port).
    pub target: SocketAddr,
}

impl Backend {
    /// The backend, its addresses in canonical form (an IPv4-mapped IPv6 address as
    /// IPv4, as the map reads it back).
    pub fn new(vip: SocketAddr, target: SocketAddr) -> Self {
        let canon = |a: SocketAddr| SocketAddr::new(a.ip().to_canonical(), a.port());
        Self {
            vip: canon(vip),
            target: canon(target),
        }
    }

    /// Its map key.
    pub fn key(&self) -> ServiceBackend {
        ServiceBackend {
            vip: ip_key(self.vip.ip()),
            target: ip_key(self.target.ip()),
            vip_port: u32::from(self.vip.port()),
            target_port: u32::from(self.target.port()),
        }
    }

    /// The backend a map key holds (`None` for a port out of range).
    pub fn from_key(k: &ServiceBackend) -> Option<Self> {
        Some(Self::new(
            SocketAddr::new(ip_from_key(k.vip), u16::try_from(k.vip_port).ok()?),
            SocketAddr::new(ip_from_key(k.target), u16::try_from(k.target_port).ok()?),
        ))
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.vip, self.target)
    }
}

/// Why a `--service-backend` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "--service-backend {value:?}: {reason}; write SERVICE_IP:PORT=POD_IP:PORT, e.g. 10.96.0.10:80=10.244.0.7:8080 or [fd00::a]:80=[fd00:1::7]:8080"
)]
pub struct BadBackend {
    /// The value given.
    pub value: String,
    /// What is wrong with it.
    pub reason: String,
}

impl FromStr for Backend {
    type Err = BadBackend;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |reason: &str| BadBackend {
            value: s.to_owned(),
            reason: reason.to_owned(),
        };
        let (vip, target) = s
            .split_once('=')
            .ok_or_else(|| bad("no '=' between the Service end and the backend"))?;
        let parse = |part: &str, what: &str| -> Result<SocketAddr, BadBackend> {
            let a: SocketAddr = part.trim().parse().map_err(|_| {
                bad(&format!(
                    "{what} {part:?} is not ADDRESS:PORT (an IPv6 address in brackets)"
                ))
            })?;
            if a.port() == 0 {
                return Err(bad(&format!("{what} {part:?} has port 0")));
            }
            if !crate::sync::is_unicast(a.ip()) {
                return Err(bad(&format!("{what} {part:?} is not a unicast address")));
            }
            Ok(a)
        };
        let b = Self::new(
            parse(vip, "the Service end")?,
            parse(target, "the backend")?,
        );
        if b.vip.is_ipv4() != b.target.is_ipv4() {
            return Err(bad(
                "the Service end and the backend are of two address families",
            ));
        }
        Ok(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_families_and_round_trips() {
        let b: Backend = "10.96.0.10:80=10.244.0.7:8080".parse().unwrap();
        assert_eq!(b.vip, "10.96.0.10:80".parse().unwrap());
        assert_eq!(b.target, "10.244.0.7:8080".parse().unwrap());
        assert_eq!(b.to_string().parse::<Backend>().unwrap(), b);
        assert_eq!(Backend::from_key(&b.key()), Some(b));
        let v6: Backend = "[fd00::a]:80=[fd00:1::7]:8080".parse().unwrap();
        assert_eq!(Backend::from_key(&v6.key()), Some(v6));
        assert_eq!(v6.to_string(), "[fd00::a]:80=[fd00:1::7]:8080");
    }

    #[test]
    fn mapped_addresses_are_canonical() {
        let m: Backend = "[::ffff:10.96.0.10]:80=[::ffff:10.244.0.7]:8080"
            .parse()
            .unwrap();
        let b: Backend = "10.96.0.10:80=10.244.0.7:8080".parse().unwrap();
        assert_eq!(m, b);
        assert_eq!(m.key(), b.key());
    }

    #[test]
    fn refuses_what_names_no_backend() {
        for (v, why) in [
            ("10.96.0.10:80", "no '='"),
            ("10.96.0.10=10.244.0.7:8080", "not ADDRESS:PORT"),
            ("10.96.0.10:80=10.244.0.7", "not ADDRESS:PORT"),
            ("10.96.0.10:80=fd00::7:8080", "not ADDRESS:PORT"),
            ("10.96.0.10:0=10.244.0.7:8080", "port 0"),
            ("10.96.0.10:80=0.0.0.0:8080", "not a unicast"),
            ("224.0.0.1:80=10.244.0.7:8080", "not a unicast"),
            ("10.96.0.10:80=[fd00::7]:8080", "two address families"),
        ] {
            let e = v.parse::<Backend>().unwrap_err();
            assert!(e.reason.contains(why), "{v}: {e}");
            assert!(e.to_string().contains("SERVICE_IP:PORT=POD_IP:PORT"), "{e}");
        }
    }
}
