//! An attacker's own ground, as any pod can make it where user namespaces are allowed:
//! a user and a network namespace of its own (with `CAP_NET_ADMIN` and `CAP_NET_RAW`
//! there, root inside mapped to an unprivileged uid outside), copies of the victim
//! pods' addresses on its interfaces, and TCP segments crafted on a raw socket.

use std::{
    net::{Ipv4Addr, SocketAddrV4},
    os::fd::OwnedFd,
};

use anyhow::{Context as _, Result, ensure};
use nix::{
    sched::{CloneFlags, unshare},
    sys::wait::{WaitStatus, waitpid},
    unistd::{
        ForkResult, Gid, Pid, Uid, fork, getpid, pipe, read, setgroups, setresgid, setresuid, write,
    },
};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use xtask_lib::cmd;

/// Root of the new user namespace is this uid (and gid) outside, with the
/// [`ID_RANGE`] after it: an unprivileged user, as a pod with user namespaces gets.
const OUTSIDE_ID: u32 = 100_000;
const ID_RANGE: u32 = 65_536;

/// Moves the calling process into a new user and network namespace and becomes root
/// there ([`OUTSIDE_ID`] outside). The process must not have started a thread
/// (`unshare(CLONE_NEWUSER)` refuses a threaded caller, kernel/fork.c,
/// check_unshare_flags). Its cgroup stays as it was, so the programs attached above
/// it still see its sockets.
///
/// A process may map only its own uid into a namespace it made; mapping root to
/// another uid takes `CAP_SETUID` in the parent namespace (kernel/user_namespace.c,
/// new_idmap_permitted), so a child forked before the `unshare`, still in the parent
/// namespace, writes the maps (what `newuidmap` does for a container runtime).
///
/// Where the kernel refuses a new user namespace to this process (`EPERM`: a caller
/// in a chroot, as the kernel matrix's guests run their tests, kernel/user_namespace.c,
/// create_user_ns), it makes only the network namespace and stays real root (with
/// `CAP_NET_ADMIN` in it either way). Returns whether it made a user namespace.
pub fn enter_own_namespaces() -> Result<bool> {
    if let Err(nix::errno::Errno::EPERM) = probe_user_namespace() {
        unshare(CloneFlags::CLONE_NEWNET).context("unshare(CLONE_NEWNET)")?;
        return Ok(false);
    }
    let (ready_r, ready_w) = pipe().context("pipe")?;
    let me = getpid();
    // SAFETY: the process is single-threaded (the caller's contract), so the child may
    // run any code the parent could; it leaves by `_exit`.
    match unsafe { fork() }.context("fork")? {
        ForkResult::Child => {
            drop(ready_w);
            let code = match map_ids(me, &ready_r) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("bypass-test-tool probe: id-mapping helper: {e:#}");
                    1
                }
            };
            // SAFETY: ends the forked child without running the parent's exit handlers.
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => {
            drop(ready_r);
            let unshared = unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNET)
                .context("unshare(CLONE_NEWUSER | CLONE_NEWNET)");
            if unshared.is_ok() {
                write(&ready_w, b"u").context("wake the id-mapping helper")?;
            }
            // Closing the pipe without a byte tells the helper to give up.
            drop(ready_w);
            let status = waitpid(child, None).context("wait for the id-mapping helper")?;
            unshared?;
            ensure!(
                status == WaitStatus::Exited(child, 0),
                "the id-mapping helper failed: {status:?}"
            );
        }
    }
    // Become the namespace's root: until now the process kept its outside ids (not
    // mapped inside), and the files it creates would be real root's.
    let root = (Uid::from_raw(0), Gid::from_raw(0));
    setgroups(&[]).context("setgroups")?;
    setresgid(root.1, root.1, root.1).context("setresgid")?;
    setresuid(root.0, root.0, root.0).context("setresuid")?;
    Ok(true)
}

/// Whether this process may make a user namespace: tried in a forked child, which
/// exits at once (the caller's own namespaces are left as they are).
fn probe_user_namespace() -> Result<(), nix::errno::Errno> {
    // SAFETY: the process is single-threaded (the caller's contract); the child only
    // calls unshare and `_exit`.
    match unsafe { fork() }.map_err(|_| nix::errno::Errno::EAGAIN)? {
        ForkResult::Child => {
            let code = match unshare(CloneFlags::CLONE_NEWUSER) {
                Ok(()) => 0,
                Err(e) => e as i32,
            };
            // SAFETY: ends the forked child without running the parent's exit handlers.
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => match waitpid(child, None) {
            Ok(WaitStatus::Exited(_, 0)) => Ok(()),
            Ok(WaitStatus::Exited(_, code)) => Err(nix::errno::Errno::from_raw(code)),
            _ => Err(nix::errno::Errno::EIO),
        },
    }
}

/// The helper's part: once the probe has unshared (a byte on `ready`), map root of
/// its new user namespace to [`OUTSIDE_ID`].
fn map_ids(probe: Pid, ready: &OwnedFd) -> Result<()> {
    let mut byte = [0u8; 1];
    ensure!(
        read(ready, &mut byte).context("read")? == 1,
        "the probe did not unshare"
    );
    for file in ["uid_map", "gid_map"] {
        let path = format!("/proc/{probe}/{file}");
        std::fs::write(&path, format!("0 {OUTSIDE_ID} {ID_RANGE}\n"))
            .with_context(|| format!("write {path}"))?;
    }
    Ok(())
}

/// Sets up the namespace's network: `lo` up holding `local` (a victim's address, so
/// a socket can bind it and a crafted segment to it is delivered here), and `away`
/// (the other victim's address) routed out of one end of a veth pair whose ends both
/// stay here. What the namespace sends to `away` goes out and is dropped on the other
/// end (ARP off: the frames carry the sender's own MAC, not the peer's, so they are
/// "for another host", net/ipv4/ip_input.c, ip_rcv_core): nothing answers, not even
/// with a reset, and no resolution fails later with an ICMP error.
pub fn configure_network(local: Ipv4Addr, away: Ipv4Addr) -> Result<()> {
    for args in [
        &["link", "set", "lo", "up"][..],
        &["addr", "add", &format!("{local}/32"), "dev", "lo"],
        &["link", "add", "fv0", "type", "veth", "peer", "name", "fv1"],
        &["link", "set", "fv0", "arp", "off", "up"],
        &["link", "set", "fv1", "up"],
        &["route", "add", &format!("{away}/32"), "dev", "fv0"],
    ] {
        cmd::ip(args)?;
    }
    Ok(())
}

/// An IPv4 packet (header and TCP header, no options, no payload) carrying a SYN-ACK
/// from `from` to `to` with sequence number `seq` and acknowledgement `ack`, its TCP
/// checksum set. The kernel fills the IP header's length, id and checksum
/// (net/ipv4/raw.c, raw_send_hdrinc).
pub fn syn_ack(from: SocketAddrV4, to: SocketAddrV4, seq: u32, ack: u32) -> [u8; 40] {
    segment(from, to, seq, ack, SYN | ACK)
}

/// The TCP flag SYN.
pub const SYN: u8 = 0x02;
/// The TCP flag ACK.
pub const ACK: u8 = 0x10;

/// As [`syn_ack`], with TCP flags `flags`.
pub fn segment(from: SocketAddrV4, to: SocketAddrV4, seq: u32, ack: u32, flags: u8) -> [u8; 40] {
    let mut p = [0u8; 40];
    p[0] = 0x45; // version 4, 5 words of header
    p[2..4].copy_from_slice(&40u16.to_be_bytes());
    p[8] = 64; // TTL
    p[9] = libc::IPPROTO_TCP as u8;
    p[12..16].copy_from_slice(&from.ip().octets());
    p[16..20].copy_from_slice(&to.ip().octets());
    let tcp = &mut p[20..];
    tcp[0..2].copy_from_slice(&from.port().to_be_bytes());
    tcp[2..4].copy_from_slice(&to.port().to_be_bytes());
    tcp[4..8].copy_from_slice(&seq.to_be_bytes());
    tcp[8..12].copy_from_slice(&ack.to_be_bytes());
    tcp[12] = 5 << 4; // 5 words of header
    tcp[13] = flags;
    tcp[14..16].copy_from_slice(&u16::MAX.to_be_bytes()); // window
    let sum = tcp_checksum(*from.ip(), *to.ip(), &p[20..]);
    p[36..38].copy_from_slice(&sum.to_be_bytes());
    p
}

/// The TCP checksum of `segment` (its checksum field zero) between `src` and `dst`:
/// the ones' complement of the ones' complement sum over the pseudo-header and the
/// segment (RFC 793, 3.1).
fn tcp_checksum(src: Ipv4Addr, dst: Ipv4Addr, segment: &[u8]) -> u16 {
    let len = u16::try_from(segment.len()).unwrap_or(u16::MAX);
    let mut pseudo = Vec::with_capacity(12 + segment.len());
    pseudo.extend_from_slice(&src.octets());
    pseudo.extend_from_slice(&dst.octets());
    pseudo.extend_from_slice(&[0, libc::IPPROTO_TCP as u8]);
    pseudo.extend_from_slice(&len.to_be_bytes());
    pseudo.extend_from_slice(segment);
    !ones_complement_sum(&pseudo)
}

fn ones_complement_sum(bytes: &[u8]) -> u16 {
    let mut sum: u32 = bytes
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w.get(1).copied().unwrap_or(0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// Sends `packet` (a whole IPv4 packet, header included) on a raw socket; it is
/// routed by its destination `to`.
pub fn send_raw(packet: &[u8], to: Ipv4Addr) -> Result<()> {
    // IPPROTO_RAW implies IP_HDRINCL (net/ipv4/af_inet.c, inet_create).
    let s = Socket::new(
        Domain::IPV4,
        Type::RAW,
        Some(Protocol::from(libc::IPPROTO_RAW)),
    )
    .context("raw socket")?;
    let n = s
        .send_to(packet, &SockAddr::from(SocketAddrV4::new(to, 0)))
        .with_context(|| format!("send a crafted packet to {to}"))?;
    ensure!(n == packet.len(), "sent {n} of {} bytes", packet.len());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syn_ack_fields_and_checksum() {
        let from = SocketAddrV4::new(Ipv4Addr::new(10, 88, 7, 2), 5615);
        let to = SocketAddrV4::new(Ipv4Addr::new(10, 88, 7, 1), 35615);
        let p = syn_ack(from, to, 0xdead_beef, 0x0102_0304);
        assert_eq!(&p[12..20], &[10, 88, 7, 2, 10, 88, 7, 1]);
        assert_eq!(u16::from_be_bytes([p[20], p[21]]), 5615);
        assert_eq!(u16::from_be_bytes([p[22], p[23]]), 35615);
        assert_eq!(&p[24..28], &0xdead_beef_u32.to_be_bytes());
        assert_eq!(&p[28..32], &0x0102_0304_u32.to_be_bytes());
        assert_eq!(p[33], 0x12);
        // A receiver sums the pseudo-header and the segment, checksum included: all ones.
        let mut pseudo = vec![10, 88, 7, 2, 10, 88, 7, 1, 0, 6, 0, 20];
        pseudo.extend_from_slice(&p[20..]);
        assert_eq!(ones_complement_sum(&pseudo), 0xffff);
    }

    #[test]
    fn checksum_matches_a_known_segment() {
        // RFC 1071's example words, summed with their carries folded in.
        assert_eq!(
            ones_complement_sum(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]),
            0xddf2
        );
        // An odd length pads the last byte with zero.
        assert_eq!(ones_complement_sum(&[0x12]), 0x1200);
    }
}
