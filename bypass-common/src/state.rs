//! Per-socket state kept in socket-local storage ([`crate::names::MAP_SOCK_STATE`]),
//! created by sock_ops when a socket is inserted and read by sk_msg on each send; and
//! the pure decisions sk_msg makes from it and from what it reads of the two sockets.

use crate::key::SockKey;

/// The storage value of one inserted socket.
///
/// 112 bytes, no padding (checked below).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SockState {
    /// The socket's own key, as inserted into the SockHash.
    pub key: SockKey,
    /// The peer's key once the connection is paired ([`SockState::hop`] not
    /// [`hop::UNPAIRED`]); until then the peer is looked for under [`SockKey::peer`].
    pub peer: SockKey,
    /// The socket's [`crate::tx_mode`].
    pub tx_mode: u32,
    /// How the two sockets were paired, a [`hop`] kind.
    pub hop: u32,
    /// Kernel address of the socket (`struct sock *`), only ever read through
    /// `bpf_probe_read_kernel`: the sk_msg program reads its own `write_seq` there.
    pub sk: u64,
}

const _: () = assert!(core::mem::size_of::<SockState>() == 112);
const _: () = assert!(core::mem::align_of::<SockState>() == 8);

impl SockState {
    /// The key the peer is found under, and the hop kind of the connection.
    #[inline(always)]
    pub const fn peer_and_hop(&self) -> (SockKey, u32) {
        if self.hop == hop::UNPAIRED {
            (self.key.peer(), hop::of_mirror(&self.key))
        } else {
            (self.peer, self.hop)
        }
    }
}

/// How the two sockets of a bypassed connection were paired; each kind has its own
/// redirected-bytes counter.
pub mod hop {
    use crate::key::SockKey;

    /// Not paired yet: a connecting socket whose peer has not been established; its peer
    /// is presumed to be the mirror of its key.
    pub const UNPAIRED: u32 = 0;
    /// Pod address to pod address, each socket's key the mirror of the other's.
    pub const POD: u32 = 1;
    /// Inside one pod over a loopback end (127.0.0.0/8, ::1), keys mirrored and scoped
    /// to the pod's network namespace.
    pub const LOOPBACK: u32 = 2;
    /// Translated on the way (iptables REDIRECT to a sidecar, a ClusterIP DNAT): the
    /// client's destination is not where the connection landed. Paired by the client's
    /// end and both sides' initial sequence numbers.
    pub const TRANSLATED: u32 = 3;

    /// The kind of a connection whose two keys mirror each other.
    #[inline(always)]
    pub const fn of_mirror(key: &SockKey) -> u32 {
        if key.is_loopback() { LOOPBACK } else { POD }
    }
}

/// What a connecting socket publishes about itself, under its local
/// [`crate::key::Endpoint`], for the accepting side of a translated connection.
///
/// 56 bytes, no padding (checked below).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Connector {
    /// The connecting socket's key.
    pub key: SockKey,
    /// Its `snd_nxt` when established: its initial sequence number + 1.
    pub snd_nxt: u32,
    /// Its `rcv_nxt` when established: its peer's initial sequence number + 1.
    pub rcv_nxt: u32,
}

const _: () = assert!(core::mem::size_of::<Connector>() == 56);

/// Whether an accepting socket, established with `snd_nxt` and `rcv_nxt` (nothing sent
/// or received yet but the handshake), is the other end of `connector`. NAT rewrites
/// addresses and ports, not sequence numbers, so the two sides' initial sequence numbers
/// (random 32-bit each) must cross over; a socket that merely shares the client's
/// address and port (a source port reused towards another destination) does not.
#[inline(always)]
pub const fn is_other_end(connector: &Connector, snd_nxt: u32, rcv_nxt: u32) -> bool {
    connector.snd_nxt == rcv_nxt && connector.rcv_nxt == snd_nxt
}

/// What the accepting side tells a connecting socket about its peer, under the
/// connecting socket's key.
///
/// 56 bytes, no padding (checked below).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Pairing {
    /// The accepting socket's key.
    pub peer: SockKey,
    /// The [`hop`] kind.
    pub hop: u32,
    /// Zero.
    pub reserved: u32,
}

const _: () = assert!(core::mem::size_of::<Pairing>() == 56);

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

#[cfg(feature = "user")]
// SAFETY: `repr(C)`, no padding (asserted above), every bit pattern valid.
unsafe impl aya::Pod for Connector {}

#[cfg(feature = "user")]
// SAFETY: `repr(C)`, no padding (asserted above), every bit pattern valid.
unsafe impl aya::Pod for Pairing {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairing_needs_crossed_sequence_numbers() {
        let c = Connector {
            key: SockKey::default(),
            snd_nxt: 1001,
            rcv_nxt: 5001,
        };
        assert!(is_other_end(&c, 5001, 1001));
        assert!(!is_other_end(&c, 1001, 5001), "not crossed");
        assert!(
            !is_other_end(&c, 5001, 1002),
            "another client on the same end"
        );
    }

    #[test]
    fn unpaired_state_presumes_the_mirror() {
        let key = SockKey {
            local_ip: [0, 0, 0xffff_u32.to_be(), 1],
            remote_ip: [0, 0, 0xffff_u32.to_be(), 2],
            local_port: 1,
            remote_port: 2,
            netns: 0,
        };
        let mut s = SockState {
            key,
            ..SockState::default()
        };
        assert_eq!(s.peer_and_hop(), (key.peer(), hop::POD));
        let other = SockKey {
            local_port: 15001,
            ..key.peer()
        };
        s.peer = other;
        s.hop = hop::TRANSLATED;
        assert_eq!(s.peer_and_hop(), (other, hop::TRANSLATED));
    }

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
