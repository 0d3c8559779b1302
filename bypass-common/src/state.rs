//! Per-socket state kept in socket-local storage ([`crate::names::MAP_SOCK_STATE`]),
//! what a connecting socket publishes for its peer ([`Connector`]), what the two sides
//! of a paired connection share ([`Link`]), and the pure decisions the programs make
//! from them.

use crate::key::SockKey;

/// Which end of its connection an inserted socket is; indexes the [`Link`] arrays
/// through [`side::index`].
pub mod side {
    /// Not inserted (no state, or state of a socket that is not in the SockHash).
    pub const NONE: u32 = 0;
    /// The connecting socket (active open).
    pub const CLIENT: u32 = 1;
    /// The accepting socket (passive open).
    pub const SERVER: u32 = 2;

    /// The [`super::Link`] array index of `side` (a [`CLIENT`] or [`SERVER`]).
    #[inline(always)]
    pub const fn index(side: u32) -> usize {
        if side == SERVER { 1 } else { 0 }
    }

    /// The index of the other end.
    #[inline(always)]
    pub const fn peer_index(side: u32) -> usize {
        if side == SERVER { 0 } else { 1 }
    }
}

/// The storage value of one socket.
///
/// 136 bytes, no padding (checked below).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SockState {
    /// The socket's own key, as inserted into the SockHash.
    pub key: SockKey,
    /// The key of the connection's [`Link`]: the connecting socket's key (the client's
    /// own, the server's client's).
    pub link: SockKey,
    /// A [`side`] value; [`side::NONE`] until the socket is in the SockHash.
    pub side: u32,
    /// The socket's [`crate::tx_mode`].
    pub tx_mode: u32,
    /// Non-zero once this socket asked for a receive option the ingress queue cannot
    /// honour (SO_RCVLOWAT > 1, SO_PEEK_OFF): its peer sends to it by TCP from then on.
    pub rx_tcp: u32,
    /// Its `write_seq` when inserted. Only its sends through sk_msg that take the TCP
    /// path advance it (a redirect queues nothing to TCP), and those end redirects for
    /// good; so while it may redirect, a different `write_seq` means bytes went to TCP
    /// past sk_msg (a `write` that blocked in plain `tcp_sendmsg` while the socket was
    /// connecting, and completed after it was inserted), and later redirected bytes
    /// would overtake them.
    pub write_seq: u32,
    /// [`flags`] bits.
    pub flags: u32,
    /// Small sends in a row that found the peer's queue not yet read
    /// ([`small_stream_step`]).
    pub small_run: u32,
    /// An upper bound on the bytes waiting in the peer's ingress queue: this socket is
    /// the only one that redirects to its peer, so the queue grows only by what it adds
    /// here; a read shrinks it. Measured again only when a send could cross the bound.
    pub queued: u64,
    /// Its socket cookie (unique on the node, never reused): a [`Link`] is this
    /// socket's only if it names this cookie on this socket's side.
    pub cookie: u64,
}

const _: () = assert!(core::mem::size_of::<SockState>() == 136);

/// Bits of [`SockState::flags`].
pub mod flags {
    /// The socket was once in the SockHash, so it has (or had) a psock with an ingress
    /// queue: redirected bytes may still wait there after a close or a disconnect, so
    /// an upper-layer protocol must never be attached to it.
    pub const INSERTED: u32 = 1;
}
const _: () = assert!(core::mem::align_of::<SockState>() == 8);

/// How the two sockets of a bypassed connection were paired; each kind has its own
/// counters.
pub mod hop {
    use crate::key::SockKey;

    /// Not paired.
    pub const UNPAIRED: u32 = 0;
    /// Pod address to pod address, each socket's key the mirror of the other's.
    pub const POD: u32 = 1;
    /// Inside one pod over a loopback end (127.0.0.0/8, ::1).
    pub const LOOPBACK: u32 = 2;
    /// Translated on the way (iptables REDIRECT to a sidecar, a ClusterIP DNAT): the
    /// client's destination is not where the connection landed.
    pub const TRANSLATED: u32 = 3;

    /// The kind of the connection between a connecting socket with key `client` and the
    /// accepting socket with key `server`.
    #[inline(always)]
    pub const fn of(client: &SockKey, server: &SockKey) -> u32 {
        if !client.mirrors(server) {
            TRANSLATED
        } else if client.is_loopback() {
            LOOPBACK
        } else {
            POD
        }
    }
}

/// What a connecting socket publishes about itself, under its local
/// [`crate::key::Endpoint`], for the accepting side to find and prove.
///
/// 80 bytes, no padding (checked below).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Connector {
    /// The connecting socket's key.
    pub key: SockKey,
    /// Its `snd_nxt` when established: its initial sequence number + 1.
    pub snd_nxt: u32,
    /// Its `rcv_nxt` when established: its peer's initial sequence number + 1.
    pub rcv_nxt: u32,
    /// Its kernel address (`struct sock *`), only ever read through
    /// `bpf_probe_read_kernel` after checking [`Connector::cookie`] is still there.
    pub sk: u64,
    /// Its socket cookie (unique on the node, never reused).
    pub cookie: u64,
    /// Its [`SockState::rx_tcp`] when it was inserted, set later if it asks for a receive
    /// option before it is paired.
    pub rx_tcp: u32,
    /// Zero.
    pub reserved: u32,
}

const _: () = assert!(core::mem::size_of::<Connector>() == 80);

/// What the two sockets of a paired connection share, under the connecting socket's
/// key, written by the accepting side when it pairs. Arrays are indexed by
/// [`side::index`]: 0 the client, 1 the server.
///
/// 96 bytes, no padding (checked below).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Link {
    /// The accepting socket's key.
    pub server: SockKey,
    /// The [`hop`] kind.
    pub hop: u32,
    /// Zero.
    pub reserved: u32,
    /// Kernel addresses, only read through `bpf_probe_read_kernel` after checking the
    /// cookie at that address.
    pub sk: [u64; 2],
    /// Socket cookies.
    pub cookie: [u64; 2],
    /// Each side's [`SockState::rx_tcp`]: non-zero keeps the other side's sends on TCP.
    pub rx_tcp: [u32; 2],
}

const _: () = assert!(core::mem::size_of::<Link>() == 96);

impl Link {
    /// Whether this link is the one the socket with `state` belongs to: it names the
    /// socket's cookie on its side (a link left by an earlier socket with the same key,
    /// or a map element reused for another connection, names another), and a server's
    /// also names it as the server.
    #[inline(always)]
    pub const fn is_of(&self, state: &SockState) -> bool {
        // A client's link names a server whose remote end is the client's own local end
        // (NAT rewrites where a connection lands, not where it comes from): a torn read
        // of an element being reused for another client's link fails it.
        let named = if state.side == side::SERVER {
            key_eq(&self.server, &state.key)
        } else {
            state.side == side::CLIENT && self.server.remote_end().same(&state.key.local_end())
        };
        named && state.cookie != 0 && self.cookie[side::index(state.side)] == state.cookie
    }

    /// The key the socket with `state` redirects to.
    #[inline(always)]
    pub const fn target(&self, state: &SockState) -> SockKey {
        if state.side == side::SERVER {
            state.link
        } else {
            self.server
        }
    }
}

#[inline(always)]
const fn key_eq(a: &SockKey, b: &SockKey) -> bool {
    a.local_port == b.local_port
        && a.remote_port == b.remote_port
        && a.netns == b.netns
        && a.local_ip[0] == b.local_ip[0]
        && a.local_ip[1] == b.local_ip[1]
        && a.local_ip[2] == b.local_ip[2]
        && a.local_ip[3] == b.local_ip[3]
        && a.remote_ip[0] == b.remote_ip[0]
        && a.remote_ip[1] == b.remote_ip[1]
        && a.remote_ip[2] == b.remote_ip[2]
        && a.remote_ip[3] == b.remote_ip[3]
}

/// Whether an accepting socket, established with `snd_nxt` and `rcv_nxt` (nothing sent
/// or received yet but the handshake), is the other end of `connector`. NAT rewrites
/// addresses and ports, not sequence numbers, so the two sides' initial sequence numbers
/// (random 32-bit each, and secret: another namespace never sees them) must cross over;
/// a socket that merely shares the client's address and port (a source port reused
/// towards another destination, another namespace's socket) does not.
#[inline(always)]
pub const fn is_other_end(connector: &Connector, snd_nxt: u32, rcv_nxt: u32) -> bool {
    connector.snd_nxt == rcv_nxt && connector.rcv_nxt == snd_nxt
}

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

/// Whether a socket's receive options keep redirects away from it: the ingress queue is
/// read without regard to SO_RCVLOWAT (a read returns what is queued, poll reports it
/// readable at once) or SO_PEEK_OFF (net/core/skmsg.c, sk_msg_recvmsg), while the TCP
/// path honours both.
#[inline(always)]
pub const fn options_need_tcp(rcvlowat: i32, peek_off: i32) -> bool {
    rcvlowat > 1 || peek_off >= 0
}

/// Why a message takes the TCP path (and with it, every later message of the socket:
/// a direction never goes back from TCP to redirects, see [`crate::tx_mode`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PassReason {
    /// An earlier message already did.
    AlreadyTcp,
    /// The bypass is switched off.
    Disabled,
    /// No link for the connection: the accepting side has not paired yet (the first
    /// send raced the handshake's end), never will (a peer off the node), or the peer
    /// closed.
    Unpaired,
    /// The peer asked for a receive option the ingress queue cannot honour.
    PeerOptions,
    /// The peer's queue would pass its bound.
    QueueFull,
    /// The peer could not be measured (its address no longer names it).
    Unmeasurable,
    /// The redirect found no peer in the SockHash.
    NoPeer,
    /// Bytes of this socket went to TCP past sk_msg (see [`SockState::write_seq`]).
    WroteByTcp,
    /// An upper-layer protocol is attached to this socket (kTLS set through a path the
    /// setsockopt hook does not see: a 32-bit process's compat setsockopt).
    Ulp,
    /// A stream of small messages (see [`small_stream_step`]).
    SmallStream,
}

/// Small sends in a row that must find the peer's queue still holding unread bytes
/// before a direction counts as a small-message stream.
pub const SMALL_STREAM_RUN: u32 = 8;

/// One small send's step of the small-stream rule: from the run so far and the bytes
/// waiting unread in the peer's ingress queue, the new run and whether this direction
/// now takes the TCP path. A send that finds the queue empty (request/response: the
/// peer read everything before answering) resets the run, and so does any send at or
/// above the size (sk_msg does that); a writer that keeps ahead of its reader with
/// small messages reaches [`SMALL_STREAM_RUN`]. So does a response written as that many
/// small writes before its reader reads, and a pipelining client: the rule is opt-in.
#[inline(always)]
pub const fn small_stream_step(run: u32, peer_queued: u64) -> (u32, bool) {
    if peer_queued == 0 {
        return (0, false);
    }
    let run = run.saturating_add(1);
    (run, run >= SMALL_STREAM_RUN)
}

/// The first checks of sk_msg, before anything is read of the peer: `None` lets the
/// message go on towards a redirect.
#[inline(always)]
pub const fn precheck(
    tx_mode: u32,
    enabled: bool,
    link: Option<&Link>,
    state: &SockState,
) -> Option<PassReason> {
    if tx_mode == crate::tx_mode::TCP {
        return Some(PassReason::AlreadyTcp);
    }
    if !enabled {
        return Some(PassReason::Disabled);
    }
    let Some(link) = link else {
        return Some(PassReason::Unpaired);
    };
    if !link.is_of(state) {
        return Some(PassReason::Unpaired);
    }
    if link.rx_tcp[side::peer_index(state.side)] != 0 {
        return Some(PassReason::PeerOptions);
    }
    None
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
unsafe impl aya::Pod for Link {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tx_mode;

    fn key(lp: u32, rp: u32, netns: u64) -> SockKey {
        SockKey::new(
            [0, 0, 0xffff_u32.to_be(), lp],
            [0, 0, 0xffff_u32.to_be(), rp],
            lp,
            rp,
            netns,
        )
    }

    #[test]
    fn small_stream_rule() {
        // Request/response: every send finds the queue read.
        let mut run = 0;
        for _ in 0..100 {
            let (r, tcp) = small_stream_step(run, 0);
            assert!(!tcp);
            run = r;
        }
        // A stream: the reader falls behind; TCP at the SMALL_STREAM_RUN-th send.
        for i in 1..=SMALL_STREAM_RUN {
            let (r, tcp) = small_stream_step(run, 5);
            assert_eq!((r, tcp), (i, i == SMALL_STREAM_RUN));
            run = r;
        }
        // A burst shorter than the run, then the reader catches up: the run restarts.
        let (r, _) = small_stream_step(3, 7);
        assert_eq!(small_stream_step(r, 0), (0, false));
    }

    #[test]
    fn pairing_needs_crossed_sequence_numbers() {
        let c = Connector {
            snd_nxt: 1001,
            rcv_nxt: 5001,
            ..Connector::default()
        };
        assert!(is_other_end(&c, 5001, 1001));
        assert!(!is_other_end(&c, 1001, 5001), "not crossed");
        assert!(
            !is_other_end(&c, 5001, 1002),
            "another client on the same end"
        );
    }

    #[test]
    fn hop_kinds() {
        let client = key(1, 2, 10);
        let server = key(2, 1, 20);
        assert_eq!(hop::of(&client, &server), hop::POD);
        let redirected = SockKey {
            local_port: 15006,
            ..server
        };
        assert_eq!(hop::of(&client, &redirected), hop::TRANSLATED);
        let lo = [0, 0, 0xffff_u32.to_be(), u32::from_ne_bytes([127, 0, 0, 1])];
        let c = SockKey::new(lo, lo, 1, 2, 5);
        let s = SockKey::new(lo, lo, 2, 1, 5);
        assert_eq!(hop::of(&c, &s), hop::LOOPBACK);
    }

    #[test]
    fn links_are_used_only_by_their_two_sockets() {
        let client = SockState {
            key: key(1, 2, 10),
            link: key(1, 2, 10),
            side: side::CLIENT,
            cookie: 7,
            ..SockState::default()
        };
        let server = SockState {
            key: key(2, 1, 20),
            link: key(1, 2, 10),
            side: side::SERVER,
            cookie: 8,
            ..SockState::default()
        };
        let link = Link {
            server: server.key,
            cookie: [7, 8],
            ..Link::default()
        };
        assert!(link.is_of(&client) && link.is_of(&server));
        let elsewhere = Link {
            server: key(2, 3, 20),
            ..link
        };
        assert!(
            !elsewhere.is_of(&client),
            "a server whose remote end is not this client's local end"
        );
        let stale = Link {
            cookie: [6, 8],
            ..link
        };
        assert!(
            !stale.is_of(&client) && stale.is_of(&server),
            "a link an earlier client left under the same key"
        );
        let reused = Link {
            cookie: [7, 9],
            ..link
        };
        assert!(!reused.is_of(&server), "another server with the same key");
        let uncookied = SockState {
            cookie: 0,
            ..client
        };
        assert!(
            !Link {
                cookie: [0, 8],
                ..link
            }
            .is_of(&uncookied)
        );
        assert_eq!(link.target(&client), server.key);
        assert_eq!(link.target(&server), client.key);
        let older_server = SockState {
            key: key(2, 1, 21),
            ..server
        };
        assert!(!link.is_of(&older_server), "a later connection's link");
        let outsider = SockState {
            side: side::NONE,
            ..client
        };
        assert!(!link.is_of(&outsider));
    }

    #[test]
    fn precheck_order() {
        let state = SockState {
            side: side::CLIENT,
            cookie: 3,
            ..SockState::default()
        };
        let link = Link {
            cookie: [3, 4],
            ..Link::default()
        };
        assert_eq!(
            precheck(tx_mode::TCP, true, Some(&link), &state),
            Some(PassReason::AlreadyTcp)
        );
        assert_eq!(
            precheck(tx_mode::UNDECIDED, false, Some(&link), &state),
            Some(PassReason::Disabled)
        );
        assert_eq!(
            precheck(tx_mode::REDIRECT, true, None, &state),
            Some(PassReason::Unpaired)
        );
        assert_eq!(precheck(tx_mode::REDIRECT, true, Some(&link), &state), None);
        let picky = Link {
            rx_tcp: [0, 1],
            ..link
        };
        assert_eq!(
            precheck(tx_mode::UNDECIDED, true, Some(&picky), &state),
            Some(PassReason::PeerOptions)
        );
        let own_options_only = Link {
            rx_tcp: [1, 0],
            ..link
        };
        assert_eq!(
            precheck(tx_mode::UNDECIDED, true, Some(&own_options_only), &state),
            None,
            "a socket's own receive options do not stop its sends"
        );
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
}
