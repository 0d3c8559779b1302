//! Everything the kernel programs and the agent must agree on, defined once: map and
//! program names, pin sub-paths, the socket key layout, address encoding, stats slots
//! and the control word.
//!
//! `no_std` so the eBPF crate can use it; the `user` feature adds `aya::Pod` impls.
#![no_std]

pub mod addr;
pub mod key;
pub mod layout;
pub mod names;
pub mod state;
pub mod stats;

pub use addr::{IpKey, ip_key, mapped_v4};
pub use key::{Endpoint, SockKey};
pub use layout::KernelLayout;
pub use state::{Connector, Pairing, SockState};
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
    /// backpressure) until the peer has read everything. 0: no bound. The kernel charges
    /// that queue to no socket buffer limit (net/ipv4/tcp_bpf.c, bpf_tcp_ingress), so
    /// without a bound a reader that stops reading lets its peer queue memory without
    /// limit.
    pub const SLOT_MAX_QUEUED: u32 = 6;
    /// [`crate::KernelLayout::sk_user_data`].
    pub const SLOT_OFF_SK_USER_DATA: u32 = 8;
    /// [`crate::KernelLayout::sk_write_pending`].
    pub const SLOT_OFF_SK_WRITE_PENDING: u32 = 9;
    /// [`crate::KernelLayout::psock_msg_tot_len`].
    pub const SLOT_OFF_PSOCK_MSG_TOT_LEN: u32 = 10;
    /// [`crate::KernelLayout::tcp_copied_seq`].
    pub const SLOT_OFF_TCP_COPIED_SEQ: u32 = 11;
    /// [`crate::KernelLayout::tcp_write_seq`].
    pub const SLOT_OFF_TCP_WRITE_SEQ: u32 = 12;
    /// [`crate::KernelLayout::sk_rcvlowat`].
    pub const SLOT_OFF_SK_RCVLOWAT: u32 = 13;
    /// [`crate::KernelLayout::sk_peek_off`].
    pub const SLOT_OFF_SK_PEEK_OFF: u32 = 14;
    /// Number of slots.
    pub const SLOTS: u32 = 16;

    /// Value of [`SLOT_ENABLED`]: redirects allowed.
    pub const ENABLED: u32 = 1;
    /// Value of [`SLOT_ENABLED`]: every send takes the TCP path.
    pub const DISABLED: u32 = 0;
}

/// Per-socket transmit mode kept in socket-local storage by the sk_msg program.
///
/// A direction of a connection may switch from redirect to the TCP path at any time
/// (the peer reads its queued redirected bytes before anything that arrives by TCP,
/// net/ipv4/tcp_bpf.c, tcp_bpf_recvmsg). Back from TCP to redirect only once the peer
/// has read every byte sent by TCP ([`crate::state::caught_up`]): a byte redirected
/// earlier would overtake them.
pub mod tx_mode {
    /// No message sent yet.
    pub const UNDECIDED: u32 = 0;
    /// Messages are redirected to the peer socket.
    pub const REDIRECT: u32 = 1;
    /// The last message took the TCP path; the next redirects only once the peer has
    /// read everything sent by TCP.
    pub const TCP: u32 = 2;
}
