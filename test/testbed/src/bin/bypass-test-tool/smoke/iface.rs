//! Network namespaces without `ip`: one made by a thread that unshares its own and
//! hands back the namespace file, and the IPv4 set-up of an interface inside one
//! (address, netmask, up) through the classic `SIOCSIF*` ioctls.

use std::{
    fs::File,
    net::Ipv4Addr,
    os::fd::{AsRawFd as _, OwnedFd},
};

use anyhow::{Context as _, Result, anyhow};
use nix::{
    ioctl_readwrite_bad,
    sched::{CloneFlags, setns, unshare},
    sys::socket::{AddressFamily, SockFlag, SockType, socket},
};

/// A fresh network namespace; the file keeps it alive.
pub fn new_netns() -> Result<File> {
    std::thread::spawn(|| -> Result<File> {
        // CLONE_NEWNET changes this thread's namespace only.
        unshare(CloneFlags::CLONE_NEWNET)
            .map_err(|e| anyhow!("unshare(CLONE_NEWNET): {}", std::io::Error::from(e)))?;
        File::open("/proc/thread-self/ns/net").context("open /proc/thread-self/ns/net")
    })
    .join()
    .map_err(|_| anyhow!("the namespace thread panicked"))?
}

/// The path `setns` can open for `ns` (a link in this process's fd table).
pub fn path_of(ns: &File) -> std::path::PathBuf {
    format!("/proc/{}/fd/{}", std::process::id(), ns.as_raw_fd()).into()
}

/// `struct ifreq`: the name, then a 24-byte union (a `sockaddr` or the flags).
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    data: [u8; 24],
}

impl IfReq {
    fn new(ifname: &str) -> Self {
        let mut name = [0u8; libc::IFNAMSIZ];
        let n = ifname.len().min(libc::IFNAMSIZ - 1);
        name[..n].copy_from_slice(&ifname.as_bytes()[..n]);
        Self {
            name,
            data: [0; 24],
        }
    }

    /// With a `sockaddr_in` of `addr` in the union.
    fn with_addr(ifname: &str, addr: Ipv4Addr) -> Self {
        let mut r = Self::new(ifname);
        r.data[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        r.data[4..8].copy_from_slice(&addr.octets());
        r
    }
}

/// The netmask of a prefix length.
pub fn netmask(prefix: u8) -> Ipv4Addr {
    Ipv4Addr::from(
        u32::MAX
            .checked_shl(32 - u32::from(prefix.min(32)))
            .unwrap_or(0),
    )
}

// nix has no ifreq calls: its ioctl macro declares them. All four as read-write, so
// one signature serves them; the set requests only read the struct.
ioctl_readwrite_bad!(set_addr, libc::SIOCSIFADDR, IfReq);
ioctl_readwrite_bad!(set_netmask, libc::SIOCSIFNETMASK, IfReq);
ioctl_readwrite_bad!(get_flags, libc::SIOCGIFFLAGS, IfReq);
ioctl_readwrite_bad!(set_flags, libc::SIOCSIFFLAGS, IfReq);

/// One of the ifreq ioctls above.
type IfReqCall = unsafe fn(libc::c_int, *mut IfReq) -> nix::Result<libc::c_int>;

fn ioctl(sock: &OwnedFd, call: IfReqCall, req: &mut IfReq, what: &str) -> Result<()> {
    // SAFETY: `req` is a valid `struct ifreq` for these requests.
    unsafe { call(sock.as_raw_fd(), req) }
        .map_err(|e| anyhow!("{what}: {}", std::io::Error::from(e)))?;
    Ok(())
}

fn up(sock: &OwnedFd, ifname: &str) -> Result<()> {
    let mut r = IfReq::new(ifname);
    ioctl(sock, get_flags, &mut r, "SIOCGIFFLAGS")?;
    let flags = i16::from_ne_bytes([r.data[0], r.data[1]]) | libc::IFF_UP as i16;
    r.data[..2].copy_from_slice(&flags.to_ne_bytes());
    ioctl(sock, set_flags, &mut r, &format!("bring {ifname} up"))
}

/// In `ns`: `lo` up, `ifname` up with `addr/prefix`.
pub fn configure(ns: &File, ifname: &str, addr: Ipv4Addr, prefix: u8) -> Result<()> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| -> Result<()> {
                // setns changes this thread's namespace only; the socket is closed
                // before the thread ends.
                setns(ns, CloneFlags::CLONE_NEWNET)
                    .map_err(|e| anyhow!("setns: {}", std::io::Error::from(e)))?;
                let sock = socket(
                    AddressFamily::Inet,
                    SockType::Datagram,
                    SockFlag::SOCK_CLOEXEC,
                    None,
                )
                .map_err(|e| anyhow!("socket: {}", std::io::Error::from(e)))?;
                let mut a = IfReq::with_addr(ifname, addr);
                ioctl(&sock, set_addr, &mut a, &format!("address {ifname}"))?;
                let mut m = IfReq::with_addr(ifname, netmask(prefix));
                ioctl(&sock, set_netmask, &mut m, &format!("netmask {ifname}"))?;
                up(&sock, "lo")?;
                up(&sock, ifname)
            })
            .join()
            .map_err(|_| anyhow!("the configuring thread panicked"))?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netmasks() {
        assert_eq!(netmask(24), Ipv4Addr::new(255, 255, 255, 0));
        assert_eq!(netmask(0), Ipv4Addr::UNSPECIFIED);
        assert_eq!(netmask(32), Ipv4Addr::BROADCAST);
        assert_eq!(size_of::<IfReq>(), 40);
        let r = IfReq::with_addr("eth0", Ipv4Addr::new(10, 250, 0, 1));
        assert_eq!(&r.name[..5], b"eth0\0");
        assert_eq!(&r.data[4..8], &[10, 250, 0, 1]);
    }
}
