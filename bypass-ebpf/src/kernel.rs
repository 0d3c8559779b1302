//! What the programs read of kernel structures, and the read-only globals the agent
//! fixes at load (`bypass_common::layout`).
//!
//! A socket's own fields are read typed: `bpf_skc_to_tcp_sock` on the context's socket
//! gives a BTF pointer, and a load at `pointer + OFFSET` (a frozen read-only global, so
//! a constant to the verifier) is checked against the kernel's own `struct tcp_sock`:
//! a wrong offset fails the load, never reads another field. Nothing is kept.
//!
//! The one read of another socket, its peer's ingress queue length for the queue bound,
//! cannot be typed: sk_msg may not hold a reference to another socket (a SockHash
//! lookup returns a counted reference and `bpf_sk_release` is not allowed there), so it
//! goes through `bpf_probe_read_kernel` at the address the peer published, and only
//! after reading the peer's socket cookie back at that address: cookies are unique and
//! never reused, and a freed or reused socket has another (or none), so a stale
//! address yields "cannot measure", never another socket's numbers. A probe read never
//! faults. With [`features::QUEUE_BOUND`] off that code is dead to the verifier, which
//! then loads the object where the helper is unavailable (kernel lockdown).

use core::ptr::{addr_of, read_volatile};

use aya_ebpf::{
    Global,
    bindings::{bpf_sock, bpf_sock_ops},
    helpers::{bpf_probe_read_kernel, generated::bpf_skc_to_tcp_sock},
};
use bypass_common::{layout::features, state::psock_of};

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
static BYPASS_OFF_SK_USER_DATA: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static BYPASS_OFF_SK_COOKIE: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static BYPASS_OFF_PSOCK_MSG_TOT_LEN: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static BYPASS_FEATURES: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static BYPASS_HOST_NETNS: Global<u64> = Global::new(0);

/// The host's network namespace cookie.
#[inline(always)]
pub(crate) fn host_netns() -> u64 {
    BYPASS_HOST_NETNS.load()
}

/// Whether the sk_msg program measures and bounds its peer's queue.
#[inline(always)]
pub(crate) fn bound_enabled() -> bool {
    BYPASS_FEATURES.load() & features::QUEUE_BOUND != 0
}

/// What an establishing socket's own fields say.
pub(crate) struct Own {
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
}

/// The sock_ops context socket's own fields, read typed; `None` if the context has no
/// full TCP socket.
#[inline(always)]
pub(crate) fn own(ops: *const bpf_sock_ops) -> Option<Own> {
    // SAFETY: context field load.
    let sk = unsafe { read_volatile(addr_of!((*ops).__bindgen_anon_2.sk)) };
    if sk.is_null() {
        return None;
    }
    // SAFETY: `sk` is the context's non-null socket; the helper returns a BTF pointer
    // to its `struct tcp_sock`, or null.
    let tp = unsafe { bpf_skc_to_tcp_sock(sk.cast()) }.cast::<u8>();
    if tp.is_null() {
        return None;
    }
    // SAFETY: typed loads at offsets the verifier checks against the kernel's BTF.
    unsafe {
        let rcvlowat = read_volatile(tp.add(BYPASS_OFF_SK_RCVLOWAT.load() as usize).cast::<i32>());
        let peek_off = read_volatile(tp.add(BYPASS_OFF_SK_PEEK_OFF.load() as usize).cast::<i32>());
        let ulp = read_volatile(
            tp.add(BYPASS_OFF_ICSK_ULP_OPS.load() as usize)
                .cast::<u64>(),
        );
        let write_seq = read_volatile(
            tp.add(BYPASS_OFF_TCP_WRITE_SEQ.load() as usize)
                .cast::<u32>(),
        );
        let fastopen = read_volatile(
            tp.add(BYPASS_OFF_TCP_FASTOPEN_REQ.load() as usize)
                .cast::<u64>(),
        );
        Some(Own {
            rcvlowat,
            peek_off,
            ulp: ulp != 0,
            write_seq,
            fastopen: fastopen != 0,
        })
    }
}

/// What sk_msg reads of its own socket (`msg->sk`) on every send.
pub(crate) struct Sending {
    /// `write_seq`.
    pub(crate) write_seq: u32,
    /// An upper-layer protocol is attached (`icsk_ulp_ops` set).
    pub(crate) ulp: bool,
}

/// The sk_msg context's socket's own fields, read typed; `None` if it is not a full TCP
/// socket.
#[inline(always)]
pub(crate) fn sending(sk: *mut bpf_sock) -> Option<Sending> {
    // SAFETY: `sk` is the context's non-null socket; the helper returns a BTF pointer
    // to its `struct tcp_sock`, or null.
    let tp = unsafe { bpf_skc_to_tcp_sock(sk.cast()) }.cast::<u8>();
    if tp.is_null() {
        return None;
    }
    // SAFETY: typed loads at offsets the verifier checks against the kernel's BTF.
    unsafe {
        Some(Sending {
            write_seq: read_volatile(
                tp.add(BYPASS_OFF_TCP_WRITE_SEQ.load() as usize)
                    .cast::<u32>(),
            ),
            ulp: read_volatile(
                tp.add(BYPASS_OFF_ICSK_ULP_OPS.load() as usize)
                    .cast::<u64>(),
            ) != 0,
        })
    }
}

#[inline(always)]
fn read_u32(addr: u64) -> Option<u32> {
    // SAFETY: a probe read copies or fails; it never dereferences in BPF.
    unsafe { bpf_probe_read_kernel(addr as *const u32) }.ok()
}

#[inline(always)]
fn read_u64(addr: u64) -> Option<u64> {
    // SAFETY: as above.
    unsafe { bpf_probe_read_kernel(addr as *const u64) }.ok()
}

/// Bytes waiting in the ingress queue of the socket published at `sk` with `cookie`,
/// or `None` when that address no longer holds that socket (or it has no psock).
#[inline(always)]
pub(crate) fn peer_queued(sk: u64, cookie: u64) -> Option<u64> {
    if sk == 0 || cookie == 0 {
        return None;
    }
    if read_u64(sk + u64::from(BYPASS_OFF_SK_COOKIE.load()))? != cookie {
        return None;
    }
    let psock = psock_of(read_u64(sk + u64::from(BYPASS_OFF_SK_USER_DATA.load()))?)?;
    let queued = read_u32(psock + u64::from(BYPASS_OFF_PSOCK_MSG_TOT_LEN.load()))?;
    // Still the same socket after the reads: nothing above came from a reused one.
    if read_u64(sk + u64::from(BYPASS_OFF_SK_COOKIE.load()))? != cookie {
        return None;
    }
    Some(u64::from(queued))
}
