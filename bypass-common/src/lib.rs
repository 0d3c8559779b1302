//! Everything the kernel programs and the agent must agree on, defined once: map and
//! program names, pin sub-paths, the socket key layout, address encoding, stats slots
//! and the control word.
//!
//! `no_std` so the eBPF crate can use it; the `user` feature adds `aya::Pod` impls.
#![no_std]

pub mod addr;
pub mod key;
pub mod names;
pub mod stats;

pub use addr::{IpKey, ip_key, mapped_v4};
pub use key::SockKey;
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
    /// Number of slots.
    pub const SLOTS: u32 = 8;

    /// Value of [`SLOT_ENABLED`]: redirects allowed.
    pub const ENABLED: u32 = 1;
    /// Value of [`SLOT_ENABLED`]: every send takes the TCP path.
    pub const DISABLED: u32 = 0;
}

/// Per-socket transmit mode kept in socket-local storage by the sk_msg program.
///
/// A direction of a connection may switch from redirect to the TCP path (the peer's
/// queued bytes are read before anything that arrives by TCP), never the other way:
/// a byte redirected after one sent by TCP could overtake it.
pub mod tx_mode {
    /// No message sent yet.
    pub const UNDECIDED: u32 = 0;
    /// Messages are redirected to the peer socket.
    pub const REDIRECT: u32 = 1;
    /// At least one message took the TCP path; this socket stays there.
    pub const TCP: u32 = 2;
}
