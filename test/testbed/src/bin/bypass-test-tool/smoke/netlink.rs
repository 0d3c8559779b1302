//! One rtnetlink request, built by hand: a veth pair whose two ends are created straight
//! inside two network namespaces (`IFLA_NET_NS_FD` on the link and on its peer), so the
//! smoke test needs no `ip` binary of the guest's architecture. The message building and
//! the reply parsing are pure, and by hand: no crate in Cargo.lock builds rtnetlink
//! messages, and one message does not call for one. The socket is nix's.

use std::os::fd::{AsRawFd as _, RawFd};

use anyhow::{Result, anyhow, bail};
use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, recv, sendto, socket,
};

// include/uapi/linux/netlink.h, rtnetlink.h, if_link.h, veth.h.
const RTM_NEWLINK: u16 = 16;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const IFLA_IFNAME: u16 = 3;
const IFLA_LINKINFO: u16 = 18;
const IFLA_NET_NS_FD: u16 = 28;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_INFO_DATA: u16 = 2;
const VETH_INFO_PEER: u16 = 1;
/// `struct nlmsghdr`.
const HEADER_LEN: usize = 16;
/// `struct ifinfomsg`, all zero: family AF_UNSPEC, no index, no flags.
const IFINFOMSG: [u8; 16] = [0; 16];

/// Appends one attribute (`struct nlattr` and its payload, padded to 4 bytes).
fn attr(buf: &mut Vec<u8>, ty: u16, payload: &[u8]) {
    let len = u16::try_from(4 + payload.len()).unwrap_or(u16::MAX);
    buf.extend_from_slice(&len.to_ne_bytes());
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(payload);
    buf.resize(buf.len().next_multiple_of(4), 0);
}

/// A link's name and namespace: `ifinfomsg`, `IFLA_IFNAME`, `IFLA_NET_NS_FD`.
fn link_body(name: &str, ns: RawFd) -> Vec<u8> {
    let mut body = IFINFOMSG.to_vec();
    let mut cname = name.as_bytes().to_vec();
    cname.push(0);
    attr(&mut body, IFLA_IFNAME, &cname);
    attr(&mut body, IFLA_NET_NS_FD, &(ns as u32).to_ne_bytes());
    body
}

/// `ip link add NAME netns NS type veth peer name PEER netns PEER_NS`, as one message.
pub fn veth_request(seq: u32, name: &str, ns: RawFd, peer: &str, peer_ns: RawFd) -> Vec<u8> {
    let mut data = Vec::new();
    attr(&mut data, VETH_INFO_PEER, &link_body(peer, peer_ns));
    let mut info = Vec::new();
    attr(&mut info, IFLA_INFO_KIND, b"veth");
    attr(&mut info, IFLA_INFO_DATA, &data);
    let mut body = link_body(name, ns);
    attr(&mut body, IFLA_LINKINFO, &info);
    let flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;
    let mut msg = Vec::with_capacity(HEADER_LEN + body.len());
    msg.extend_from_slice(&((HEADER_LEN + body.len()) as u32).to_ne_bytes());
    msg.extend_from_slice(&RTM_NEWLINK.to_ne_bytes());
    msg.extend_from_slice(&flags.to_ne_bytes());
    msg.extend_from_slice(&seq.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.extend_from_slice(&body);
    msg
}

/// The errno of the acknowledgement to `seq` in `reply` (0: done).
pub fn ack(reply: &[u8], seq: u32) -> Result<i32> {
    let word = |at: usize| -> Option<[u8; 4]> { reply.get(at..at + 4)?.try_into().ok() };
    let (Some(len), Some(ty_flags), Some(got_seq), Some(err)) =
        (word(0), word(4), word(8), word(HEADER_LEN))
    else {
        bail!("short netlink reply ({} bytes)", reply.len());
    };
    let ty = u16::from_ne_bytes([ty_flags[0], ty_flags[1]]);
    if ty != NLMSG_ERROR || (u32::from_ne_bytes(len) as usize) < HEADER_LEN + 4 {
        bail!("netlink reply of type {ty}, not an acknowledgement");
    }
    if u32::from_ne_bytes(got_seq) != seq {
        bail!(
            "netlink reply to {}, not {seq}",
            u32::from_ne_bytes(got_seq)
        );
    }
    Ok(-i32::from_ne_bytes(err))
}

/// Creates the veth pair: `name` in `ns`, `peer` in `peer_ns`.
pub fn add_veth(name: &str, ns: RawFd, peer: &str, peer_ns: RawFd) -> Result<()> {
    const SEQ: u32 = 1;
    let msg = veth_request(SEQ, name, ns, peer, peer_ns);
    let io = |e: nix::Error| std::io::Error::from(e);
    let fd = socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkRoute,
    )
    .map_err(|e| anyhow!("netlink socket: {}", io(e)))?;
    let mut reply = vec![0u8; 8192];
    let got = sendto(
        fd.as_raw_fd(),
        &msg,
        &NetlinkAddr::new(0, 0),
        MsgFlags::empty(),
    )
    .and_then(|_| recv(fd.as_raw_fd(), &mut reply, MsgFlags::empty()))
    .map_err(|e| anyhow!("netlink RTM_NEWLINK: {}", io(e)))?;
    reply.truncate(got);
    match ack(&reply, SEQ)? {
        0 => Ok(()),
        errno => bail!(
            "create veth {name}/{peer}: {}",
            std::io::Error::from_raw_os_error(errno)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u16_at(b: &[u8], at: usize) -> u16 {
        u16::from_ne_bytes([b[at], b[at + 1]])
    }

    #[test]
    fn veth_request_nests_the_peer() {
        let m = veth_request(7, "eth0", 3, "eth1", 4);
        assert_eq!(
            u32::from_ne_bytes(m[0..4].try_into().unwrap()) as usize,
            m.len()
        );
        assert_eq!(u16_at(&m, 4), RTM_NEWLINK);
        assert_eq!(u16_at(&m, 6), 0x605);
        assert_eq!(u32::from_ne_bytes(m[8..12].try_into().unwrap()), 7);
        assert_eq!(m.len() % 4, 0);
        // The first attribute after the header and ifinfomsg: IFLA_IFNAME "eth0\0".
        assert_eq!((u16_at(&m, 32), u16_at(&m, 34)), (9, IFLA_IFNAME));
        assert_eq!(&m[36..41], b"eth0\0");
        // Then IFLA_NET_NS_FD 3, then IFLA_LINKINFO holding the kind and the peer.
        assert_eq!((u16_at(&m, 44), u16_at(&m, 46)), (8, IFLA_NET_NS_FD));
        assert_eq!(u32::from_ne_bytes(m[48..52].try_into().unwrap()), 3);
        assert_eq!(u16_at(&m, 54), IFLA_LINKINFO);
        assert_eq!(usize::from(u16_at(&m, 52)), m.len() - 52);
        let rest = &m[56..];
        assert_eq!(&rest[4..8], b"veth");
        assert!(rest.windows(5).any(|w| w == b"eth1\0"));
        assert_eq!(u32::from_ne_bytes(m[m.len() - 4..].try_into().unwrap()), 4);
    }

    #[test]
    fn acks_and_errors() {
        let reply = |seq: u32, err: i32| {
            let mut r = 36u32.to_ne_bytes().to_vec();
            r.extend_from_slice(&NLMSG_ERROR.to_ne_bytes());
            r.extend_from_slice(&0u16.to_ne_bytes());
            r.extend_from_slice(&seq.to_ne_bytes());
            r.extend_from_slice(&0u32.to_ne_bytes());
            r.extend_from_slice(&err.to_ne_bytes());
            r.extend_from_slice(&[0; 16]);
            r
        };
        assert_eq!(ack(&reply(1, 0), 1).unwrap(), 0);
        assert_eq!(ack(&reply(1, -17), 1).unwrap(), 17);
        assert!(ack(&reply(2, 0), 1).is_err());
        assert!(ack(&[0; 8], 1).is_err());
    }
}
