//! sk_msg: runs on every send of a socket in the SockHash. Redirects the message to the
//! peer socket's ingress queue when the connection is paired, the bypass is on, the
//! peer honours what it would receive that way, its queue stays under its bound and
//! the socket is not streaming small messages faster than the peer reads them
//! (`bypass_common::state::small_stream_step`); otherwise the message takes the normal
//! TCP path, and so does every later one of this
//! socket (`bypass_common::tx_mode`: a direction never goes back from TCP to
//! redirects, which is what keeps a blocked reader's bytes in order). It never drops:
//! every path returns SK_PASS, and `bpf_msg_redirect_hash` changes nothing when the
//! peer is missing (net/core/sock_map.c).

use core::ptr::{addr_of, read_volatile};

use aya_ebpf::{
    bindings::{BPF_F_INGRESS, bpf_sock, sk_action::SK_PASS},
    macros::sk_msg,
    programs::SkMsgContext,
};
use bypass_common::{
    SockState, Stat, control,
    state::{PassReason, precheck, side, small_stream_step, within_limit},
    tx_mode,
};

use crate::{
    kernel,
    maps::{BYPASS_CONTROL, BYPASS_LINKS, BYPASS_SOCKETS, sock_state},
    stats,
};

#[sk_msg]
pub fn bypass_skmsg(ctx: SkMsgContext) -> u32 {
    let size = u64::from(ctx.size());
    match try_redirect(&ctx, size) {
        Ok(kind) => {
            stats::add(Stat::RedirectedMessages, 1);
            stats::add(Stat::RedirectedBytes, size);
            if let Some(stat) = Stat::redirected_bytes(kind) {
                stats::add(stat, size);
            }
        }
        Err(reason) => {
            stats::add(Stat::PassedMessages, 1);
            stats::add(Stat::PassedBytes, size);
            match reason {
                PassReason::QueueFull => stats::add(Stat::QueueLimited, 1),
                PassReason::SmallStream => stats::add(Stat::SmallStreams, 1),
                _ => {}
            }
        }
    }
    SK_PASS
}

/// A control word (0 when the slot cannot be read).
#[inline(always)]
fn control_word(slot: u32) -> u64 {
    u64::from(BYPASS_CONTROL.get(slot).copied().unwrap_or(0))
}

/// Sets up the redirect and returns the connection's hop kind, or says why the message
/// takes the TCP path (recording that this socket stays there).
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
    // the socket's lock (net/ipv4/tcp_bpf.c, tcp_bpf_sendmsg), so this is its only writer.
    let state = unsafe { &mut *state };
    match decide(ctx, sk, state, size) {
        Ok(kind) => {
            state.tx_mode = tx_mode::REDIRECT;
            state.queued = state.queued.saturating_add(size);
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

// Keys are passed by reference on purpose: by value they would be copied onto the
// 512-byte BPF stack.
#[allow(clippy::needless_borrows_for_generic_args)]
#[inline(always)]
fn decide(
    ctx: &SkMsgContext,
    sk: *mut bpf_sock,
    state: &mut SockState,
    size: u64,
) -> Result<u32, PassReason> {
    let enabled = BYPASS_CONTROL.get(control::SLOT_ENABLED).copied() == Some(control::ENABLED);
    let ptr = BYPASS_LINKS.get_ptr(&state.link);
    // Copied, then checked: links live in an LRU map, whose elements are reused at once
    // (no RCU grace period), so one read in place could mix two connections' links.
    // SAFETY: a live map value, copied.
    let link = ptr.map(|p| unsafe { *p });
    if let Some(reason) = precheck(state.tx_mode, enabled, link.as_ref(), state) {
        return Err(reason);
    }
    let (Some(link), Some(ptr)) = (link, ptr) else {
        return Err(PassReason::Unpaired);
    };
    // Still this socket's link after the copy (it names this socket's unique cookie).
    // SAFETY: a live map value, one field read.
    if unsafe { (*ptr).cookie[side::index(state.side)] } != state.cookie {
        return Err(PassReason::Unpaired);
    }
    let own = kernel::sending(sk).ok_or(PassReason::Unpaired)?;
    if own.write_seq != state.write_seq {
        return Err(PassReason::WroteByTcp);
    }
    if own.ulp {
        return Err(PassReason::Ulp);
    }
    if kernel::bound_enabled() {
        let limit = control_word(control::SLOT_MAX_QUEUED);
        let small = size < control_word(control::SLOT_SMALL_STREAM);
        // Only this socket adds to its peer's queue, so `state.queued` bounds it from
        // above: measure only when this message could cross the bound, or when it is
        // small (the small-stream rule asks whether the peer is behind).
        let over = !within_limit(state.queued, size, limit);
        if over || small {
            let peer = side::peer_index(state.side);
            let queued = kernel::peer_queued(link.sk[peer], link.cookie[peer])
                .ok_or(PassReason::Unmeasurable)?;
            state.queued = queued;
            if over && !within_limit(queued, size, limit) {
                return Err(PassReason::QueueFull);
            }
            if small {
                let (run, to_tcp) = small_stream_step(state.small_run, queued);
                state.small_run = run;
                if to_tcp {
                    return Err(PassReason::SmallStream);
                }
            }
        }
        if !small {
            // Only small sends in a row count: a length prefix before each large body
            // is not a stream of small messages.
            state.small_run = 0;
        }
    }
    let mut target = link.target(state);
    if BYPASS_SOCKETS.redirect_msg(ctx, &mut target, BPF_F_INGRESS.into()) != i64::from(SK_PASS) {
        return Err(PassReason::NoPeer);
    }
    Ok(link.hop)
}
