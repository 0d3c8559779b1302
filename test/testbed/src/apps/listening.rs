//! Whether a TCP socket listens on an address in a process's network namespace, from
//! `/proc/<pid>/net/tcp` and `tcp6` (the namespace's own tables), without connecting:
//! a probe connection would count as a client (redis, pgbench) and as a connection of
//! the bypass.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use anyhow::{Context as _, Result};

/// `st` of a listening socket (include/net/tcp_states.h, TCP_LISTEN).
const LISTEN: &str = "0A";

/// Whether a socket listens on `addr` (or on the wildcard address of its family and
/// its port) in the network namespace of process `pid`.
pub fn is_listening(pid: u32, addr: SocketAddr) -> Result<bool> {
    let table = if addr.is_ipv4() { "tcp" } else { "tcp6" };
    let path = format!("/proc/{pid}/net/{table}");
    let text = std::fs::read_to_string(&path).with_context(|| format!("read {path}"))?;
    Ok(listens(&text, addr))
}

/// Whether the table `text` has a listening socket on `addr` (or the wildcard).
pub fn listens(text: &str, addr: SocketAddr) -> bool {
    text.lines().skip(1).any(|line| {
        let mut fields = line.split_whitespace();
        let (Some(_), Some(local), Some(_), Some(state)) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return false;
        };
        state == LISTEN
            && parse_local(local).is_some_and(|(ip, port)| {
                port == addr.port() && (ip == addr.ip() || ip.is_unspecified())
            })
    })
}

/// `0100007F:1F90` (IPv4) or 32 hex digits and a port (IPv6): the kernel prints each
/// 32-bit word of the address as a native-endian integer (net/ipv4/tcp_ipv4.c,
/// get_tcp4_sock; net/ipv6/tcp_ipv6.c, get_tcp6_sock).
fn parse_local(field: &str) -> Option<(IpAddr, u16)> {
    let (hex, port) = field.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let words: Option<Vec<[u8; 4]>> = (0..hex.len() / 8)
        .map(|i| {
            let w = u32::from_str_radix(hex.get(i * 8..i * 8 + 8)?, 16).ok()?;
            Some(w.to_ne_bytes())
        })
        .collect();
    let bytes: Vec<u8> = words?.concat();
    let ip = match bytes.len() {
        4 => IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3])),
        16 => {
            let mut b = [0u8; 16];
            b.copy_from_slice(&bytes);
            IpAddr::V6(Ipv6Addr::from(b))
        }
        _ => return None,
    };
    Some((ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0207580A:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0
   1: 00000000:0050 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1 0 100 0 0 10 0
   2: 0207580A:2710 0107580A:C350 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0 100 0 0 10 0
";

    #[test]
    fn finds_listeners_by_address_and_wildcard() {
        if cfg!(target_endian = "big") {
            return;
        }
        let at = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert!(listens(TCP, at("10.88.7.2:8080")));
        assert!(!listens(TCP, at("10.88.7.3:8080")));
        // Port 80 on 0.0.0.0 listens on every address.
        assert!(listens(TCP, at("10.88.7.9:80")));
        // An established socket is not a listener.
        assert!(!listens(TCP, at("10.88.7.2:10000")));
    }

    #[test]
    fn parses_ipv6_words() {
        if cfg!(target_endian = "big") {
            return;
        }
        // fd88::2 as the kernel prints it.
        let (ip, port) = parse_local("000088FD000000000000000002000000:1F90").unwrap();
        assert_eq!(ip, "fd88::2".parse::<IpAddr>().unwrap());
        assert_eq!(port, 8080);
    }
}
