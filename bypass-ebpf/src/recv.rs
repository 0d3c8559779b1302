//! The reader's side of a connection's accounting. After each read of a bypassed
//! socket through `recvmsg` (where the kernel runs BPF trampolines, the return of
//! `tcp_bpf_recvmsg`; elsewhere the `sock_recv_length` tracepoint, Linux >= 6.4), the
//! socket publishes in its link what a sender needs of its peer, without either
//! reading the other's memory:
//! - how many redirected bytes it has read out of its ingress queue (`rx_read`): what
//!   its reads returned less what it read from its TCP queue
//!   (`bypass_common::state::ingress_read`), so its peer knows what still waits for it;
//! - how far it has read what came by TCP (`rx_copied`): its peer goes back from TCP to
//!   redirects only once it has read every byte sent by TCP. A reader still blocked
//!   inside plain `tcp_recvmsg` (MSG_WAITALL) has not returned, so what it copied is
//!   not published yet, and its peer keeps TCP; where trampolines run, the entry of
//!   `tcp_bpf_recvmsg` counts the readers inside, and only the last one out publishes
//!   `rx_copied`, so another thread's read cannot publish it for that one;
//! - its bound (`rx_limit`), from its receive buffer.

use core::{
    ffi::c_void,
    ptr::{addr_of, addr_of_mut, read_volatile, write_volatile},
};

use aya_ebpf::{
    helpers::generated::bpf_get_current_pid_tgid,
    macros::{btf_tracepoint, fentry, fexit},
    programs::{BtfTracePointContext, FEntryContext, FExitContext},
};
use bypass_common::{
    SockState,
    state::{flags, ingress_read, rx, side, skipped_seqs, tcp_read_step},
};

use crate::{
    atomic, kernel, leave,
    maps::{BYPASS_LINKS, BYPASS_SPLICERS, sock_state},
};

/// `MSG_PEEK`, `MSG_OOB` and `MSG_ERRQUEUE` (include/linux/socket.h): reads that
/// leave the stream's bytes queued, return the urgent byte (which `copied_seq` does
/// not count), or return the error queue's (a timestamped copy of sent bytes): none of
/// them reads the ingress queue.
const NOT_STREAM_READS: i32 = 2 | 1 | 0x2000;

#[btf_tracepoint(function = "sock_recv_length")]
pub fn bypass_read(ctx: BtfTracePointContext) -> i32 {
    // TP_PROTO(struct sock *sk, int ret, int flags), after sock_recvmsg
    // (include/trace/events/sock.h). No reader is counted here: every read publishes.
    let (sk, read, flags): (*mut c_void, i32, i32) = (ctx.arg(0), ctx.arg(1), ctx.arg(2));
    if kernel::hooks_active() {
        on_read(sk, read, flags, true);
    }
    0
}

#[fentry(function = "tcp_bpf_recvmsg")]
pub fn bypass_read_enter(ctx: FEntryContext) -> i32 {
    if !kernel::hooks_active() {
        return 0;
    }
    let sk: *mut c_void = ctx.arg(0);
    if let Some(state) = bypassed(sk) {
        // SAFETY: a field of live socket storage; readers may run at once.
        unsafe { atomic::add_u64(addr_of_mut!(state.readers), 1) };
    }
    0
}

#[fexit(function = "tcp_bpf_recvmsg")]
pub fn bypass_read_exit(ctx: FExitContext) -> i32 {
    // int tcp_bpf_recvmsg(struct sock *sk, struct msghdr *msg, size_t len, int flags,
    // int *addr_len) since Linux 5.19, without addr_len once struct proto's recvmsg lost
    // it (7.2, 7.3): flags fourth in both (the agent refuses the older signature).
    if !kernel::hooks_active() {
        return 0;
    }
    let sk: *mut c_void = ctx.arg(0);
    let flags: i32 = ctx.arg(3);
    let Ok(read) = ctx.ret::<i32>() else {
        return 0;
    };
    let Some(state) = bypassed(sk) else {
        return 0;
    };
    // SAFETY: as in the entry. A reader that entered before this program was attached
    // makes the count wrap: then no reader is ever last, and nothing publishes
    // `rx_copied` (its peer stays on TCP), never the other way round.
    let left = unsafe {
        atomic::sub_u64(addr_of_mut!(state.readers), 1);
        atomic::load_ordered(addr_of_mut!(state.readers))
    };
    on_read(sk, read, flags, left == 0);
    0
}

/// The state of `sk` if it is a bypassed socket.
#[inline(always)]
fn bypassed(sk: *mut c_void) -> Option<&'static mut SockState> {
    if sk.is_null() {
        return None;
    }
    // SAFETY: a traced socket argument; the helper returns its storage or null.
    let state = unsafe { sock_state(sk, false) }?;
    // SAFETY: non-null storage of that socket, sized for a `SockState`.
    let state = unsafe { &mut *state };
    (state.side != side::NONE).then_some(state)
}

/// A read of `sk` returned `read` (bytes or an error) with `flags`; `last` when no
/// other read of it is in flight.
#[inline(always)]
fn on_read(sk: *mut c_void, read: i32, flags: i32, last: bool) {
    if flags & NOT_STREAM_READS != 0 {
        return;
    }
    let Some(state) = bypassed(sk) else {
        return;
    };
    // SAFETY: the traced socket.
    let Some(r) = (unsafe { kernel::reading(sk) }) else {
        return;
    };
    // What this read (and any before it) took from the TCP queue, counted before the
    // bytes it returned, so that the difference is never above the truth.
    // SAFETY: fields of live socket storage; readers may run at once.
    let (total, tcp) = unsafe {
        count_tcp_step(state, &r);
        if read > 0 {
            atomic::add_u64(addr_of_mut!(state.read_total), read as u64);
        }
        (
            atomic::load_ordered(addr_of_mut!(state.read_total)),
            atomic::load_ordered(addr_of_mut!(state.tcp_total)),
        )
    };
    // A closed socket's link may be gone, or another connection's already (elements
    // are reused at once): its counts stay its own, for its read guard.
    if state.flags & flags::CLOSED != 0 {
        return;
    }
    publish(state, ingress_read(total, tcp), last, &r);
}

/// Publishes the reader's numbers in its link.
#[inline(always)]
fn publish(state: &mut SockState, read: u64, last: bool, r: &kernel::Reading) {
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
            write_volatile(addr_of_mut!((*ptr).rx_read[me]), read);
        }
        if last {
            write_volatile(addr_of_mut!((*ptr).rx_copied[me]), r.copied_seq);
        }
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

/// Adds to `tcp_total` how far `copied_seq` moved since `copied_last`, and moves
/// `copied_last` there: by compare-and-exchange, so that of readers publishing at once
/// each step is added once (a loser retries from the winner's value). At the last try
/// the step is added without it: counted twice at worst, which only lowers
/// `ingress_read`.
///
/// # Safety
/// `state` is live socket storage.
#[inline(always)]
unsafe fn count_tcp_step(state: &mut SockState, r: &kernel::Reading) {
    let copied_seq = r.copied_seq;
    let last = addr_of_mut!(state.copied_last);
    for attempt in 0..4 {
        // SAFETY: a field of live socket storage.
        let seen = unsafe { read_volatile(last) };
        let step = tcp_read_step(copied_seq, seen as u32);
        if step == 0 {
            return;
        }
        // SAFETY: as above.
        let moved =
            attempt == 3 || unsafe { atomic::cmpxchg_u64(last, seen, u64::from(copied_seq)) };
        if moved {
            if attempt == 3 {
                // SAFETY: as above.
                unsafe { write_volatile(last, u64::from(copied_seq)) };
            }
            // An urgent byte or the FIN stepped over returned nothing: not a byte
            // read from the TCP queue (else what was read from the ingress queue
            // would stay one short for good, and its guard and leaving with it).
            let bytes = step - skipped_seqs(copied_seq, seen as u32, r.urg, r.fin);
            // SAFETY: as above.
            unsafe { atomic::add_u64(addr_of_mut!(state.tcp_total), bytes) };
            return;
        }
    }
}
