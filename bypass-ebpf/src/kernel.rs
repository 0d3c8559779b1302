//! What the programs read of kernel structures, and the read-only globals the agent
//! fixes at load (`bypass_common::layout`).
//!
//! Every read is typed: `bpf_skc_to_tcp_sock` on a socket the program was given (its
//! context's, or a traced function's argument) gives a BTF pointer, and a load at
//! `pointer + OFFSET` (a frozen read-only global, so a constant to the verifier) is
//! checked against the kernel's own `struct tcp_sock`: a wrong offset fails the load,
//! never reads another field. No program reads another socket's memory: what a sender
//! needs of its peer, the peer's own programs publish in the connection's link.

use core::{
    ffi::c_void,
    ptr::{addr_of, read_volatile},
};

use aya_ebpf::{
    Global,
    bindings::{bpf_sock, bpf_sock_ops},
    helpers::generated::bpf_skc_to_tcp_sock,
};
use bypass_common::state::receive_bound;

#[unsafe(no_mangle)]
static BYPASS_OFF_SK_RCVLOWAT: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static BYPASS_OFF_SK_PEEK_OFF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static BYPASS_OFF_ICSK_ULP_OPS: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static BYPASS_OFF_TCP_WRITE_SEQ: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static BYPASS_OFF_TCP_FASTOPEN_REQ: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static BYPASS_OFF_TCP_COPIED_SEQ: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static BYPASS_OFF_SK_RCVBUF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static BYPASS_OFF_SK_USERLOCKS: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static BYPASS_OFF_SOCKET_SK: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static BYPASS_MSG_COST: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static BYPASS_OFF_SK_FLAGS: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static BYPASS_SOCK_ZEROCOPY: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static BYPASS_OFF_SK_PROT: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static BYPASS_OFF_PROTO_MEMORY_ALLOCATED: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static BYPASS_OFF_SK_USER_DATA: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static BYPASS_OFF_SK_BACKLOG: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static BYPASS_OFF_TCP_RCV_NXT: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static BYPASS_OFF_TCP_URG_DATA: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static BYPASS_OFF_TCP_URG_SEQ: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static BYPASS_SOCK_DONE: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static BYPASS_SOCK_URGINLINE: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static BYPASS_FEATURES: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static BYPASS_BUILD: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static BYPASS_HOST_NETNS: Global<u64> = Global::new(0);

/// Whether the kernel honours `SO_PEEK_OFF` on TCP (`layout::features::TCP_PEEK_OFF`).
#[inline(always)]
pub(crate) fn tcp_peek_off() -> bool {
    BYPASS_FEATURES.load() & bypass_common::layout::features::TCP_PEEK_OFF != 0
}

/// Whether this build's tracing programs are the ones that act
/// (`bypass_common::control::SLOT_HOOKS_OWNER`): the build that loaded the datapath names
/// itself there. An upgrade in place replaces sk_msg, sock_ops and setsockopt and leaves
/// the tracing programs and the slot as they are (the kernel skips the return programs
/// of calls in flight whenever a trampoline changes), so one build's read, guard and
/// count act on a datapath's maps, and no other build's attached to them ever does.
#[inline(always)]
pub(crate) fn hooks_active() -> bool {
    crate::maps::BYPASS_CONTROL
        .get(bypass_common::control::SLOT_HOOKS_OWNER)
        .is_some_and(|owner| *owner == BYPASS_BUILD.load())
}

/// Whether the [`bypass_common::layout::features`] bit `bit` was loaded on.
#[inline(always)]
pub(crate) fn feature(bit: u32) -> bool {
    BYPASS_FEATURES.load() & bit != 0
}

/// The host's network namespace cookie.
#[inline(always)]
pub(crate) fn host_netns() -> u64 {
    BYPASS_HOST_NETNS.load()
}

/// Kernel memory a waiting message holds besides its bytes.
#[inline(always)]
pub(crate) fn msg_cost() -> u64 {
    u64::from(BYPASS_MSG_COST.load())
}

/// The `struct tcp_sock` of a socket pointer, as a byte pointer; null when it is not a
/// full TCP socket.
///
/// # Safety
/// `sk` must be a socket pointer the verifier knows as one (a context's socket, or a
/// traced function's `struct sock *`).
#[inline(always)]
unsafe fn tcp_sock<S>(sk: *mut S) -> *const u8 {
    // SAFETY: the helper takes any socket pointer and returns its `struct tcp_sock` or
    // null.
    unsafe { bpf_skc_to_tcp_sock(sk.cast()) }
        .cast::<u8>()
        .cast_const()
}

/// A typed load of a `T` at `tp + off`.
///
/// # Safety
/// `tp` is a non-null `struct tcp_sock` BTF pointer and `off` the offset of a field of
/// type `T` (the verifier checks both against BTF).
#[inline(always)]
unsafe fn field<T>(tp: *const u8, off: u32) -> T {
    // SAFETY: see above.
    unsafe { read_volatile(tp.add(off as usize).cast::<T>()) }
}

/// What an establishing socket's own fields say.
pub(crate) struct Established {
    /// `sk_rcvlowat`.
    pub(crate) rcvlowat: i32,
    /// `sk_peek_off`.
    pub(crate) peek_off: i32,
    /// An upper-layer protocol is attached (`icsk_ulp_ops` set).
    pub(crate) ulp: bool,
    /// `write_seq`: the end of what the application has queued.
    pub(crate) write_seq: u32,
    /// A TCP Fast Open send is connecting (`fastopen_req` set).
    pub(crate) fastopen: bool,
    /// Its bound on what may wait for it ([`receive_bound`]).
    pub(crate) rx_limit: u32,
    /// `SOCK_ZEROCOPY` is set (SO_ZEROCOPY, or inherited from its listener).
    pub(crate) zerocopy: bool,
}

/// The sock_ops context socket's own fields, read typed; `None` if the context has no
/// full TCP socket.
#[inline(always)]
pub(crate) fn established(ops: *const bpf_sock_ops) -> Option<Established> {
    // SAFETY: context field load.
    let sk = unsafe { read_volatile(addr_of!((*ops).__bindgen_anon_2.sk)) };
    if sk.is_null() {
        return None;
    }
    // SAFETY: the context's non-null socket.
    let tp = unsafe { tcp_sock(sk) };
    if tp.is_null() {
        return None;
    }
    // SAFETY: typed loads at offsets the verifier checks against the kernel's BTF.
    unsafe {
        Some(Established {
            rcvlowat: field::<i32>(tp, BYPASS_OFF_SK_RCVLOWAT.load()),
            peek_off: field::<i32>(tp, BYPASS_OFF_SK_PEEK_OFF.load()),
            ulp: field::<u64>(tp, BYPASS_OFF_ICSK_ULP_OPS.load()) != 0,
            write_seq: field::<u32>(tp, BYPASS_OFF_TCP_WRITE_SEQ.load()),
            fastopen: field::<u64>(tp, BYPASS_OFF_TCP_FASTOPEN_REQ.load()) != 0,
            rx_limit: limit_of(tp),
            zerocopy: zerocopy_of(tp),
        })
    }
}

/// Whether `SOCK_ZEROCOPY` is set in the socket's `sk_flags` (false where the agent
/// found no such field or bit).
///
/// # Safety
/// `tp` is a non-null `struct tcp_sock` BTF pointer.
#[inline(always)]
unsafe fn zerocopy_of(tp: *const u8) -> bool {
    let at = BYPASS_OFF_SK_FLAGS.load();
    if at == 0 {
        return false;
    }
    // SAFETY: a typed load at an offset the verifier checks against the kernel's BTF.
    let flags = unsafe { field::<u64>(tp, at) };
    flags & (1u64 << (BYPASS_SOCK_ZEROCOPY.load() & 63)) != 0
}

/// A socket's bound, from its `sk_rcvbuf` and `sk_userlocks` (the latter only where it
/// is a byte: without it, the global bound).
///
/// # Safety
/// `tp` is a non-null `struct tcp_sock` BTF pointer.
#[inline(always)]
unsafe fn limit_of(tp: *const u8) -> u32 {
    let locks_at = BYPASS_OFF_SK_USERLOCKS.load();
    if locks_at == 0 {
        return 0;
    }
    // SAFETY: typed loads at offsets the verifier checks against the kernel's BTF.
    unsafe {
        receive_bound(
            field::<i32>(tp, BYPASS_OFF_SK_RCVBUF.load()),
            field::<u8>(tp, locks_at),
        )
    }
}

/// What sk_msg reads of its own socket (`msg->sk`) on every send.
pub(crate) struct Sending {
    /// `write_seq`.
    pub(crate) write_seq: u32,
    /// An upper-layer protocol is attached (`icsk_ulp_ops` set).
    pub(crate) ulp: bool,
    /// Its `struct tcp_sock` (non-null), for [`Sending::tcp_memory_allocated`]: one
    /// helper call per send.
    tp: *const u8,
}

/// The sk_msg context's socket's own fields, read typed; `None` if it is not a full TCP
/// socket.
#[inline(always)]
pub(crate) fn sending(sk: *mut bpf_sock) -> Option<Sending> {
    // SAFETY: the context's non-null socket.
    let tp = unsafe { tcp_sock(sk) };
    if tp.is_null() {
        return None;
    }
    // SAFETY: typed loads at offsets the verifier checks against the kernel's BTF.
    unsafe {
        Some(Sending {
            write_seq: field::<u32>(tp, BYPASS_OFF_TCP_WRITE_SEQ.load()),
            ulp: field::<u64>(tp, BYPASS_OFF_ICSK_ULP_OPS.load()) != 0,
            tp,
        })
    }
}

impl Sending {
    /// The pages of TCP memory the node holds (`*sk->sk_prot->memory_allocated`, the
    /// counter `tcp_mem` limits: the same for every TCP socket), read typed through the
    /// sending socket; `None` where the agent found no such fields.
    #[inline(always)]
    pub(crate) fn tcp_memory_allocated(&self) -> Option<i64> {
        let prot_at = BYPASS_OFF_SK_PROT.load();
        let allocated_at = BYPASS_OFF_PROTO_MEMORY_ALLOCATED.load();
        if prot_at == 0 || allocated_at == 0 {
            return None;
        }
        // SAFETY: `tp` is the non-null `struct tcp_sock` `sending` found; typed loads,
        // each at an offset the verifier checks against the kernel's BTF: `struct
        // sock_common`'s `skc_prot` (a `struct proto *`), that struct's
        // `memory_allocated` (an `atomic_long_t *`), and its `counter`, at offset 0.
        unsafe {
            let prot = field::<*const u8>(self.tp, prot_at);
            if prot.is_null() {
                return None;
            }
            let allocated = field::<*const u8>(prot, allocated_at);
            if allocated.is_null() {
                return None;
            }
            Some(field::<i64>(allocated, 0))
        }
    }
}

/// What a reader publishes when it leaves `tcp_bpf_recvmsg`: its socket's
/// `copied_seq` and bound.
pub(crate) struct Reading {
    /// `copied_seq`.
    pub(crate) copied_seq: u32,
    /// Its bound ([`receive_bound`]).
    pub(crate) rx_limit: u32,
    /// Whether an urgent byte at `urg_seq` was stepped over, and `urg_seq`: never
    /// claimed (see [`reading`]).
    pub(crate) urg: (bool, u32),
    /// Whether the FIN was read (`SOCK_DONE`, `copied_seq` at `rcv_nxt`), and its
    /// sequence number.
    pub(crate) fin: (bool, u32),
}

/// A traced function's socket argument's fields, read typed.
///
/// # Safety
/// `sk` must be a `struct sock *` argument of the traced function (a BTF pointer).
#[inline(always)]
pub(crate) unsafe fn reading(sk: *mut c_void) -> Option<Reading> {
    // SAFETY: the caller passes a traced socket argument.
    let tp = unsafe { tcp_sock(sk) };
    if tp.is_null() {
        return None;
    }
    // SAFETY: typed loads at offsets the verifier checks against the kernel's BTF.
    unsafe {
        let copied_seq = field::<u32>(tp, BYPASS_OFF_TCP_COPIED_SEQ.load());
        let mut fin = (false, 0);
        if queued_fields() {
            // rcv_nxt on both sides of the flags: the FIN moved it before tcp_fin set
            // SOCK_DONE, and a FIN is taken only where both reads agree.
            let before = field::<u32>(tp, BYPASS_OFF_TCP_RCV_NXT.load());
            let flags = field::<u64>(tp, BYPASS_OFF_SK_FLAGS.load());
            let rcv_nxt = field::<u32>(tp, BYPASS_OFF_TCP_RCV_NXT.load());
            let done = flags & (1u64 << (BYPASS_SOCK_DONE.load() & 63)) != 0;
            fin = (
                done && before == rcv_nxt && copied_seq == rcv_nxt,
                rcv_nxt.wrapping_sub(1),
            );
        }
        // An urgent byte TCP stepped over is not told apart: `urg_seq` outlives its
        // byte (and is 0 on a socket that never had one), so a step over it proves
        // nothing; counted as read from TCP, it leaves what was read from the ingress
        // queue one short, the safe side.
        Some(Reading {
            copied_seq,
            rx_limit: limit_of(tp),
            urg: (false, 0),
            fin,
        })
    }
}

/// The `struct sock *` of a `struct socket *` (the read guard has a file's socket).
///
/// # Safety
/// `sock` must be a non-null `struct socket` BTF pointer (from `bpf_sock_from_file`).
#[inline(always)]
pub(crate) unsafe fn socket_sk(sock: *const u8) -> *mut c_void {
    // SAFETY: a typed load of `struct socket`'s `sk` member.
    unsafe { field::<*mut c_void>(sock, BYPASS_OFF_SOCKET_SK.load()) }
}

/// `SK_USER_DATA_PSOCK` (include/net/sock.h): `sk_user_data` points to a psock.
const SK_USER_DATA_PSOCK: u64 = 4;

/// What the FIONREAD compensation reads of a traced socket: whether it has a psock now,
/// and the bytes waiting in its TCP receive queue as `tcp_inq` counts them.
pub(crate) struct Queued {
    /// The socket has a psock (it is in a SockHash), so its FIONREAD went through
    /// sockmap's answer.
    pub(crate) psock: bool,
    /// `tcp_inq`: what came by TCP and was not read yet, the FIN not counted, up to an
    /// urgent byte not read inline.
    pub(crate) tcp_inq: u32,
    /// `sk_rmem_alloc`: what the receive queues hold (redirected bytes at their size,
    /// TCP's at their buffers' size), never below 0.
    pub(crate) rmem_alloc: u32,
    /// What `recv(MSG_OOB)` would get from TCP now: `Err(EINVAL)` when no urgent byte
    /// is to be read (tcp_recv_urg, net/ipv4/tcp.c: inline, none, or already read),
    /// `Ok(true)` when one is there (`TCP_URG_VALID`), `Ok(false)` when one is announced
    /// and not arrived (`TCP_URG_NOTYET`).
    pub(crate) urgent: Result<bool, i32>,
}

/// `TCP_URG_READ` (include/net/tcp.h): the urgent byte was read.
const TCP_URG_READ: u16 = 0x0400;
/// `TCP_URG_VALID`: the urgent byte is in `urg_data`'s low byte.
const TCP_URG_VALID: u16 = 0x0100;
/// `EINVAL`.
const EINVAL: i32 = 22;

/// `tcp_inq` of the socket at `tp` (include/net/tcp.h), for an established socket.
///
/// # Safety
/// `tp` is a non-null `struct tcp_sock` BTF pointer; the FIONREAD compensation's
/// fields are known (the agent loads it only then).
#[inline(always)]
unsafe fn tcp_inq(tp: *const u8) -> u32 {
    // SAFETY: typed loads at offsets the verifier checks against the kernel's BTF. No
    // socket lock is held (tcp_inq runs under one): copied_seq is read first, so a read
    // moving it in between makes the difference smaller, never wrap (checked below).
    let (copied, rcv_nxt, urg_data, urg_seq, flags) = unsafe {
        (
            field::<u32>(tp, BYPASS_OFF_TCP_COPIED_SEQ.load()),
            field::<u32>(tp, BYPASS_OFF_TCP_RCV_NXT.load()),
            field::<u16>(tp, BYPASS_OFF_TCP_URG_DATA.load()),
            field::<u32>(tp, BYPASS_OFF_TCP_URG_SEQ.load()),
            field::<u64>(tp, BYPASS_OFF_SK_FLAGS.load()),
        )
    };
    let bit = |b: u32| flags & (1u64 << (b & 63)) != 0;
    let before = |a: u32, b: u32| (a.wrapping_sub(b) as i32) < 0;
    if bit(BYPASS_SOCK_URGINLINE.load())
        || urg_data == 0
        || before(urg_seq, copied)
        || !before(urg_seq, rcv_nxt)
    {
        if before(rcv_nxt, copied) {
            return 0;
        }
        let answer = rcv_nxt.wrapping_sub(copied);
        if answer != 0 && bit(BYPASS_SOCK_DONE.load()) {
            answer - 1
        } else {
            answer
        }
    } else {
        // urg_seq lies between copied_seq and rcv_nxt here.
        urg_seq.wrapping_sub(copied)
    }
}

/// Whether every field [`queued`] reads is known on this kernel (the agent's
/// `KernelLayout::fionread_fields`): an unknown one is offset 0.
#[inline(always)]
pub(crate) fn queued_fields() -> bool {
    BYPASS_OFF_SK_USER_DATA.load() != 0
        && BYPASS_OFF_SK_BACKLOG.load() != 0
        && BYPASS_OFF_TCP_RCV_NXT.load() != 0
        && BYPASS_OFF_TCP_URG_DATA.load() != 0
        && BYPASS_OFF_TCP_URG_SEQ.load() != 0
        && BYPASS_OFF_SK_FLAGS.load() != 0
        && BYPASS_SOCK_DONE.load() != 0
        && BYPASS_SOCK_URGINLINE.load() != 0
}

/// A traced socket argument's psock bit and `tcp_inq`; `None` if it is not a full TCP
/// socket.
///
/// # Safety
/// `sk` must be a `struct sock *` argument of the traced function (a BTF pointer).
#[inline(always)]
pub(crate) unsafe fn queued(sk: *mut c_void) -> Option<Queued> {
    // SAFETY: the caller passes a traced socket argument.
    let tp = unsafe { tcp_sock(sk) };
    if tp.is_null() {
        return None;
    }
    // SAFETY: typed loads at offsets the verifier checks against the kernel's BTF.
    unsafe {
        let urg_data = field::<u16>(tp, BYPASS_OFF_TCP_URG_DATA.load());
        let flags = field::<u64>(tp, BYPASS_OFF_SK_FLAGS.load());
        let inline = flags & (1u64 << (BYPASS_SOCK_URGINLINE.load() & 63)) != 0;
        Some(Queued {
            psock: field::<u64>(tp, BYPASS_OFF_SK_USER_DATA.load()) & SK_USER_DATA_PSOCK != 0,
            tcp_inq: tcp_inq(tp),
            rmem_alloc: field::<i32>(tp, BYPASS_OFF_SK_BACKLOG.load()).max(0) as u32,
            urgent: if inline || urg_data == 0 || urg_data & TCP_URG_READ != 0 {
                Err(EINVAL)
            } else {
                Ok(urg_data & TCP_URG_VALID != 0)
            },
        })
    }
}
