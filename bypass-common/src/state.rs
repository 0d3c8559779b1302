//! Per-socket state kept in socket-local storage ([`crate::names::MAP_SOCK_STATE`]),
//! what a connecting socket publishes for its peer ([`Connector`]), what the two sides
//! of a paired connection share ([`Link`]), and the pure decisions the programs make
//! from them.
//!
//! # Who writes what
//! A [`Link`] is shared by the two sockets of a connection and by the programs that
//! watch each of them read. Each field has one writer:
//! - `tx_redir[i]`: side `i`'s sk_msg, under its socket lock (a fully ordered
//!   compare-and-exchange from the value it read, so that the receive guard and the
//!   sender see each other, see [`rx`]; a plain atomic subtract to undo it);
//! - `rx_read[i]`, `rx_copied[i]`, `rx_limit[i]`: the programs on side `i`'s reads;
//! - `rx_flags[i]`: side `i`'s setsockopt hook and read guard (atomic or);
//! - `state`: either side (atomic or).
//!
//! So a sender knows, without reading another socket's memory, how many bytes it has
//! queued on its peer and not yet read (`tx_redir[me] - rx_read[peer]`), whether the
//! peer has read every byte it sent by TCP (`rx_copied[peer] == write_seq`), and how
//! the peer reads (`rx_flags[peer]`).

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

    /// The side of the other end of a socket on `side`.
    #[inline(always)]
    pub const fn peer(side: u32) -> u32 {
        if side == SERVER { CLIENT } else { SERVER }
    }
}

/// The storage value of one socket.
///
/// 208 bytes, no padding (checked below).
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
    /// The socket's last send decision ([`crate::tx_mode`]), for the counters.
    pub tx_mode: u32,
    /// [`flags`] bits.
    pub flags: u32,
    /// Small sends in a row that found the peer's queue not yet read
    /// ([`small_stream_step`]).
    pub small_run: u32,
    /// Non-zero once this socket asked for a receive option the ingress queue cannot
    /// honour (see [`rcvlowat_needs_tcp`], SO_PEEK_OFF), before it was paired: the
    /// accepting side copies it into the link.
    pub rx_tcp: u32,
    /// The cut generation ([`crate::control::SLOT_CUT_GEN`]) this socket last checked.
    pub cut_gen: u32,
    /// Its `copied_seq` when a read last published (its `rcv_nxt` when inserted:
    /// nothing read yet), from which `tcp_total` grows ([`tcp_read_step`]); the low 32
    /// bits of a word that readers move by compare-and-exchange, so that of two readers
    /// publishing at once only one adds a step.
    pub copied_last: u64,
    /// Bytes its reads through `recvmsg` returned, both queues together (atomic): what
    /// came from the ingress queue is this less `tcp_total` ([`ingress_read`]).
    pub read_total: u64,
    /// How far `copied_seq` has moved since insertion, in 64 bits (atomic adds of each
    /// read's 32-bit step): the bytes read from the TCP receive queue, by any means.
    pub tcp_total: u64,
    /// Reads of this socket inside `tcp_bpf_recvmsg` now (atomic; where trampolines run:
    /// elsewhere 0). Only the last one out publishes how far TCP was read, so a reader
    /// still blocked in plain `tcp_recvmsg` is never taken for one that has caught up.
    pub readers: u64,
    /// Messages this socket has redirected.
    pub tx_msgs: u64,
    /// A checkpoint: `tx_msgs` when it was taken...
    pub cp_msgs: u64,
    /// ...and the bytes this socket had redirected then ([`Link::tx_redir`]).
    pub cp_redir: u64,
    /// Messages known to be read by the peer: every message up to a checkpoint whose
    /// bytes the peer has read ([`consumed_messages`]).
    pub done_msgs: u64,
    /// Bytes this socket has sent by TCP since its last redirect, for reasons that keep
    /// it there until its peer catches up ([`PassReason::lingers`]): past
    /// [`crate::control::SLOT_LEAVE_AFTER`] the connection leaves the SockHash, so a
    /// stream that does not come back runs as plain TCP, not as TCP inside the
    /// SockHash.
    pub tcp_run: u64,
    /// Its socket cookie (unique on the node, never reused): a [`Link`] is this
    /// socket's only if it names this cookie on this socket's side.
    pub cookie: u64,
    /// Once the socket has closed ([`flags::CLOSED`]): the bytes its peer had
    /// redirected to it then ([`Link::tx_redir`]), all there will ever be (the peer
    /// redirects nothing once it sees the closed bit, which goes in first). The link
    /// may go before the socket is read to the end (both ends closed), so the read
    /// guard compares what the socket read out of its ingress queue with this
    /// ([`closed_drained`]).
    pub rx_due: u64,
}

const _: () = assert!(core::mem::size_of::<SockState>() == 208);
const _: () = assert!(core::mem::align_of::<SockState>() == 8);

/// Bytes a socket has read out of its ingress queue: what its `recvmsg` reads returned
/// (`read_total`) less what it read from its TCP receive queue (`tcp_total`). Never
/// above the truth: a read moves `copied_seq` before it returns and is counted in
/// `read_total`; a TCP read that no `recvmsg` returned (a splice, zero-copy receive)
/// only lowers it; and of two readers publishing at once, each step of `copied_seq`
/// is counted once (`copied_last` moves by compare-and-exchange), never missed.
#[inline(always)]
pub const fn ingress_read(read_total: u64, tcp_total: u64) -> u64 {
    read_total.saturating_sub(tcp_total)
}

/// Whether a closed socket has read out of its ingress queue every byte redirected to
/// it (`due`, [`SockState::rx_due`], never below the truth); `read_total` and
/// `tcp_total` as in [`ingress_read`], never above it. So reaching `due` means every
/// byte was read, and a count short of it keeps the guard refusing, never lets it
/// through early.
#[inline(always)]
pub const fn closed_drained(due: u64, read_total: u64, tcp_total: u64) -> bool {
    ingress_read(read_total, tcp_total) >= due
}

/// How far `copied_seq` moved since `copied_last`, the socket's last published value:
/// a 32-bit step (sequence numbers wrap; a reader moves less than 2 GiB between two
/// publishes), added to the 64-bit `tcp_total`.
#[inline(always)]
pub const fn tcp_read_step(copied_seq: u32, copied_last: u32) -> u64 {
    let step = copied_seq.wrapping_sub(copied_last);
    // A reader publishing an older copied_seq than another's (two readers at once)
    // moved backwards: no step.
    if step > i32::MAX as u32 {
        0
    } else {
        step as u64
    }
}

/// Of the sequence numbers `[copied_last, copied_seq)` a read stepped over, how many
/// returned no byte: the urgent byte at `urg_seq` when `urg` (it is not read inline:
/// tcp_recvmsg steps over it, net/ipv4/tcp.c), and the FIN at `fin_seq` when `fin` (it
/// was read). `tcp_total` counts bytes, so these are not part of it (pure; plain values,
/// not options: the BPF verifier refuses reads of an absent option's payload, which the
/// compiler may hoist).
#[inline(always)]
pub const fn skipped_seqs(
    copied_seq: u32,
    copied_last: u32,
    (urg, urg_seq): (bool, u32),
    (fin, fin_seq): (bool, u32),
) -> u64 {
    let step = tcp_read_step(copied_seq, copied_last);
    let mut n = 0;
    if urg && (urg_seq.wrapping_sub(copied_last) as u64) < step {
        n += 1;
    }
    if fin && (fin_seq.wrapping_sub(copied_last) as u64) < step {
        n += 1;
    }
    if n > step { step } else { n }
}

/// Bits of [`SockState::flags`].
pub mod flags {
    /// The socket was once in the SockHash, so it has (or had) a psock with an ingress
    /// queue: redirected bytes may still wait there after a close or a disconnect, so
    /// an upper-layer protocol must never be attached to it.
    pub const INSERTED: u32 = 1;
    /// The read guard let a splice or a mapping read this socket: nothing redirected
    /// to it was unread then, and nothing is redirected to it any more, so its
    /// published `rx_read` stays as it was (its later TCP reads are not ingress
    /// reads).
    pub const RX_FROZEN: u32 = 2;
    /// The socket reached TCP_CLOSE: its own peer's FIN after its half-close
    /// (FIN_WAIT2 to TIME_WAIT), a reset, or its close. It stays readable while the
    /// application holds it, with redirected bytes still queued: it stays known to
    /// the programs on its reads (`side` is kept) and never redirects again.
    pub const CLOSED: u32 = 4;
}

/// Bits of [`super::Link::rx_flags`]: how one side reads, as far as its peer's sends
/// care. Set with an atomic or, never cleared.
///
/// [`rx::SPLICE`] and [`rx::ZEROCOPY`] are set by the read guard before a `splice(2)` or a
/// zero-copy mapping reads the socket: both read only the TCP receive queue
/// (net/ipv4/tcp.c, tcp_splice_read and tcp_zerocopy_receive), never the ingress queue
/// redirected bytes wait in. The guard sets its bit, then reads how many bytes its peer
/// has redirected (`tx_redir`) against how many it has read (`rx_read`), and refuses the
/// call when they differ; a sender adds to `tx_redir`, then reads the bits, and takes
/// TCP when one is set, unless the reader has not read every byte redirected to it yet
/// (read after the bits): then the guard refuses, and the sender goes on redirecting
/// until its reader's ingress queue is empty, so no read of that queue returns short
/// with TCP bytes waiting behind it ([`super::drains_first`]). The guard's or and the
/// sender's add (a compare-and-exchange) are fully ordered atomics, full barriers, so
/// at least one of the two sees the other: no byte is ever left where the
/// reader cannot see it.
pub mod rx {
    /// A receive option the ingress queue ignores (SO_RCVLOWAT above 1, SO_PEEK_OFF):
    /// bytes for this side go by TCP.
    pub const OPTION: u64 = 1;
    /// This side reads with `splice(2)`.
    pub const SPLICE: u64 = 2;
    /// This side reads with zero-copy receive (`mmap` of the socket).
    pub const ZEROCOPY: u64 = 4;
    /// This side discards with `recv(MSG_TRUNC)`, which the ingress queue would copy
    /// out instead (net/core/skmsg.c, sk_msg_recvmsg takes no such flag).
    pub const TRUNC: u64 = 8;
    /// The bits after which this side reads only the TCP receive queue.
    pub const TCP_ONLY: u64 = SPLICE | ZEROCOPY | TRUNC;
    /// This side's read guard let a TCP-only read through with nothing redirected to it
    /// unread: no sender drains into it again ([`super::drains_first`]). Or-ed (fully
    /// ordered) before the guard reads the peer's count once more, so either the guard
    /// sees a send counted meanwhile and refuses, or that sender sees this bit and takes
    /// TCP: a reader's receive publishing its count from another thread than its splice
    /// never lets a drained message land behind a splice.
    pub const DRAINED: u64 = 16;
}

/// The read guard's decision for one thread's splice or mapping
/// ([`crate::names::MAP_VERDICTS`]): the call's permission check of `file` fails with
/// `-err`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// The `struct file *` the decision is about (compared, never dereferenced).
    pub file: u64,
    /// The errno the check returns, positive.
    pub err: i32,
    /// Zero.
    pub reserved: u32,
}

const _: () = assert!(core::mem::size_of::<Verdict>() == 16);

/// Bits of [`Link::state`]. Set with an atomic or, never cleared.
pub mod link_state {
    /// The connection is leaving the SockHash: neither side redirects again (but a sender
    /// whose TCP-only reader has not read everything redirected to it, until it has:
    /// [`super::drains_first`]), and once
    /// each side has read what was redirected to it the agent deletes both sockets from
    /// the SockHash, after which the kernel runs them as plain TCP (autocork, splice,
    /// zero-copy receive).
    pub const LEAVING: u64 = 1;
    /// The client socket has closed.
    pub const CLOSED_CLIENT: u64 = 2;
    /// The server socket has closed.
    pub const CLOSED_SERVER: u64 = 4;
    /// The agent cut the connection (set with [`LEAVING`] by the first socket that saw
    /// the cut): no send is redirected again, not even to drain a TCP-only reader
    /// ([`super::drains_first`]).
    pub const CUT: u64 = 8;

    /// The closed bit of `side` (a [`super::side`] value).
    #[inline(always)]
    pub const fn closed(side: u32) -> u64 {
        if side == super::side::SERVER {
            CLOSED_SERVER
        } else {
            CLOSED_CLIENT
        }
    }

    /// Both sockets have closed: the link can go.
    pub const BOTH_CLOSED: u64 = CLOSED_CLIENT | CLOSED_SERVER;
}

/// How the two sockets of a bypassed connection were paired; each kind has its own
/// counters. A link holds it as its `u32` ([`Link::hop`]), 0 before it is paired.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hop {
    /// Pod address to pod address, each socket's key the mirror of the other's.
    Pod = 1,
    /// Inside one pod over a loopback end (127.0.0.0/8, ::1).
    Loopback = 2,
    /// Translated on the way (iptables REDIRECT to a sidecar, a ClusterIP DNAT): the
    /// client's destination is not where the connection landed.
    Translated = 3,
}

impl Hop {
    /// Every kind, in the order the metrics list them.
    pub const ALL: [Self; 3] = [Self::Pod, Self::Loopback, Self::Translated];

    /// Its name, as the metrics' `kind` label shows it.
    pub const fn label(self) -> &'static str {
        match self {
            Self::Pod => "pod",
            Self::Loopback => "loopback",
            Self::Translated => "translated",
        }
    }

    /// The kind a link's `hop` holds; `None` for one not paired (0).
    #[inline(always)]
    pub const fn from_raw(raw: u32) -> Option<Self> {
        match raw {
            1 => Some(Self::Pod),
            2 => Some(Self::Loopback),
            3 => Some(Self::Translated),
            _ => None,
        }
    }

    /// The kind of the connection between a connecting socket with key `client` and the
    /// accepting socket with key `server`.
    #[inline(always)]
    pub const fn of(client: &SockKey, server: &SockKey) -> Self {
        if !client.mirrors(server) {
            Self::Translated
        } else if client.is_loopback() {
            Self::Loopback
        } else {
            Self::Pod
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
    /// Its `rcv_nxt` when established: its peer's initial sequence number + 1 (and so
    /// its `copied_seq`: nothing was read yet).
    pub rcv_nxt: u32,
    /// Its socket cookie (unique on the node, never reused).
    pub cookie: u64,
    /// Its [`SockState::rx_tcp`] when it was inserted, set later (an atomic or: a 64-bit
    /// word, as [`Link::state`]) if it asks for a receive option before it is paired.
    pub rx_tcp: u64,
    /// Its receive bound ([`receive_bound`]) when it was inserted.
    pub rx_limit: u32,
    /// Zero when published. The first accepting socket that could have been its server
    /// (every other check passed) claims it, setting [`SPENT_IN_WORD`] in the 64-bit
    /// word it makes with [`Connector::rx_limit`] by one fetching atomic or, before any
    /// comparison: only the claimant that found it clear compares its sequence numbers
    /// ([`pairing`]), so sockets on several CPUs at once still get one comparison. The
    /// claimant reads the word again after its checks and is refused when the bit is
    /// clear (the element was reused for a new record after its claim).
    pub spent: u32,
}

/// [`Connector::spent`] as a bit of the 64-bit word at [`Connector::rx_limit`] (the
/// kernel crate has fetching atomics on 64-bit words only): the low bit of `spent`.
pub const SPENT_IN_WORD: u64 = if cfg!(target_endian = "little") {
    1 << 32
} else {
    1
};

// `rx_limit` and `spent` make one aligned 64-bit word, `spent` its second half.
const _: () = assert!(core::mem::offset_of!(Connector, rx_limit) % 8 == 0);
const _: () = assert!(
    core::mem::offset_of!(Connector, spent) == core::mem::offset_of!(Connector, rx_limit) + 4
);

const _: () = assert!(core::mem::size_of::<Connector>() == 80);

/// What the two sockets of a paired connection share, under the connecting socket's
/// key, written by the accepting side when it pairs. Arrays are indexed by
/// [`side::index`]: 0 the client, 1 the server. See the module's documentation for who
/// writes which field.
///
/// 144 bytes, no padding (checked below).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Link {
    /// The accepting socket's key.
    pub server: SockKey,
    /// The [`Hop`] kind, as its `u32` (0: not paired).
    pub hop: u32,
    /// The cut generation ([`crate::control::SLOT_CUT_GEN`]) when the accepting side
    /// made the link, plus one; 0: not recorded (a build of this layout before it,
    /// which wrote zero here). Both sockets check cuts from that generation or an
    /// earlier one, so a cut of everything after it has cut them ([`Link::cut_by_all`]).
    pub paired_gen: u32,
    /// [`link_state`] bits (a 64-bit word: without 32-bit sub-registers, the BPF
    /// backend has fetching atomics on 64-bit words only).
    pub state: u64,
    /// Socket cookies.
    pub cookie: [u64; 2],
    /// Bytes each side has redirected to the other, counted before the redirect (so
    /// also those still on their way).
    pub tx_redir: [u64; 2],
    /// Bytes each side has read out of its ingress queue.
    pub rx_read: [u64; 2],
    /// Each side's [`rx`] bits (64-bit words, as `state`).
    pub rx_flags: [u64; 2],
    /// Each side's `copied_seq` (how far it has read what came by TCP), published as
    /// each of its reads returns.
    pub rx_copied: [u32; 2],
    /// Each side's bound on what may wait for it ([`receive_bound`]; 0: the global one).
    pub rx_limit: [u32; 2],
}

const _: () = assert!(core::mem::size_of::<Link>() == 144);

impl Link {
    /// Whether the cut of everything made at generation `all`
    /// ([`crate::control::SLOT_CUT_ALL`]) has cut this link's sockets, the cut generation
    /// being `generation` now: it came after the link was made. `false` where the link
    /// does not say when it was made ([`Link::paired_gen`] 0).
    pub const fn cut_by_all(&self, generation: u32, all: u32) -> bool {
        self.paired_gen != 0
            && crate::control::cut_everything_since(
                self.paired_gen.wrapping_sub(1),
                generation,
                all,
            )
    }

    /// Whether this link is cut already: a socket saw its cut ([`link_state::CUT`]), or
    /// the cut of everything at `all` came after it was made ([`Link::cut_by_all`]).
    pub const fn already_cut(&self, generation: u32, all: u32) -> bool {
        self.state & link_state::CUT != 0 || self.cut_by_all(generation, all)
    }
}

/// What one pod's closed connections carried through the bypass, the value of
/// [`crate::names::MAP_POD_COUNTS`]: added to by sock_ops as each of its sockets that
/// was paired closes (fetching adds: sockets of one pod close on several CPUs at once).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PodCounts {
    /// Bytes the pod's sockets redirected to their peers ([`Link::tx_redir`] of their
    /// side).
    pub bytes: u64,
    /// The pod's paired connections: each counted once per pod, so a loopback
    /// connection inside one pod counts once ([`PodCounts::counts_connection`]).
    pub connections: u64,
}

const _: () = assert!(core::mem::size_of::<PodCounts>() == 16);

impl PodCounts {
    /// Whether the socket on `side` of a link whose client's network namespace is
    /// `client_netns` counts the connection for its own namespace `netns`: the client
    /// always, the server unless both ends are in one namespace (a loopback connection,
    /// or a sidecar's redirect inside one pod), where the client counted it already.
    #[inline(always)]
    pub const fn counts_connection(side: u32, netns: u64, client_netns: u64) -> bool {
        side != side::SERVER || netns != client_netns
    }
}

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
/// (32 bits each, never seen by another namespace) must cross over; a socket that
/// merely shares the client's address and port (a source port reused towards another
/// destination, another namespace's socket) does not. They are not secret from a
/// namespace that can hold the same addresses: the kernel hashes addresses and ports
/// under one host-wide key plus a clock (net/core/secure_seq.c), so only the clock is
/// left to guess; hence one comparison per client record ([`pairing`]).
#[inline(always)]
pub const fn is_other_end(connector: &Connector, snd_nxt: u32, rcv_nxt: u32) -> bool {
    connector.snd_nxt == rcv_nxt && connector.rcv_nxt == snd_nxt
}

/// What an accepting socket that passed every other check (its address its own, no
/// simultaneous open, its client able to reach it) does with the [`Connector`] on its
/// client's end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pairing {
    /// Its other end ([`is_other_end`]): paired.
    Pair,
    /// Not its other end: refused; its claim has spent the connector
    /// ([`Connector::spent`]).
    Spend,
    /// An earlier socket claimed the connector (a wrong one, or its real server):
    /// refused, nothing compared.
    Spent,
}

/// What an accepting socket established with `snd_nxt` and `rcv_nxt` (having passed
/// every other check) does with `connector`, which it has just claimed: `claimed_before`
/// is whether [`SPENT_IN_WORD`] was already set when it did. A client's record is
/// compared once: the real server is established within microseconds of its client, so
/// a wrong socket first is a SNAT onto the client's end or a pod trying numbers, which
/// could otherwise try again for as long as the client lives.
#[inline(always)]
pub const fn pairing(
    claimed_before: bool,
    connector: &Connector,
    snd_nxt: u32,
    rcv_nxt: u32,
) -> Pairing {
    if claimed_before {
        Pairing::Spent
    } else if is_other_end(connector, snd_nxt, rcv_nxt) {
        Pairing::Pair
    } else {
        Pairing::Spend
    }
}

/// Whether a socket's receive options keep redirects away from it: the ingress queue is
/// read without regard to SO_RCVLOWAT (a read returns what is queued, poll reports it
/// readable at once) or SO_PEEK_OFF (net/core/skmsg.c, sk_msg_recvmsg), while the TCP
/// path honours both. `rcvlowat` as the kernel holds it (`sk_rcvlowat`).
#[inline(always)]
pub const fn options_need_tcp(rcvlowat: i32, peek_off: i32) -> bool {
    rcvlowat > 1 || peek_off >= 0
}

/// Whether `setsockopt(SO_RCVLOWAT, value)` leaves the socket with a low-water mark
/// above 1: the kernel turns a negative value into `INT_MAX` and 0 into 1
/// (net/core/sock.c, sk_setsockopt).
#[inline(always)]
pub const fn rcvlowat_needs_tcp(value: i32) -> bool {
    value > 1 || value < 0
}

/// `SOCK_RCVBUF_LOCK` (include/net/sock.h): the application set SO_RCVBUF, so the
/// kernel no longer grows its receive buffer.
pub const SOCK_RCVBUF_LOCK: u8 = 2;

/// The bound on bytes waiting for a reader whose `sk_rcvbuf` and `sk_userlocks` are
/// given: its own receive buffer when the application fixed it (TCP would hold its
/// sender to that), else 0, the global bound ([`crate::control::SLOT_MAX_QUEUED`], what
/// TCP lets a receive buffer grow to).
#[inline(always)]
pub const fn receive_bound(rcvbuf: i32, userlocks: u8) -> u32 {
    if userlocks & SOCK_RCVBUF_LOCK != 0 && rcvbuf > 0 {
        rcvbuf as u32
    } else {
        0
    }
}

/// Bytes a sender that redirected `tx_redir` in all has queued on a peer that read
/// `rx_read` of them: still waiting, or on their way.
#[inline(always)]
pub const fn pending(tx_redir: u64, rx_read: u64) -> u64 {
    tx_redir.saturating_sub(rx_read)
}

/// Advances a sender's message checkpoint and returns `(cp_msgs, cp_redir, done_msgs)`:
/// when the peer has read up to the checkpoint (`rx_read >= cp_redir`), every message
/// counted in it was read (a message counted there ended at or before `cp_redir`), so
/// `done_msgs` moves up to it and a new checkpoint is taken at the totals now
/// (`tx_msgs`, `tx_redir`). `tx_msgs - done_msgs` is then never below the messages
/// still waiting: an upper bound on them, at most about twice the truth for a reader
/// that keeps a steady distance.
#[inline(always)]
pub const fn consumed_messages(
    cp_msgs: u64,
    cp_redir: u64,
    done_msgs: u64,
    tx_msgs: u64,
    tx_redir: u64,
    rx_read: u64,
) -> (u64, u64, u64) {
    if rx_read >= cp_redir {
        (tx_msgs, tx_redir, cp_msgs)
    } else {
        (cp_msgs, cp_redir, done_msgs)
    }
}

/// What a peer is charged for a message of `size` bytes on top of `pending` bytes and
/// `pending_msgs` messages already waiting: the bytes, plus `msg_cost` for each message
/// (a queued message holds a `struct sk_msg`, about 1 KiB, whatever its size:
/// net/ipv4/tcp_bpf.c, bpf_tcp_ingress), so a stream of 1-byte messages is bounded as
/// TCP bounds it, by memory and not by payload.
#[inline(always)]
pub const fn charge(pending: u64, pending_msgs: u64, size: u64, msg_cost: u64) -> u64 {
    // Capped so the product cannot overflow without a 128-bit multiply (which BPF does
    // not have): 2^32 messages of up to 2^31 bytes each.
    let msgs = min(pending_msgs.saturating_add(1), 1 << 32);
    let cost = min(msg_cost, 1 << 31);
    pending
        .saturating_add(size)
        .saturating_add(msgs.wrapping_mul(cost))
}

#[inline(always)]
const fn min(a: u64, b: u64) -> u64 {
    if a < b { a } else { b }
}

/// Whether `charge` fits under `limit` (0: no bound).
#[inline(always)]
pub const fn within_limit(charge: u64, limit: u64) -> bool {
    limit == 0 || charge <= limit
}

/// Why a message takes the TCP path. None of them is for good by itself: a direction
/// goes back to redirects as soon as its peer has read every byte it sent by TCP
/// ([`PassReason::Behind`]) and nothing else holds it (a receive option, a reader that
/// cannot see the ingress queue, a connection leaving the SockHash, an upper-layer
/// protocol: those stay).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PassReason {
    /// The bypass is switched off.
    Disabled,
    /// No link for the connection: the accepting side has not paired yet (the first
    /// send raced the handshake's end), never will (a peer off the node), or the link
    /// is another connection's.
    Unpaired,
    /// The peer has closed.
    PeerClosed,
    /// The connection is leaving the SockHash ([`link_state::LEAVING`]).
    Leaving,
    /// The peer asked for a receive option the ingress queue cannot honour.
    PeerOptions,
    /// The peer reads with `splice(2)` or zero-copy receive, which see only TCP bytes.
    PeerReadsTcp,
    /// An upper-layer protocol is attached to this socket (kTLS set through a path the
    /// setsockopt hook does not see: a 32-bit process's compat setsockopt).
    Ulp,
    /// The peer has not yet read every byte this socket sent by TCP: a redirected byte
    /// would be read before them (the peer reads its ingress queue first).
    Behind,
    /// The peer's queue would pass its bound.
    QueueFull,
    /// A stream of small messages (see [`small_stream_step`]): the connection leaves
    /// the SockHash, so plain TCP can coalesce them.
    SmallStream,
    /// The redirect found no peer in the SockHash.
    NoPeer,
    /// The peer's read guard or a leave came in while this message was being claimed.
    Raced,
    /// The node's TCP memory is near `tcp_mem`'s first threshold
    /// ([`crate::control::SLOT_TCP_MEM_TIGHT`]): a redirect could be refused memory,
    /// and the kernel would fail the send; TCP makes it wait instead. It does not count
    /// towards leaving the SockHash (a node-wide spike would otherwise push every busy
    /// connection out for good); the direction comes back once memory is below the
    /// threshold and the peer has read what came by TCP.
    MemoryTight,
}

impl PassReason {
    /// Whether the connection should leave the SockHash because of it: it will take
    /// TCP from now on, and plain TCP serves it better than TCP inside the SockHash.
    #[inline(always)]
    pub const fn leaves(self) -> bool {
        matches!(self, PassReason::SmallStream | PassReason::PeerReadsTcp)
    }

    /// Whether it keeps the direction on TCP until the peer catches up (or for good),
    /// so the bytes it sends count towards leaving the SockHash
    /// ([`SockState::tcp_run`]).
    #[inline(always)]
    pub const fn lingers(self) -> bool {
        matches!(
            self,
            PassReason::Behind | PassReason::QueueFull | PassReason::PeerOptions
        )
    }
}

/// Adds `size` bytes sent by TCP for a lingering reason to `run`: the new run, and
/// whether the connection should now leave the SockHash (`limit` 0: never).
#[inline(always)]
pub const fn tcp_run_step(run: u64, size: u64, limit: u64) -> (u64, bool) {
    let run = run.saturating_add(size);
    (run, limit != 0 && run >= limit)
}

/// Small sends in a row that must find the peer's queue still holding unread bytes
/// before a direction counts as a small-message stream.
pub const SMALL_STREAM_RUN: u32 = 8;

/// One small send's step of the small-stream rule: from the run so far, the bytes
/// waiting unread in the peer's ingress queue (`peer_pending`), an upper bound on the
/// messages they are in (`pending_msgs`, [`consumed_messages`]) and the size under
/// which a send is small (`small`), the new run and whether this direction is a
/// small-message stream. What a stream costs is a queue entry and a wake-up per
/// message, so a send counts only when the queue it joins holds small messages on
/// average. A send that finds the queue empty (request/response: the peer read
/// everything before answering) resets the run, and so does one that finds large
/// messages waiting (an echo of bulk data that answers with a short read's remainder
/// while its peer has not read the last large answer yet), or any send at or above
/// `small` (sk_msg does that); a writer that keeps ahead of its reader with small
/// messages reaches [`SMALL_STREAM_RUN`].
#[inline(always)]
pub const fn small_stream_step(
    run: u32,
    peer_pending: u64,
    pending_msgs: u64,
    small: u64,
) -> (u32, bool) {
    if peer_pending == 0 || !small_on_average(peer_pending, pending_msgs, small) {
        return (0, false);
    }
    let run = run.saturating_add(1);
    (run, run >= SMALL_STREAM_RUN)
}

/// Whether `bytes` in at most `msgs` messages average under `small` bytes each. The
/// count is an upper bound, so the average found is at most the real one: a queue of
/// large messages can be taken for small ones, never the other way. Capped as
/// [`charge`] caps its product (no 128-bit multiply in BPF).
#[inline(always)]
const fn small_on_average(bytes: u64, msgs: u64, small: u64) -> bool {
    let msgs = min(if msgs == 0 { 1 } else { msgs }, 1 << 32);
    bytes < msgs.wrapping_mul(min(small, 1 << 31))
}

/// The first checks of sk_msg, in order, on its copy of the link: `None` lets the
/// message go on towards a redirect.
#[inline(always)]
pub const fn precheck(enabled: bool, link: Option<&Link>, state: &SockState) -> Option<PassReason> {
    if !enabled {
        return Some(PassReason::Disabled);
    }
    let Some(link) = link else {
        return Some(PassReason::Unpaired);
    };
    if !link.is_of(state) {
        return Some(PassReason::Unpaired);
    }
    if link.state & link_state::LEAVING != 0 {
        return Some(PassReason::Leaving);
    }
    let peer = side::peer_index(state.side);
    if link.state & link_state::closed(side::peer(state.side)) != 0 {
        return Some(PassReason::PeerClosed);
    }
    let flags = link.rx_flags[peer];
    if flags & rx::TCP_ONLY != 0 {
        return Some(PassReason::PeerReadsTcp);
    }
    if flags & rx::OPTION != 0 {
        return Some(PassReason::PeerOptions);
    }
    None
}

/// Whether a message that `reason` sends by TCP goes on towards a redirect instead: the
/// peer reads only its TCP queue from now on ([`rx::TCP_ONLY`], and the leave its guard
/// asked for) but has not read every byte redirected to it yet (pure, on sk_msg's copy of
/// the link; [`PassReason::Leaving`] and [`PassReason::PeerReadsTcp`] only). Its read
/// guard refuses while those bytes wait, so it reads them with `read`/`recv`, and a read
/// of the ingress queue never goes on into the TCP queue (net/ipv4/tcp_bpf.c,
/// tcp_bpf_recvmsg): a first byte sent by TCP while they wait would make that read return
/// short with more waiting, which an application may take for the end of what is there
/// (HAProxy, once the peer's FIN was reported, for the end of the stream). So the
/// direction moves to TCP only once its reader has read everything redirected to it, and
/// its ingress queue is empty when the first TCP byte comes. The claim checks again on
/// the link itself ([`drains_after_claim`]).
#[inline(always)]
pub const fn drains_first(reason: PassReason, link: &Link, state: &SockState) -> bool {
    if !matches!(reason, PassReason::Leaving | PassReason::PeerReadsTcp) {
        return false;
    }
    let (me, peer) = (side::index(state.side), side::peer_index(state.side));
    link.state & (link_state::closed(side::peer(state.side)) | link_state::CUT) == 0
        && drains_after_claim(link.rx_flags[peer], link.tx_redir[me], link.rx_read[peer])
}

/// At the claim of a message [`drains_first`] let go on, on the link itself: the
/// sender added the message to its count (`sent` before it), then read the peer's flags
/// (`peer_flags`) and, after them, what the peer has read (`read`); whether the redirect
/// may go on (pure). The guard or-s its bit, then reads the two counts, and lets a splice
/// through only when they are equal; the sender's add and the guard's or are fully
/// ordered, and the reader publishes what it read before its guard runs, so a sender
/// that sees the bit reads `read` at least as the guard did: if the guard let a splice
/// through, this finds nothing pending and takes TCP; if this redirects, the guard
/// refused (`bypass_common::state::rx`).
#[inline(always)]
pub const fn drains_after_claim(peer_flags: u64, sent: u64, read: u64) -> bool {
    peer_flags & rx::TCP_ONLY != 0
        && peer_flags & (rx::OPTION | rx::DRAINED) == 0
        && pending(sent, read) > 0
}

/// Whether the peer has read every byte a socket whose `write_seq` is given sent by TCP
/// (`rx_copied` is the peer's published `copied_seq`). Sequence numbers wrap; equality
/// is all that is asked.
#[inline(always)]
pub const fn caught_up(rx_copied: u32, write_seq: u32) -> bool {
    rx_copied == write_seq
}

/// What the ring buffer [`crate::names::MAP_EVENTS`] carries: a connection, by its
/// link's key, that started to leave the SockHash.
///
/// 48 bytes, no padding (checked below).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct LeaveEvent {
    /// The connection's link key (its connecting socket's key).
    pub link: SockKey,
}

const _: () = assert!(core::mem::size_of::<LeaveEvent>() == 48);

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

#[cfg(feature = "user")]
// SAFETY: `repr(C)`, no padding (asserted above), every bit pattern valid.
unsafe impl aya::Pod for LeaveEvent {}

#[cfg(feature = "user")]
// SAFETY: `repr(C)`, two `u64`s, no padding (asserted above), every bit pattern valid.
unsafe impl aya::Pod for PodCounts {}

#[cfg(test)]
mod tests;
