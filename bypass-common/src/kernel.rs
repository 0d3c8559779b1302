//! The oldest upstream kernel with everything the datapath uses (the agent probes the
//! features themselves, so a kernel with them backported runs it too), and the words of
//! the refusal, stated once for the agent and the tests that expect a refusal.

use core::fmt;

/// A kernel's `major.minor`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct KernelVersion {
    /// The major version.
    pub major: u32,
    /// The minor version.
    pub minor: u32,
}

impl fmt::Display for KernelVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// What the agent's refusal of a kernel says, whatever it lacks (the kernel matrix
/// looks for it).
pub const REFUSAL: &str = "lacks what the datapath needs";

/// Minimum kernel version: 5.15. sock_ops programs may call `bpf_get_netns_cookie` from
/// 5.15 on (`sock_ops_func_proto` in `net/core/filter.c`), and every SockHash key
/// carries the socket's network namespace.
pub const MIN_KERNEL: KernelVersion = KernelVersion {
    major: 5,
    minor: 15,
};

#[cfg(test)]
mod tests {
    extern crate std;

    use std::format;

    use super::*;

    #[test]
    fn orders_and_prints() {
        assert!(
            KernelVersion {
                major: 5,
                minor: 10
            } < MIN_KERNEL
        );
        assert!(KernelVersion { major: 6, minor: 1 } > MIN_KERNEL);
        assert_eq!(format!("{MIN_KERNEL}"), "5.15");
    }
}
