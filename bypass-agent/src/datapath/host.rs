//! What the agent learns about the host before loading: the kernel release, the
//! cookie of its own network namespace (the host's: the agent runs with the host
//! network), and whether kernel lockdown forbids the programs' probe reads.

use std::{os::fd::OwnedFd, path::Path};

use nix::{
    getsockopt_impl, sockopt_impl,
    sys::socket::{AddressFamily, SockFlag, SockType, getsockopt, socket},
};

use crate::error::AgentError;

/// Where the lockdown LSM shows its mode; `BYPASS_LOCKDOWN_FILE` overrides it (tests).
pub const LOCKDOWN_FILE: &str = "/sys/kernel/security/lockdown";

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

/// The lockdown mode in force, from the contents of [`LOCKDOWN_FILE`] (`none integrity
/// [confidentiality]`: the bracketed one); `None` without the lockdown LSM.
pub fn lockdown_mode(contents: &str) -> Option<&str> {
    let start = contents.find('[')?;
    let end = contents[start..].find(']')? + start;
    Some(&contents[start + 1..end])
}

/// Whether kernel lockdown forbids `bpf_probe_read_kernel` (`confidentiality` mode,
/// security/lockdown: LOCKDOWN_BPF_READ_KERNEL).
pub fn probe_reads_forbidden() -> bool {
    let path = std::env::var_os("BYPASS_LOCKDOWN_FILE")
        .map_or_else(|| Path::new(LOCKDOWN_FILE).to_path_buf(), Into::into);
    std::fs::read_to_string(path)
        .ok()
        .as_deref()
        .and_then(lockdown_mode)
        .is_some_and(|m| m == "confidentiality")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lockdown_modes() {
        assert_eq!(
            lockdown_mode("[none] integrity confidentiality\n"),
            Some("none")
        );
        assert_eq!(
            lockdown_mode("none integrity [confidentiality]\n"),
            Some("confidentiality")
        );
        assert_eq!(lockdown_mode(""), None);
        assert_eq!(lockdown_mode("none ["), None);
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
