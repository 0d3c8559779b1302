//! What the agent learns about the host before loading: the kernel release, the
//! cookie of its own network namespace (the host's: the agent runs with the host
//! network), and how far TCP lets a receive buffer grow.

use std::os::fd::OwnedFd;

use nix::{
    getsockopt_impl, sockopt_impl,
    sys::socket::{AddressFamily, SockFlag, SockType, getsockopt, socket},
};

use crate::error::AgentError;

/// `net.ipv4.tcp_rmem`: min, default and max receive buffer.
pub const TCP_RMEM_FILE: &str = "/proc/sys/net/ipv4/tcp_rmem";

// nix has no wrapper for this option; its macro makes one (no unsafe here).
sockopt_impl!(
    /// `SO_NETNS_COOKIE`: the cookie of the socket's network namespace
    /// (include/uapi/asm-generic/socket.h; Linux ≥ 5.14).
    NetnsCookie,
    GetOnly,
    libc::SOL_SOCKET,
    libc::SO_NETNS_COOKIE,
    u64
);

/// The running kernel's release, as `uname -r` prints it.
pub fn kernel_release() -> String {
    nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_else(|_| "unknown".into())
}

/// The cookie of the network namespace this process runs in.
pub fn netns_cookie() -> Result<u64, AgentError> {
    let fd: OwnedFd = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| AgentError::KernelSupport {
        what: "create a socket to read the host network namespace's cookie",
        source: Box::new(e),
    })?;
    let cookie = getsockopt(&fd, NetnsCookie).map_err(|e| AgentError::KernelSupport {
        what: "tell the host network namespace apart (SO_NETNS_COOKIE)",
        source: Box::new(std::io::Error::from(e)),
    })?;
    if cookie == 0 {
        return Err(AgentError::KernelSupport {
            what: "tell the host network namespace apart (SO_NETNS_COOKIE)",
            source: "the kernel gave the cookie 0".into(),
        });
    }
    Ok(cookie)
}

/// The third value of `net.ipv4.tcp_rmem` (`4096 131072 6291456`): what TCP lets a
/// receive buffer grow to.
pub fn parse_tcp_rmem_max(contents: &str) -> Option<u32> {
    contents.split_whitespace().nth(2)?.parse().ok()
}

/// `parse_tcp_rmem_max` of this host's `TCP_RMEM_FILE` (`/proc/sys/net/ipv4/tcp_rmem`).
pub fn tcp_rmem_max() -> Option<u32> {
    std::fs::read_to_string(TCP_RMEM_FILE)
        .ok()
        .as_deref()
        .and_then(parse_tcp_rmem_max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_rmem_max() {
        assert_eq!(
            parse_tcp_rmem_max("4096\t131072\t6291456\n"),
            Some(6_291_456)
        );
        assert_eq!(parse_tcp_rmem_max("4096 131072"), None);
        assert_eq!(parse_tcp_rmem_max(""), None);
    }

    #[test]
    fn own_namespace_has_a_cookie() {
        // Any process has a network namespace; the kernels the agent supports give
        // its cookie.
        assert_ne!(netns_cookie().unwrap(), 0);
        assert_eq!(netns_cookie().unwrap(), netns_cookie().unwrap());
        assert!(!kernel_release().is_empty());
    }
}
