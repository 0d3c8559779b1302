//! sk_msg: runs on every send of a socket in the SockHash. Redirects the message to the
//! peer socket's ingress queue when the connection is paired, the bypass is on, the
//! peer reads in a way that sees that queue, has read every byte this socket sent by
//! TCP, and has room under its bound, and the node's TCP memory is not near its limit;
//! otherwise the message takes the normal TCP path.
//! The decision is made afresh on every send (`bypass_common::state::PassReason` says
//! which ones hold). It never drops: every path returns SK_PASS, and
//! `bpf_msg_redirect_hash` changes nothing when the peer is missing
//! (net/core/sock_map.c).

use core::ptr::{addr_of, addr_of_mut, read_volatile};

use aya_ebpf::{
    bindings::{BPF_F_INGRESS, bpf_sock, sk_action::SK_PASS},
    macros::sk_msg,
    programs::SkMsgContext,
};
use bypass_common::{
    Link, SockState, Stat, control,
    state::{
        Hop, PassReason, caught_up, charge, consumed_messages, drains_after_claim, drains_first,
        link_state, pending, precheck, rx, side, small_stream_step, tcp_run_step, within_limit,
    },
    tx_mode,
};

use crate::{
    atomic, kernel, leave,
    maps::{BYPASS_LINKS, BYPASS_SOCKETS, sock_state},
    stats,
};

#[sk_msg]
pub fn bypass_skmsg(ctx: SkMsgContext) -> u32 {
    let size = u64::from(ctx.size());
    match try_redirect(&ctx, size) {
        Ok(kind) => {
            stats::add(Stat::RedirectedMessages, 1);
            stats::add(Stat::RedirectedBytes, size);
            if let Some(kind) = Hop::from_raw(kind) {
                stats::add(Stat::redirected_bytes(kind), size);
            }
        }
        Err(reason) => {
            stats::add(Stat::PassedMessages, 1);
            stats::add(Stat::PassedBytes, size);
            match reason {
                PassReason::QueueFull => stats::add(Stat::QueueLimited, 1),
                PassReason::MemoryTight => stats::add(Stat::MemoryTight, 1),
                _ => {}
            }
        }
    }
    SK_PASS
}

/// Sets up the redirect and returns the connection's hop kind, or says why the message
/// takes the TCP path.
#[inline(always)]
fn try_redirect(ctx: &SkMsgContext, size: u64) -> Result<u32, PassReason> {
    // SAFETY: context field load.
    let sk = unsafe { read_volatile(addr_of!((*ctx.msg).__bindgen_anon_3.sk)) };
    if sk.is_null() {
        return Err(PassReason::Unpaired);
    }
    // SAFETY: `sk` is this program's context socket, checked non-null above.
    let Some(state) = (unsafe { sock_state(sk, false) }) else {
        return Err(PassReason::Unpaired);
    };
    // SAFETY: non-null storage of this socket, sized for a `SockState`. sk_msg runs under
    // the socket's lock (net/ipv4/tcp_bpf.c, tcp_bpf_sendmsg), so this is its only writer
    // of the fields it writes.
    let state = unsafe { &mut *state };
    // A socket that has shut its sending side (shutdown(SHUT_WR), close) or closed
    // (`flags::CLOSED`: TCP_CLOSE) sends nothing more by redirect: tcp_bpf_sendmsg does
    // not look at the socket's state before the verdict, and a redirect would hand its
    // peer bytes after its FIN. TCP's path gives the application TCP's error (EPIPE).
    // SAFETY: context field load of the non-null socket.
    let tcp_state = unsafe { read_volatile(addr_of!((*sk).state)) };
    if !can_send(tcp_state) {
        return Err(PassReason::Unpaired);
    }
    match decide(ctx, sk, state, size) {
        Ok(kind) => {
            if state.tx_mode == tx_mode::TCP {
                stats::add(Stat::Resumed, 1);
            }
            state.tx_mode = tx_mode::REDIRECT;
            Ok(kind)
        }
        Err(reason) => {
            if reason == PassReason::Unpaired
                && state.tx_mode == tx_mode::UNDECIDED
                && state.side == side::CLIENT
            {
                stats::add(Stat::UnpairedSends, 1);
            }
            state.tx_mode = tx_mode::TCP;
            Err(reason)
        }
    }
}

/// Whether a read guard runs on this kernel: the drain of a TCP-only reader
/// ([`drains_first`]) relies on it refusing the reader's splice while bytes wait; without
/// it the reader splices at once, and a drain would only add to what it misses.
#[inline(always)]
fn guarded() -> bool {
    !kernel::feature(bypass_common::layout::features::NO_READ_GUARD)
}

/// `TCP_ESTABLISHED` and `TCP_CLOSE_WAIT` (include/net/tcp_states.h): the states in
/// which a socket may still send.
const TCP_ESTABLISHED: u32 = 1;
const TCP_CLOSE_WAIT: u32 = 8;

/// Whether a socket in `tcp_state` may still send (its sending side is not shut).
#[inline(always)]
fn can_send(tcp_state: u32) -> bool {
    tcp_state == TCP_ESTABLISHED || tcp_state == TCP_CLOSE_WAIT
}

/// A control word (0 when the slot cannot be read).
#[inline(always)]
fn control_word(slot: u32) -> u32 {
    crate::maps::BYPASS_CONTROL.get(slot).copied().unwrap_or(0)
}

#[inline(always)]
fn decide(
    ctx: &SkMsgContext,
    sk: *mut bpf_sock,
    state: &mut SockState,
    size: u64,
) -> Result<u32, PassReason> {
    let enabled = control_word(control::SLOT_ENABLED) == control::ENABLED;
    let ptr = BYPASS_LINKS.get_ptr_mut(&state.link);

    // Copied, then checked: hash map elements are reused at once after a delete (no
    // RCU grace period), so one read in place could mix two connections' links.
    // SAFETY: a live map value, copied.
    let link: Option<Link> = ptr.map(|p| unsafe { *p });
    if let (Some(l), Some(p)) = (&link, ptr)
        && l.is_of(state)
        && leave::check_cut(state, p)
    {
        return Err(PassReason::Leaving);
    }
    if let Some(reason) = precheck(enabled, link.as_ref(), state)
        && !(guarded()
            && link
                .as_ref()
                .is_some_and(|l| drains_first(reason, l, state)))
    {
        if let (Some(p), true) = (ptr, reason.lingers()) {
            linger(state, p, size);
        }
        return Err(reason);
    }
    let (Some(link), Some(ptr)) = (link, ptr) else {
        return Err(PassReason::Unpaired);
    };
    let verdict = claim_and_redirect(ctx, sk, state, size, &link, ptr);
    match verdict {
        Ok(_) => state.tcp_run = 0,
        Err(reason) if reason.lingers() => linger(state, ptr, size),
        Err(_) => {}
    }
    verdict
}

/// Counts `size` bytes sent by TCP while the direction waits to come back; past the
/// limit the connection leaves the SockHash.
#[inline(always)]
fn linger(state: &mut SockState, ptr: *mut Link, size: u64) {
    let (run, leave) = tcp_run_step(
        state.tcp_run,
        size,
        u64::from(control_word(control::SLOT_LEAVE_AFTER)),
    );
    state.tcp_run = run;
    if leave {
        leave::request(ptr, &state.link);
    }
}

/// The checks after the link was found to be this socket's: the peer's progress, the
/// bound, the small-stream rule, then the claim and the redirect.
#[inline(always)]
fn claim_and_redirect(
    ctx: &SkMsgContext,
    sk: *mut bpf_sock,
    state: &mut SockState,
    size: u64,
    link: &Link,
    ptr: *mut Link,
) -> Result<u32, PassReason> {
    let me = side::index(state.side);
    let peer = side::peer_index(state.side);
    let own = kernel::sending(sk).ok_or(PassReason::Unpaired)?;
    if own.ulp {
        return Err(PassReason::Ulp);
    }
    // Near tcp_mem's first threshold the redirect's charge on the peer may be refused,
    // and the kernel would fail this send (ENOMEM); TCP makes it wait instead.
    let tight = control_word(control::SLOT_TCP_MEM_TIGHT);
    if tight != 0
        && own
            .tcp_memory_allocated()
            .is_some_and(|a| control::memory_tight(a, tight))
    {
        return Err(PassReason::MemoryTight);
    }
    // Every byte this socket sent by TCP must be read before a redirected one can be:
    // the peer reads its ingress queue first. (Also bytes that reached TCP past sk_msg:
    // a write blocked in plain tcp_sendmsg while connecting moves write_seq too.)
    if !caught_up(link.rx_copied[peer], own.write_seq) {
        return Err(PassReason::Behind);
    }
    let sent = link.tx_redir[me];
    let read = link.rx_read[peer];
    let (cp_msgs, cp_redir, done) = consumed_messages(
        state.cp_msgs,
        state.cp_redir,
        state.done_msgs,
        state.tx_msgs,
        sent,
        read,
    );
    state.cp_msgs = cp_msgs;
    state.cp_redir = cp_redir;
    state.done_msgs = done;
    let waiting = pending(sent, read);
    let waiting_msgs = state.tx_msgs.saturating_sub(done);
    let limit = match link.rx_limit[peer] {
        0 => control_word(control::SLOT_MAX_QUEUED),
        l => l,
    };
    let due = charge(waiting, waiting_msgs, size, kernel::msg_cost());
    if !within_limit(due, u64::from(limit)) {
        return Err(PassReason::QueueFull);
    }
    let small = u64::from(control_word(control::SLOT_SMALL_STREAM));
    if size < small {
        let (run, stream) = small_stream_step(state.small_run, waiting, waiting_msgs, small);
        state.small_run = run;
        if stream {
            stats::add(Stat::SmallStreams, 1);
            leave::request(ptr, &state.link);
            return Err(PassReason::SmallStream);
        }
    } else {
        // Only small sends in a row count: a length prefix before each large body is
        // not a stream of small messages.
        state.small_run = 0;
    }
    claim(ptr, state, me, peer, size, sent)?;
    let mut target = link.target(state);
    if BYPASS_SOCKETS.redirect_msg(ctx, &mut target, BPF_F_INGRESS.into()) != i64::from(SK_PASS) {
        // SAFETY: a live map value; this socket's own counter.
        unsafe { atomic::sub_u64(addr_of_mut!((*ptr).tx_redir[me]), size) };
        return Err(PassReason::NoPeer);
    }
    state.tx_msgs = state.tx_msgs.wrapping_add(1);
    Ok(link.hop)
}

/// Counts the message as redirected before it is, then looks again at what the peer's
/// read guard, its close and a leave write: the count's compare-and-exchange and the
/// guard's or are both fully ordered atomics (`bypass_common::state::rx`), so either
/// the guard sees these bytes and refuses its splice, or this sees the guard's bit and
/// takes TCP, unless the peer has not read every byte redirected to it yet
/// ([`drains_after_claim`]: then its guard refuses, and the redirect goes on until its
/// ingress queue is empty). Undone on the way out.
#[inline(always)]
fn claim(
    ptr: *mut Link,
    state: &SockState,
    me: usize,
    peer: usize,
    size: u64,
    sent: u64,
) -> Result<(), PassReason> {
    // SAFETY: a live map value; fields read and written in place.
    unsafe {
        // Only this socket, under its lock, changes its own count: it still holds `sent`
        // unless the link was replaced meanwhile, and then nothing is added. One atomic,
        // fully ordered when it succeeds: the count and the barrier before the reads
        // below (a failed one orders nothing, and nothing is read after it).
        if !atomic::cmpxchg_u64(
            addr_of_mut!((*ptr).tx_redir[me]),
            sent,
            sent.wrapping_add(size),
        ) {
            return Err(PassReason::Raced);
        }
        let flags = read_volatile(addr_of!((*ptr).rx_flags[peer]));
        let st = read_volatile(addr_of!((*ptr).state));
        let cookie = read_volatile(addr_of!((*ptr).cookie[me]));
        // The peer's close or-s its closed bit, then reads this count (sockops.rs,
        // on_state_change): either it counted these bytes as due to it, or this sees
        // the bit.
        let mut raced = st & (link_state::closed(side::peer(state.side)) | link_state::CUT) != 0
            || cookie != state.cookie;
        if !raced && (flags & (rx::TCP_ONLY | rx::OPTION) != 0 || st & link_state::LEAVING != 0) {
            // What the peer has read, after its flags: fully ordered.
            let read = atomic::load_ordered(addr_of_mut!((*ptr).rx_read[peer]));
            raced = !guarded() || !drains_after_claim(flags, sent, read);
        }
        if raced {
            atomic::sub_u64(addr_of_mut!((*ptr).tx_redir[me]), size);
            return Err(PassReason::Raced);
        }
    }
    Ok(())
}
