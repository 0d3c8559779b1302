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
    /// Number of slots.
    pub const SLOTS: u32 = 16;

    /// Value of [`SLOT_ENABLED`]: redirects allowed.
    pub const ENABLED: u32 = 1;
    /// Value of [`SLOT_ENABLED`]: every send takes the TCP path.
    pub const DISABLED: u32 = 0;
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
