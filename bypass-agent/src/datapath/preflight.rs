//! Before anything is loaded: is this kernel one the datapath runs on? One line names
//! the kernel and what it lacks, instead of a verifier log.
//!
//! Minimum kernel version: [`MIN_KERNEL`] (why: see there). Every other kernel facility
//! the datapath needs is older: sockmap and sk_msg (4.17), socket-local storage (5.2),
//! cgroup setsockopt hooks (5.3), cgroup bpf_link (5.7), `bpf_skc_to_tcp_sock` (5.9), a
//! sock_ops context socket (5.10). What a build may leave out is probed: BTF, and
//! sockmap (`CONFIG_BPF_STREAM_PARSER`).

use aya::maps::MapType;
use bypass_common::KernelVersion;
pub use bypass_common::MIN_KERNEL;
use nix::errno::Errno;

use crate::error::AgentError;

/// `major.minor` of a release string such as `6.1.0-50-amd64` or `5.15.0-91-generic`.
pub fn parse_release(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Whether `release` is at least [`MIN_KERNEL`] (unparseable: assumed new enough, and
/// the load itself will tell).
pub fn new_enough(release: &str) -> bool {
    parse_release(release).is_none_or(|(major, minor)| KernelVersion { major, minor } >= MIN_KERNEL)
}

/// Checks the running kernel: version, BTF, sockmap.
pub fn check(release: &str) -> Result<(), AgentError> {
    if !new_enough(release) {
        return Err(AgentError::KernelTooOld {
            release: release.to_owned(),
        });
    }
    if !std::path::Path::new(super::btf::VMLINUX_BTF).exists() {
        return Err(AgentError::KernelLacks {
            release: release.to_owned(),
            what: "BTF (/sys/kernel/btf/vmlinux, CONFIG_DEBUG_INFO_BTF)",
            why: "the programs' reads of socket fields are checked against it",
        });
    }
    if !sockhash_supported() {
        return Err(AgentError::KernelLacks {
            release: release.to_owned(),
            what: "sockmap (CONFIG_BPF_STREAM_PARSER, CONFIG_NET_SOCK_MSG)",
            why: "sockets are redirected through a SockHash",
        });
    }
    Ok(())
}

/// Whether a SockHash can be created (aya's `BPF_MAP_CREATE` probe; the map is closed
/// at once).
fn sockhash_supported() -> bool {
    match aya::sys::is_map_supported(MapType::SockHash) {
        Ok(supported) => supported,
        // EPERM is a privilege problem, reported by the load with its own message.
        Err(e) => e.io_error.raw_os_error() == Some(Errno::EPERM as i32),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases() {
        assert_eq!(parse_release("6.1.0-50-amd64"), Some((6, 1)));
        assert_eq!(parse_release("5.15.0-91-generic"), Some((5, 15)));
        assert_eq!(parse_release("6.18.44-fc-v782"), Some((6, 18)));
        assert_eq!(parse_release("garbage"), None);
        assert!(!new_enough("5.10.0-35-amd64"));
        assert!(!new_enough("4.19.0"));
        assert!(new_enough("5.15.0"));
        assert!(new_enough("6.1.0-50-amd64"));
        assert!(new_enough("weird"));
    }

    #[test]
    fn this_kernel_passes() {
        // The machines the tests run on have what the datapath needs.
        check(&super::super::host::kernel_release()).unwrap();
    }
}
