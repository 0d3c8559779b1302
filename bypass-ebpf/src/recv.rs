//! The reader's side of a connection's accounting. After each read of a bypassed
//! socket through `recvmsg` (the `sock_recv_length` tracepoint, Linux >= 6.4; before
//! that, the return of `tcp_bpf_recvmsg`), the socket publishes in its link what a
//! sender needs of its peer, without either reading the other's memory:
//! - how many redirected bytes it has read out of its ingress queue (`rx_read`): what
//!   its reads returned less what came by TCP (`bypass_common::state::ingress_read`),
//!   so its peer knows what still waits for it;
//! - how far it has read what came by TCP (`rx_copied`): its peer goes back from TCP to
//!   redirects only once it has read every byte sent by TCP. A reader still blocked
//!   inside plain `tcp_recvmsg` (MSG_WAITALL) has not returned, so what it copied is
//!   not published yet, and its peer keeps TCP;
//! - its bound (`rx_limit`), from its receive buffer.

use core::{
    ffi::c_void,
    ptr::{addr_of, addr_of_mut, read_volatile, write_volatile},
};

use aya_ebpf::{
    helpers::generated::bpf_get_current_pid_tgid,
    macros::{btf_tracepoint, fexit},
    programs::{BtfTracePointContext, FExitContext},
};
use bypass_common::{
    SockState,
    state::{flags, ingress_read, rx, side},
};

use crate::{
    atomic, kernel, leave,
    maps::{BYPASS_LINKS, BYPASS_SPLICERS, sock_state},
};

/// `MSG_PEEK` (include/linux/socket.h): a read that leaves the bytes queued.
const MSG_PEEK: i32 = 2;

#[btf_tracepoint(function = "sock_recv_length")]
pub fn bypass_read(ctx: BtfTracePointContext) -> i32 {
    // TP_PROTO(struct sock *sk, int ret, int flags), after sock_recvmsg
    // (include/trace/events/sock.h).
    let (sk, read, flags): (*mut c_void, i32, i32) = (ctx.arg(0), ctx.arg(1), ctx.arg(2));
    on_read(sk, read, flags);
    0
}

#[fexit(function = "tcp_bpf_recvmsg")]
pub fn bypass_read_exit(ctx: FExitContext) -> i32 {
    // int tcp_bpf_recvmsg(struct sock *sk, struct msghdr *msg, size_t len, int flags,
    // ...): the flags are the fourth argument on every kernel this attaches to.
    let sk: *mut c_void = ctx.arg(0);
    let flags: i32 = ctx.arg(3);
    let Ok(read) = ctx.ret::<i32>() else {
        return 0;
    };
    on_read(sk, read, flags);
    0
}

/// A read of `sk` returned `read` (bytes or an error) with `flags`.
#[inline(always)]
fn on_read(sk: *mut c_void, read: i32, flags: i32) {
    if sk.is_null() || flags & MSG_PEEK != 0 {
        return;
    }
    // SAFETY: a traced socket argument; the helper returns its storage or null.
    let Some(state) = (unsafe { sock_state(sk, false) }) else {
        return;
    };
    // SAFETY: non-null storage of that socket, sized for a `SockState`.
    let state = unsafe { &mut *state };
    if state.side == side::NONE {
        return;
    }
    let total = if read > 0 {
        // SAFETY: a field of live socket storage; readers may run at once.
        unsafe {
            atomic::add_u64(addr_of_mut!(state.read_total), read as u64);
            atomic::load_ordered(addr_of_mut!(state.read_total))
        }
    } else {
        // SAFETY: as above, read only.
        unsafe { read_volatile(addr_of!(state.read_total)) }
    };
    // SAFETY: the traced socket.
    let Some(r) = (unsafe { kernel::reading(sk) }) else {
        return;
    };
    publish(state, total, &r);
}

/// Publishes the reader's numbers in its link.
// Keys are passed by reference on purpose: by value they would be copied onto the
// 512-byte BPF stack.
#[allow(clippy::needless_borrows_for_generic_args)]
#[inline(always)]
fn publish(state: &mut SockState, total: u64, r: &kernel::Reading) {
    let Some(ptr) = BYPASS_LINKS.get_ptr_mut(&state.link) else {
        return;
    };
    let me = side::index(state.side);
    // SAFETY: a live map value; this side's own fields. The cookie says the element is
    // still this socket's link (elements are reused at once after a delete; a link
    // goes only when both its sockets have closed, and this one is being read).
    unsafe {
        if read_volatile(addr_of!((*ptr).cookie[me])) != state.cookie {
            return;
        }
        if state.flags & flags::RX_FROZEN == 0 {
            write_volatile(
                addr_of_mut!((*ptr).rx_read[me]),
                ingress_read(total, r.copied_seq, state.copied_base),
            );
        }
        write_volatile(addr_of_mut!((*ptr).rx_copied[me]), r.copied_seq);
        write_volatile(addr_of_mut!((*ptr).rx_limit[me]), r.rx_limit);
        // Where the read guard cannot run: a process that splices gets no redirected
        // bytes from now on (its peer takes TCP, and this reads what waits first).
        // SAFETY: no arguments.
        let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
        if BYPASS_SPLICERS.get_ptr(&tgid).is_some()
            && read_volatile(addr_of!((*ptr).rx_flags[me])) & rx::SPLICE == 0
        {
            atomic::or_u64(addr_of_mut!((*ptr).rx_flags[me]), rx::SPLICE);
        }
    }
    leave::check_cut(state, ptr);
}
