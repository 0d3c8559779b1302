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

/// Control word slot values in [`names::MAP_CONTROL`] (an `Array<u32>` of one entry).
///
/// The sk_msg program redirects only while the word is [`CONTROL_ENABLED`]; any other
/// value sends every message the normal TCP path, which is how the agent detaches
/// without losing bytes already queued on a peer (see README, "Detach").
pub const CONTROL_ENABLED: u32 = 1;
/// See [`CONTROL_ENABLED`].
pub const CONTROL_DISABLED: u32 = 0;

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
