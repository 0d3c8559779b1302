//! Network namespaces without `ip`: one made by a thread that unshares its own and
//! hands back the namespace file, and the IPv4 set-up of an interface inside one
//! (address, netmask, up) through the classic `SIOCSIF*` ioctls.

use std::{
    fs::File,
    net::Ipv4Addr,
    os::fd::{AsRawFd as _, RawFd},
};

use anyhow::{Context as _, Result, anyhow, bail};

/// A fresh network namespace; the file keeps it alive.
pub fn new_netns() -> Result<File> {
    std::thread::spawn(|| -> Result<File> {
        // SAFETY: plain syscall; CLONE_NEWNET changes this thread's namespace only.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            bail!("unshare(CLONE_NEWNET): {}", std::io::Error::last_os_error());
        }
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

fn ioctl(sock: RawFd, request: libc::Ioctl, req: &mut IfReq, what: &str) -> Result<()> {
    // SAFETY: `req` is a valid `struct ifreq` for these requests.
    if unsafe { libc::ioctl(sock, request, std::ptr::from_mut(req)) } != 0 {
        bail!("{what}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

fn up(sock: RawFd, ifname: &str) -> Result<()> {
    let mut r = IfReq::new(ifname);
    ioctl(sock, libc::SIOCGIFFLAGS, &mut r, "SIOCGIFFLAGS")?;
    let flags = i16::from_ne_bytes([r.data[0], r.data[1]]) | libc::IFF_UP as i16;
    r.data[..2].copy_from_slice(&flags.to_ne_bytes());
    ioctl(
        sock,
        libc::SIOCSIFFLAGS,
        &mut r,
        &format!("bring {ifname} up"),
    )
}

/// In `ns`: `lo` up, `ifname` up with `addr/prefix`.
pub fn configure(ns: &File, ifname: &str, addr: Ipv4Addr, prefix: u8) -> Result<()> {
    let ns_fd = ns.as_raw_fd();
    let ifname = ifname.to_owned();
    std::thread::spawn(move || -> Result<()> {
        // SAFETY: plain syscalls; setns changes this thread's namespace only, and the
        // socket is closed before the thread ends.
        unsafe {
            if libc::setns(ns_fd, libc::CLONE_NEWNET) != 0 {
                bail!("setns: {}", std::io::Error::last_os_error());
            }
            let sock = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
            if sock < 0 {
                bail!("socket: {}", std::io::Error::last_os_error());
            }
            let done = (|| {
                let mut a = IfReq::with_addr(&ifname, addr);
                ioctl(
                    sock,
                    libc::SIOCSIFADDR,
                    &mut a,
                    &format!("address {ifname}"),
                )?;
                let mut m = IfReq::with_addr(&ifname, netmask(prefix));
                ioctl(
                    sock,
                    libc::SIOCSIFNETMASK,
                    &mut m,
                    &format!("netmask {ifname}"),
                )?;
                up(sock, "lo")?;
                up(sock, &ifname)
            })();
            libc::close(sock);
            done
        }
    })
    .join()
    .map_err(|_| anyhow!("the configuring thread panicked"))?
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
