//! Everything the kernel programs and the agent must agree on, defined once: map and
//! program names, pin sub-paths, the socket key layout, address encoding, stats slots,
//! the control words and the globals fixed at load.
//!
//! `no_std` so the eBPF crate can use it; the `std` feature adds pure std helpers, and
//! `user` adds those and the `aya::Pod` impls.
#![no_std]

pub mod addr;
pub mod kernel;
pub mod key;
pub mod layout;
#[cfg(feature = "std")]
pub mod mountinfo;
pub mod names;
pub mod state;
pub mod stats;

pub use addr::{IpKey, ip_key, mapped_v4};
pub use kernel::{KernelVersion, MIN_KERNEL};
pub use key::{Endpoint, SockKey};
pub use layout::KernelLayout;
pub use state::{Connector, Link, SockState};
#[cfg(feature = "user")]
pub use stats::Counters;
pub use stats::Stat;

/// Slots of the control array [`names::MAP_CONTROL`] (`Array<u32>`).
pub mod control {
    /// Redirect switch: [`ENABLED`] or [`DISABLED`]. The sk_msg program redirects only
    /// while it is [`ENABLED`]; otherwise every message takes the normal TCP path, which
    /// is how the agent detaches without losing bytes already queued on a peer.
    pub const SLOT_ENABLED: u32 = 0;
    /// Low and high words of the loaded object's fingerprint (FNV-1a of the ELF), so a
    /// restarted agent knows whether the pinned programs are its own build.
    pub const SLOT_OBJECT_LO: u32 = 1;
    /// See [`SLOT_OBJECT_LO`].
    pub const SLOT_OBJECT_HI: u32 = 2;
    /// Low and high words of the id (inode) of the cgroup sock_ops is attached to.
    pub const SLOT_CGROUP_LO: u32 = 3;
    /// See [`SLOT_CGROUP_LO`].
    pub const SLOT_CGROUP_HI: u32 = 4;
    /// Free for the agent's own state (e.g. why the bypass is on or off).
    pub const SLOT_AGENT_STATE: u32 = 5;
    /// Bound, in bytes, on the peer's ingress queue (redirected bytes its application
    /// has not read): a send that would pass it takes the TCP path (and TCP's
    /// backpressure), as does every later send of that socket. 0: no bound. The kernel
    /// charges that queue to no socket buffer limit (net/ipv4/tcp_bpf.c,
    /// bpf_tcp_ingress), so without a bound a reader that stops reading lets its peer
    /// queue memory without limit.
    pub const SLOT_MAX_QUEUED: u32 = 6;
    /// The [`crate::layout::features`] bits the programs were loaded with, for `status`
    /// (the programs read their own copy, a read-only global).
    pub const SLOT_FEATURES: u32 = 7;
    /// Sends smaller than this many bytes, made while the peer's ingress queue already
    /// holds unread bytes [`crate::state::SMALL_STREAM_RUN`] times in a row (a larger
    /// send in between restarts the count), are a small-message stream: that direction
    /// takes the TCP path for good, where the reader is woken per segment rather than
    /// per message. 0: never (the default; see
    /// [`crate::names::DEFAULT_SMALL_STREAM_BYTES`] for why). Needs the peer's queue
    /// measured, so it is off without [`crate::layout::features::QUEUE_BOUND`].
    pub const SLOT_SMALL_STREAM: u32 = 8;
    /// Heartbeat: the second of `CLOCK_MONOTONIC` (what `bpf_ktime_get_ns` reads,
    /// kernel/bpf/helpers.c) until which sock_ops may insert new sockets. The agent
    /// moves it forward while it runs; once it passes (the agent is gone, stuck, or its
    /// DaemonSet removed without a clean-up), new connections take the normal TCP path
    /// and established ones carry on under the ordering rule, so a datapath never keeps
    /// bypassing on maps no agent tends. 0, as a fresh load leaves it: expired. See
    /// [`heartbeat_alive`].
    pub const SLOT_HEARTBEAT: u32 = 9;
    /// Number of slots.
    pub const SLOTS: u32 = 16;

    /// Nanoseconds per second of the heartbeat.
    pub const NSEC_PER_SEC: u64 = 1_000_000_000;

    /// Whether sock_ops may insert at `now_ns` (`CLOCK_MONOTONIC`) under the heartbeat
    /// `deadline` ([`SLOT_HEARTBEAT`]).
    #[inline(always)]
    pub const fn heartbeat_alive(deadline: u32, now_ns: u64) -> bool {
        now_ns / NSEC_PER_SEC < deadline as u64
    }

    /// Seconds left until the heartbeat `deadline` at `now_ns`; 0 once it has passed.
    pub const fn heartbeat_remaining(deadline: u32, now_ns: u64) -> u64 {
        (deadline as u64).saturating_sub(now_ns / NSEC_PER_SEC)
    }

    /// The heartbeat deadline `ttl_secs` after `now_ns`, saturating.
    pub const fn heartbeat_deadline(now_ns: u64, ttl_secs: u32) -> u32 {
        let d = now_ns / NSEC_PER_SEC + ttl_secs as u64;
        if d > u32::MAX as u64 {
            u32::MAX
        } else {
            d as u32
        }
    }

    /// Value of [`SLOT_ENABLED`]: redirects allowed.
    pub const ENABLED: u32 = 1;
    /// Value of [`SLOT_ENABLED`]: every send takes the TCP path.
    pub const DISABLED: u32 = 0;
}

#[cfg(test)]
mod control_tests {
    use super::control::*;

    #[test]
    fn heartbeat_expires_at_its_deadline() {
        let now = 100 * NSEC_PER_SEC + 5;
        let d = heartbeat_deadline(now, 60);
        assert_eq!(d, 160);
        assert!(heartbeat_alive(d, now));
        assert!(heartbeat_alive(d, 159 * NSEC_PER_SEC + 999_999_999));
        assert!(!heartbeat_alive(d, 160 * NSEC_PER_SEC));
        assert_eq!(heartbeat_remaining(d, now), 60);
        assert_eq!(heartbeat_remaining(d, 500 * NSEC_PER_SEC), 0);
        // A fresh load leaves 0: nothing is inserted before the agent beats.
        assert!(!heartbeat_alive(0, 0));
        assert_eq!(heartbeat_deadline(u64::MAX, 60), u32::MAX);
    }
}

/// Per-socket transmit mode kept in socket-local storage by the sk_msg program.
///
/// A direction of a connection may move from redirects to the TCP path at any time:
/// the peer reads its queued redirected bytes before anything that arrives by TCP
/// (net/ipv4/tcp_bpf.c, tcp_bpf_recvmsg, reads the ingress queue first and falls back to
/// tcp_recvmsg only once it is empty). It never moves back. A reader may be blocked
/// inside plain tcp_recvmsg (MSG_WAITALL, SO_RCVLOWAT) with every TCP byte already
/// copied: redirected bytes sent then would wait unseen behind a read that only a later
/// TCP byte completes, ahead of them. No field of the peer tells that state apart from
/// "read everything and returned", so no resume is safe.
pub mod tx_mode {
    /// No message sent yet.
    pub const UNDECIDED: u32 = 0;
    /// Messages are redirected to the peer socket.
    pub const REDIRECT: u32 = 1;
    /// A message took the TCP path; so does every later one.
    pub const TCP: u32 = 2;
}
