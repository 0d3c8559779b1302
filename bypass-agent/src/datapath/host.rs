//! What the agent learns about the host before loading: the kernel release, the
//! cookie of its own network namespace (the host's: the agent runs with the host
//! network), and whether kernel lockdown forbids the programs' probe reads.

use std::{
    os::fd::{AsRawFd as _, OwnedFd},
    path::Path,
};

use nix::sys::socket::{AddressFamily, SockFlag, SockType, socket};

use crate::error::AgentError;

/// Where the lockdown LSM shows its mode; `BYPASS_LOCKDOWN_FILE` overrides it (tests).
pub const LOCKDOWN_FILE: &str = "/sys/kernel/security/lockdown";

/// `SO_NETNS_COOKIE` (include/uapi/asm-generic/socket.h; Linux ≥ 5.14).
const SO_NETNS_COOKIE: libc::c_int = 71;

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
        detail: e.to_string(),
    })?;
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: a valid socket, an 8-byte buffer and its length.
    let ret = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&raw mut cookie).cast(),
            &raw mut len,
        )
    };
    if ret != 0 || cookie == 0 {
        return Err(AgentError::KernelSupport {
            what: "tell the host network namespace apart (SO_NETNS_COOKIE)",
            detail: std::io::Error::last_os_error().to_string(),
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
