//! cgroup setsockopt: runs before the kernel applies any setsockopt in the cgroup. Only
//! inserted sockets are looked at; every other call passes untouched.
//!
//! - `TCP_ULP` on a socket that was ever inserted is refused (EPERM). An upper-layer protocol would
//!   see its bytes redirected around it: kTLS runs the sk_msg verdict on the plaintext
//!   record before encrypting (net/tls/tls_sw.c, bpf_exec_tx_verdict), so a redirect
//!   hands the peer plaintext where TCP carries a TLS record, and a kTLS receiver reads
//!   redirected bytes as already decrypted. TLS libraries fall back to user-space TLS
//!   when the kernel refuses.
//! - SO_RCVLOWAT that leaves a low-water mark above 1 (any value above 1, or below 0,
//!   which the kernel makes INT_MAX) or SO_PEEK_OFF on an inserted socket are recorded
//!   in its link: the ingress queue honours neither, so its peer sends to it by TCP
//!   from then on. SO_PEEK_OFF is refused (EPERM) while bytes redirected to the socket
//!   wait unread: a peek there starts at the queue's head whatever the offset.
//! - SO_ZEROCOPY on a socket that was ever inserted is refused (EPERM): a socket in a
//!   sockmap copies every send into an `sk_msg`, so MSG_ZEROCOPY would get no
//!   completion notifications, or notifications for other ids. Applications fall back
//!   to copying sends when the kernel refuses. A socket that turns it on before it is
//!   established (or inherits it from its listener) is never inserted (sock_ops reads
//!   its `SOCK_ZEROCOPY` flag).

use core::ptr::{addr_of, addr_of_mut, read_volatile, write_volatile};

use aya_ebpf::{
    bindings::{SO_PEEK_OFF, SO_RCVLOWAT, SOL_SOCKET},
    macros::cgroup_sockopt,
    programs::SockoptContext,
};
use bypass_common::{
    SockState, Stat,
    state::{flags, ingress_read, options_need_tcp, rcvlowat_needs_tcp, rx, side},
};

use crate::{
    atomic, kernel,
    maps::{BYPASS_CONNECTORS, BYPASS_LINKS, sock_state},
    stats,
};

/// The smallest page size: the kernel copies at most a page of an option for the
/// programs.
const MIN_PAGE_SIZE: i32 = 4096;

/// `SOL_TCP` (`IPPROTO_TCP`).
const SOL_TCP: i32 = 6;
/// `TCP_ULP` (include/uapi/linux/tcp.h).
const TCP_ULP: i32 = 31;
/// `SO_ZEROCOPY` (include/uapi/asm-generic/socket.h).
const SO_ZEROCOPY: i32 = 60;

#[cgroup_sockopt(setsockopt)]
pub fn bypass_sockopt(ctx: SockoptContext) -> i32 {
    let verdict = check(&ctx);
    // An option longer than the page the kernel copied for the programs: optlen 0 makes
    // the kernel use the caller's own buffer, untouched (older kernels otherwise fail it
    // with EFAULT, kernel/bpf/cgroup.c, __cgroup_bpf_run_filter_setsockopt). Any other
    // optlen is left as it is, so a rewrite by another setsockopt program that ran
    // before this one stands.
    // SAFETY: `optlen` is a readable and writable context field of setsockopt programs.
    unsafe {
        let optlen = addr_of_mut!((*ctx.sockopt).optlen);
        if read_volatile(optlen) > MIN_PAGE_SIZE {
            write_volatile(optlen, 0);
        }
    }
    verdict
}

/// 1 lets the call through, 0 refuses it with EPERM.
#[inline(always)]
fn check(ctx: &SockoptContext) -> i32 {
    let c = ctx.sockopt;
    // SAFETY: context field loads.
    let (level, optname) = unsafe {
        (
            read_volatile(addr_of!((*c).level)),
            read_volatile(addr_of!((*c).optname)),
        )
    };
    let ulp = level == SOL_TCP && optname == TCP_ULP;
    let lowat = level == SOL_SOCKET as i32 && optname == SO_RCVLOWAT as i32;
    let peek_off = level == SOL_SOCKET as i32 && optname == SO_PEEK_OFF as i32;
    let zerocopy = level == SOL_SOCKET as i32 && optname == SO_ZEROCOPY;
    if !(ulp || lowat || peek_off || zerocopy) {
        return 1;
    }
    // SAFETY: context field load.
    let sk = unsafe { read_volatile(addr_of!((*c).__bindgen_anon_1.sk)) };
    if sk.is_null() {
        return 1;
    }
    // SAFETY: `sk` is this program's context socket, checked non-null above.
    let Some(state) = (unsafe { sock_state(sk, false) }) else {
        return 1;
    };
    // SAFETY: non-null storage of this socket, sized for a `SockState`; the hook runs
    // under the socket's lock.
    let state = unsafe { &mut *state };
    // Once inserted, a socket keeps its psock, and redirected bytes may wait in its
    // ingress queue, until it is freed: also after a close or a disconnect
    // (connect(AF_UNSPEC)) that took it out of the map.
    let ever_inserted = state.side != side::NONE || state.flags & flags::INSERTED != 0;
    if ulp && ever_inserted {
        stats::add(Stat::UlpRefused, 1);
        return 0;
    }
    if zerocopy {
        // Only 1 turns it on; any other value but 0 gets the kernel's own EINVAL.
        if ever_inserted && int_value(ctx) == Some(1) {
            stats::add(Stat::ZerocopyRefused, 1);
            return 0;
        }
        return 1;
    }
    if ulp || state.side == side::NONE || state.flags & flags::CLOSED != 0 {
        return 1;
    }
    let Some(value) = int_value(ctx) else {
        return 1;
    };
    let needs_tcp = if lowat {
        rcvlowat_needs_tcp(value)
    } else {
        options_need_tcp(1, value)
    };
    if needs_tcp {
        record_rx_tcp(state);
        // The ingress queue peeks from its head whatever the offset, so with
        // redirected bytes still queued a second peek would repeat the first: refused
        // rather than applied and ignored. Its peer sends by TCP from now on (recorded
        // above), so once the reader has read the queue out, the call succeeds again.
        if peek_off && kernel::tcp_peek_off() && redirected_unread(state) {
            stats::add(Stat::PeekOffRefused, 1);
            return 0;
        }
    }
    1
}

/// Whether bytes redirected to the socket with `state` wait unread in its ingress
/// queue. Called after [`record_rx_tcp`]: its fully ordered or of the option bit and
/// this fully ordered load of the peer's count pair with sk_msg's claim (add, then read
/// the bit), so a send either is counted here or sees the bit and takes TCP.
#[inline(always)]
fn redirected_unread(state: &SockState) -> bool {
    let Some(l) = BYPASS_LINKS.get_ptr_mut(&state.link) else {
        return false;
    };
    let me = side::index(state.side);
    // SAFETY: a live map value: its cookie read, the peer's count loaded.
    unsafe {
        if read_volatile(addr_of!((*l).cookie[me])) != state.cookie {
            return false;
        }
        let due = atomic::load_ordered(addr_of_mut!((*l).tx_redir[side::peer_index(state.side)]));
        due > ingress_read(state.read_total, state.tcp_total)
    }
}

/// The option's value as an `int`, when the caller passed at least four bytes.
#[inline(always)]
fn int_value(ctx: &SockoptContext) -> Option<i32> {
    let c = ctx.sockopt;
    // SAFETY: context field loads; the value is read only after the verifier-visible
    // bounds check against `optval_end`.
    unsafe {
        let start = read_volatile(addr_of!((*c).__bindgen_anon_2.optval)).cast::<u8>();
        let end = read_volatile(addr_of!((*c).__bindgen_anon_3.optval_end)).cast::<u8>();
        if start.add(4) > end {
            return None;
        }
        Some(read_volatile(start.cast::<i32>()))
    }
}

/// Records that the socket with `state` needs its peer's bytes by TCP, where its peer
/// reads it: the connector until paired, the link once paired.
///
/// The accepting side writes the link, then reads the connector; this writes the
/// connector, then reads the link, each with a fully ordered atomic between its write
/// and its read (`crate::atomic`), so one of them sees the other's write.
#[inline(always)]
fn record_rx_tcp(state: &mut SockState) {
    record_connector_rx_tcp(state);
    if let Some(link) = BYPASS_LINKS.get_ptr_mut(&state.link) {
        let me = side::index(state.side);
        // SAFETY: a live map value: its cookie read, this side's flags or-ed.
        unsafe {
            if read_volatile(addr_of!((*link).cookie[me])) == state.cookie {
                atomic::or_u64(addr_of_mut!((*link).rx_flags[me]), rx::OPTION);
            }
        }
    }
}

/// The first half of [`record_rx_tcp`]: the socket's own flag and, for a client, its
/// connector's (fully ordered), which the accepting side copies into the link it
/// writes. The caller looks the link up after it.
#[inline(always)]
pub(crate) fn record_connector_rx_tcp(state: &mut SockState) {
    state.rx_tcp = 1;
    if state.side == side::CLIENT {
        let end = state.key.local_end();
        if let Some(c) = BYPASS_CONNECTORS.get_ptr_mut(&end) {
            // SAFETY: a live map value: its key read, its flag or-ed.
            unsafe {
                if (*c).key == state.key {
                    atomic::or_u64(addr_of_mut!((*c).rx_tcp), 1);
                }
            }
        }
    }
}
