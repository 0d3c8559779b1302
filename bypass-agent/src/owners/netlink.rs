//! The few rtnetlink requests the ownership scan needs, in the calling thread's
//! network namespace: a dump of its links (index, flags, the namespace a link's peer
//! or lower device is in), a dump of its addresses, and the id it gives another
//! namespace (include/uapi/linux/rtnetlink.h, if_link.h, if_addr.h, net_namespace.h).
//!
//! The namespace may be a hostile pod's, whose processes can send netlink messages to
//! any socket of it (a unicast needs no privilege): the socket is connected to the
//! kernel (port 0), so the kernel refuses every other sender (`ECONNREFUSED`,
//! net/netlink/af_netlink.c `netlink_getsockbyportid`), and whatever still came from
//! elsewhere would be skipped and counted; only messages from the kernel with this
//! request's sequence number (random) count, a read waits at most [`RECV_TIMEOUT`], and
//! a reply is at most [`MAX_MESSAGES`] datagrams and messages long. So a pod can neither
//! forge an answer nor hold the scan up: a flood of datagrams at the socket's port id
//! (its own `/proc/net/netlink` lists it) would otherwise keep the socket's queue above
//! half full, where the kernel holds a dump's next batch back, and the scan, reading only
//! junk, would never come to the end of the dump.

use std::{
    io,
    mem::size_of,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
};

/// How long one read of a reply may wait.
pub const RECV_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);
/// The most messages one reply (a dump) may hold, junk included: no pod holds more
/// links or addresses than that.
pub const MAX_MESSAGES: usize = 16_384;

const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
const RTM_NEWLINK: u16 = 16;
const RTM_GETLINK: u16 = 18;
const RTM_NEWADDR: u16 = 20;
const RTM_GETADDR: u16 = 22;
const RTM_NEWNSID: u16 = 88;
const RTM_GETNSID: u16 = 90;
const IFLA_LINK_NETNSID: u16 = 37;
/// `IFLA_LINKINFO` (nested) and its `IFLA_INFO_KIND`, the driver's name
/// (include/uapi/linux/if_link.h).
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const NETNSA_NSID: u16 = 1;
const NETNSA_FD: u16 = 3;
/// `struct ifinfomsg`: family, pad, type, index, flags, change.
const IFINFOMSG_LEN: usize = 16;
/// `struct ifaddrmsg`: family, prefixlen, flags, scope, index.
const IFADDRMSG_LEN: usize = 8;
/// `struct rtgenmsg`, aligned.
const RTGENMSG_LEN: usize = 4;

/// A link of the namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    /// Interface index.
    pub index: u32,
    /// `IFF_*` flags.
    pub flags: u32,
    /// The id, in this namespace, of the namespace its peer or lower device is in
    /// (veth, netkit, ipvlan, macvlan); `None` when that is this namespace or the
    /// link has none.
    pub link_netnsid: Option<i32>,
    /// Whether its driver is `dummy` (IPVS's `kube-ipvs0`, kube-router's
    /// `kube-dummy-if`).
    pub dummy: bool,
}

/// An address of the namespace, on interface `index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Addr {
    /// Interface index.
    pub index: u32,
    /// The local address.
    pub addr: IpAddr,
}

/// A `NETLINK_ROUTE` socket of the calling thread's network namespace.
pub struct Route {
    fd: OwnedFd,
    seq: u32,
    /// The longest reply taken, in messages.
    limit: usize,
}

impl Route {
    /// Opens one.
    pub fn open() -> io::Result<Self> {
        let fd = route_socket(0)?;
        let tv = libc::timeval {
            tv_sec: RECV_TIMEOUT.as_secs() as libc::time_t,
            tv_usec: 0,
        };
        // SAFETY: a valid socket and a timeval of the right size.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                std::ptr::from_ref(&tv).cast(),
                size_of::<libc::timeval>() as u32,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        // To the kernel: its replies come, every other sender is refused.
        let kernel = nl_addr(0);
        // SAFETY: a valid socket and an address of the right size.
        let rc = unsafe {
            libc::connect(
                fd.as_raw_fd(),
                std::ptr::from_ref(&kernel).cast(),
                size_of::<libc::sockaddr_nl>() as u32,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            fd,
            seq: random_u32()?,
            limit: MAX_MESSAGES,
        })
    }

    /// Takes replies of up to `limit` messages instead of [`MAX_MESSAGES`]: for the
    /// node's own namespace, whose socket no pod can send to and where IPVS binds every
    /// Service address.
    pub fn with_limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    /// Every link.
    pub fn links(&mut self) -> io::Result<Vec<Link>> {
        let mut out = Vec::new();
        for msg in self.dump(RTM_GETLINK, &[0u8; IFINFOMSG_LEN])? {
            if msg.kind != RTM_NEWLINK || msg.body.len() < IFINFOMSG_LEN {
                continue;
            }
            let b = &msg.body;
            let index = u32::from_ne_bytes([b[4], b[5], b[6], b[7]]);
            let flags = u32::from_ne_bytes([b[8], b[9], b[10], b[11]]);
            let link_netnsid = attrs(&b[IFINFOMSG_LEN..])
                .find(|(t, v)| *t == IFLA_LINK_NETNSID && v.len() >= 4)
                .map(|(_, v)| i32::from_ne_bytes([v[0], v[1], v[2], v[3]]));
            let dummy = attrs(&b[IFINFOMSG_LEN..])
                .filter(|(t, _)| *t & 0x3fff == IFLA_LINKINFO)
                .flat_map(|(_, v)| attrs(v))
                .any(|(t, v)| t == IFLA_INFO_KIND && v.split(|b| *b == 0).next() == Some(b"dummy"));
            out.push(Link {
                index,
                flags,
                link_netnsid,
                dummy,
            });
        }
        Ok(out)
    }

    /// Every IPv4 and IPv6 address.
    pub fn addrs(&mut self) -> io::Result<Vec<Addr>> {
        let mut out = Vec::new();
        for msg in self.dump(RTM_GETADDR, &[0u8; IFADDRMSG_LEN])? {
            if msg.kind != RTM_NEWADDR || msg.body.len() < IFADDRMSG_LEN {
                continue;
            }
            let b = &msg.body;
            let family = i32::from(b[0]);
            let index = u32::from_ne_bytes([b[4], b[5], b[6], b[7]]);
            // IFA_LOCAL is the local address of a point-to-point IPv4 link, where
            // IFA_ADDRESS is its peer's; otherwise they are the same.
            let mut local = None;
            let mut address = None;
            for (t, v) in attrs(&b[IFADDRMSG_LEN..]) {
                let ip = match (family, v.len()) {
                    (libc::AF_INET, 4) => IpAddr::V4(Ipv4Addr::new(v[0], v[1], v[2], v[3])),
                    (libc::AF_INET6, 16) => {
                        let mut o = [0u8; 16];
                        o.copy_from_slice(v);
                        IpAddr::V6(Ipv6Addr::from(o))
                    }
                    _ => continue,
                };
                match t {
                    IFA_LOCAL => local = Some(ip),
                    IFA_ADDRESS => address = Some(ip),
                    _ => {}
                }
            }
            if let Some(addr) = local.or(address) {
                out.push(Addr { index, addr });
            }
        }
        Ok(out)
    }

    /// The id this namespace gives the namespace `ns` (an open namespace file);
    /// `None` when it gave it none (no link of this namespace reaches it).
    pub fn nsid_of(&mut self, ns: BorrowedFd<'_>) -> io::Result<Option<i32>> {
        let mut body = vec![0u8; RTGENMSG_LEN];
        body[0] = libc::AF_UNSPEC as u8;
        push_attr(&mut body, NETNSA_FD, &(ns.as_raw_fd() as u32).to_ne_bytes());
        let replies = self.exchange(RTM_GETNSID, NLM_F_REQUEST, &body, false)?;
        Ok(replies
            .iter()
            .filter(|m| m.kind == RTM_NEWNSID && m.body.len() >= RTGENMSG_LEN)
            .flat_map(|m| attrs(&m.body[RTGENMSG_LEN..]).collect::<Vec<_>>())
            .find(|(t, v)| *t == NETNSA_NSID && v.len() >= 4)
            .map(|(_, v)| i32::from_ne_bytes([v[0], v[1], v[2], v[3]]))
            .filter(|id| *id >= 0))
    }

    fn dump(&mut self, kind: u16, body: &[u8]) -> io::Result<Vec<Message>> {
        self.exchange(kind, NLM_F_REQUEST | NLM_F_DUMP, body, true)
    }

    /// Sends one request and reads its replies: to `NLMSG_DONE` for a dump, else the
    /// first message.
    fn exchange(
        &mut self,
        kind: u16,
        flags: u16,
        body: &[u8],
        dump: bool,
    ) -> io::Result<Vec<Message>> {
        self.seq = self.seq.wrapping_add(1);
        let len = NLMSG_HDRLEN + body.len();
        let mut req = Vec::with_capacity(len);
        req.extend_from_slice(&(len as u32).to_ne_bytes());
        req.extend_from_slice(&kind.to_ne_bytes());
        req.extend_from_slice(&flags.to_ne_bytes());
        req.extend_from_slice(&self.seq.to_ne_bytes());
        req.extend_from_slice(&0u32.to_ne_bytes());
        req.extend_from_slice(body);
        // SAFETY: a buffer valid for the call, on a socket connected to the kernel.
        let sent = unsafe { libc::send(self.fd.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut out = Vec::new();
        let mut seen = 0usize;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let (n, from) = match recv_from(&self.fd, &mut buf, 0) {
                Ok(got) => got,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            // Only the kernel's messages count; anything else (the kernel refuses other
            // senders to a connected socket) counts against the reply's length.
            if from != 0 {
                seen += 1;
                if seen > self.limit {
                    return Err(io::Error::other(format!(
                        "a reply longer than {} messages",
                        self.limit
                    )));
                }
                continue;
            }
            let mut rest = &buf[..n];
            while rest.len() >= NLMSG_HDRLEN {
                let mlen = u32::from_ne_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
                if mlen < NLMSG_HDRLEN || mlen > rest.len() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "truncated netlink message",
                    ));
                }
                let mkind = u16::from_ne_bytes([rest[4], rest[5]]);
                let mseq = u32::from_ne_bytes([rest[8], rest[9], rest[10], rest[11]]);
                let body = &rest[NLMSG_HDRLEN..mlen];
                rest = &rest[align(mlen).min(rest.len())..];
                seen += 1;
                if seen > self.limit {
                    return Err(io::Error::other(format!(
                        "a reply longer than {} messages",
                        self.limit
                    )));
                }
                if mseq != self.seq {
                    continue;
                }
                match mkind {
                    NLMSG_DONE => return Ok(out),
                    NLMSG_ERROR => {
                        let errno = body
                            .get(..4)
                            .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
                            .unwrap_or(0);
                        if errno == 0 {
                            return Ok(out);
                        }
                        return Err(io::Error::from_raw_os_error(-errno));
                    }
                    _ => {
                        out.push(Message {
                            kind: mkind,
                            body: body.to_vec(),
                        });
                        if !dump {
                            return Ok(out);
                        }
                    }
                }
            }
        }
    }
}

struct Message {
    kind: u16,
    body: Vec<u8>,
}

const fn align(len: usize) -> usize {
    (len + 3) & !3
}

/// The `(type, value)` pairs of a run of route attributes (nested flag bits masked).
/// A `NETLINK_ROUTE` socket of the calling thread's namespace, close-on-exec, with
/// `flags` more (`SOCK_NONBLOCK`).
pub(super) fn route_socket(flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2).
    let raw = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC | flags,
            libc::NETLINK_ROUTE,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor just returned to us, owned from here.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// The netlink address of port id `port` (0: the kernel), in no group.
pub(super) fn nl_addr(port: u32) -> libc::sockaddr_nl {
    // SAFETY: a zeroed sockaddr_nl is a valid one; family and port are set below.
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as u16;
    addr.nl_pid = port;
    addr
}

/// Reads one datagram of `fd` into `buf` (the rest of a longer one is discarded), with
/// `flags`: its length as read and its sender's port id (0: the kernel).
pub(super) fn recv_from(
    fd: &OwnedFd,
    buf: &mut [u8],
    flags: libc::c_int,
) -> io::Result<(usize, u32)> {
    // SAFETY: a zeroed sockaddr_nl, filled by the call.
    let mut from: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    let mut from_len = size_of::<libc::sockaddr_nl>() as u32;
    // SAFETY: buffer and address valid for their lengths.
    let n = unsafe {
        libc::recvfrom(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            flags,
            std::ptr::from_mut(&mut from).cast(),
            &mut from_len,
        )
    };
    // A negative length is the error.
    usize::try_from(n)
        .map(|n| (n.min(buf.len()), from.nl_pid))
        .map_err(|_| io::Error::last_os_error())
}

/// A random number from the kernel (`getrandom`).
pub(super) fn random_u32() -> io::Result<u32> {
    let mut b = [0u8; 4];
    // SAFETY: a buffer of the length given.
    let got = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if got != 4 {
        return Err(io::Error::other("getrandom gave no random number"));
    }
    Ok(u32::from_ne_bytes(b))
}

fn attrs(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if b.len() < 4 {
            return None;
        }
        let len = usize::from(u16::from_ne_bytes([b[0], b[1]]));
        let kind = u16::from_ne_bytes([b[2], b[3]]) & 0x3fff;
        if len < 4 || len > b.len() {
            return None;
        }
        let value = &b[4..len];
        b = &b[align(len).min(b.len())..];
        Some((kind, value))
    })
}

fn push_attr(body: &mut Vec<u8>, kind: u16, value: &[u8]) {
    let len = 4 + value.len();
    body.extend_from_slice(&(len as u16).to_ne_bytes());
    body.extend_from_slice(&kind.to_ne_bytes());
    body.extend_from_slice(value);
    body.resize(align(body.len()), 0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_round_trip_and_stop_at_garbage() {
        let mut b = Vec::new();
        push_attr(&mut b, 3, &7u32.to_ne_bytes());
        push_attr(&mut b, 1, &[1, 2, 3]);
        b.extend_from_slice(&[0xff, 0xff]);
        let got: Vec<(u16, Vec<u8>)> = attrs(&b).map(|(t, v)| (t, v.to_vec())).collect();
        assert_eq!(
            got,
            vec![(3, 7u32.to_ne_bytes().to_vec()), (1, vec![1, 2, 3])]
        );
        assert_eq!(attrs(&[8, 0, 1, 0]).count(), 0, "a length past the end");
    }

    /// The port id a socket is bound to.
    fn port_of(fd: &OwnedFd) -> u32 {
        // SAFETY: a zeroed sockaddr_nl, filled by the call.
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        let mut len = size_of::<libc::sockaddr_nl>() as u32;
        // SAFETY: a valid socket and an address of the right size.
        let rc = unsafe {
            libc::getsockname(
                fd.as_raw_fd(),
                std::ptr::from_mut(&mut addr).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0, "{}", io::Error::last_os_error());
        addr.nl_pid
    }

    #[test]
    fn datagrams_from_other_sockets_are_refused_by_the_kernel() {
        let mut r = Route::open().unwrap();
        let port = port_of(&r.fd);
        assert_ne!(port, 0, "connected, so bound");
        // What a pod's process would send at the scan's socket: a bare header.
        let junk = [16u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        let other = route_socket(0).unwrap();
        let to = nl_addr(port);
        // SAFETY: buffer and address valid for the call.
        let sent = unsafe {
            libc::sendto(
                other.as_raw_fd(),
                junk.as_ptr().cast(),
                junk.len(),
                0,
                std::ptr::from_ref(&to).cast(),
                size_of::<libc::sockaddr_nl>() as u32,
            )
        };
        let err = io::Error::last_os_error();
        assert!(
            sent < 0 && err.raw_os_error() == Some(libc::ECONNREFUSED),
            "a datagram from another socket was accepted ({sent}, {err})"
        );
        // The kernel's answers still come.
        assert!(r.links().unwrap().iter().any(|l| l.index == 1));
    }

    #[test]
    fn own_namespace_lists_loopback() {
        // Every namespace has `lo`, index 1, with 127.0.0.1 once it is up (this one,
        // the test's, is the host's or a build sandbox's: up).
        let mut r = Route::open().unwrap();
        let links = r.links().unwrap();
        assert!(
            links
                .iter()
                .any(|l| l.index == 1 && l.link_netnsid.is_none()),
            "{links:?}"
        );
        let addrs = r.addrs().unwrap();
        assert!(
            addrs
                .iter()
                .any(|a| a.index == 1 && a.addr == IpAddr::V4(Ipv4Addr::LOCALHOST)),
            "{addrs:?}"
        );
    }
}
