//! Per-socket state kept in socket-local storage ([`crate::names::MAP_SOCK_STATE`]),
//! created by sock_ops when a socket is inserted and read by sk_msg on each send; and
//! the pure decisions sk_msg makes from it and from what it reads of the two sockets.

use crate::key::SockKey;

/// The storage value of one inserted socket.
///
/// 56 bytes, no padding (checked below).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SockState {
    /// The socket's own key, as inserted into the SockHash; its peer's is
    /// [`SockKey::peer`] of it.
    pub key: SockKey,
    /// The socket's [`crate::tx_mode`].
    pub tx_mode: u32,
    /// Zero; keeps `sk` 8-byte aligned without hidden padding.
    pub reserved: u32,
    /// Kernel address of the socket (`struct sock *`), only ever read through
    /// `bpf_probe_read_kernel`: the sk_msg program reads its own `write_seq` there.
    pub sk: u64,
}

const _: () = assert!(core::mem::size_of::<SockState>() == 56);
const _: () = assert!(core::mem::align_of::<SockState>() == 8);

/// `SK_USER_DATA_PSOCK` (include/net/sock.h): set in `sk_user_data` when it points to
/// the socket's `struct sk_psock`.
pub const SK_USER_DATA_PSOCK: u64 = 4;
/// The flag bits of `sk_user_data` (`SK_USER_DATA_NOCOPY | SK_USER_DATA_BPF |
/// SK_USER_DATA_PSOCK`), masked off to get the pointer (`SK_USER_DATA_PTRMASK`).
pub const SK_USER_DATA_FLAGS: u64 = 7;

/// The `struct sk_psock *` a socket's `sk_user_data` holds, if it holds one.
#[inline(always)]
pub const fn psock_of(user_data: u64) -> Option<u64> {
    if user_data & SK_USER_DATA_PSOCK == 0 {
        return None;
    }
    let p = user_data & !SK_USER_DATA_FLAGS;
    if p == 0 { None } else { Some(p) }
}

/// Whether a message of `size` bytes may be redirected to a peer that has `queued`
/// bytes waiting in its ingress queue, under a bound of `limit` bytes (0: no bound).
#[inline(always)]
pub const fn within_limit(queued: u64, size: u64, limit: u64) -> bool {
    limit == 0 || queued.saturating_add(size) <= limit
}

/// Whether a socket that sent bytes by TCP may redirect again: the peer's application
/// has read every byte this socket ever queued to TCP (the peer's `copied_seq` is this
/// socket's `write_seq`: same sequence space), and no other sendmsg of this socket is
/// waiting half-way through a TCP push (`sk_write_pending`). Then a redirected byte,
/// which the peer reads before anything in its TCP receive queue, is the next byte it
/// reads anyway.
#[inline(always)]
pub const fn caught_up(write_seq: u32, write_pending: u32, peer_copied_seq: u32) -> bool {
    write_pending == 0 && write_seq == peer_copied_seq
}

/// Whether a peer's receive options keep redirects away from it: the ingress queue is
/// read without regard to SO_RCVLOWAT (a read returns what is queued, poll reports it
/// readable at once) or SO_PEEK_OFF (net/core/skmsg.c, sk_msg_recvmsg), while the TCP
/// path honours both.
#[inline(always)]
pub const fn options_need_tcp(rcvlowat: i32, peek_off: i32) -> bool {
    rcvlowat > 1 || peek_off >= 0
}

#[cfg(feature = "user")]
// SAFETY: `SockState` is `repr(C)`, has no padding (asserted above) and every bit
// pattern is valid.
unsafe impl aya::Pod for SockState {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psock_pointer_from_user_data() {
        assert_eq!(
            psock_of(0xffff_8880_1234_5600 | 5),
            Some(0xffff_8880_1234_5600)
        );
        assert_eq!(psock_of(0xffff_8880_1234_5600 | 1), None, "not a psock");
        assert_eq!(psock_of(4), None, "null pointer");
        assert_eq!(psock_of(0), None);
    }

    #[test]
    fn limit_includes_the_message() {
        assert!(within_limit(0, 4096, 4096));
        assert!(!within_limit(1, 4096, 4096));
        assert!(within_limit(4 << 20, 1 << 30, 0), "0 is no bound");
        assert!(!within_limit(u64::MAX, 1, u64::MAX - 1), "no overflow");
    }

    #[test]
    fn receive_options() {
        assert!(!options_need_tcp(1, -1), "defaults");
        assert!(!options_need_tcp(0, -1), "SO_RCVLOWAT 0 reads as 1");
        assert!(options_need_tcp(1000, -1));
        assert!(options_need_tcp(1, 0));
    }

    #[test]
    fn resume_only_when_everything_was_read() {
        assert!(caught_up(1000, 0, 1000));
        assert!(!caught_up(1000, 0, 999), "a TCP byte is unread");
        assert!(!caught_up(1000, 1, 1000), "a push is waiting half-way");
        assert!(caught_up(5, 0, 5), "sequence numbers wrap: equality only");
    }
}
