//! sk_msg: runs on every send of a socket in the SockHash. Redirects the message to the
//! peer socket's ingress queue when that is safe and the queue stays under its bound,
//! otherwise lets it take the normal TCP path. It never drops: every path returns
//! SK_PASS, and `bpf_msg_redirect_hash` changes nothing when the peer is missing
//! (net/core/sock_map.c).
//!
//! Order is kept by one rule: a socket redirects only when the peer has read every
//! byte the socket sent by TCP (the peer reads its ingress queue before its TCP receive
//! queue, net/ipv4/tcp_bpf.c, tcp_bpf_recvmsg). Going from redirect to TCP is always
//! safe; coming back waits until `bypass_common::state::caught_up`. A peer whose receive
//! options the ingress queue would ignore (SO_RCVLOWAT, SO_PEEK_OFF) gets TCP.

use core::ptr::{addr_of, read_volatile};

use aya_ebpf::{
    bindings::{BPF_F_INGRESS, sk_action::SK_PASS},
    helpers::generated::bpf_sk_storage_get,
    macros::sk_msg,
    programs::SkMsgContext,
};
use bypass_common::{
    SockKey, SockState, Stat, control,
    state::{caught_up, hop, options_need_tcp, within_limit},
    tx_mode,
};

use crate::{
    kernel,
    maps::{
        BYPASS_CONTROL, BYPASS_PAIRS, BYPASS_SOCK_ADDRS, BYPASS_SOCK_STATE, BYPASS_SOCKETS, map_ptr,
    },
    stats,
};

/// What happened to one message.
enum Verdict {
    /// Redirected to the peer's ingress queue.
    Redirected,
    /// Redirected, the first message since this socket last took the TCP path.
    Resumed,
    /// Took the TCP path.
    Passed,
    /// Took the TCP path, the first of a run, because the peer's queue would pass its
    /// bound.
    QueueLimited,
}

#[sk_msg]
pub fn bypass_skmsg(ctx: SkMsgContext) -> u32 {
    let size = u64::from(ctx.size());
    let (verdict, kind) = try_redirect(&ctx, size);
    match verdict {
        Verdict::Redirected | Verdict::Resumed => {
            stats::add(Stat::RedirectedMessages, 1);
            stats::add(Stat::RedirectedBytes, size);
            if let Some(stat) = Stat::redirected_bytes(kind) {
                stats::add(stat, size);
            }
        }
        Verdict::Passed | Verdict::QueueLimited => {
            stats::add(Stat::PassedMessages, 1);
            stats::add(Stat::PassedBytes, size);
        }
    }
    match verdict {
        Verdict::Resumed => stats::add(Stat::Resumed, 1),
        Verdict::QueueLimited => stats::add(Stat::QueueLimited, 1),
        _ => {}
    }
    SK_PASS
}

/// Sets up the redirect, or decides on the TCP path, and records the socket's mode.
/// Returns the verdict and the connection's [`hop`] kind.
#[inline(always)]
fn try_redirect(ctx: &SkMsgContext, size: u64) -> (Verdict, u32) {
    // Storage was created when the socket was inserted; without it we cannot remember
    // that bytes went by TCP, so such a socket never redirects.
    // SAFETY: context field load.
    let sk = unsafe { read_volatile(addr_of!((*ctx.msg).__bindgen_anon_3.sk)) };
    if sk.is_null() {
        return (Verdict::Passed, hop::UNPAIRED);
    }
    // SAFETY: `sk` is the context's non-null socket; the helper may return null.
    let state = unsafe {
        bpf_sk_storage_get(
            map_ptr(&BYPASS_SOCK_STATE),
            sk.cast(),
            core::ptr::null_mut(),
            0,
        )
    }
    .cast::<SockState>();
    if state.is_null() {
        return (Verdict::Passed, hop::UNPAIRED);
    }
    // SAFETY: non-null storage of this socket, sized for a `SockState`. sk_msg runs under
    // the socket's lock (net/ipv4/tcp_bpf.c, tcp_bpf_sendmsg), so this is its only writer.
    let state = unsafe { &mut *state };
    if state.hop == hop::UNPAIRED {
        // A connecting socket learns its peer from the accepting side, once.
        if let Some(p) = BYPASS_PAIRS.get_ptr(state.key) {
            // SAFETY: a live map value.
            let p = unsafe { *p };
            state.peer = p.peer;
            state.hop = p.hop;
            let _ = BYPASS_PAIRS.remove(state.key);
        }
    }
    let (peer, kind) = state.peer_and_hop();
    let verdict = decide(ctx, state, peer, size);
    state.tx_mode = match verdict {
        Verdict::Redirected | Verdict::Resumed => tx_mode::REDIRECT,
        Verdict::Passed | Verdict::QueueLimited => tx_mode::TCP,
    };
    (verdict, kind)
}

#[inline(always)]
fn decide(ctx: &SkMsgContext, state: &SockState, mut peer: SockKey, size: u64) -> Verdict {
    if BYPASS_CONTROL.get(control::SLOT_ENABLED).copied() != Some(control::ENABLED) {
        return Verdict::Passed;
    }
    let resuming = state.tx_mode == tx_mode::TCP;
    let layout = kernel::layout();
    if resuming && !layout.can_resume() {
        return Verdict::Passed;
    }
    // The first message checks the order rule too when it can: bytes that left by TCP
    // before the socket was inserted would be overtaken just the same.
    let check_order = state.tx_mode != tx_mode::REDIRECT && layout.can_resume();
    let limit = u64::from(
        BYPASS_CONTROL
            .get(control::SLOT_MAX_QUEUED)
            .copied()
            .unwrap_or(0),
    );
    let bounded = limit != 0 && layout.can_bound();
    let check_options = layout.can_check_options();
    if check_order || bounded || check_options {
        // No address: the peer is not (or no longer) inserted; a redirect would fail.
        let Some(peer_sk) = BYPASS_SOCK_ADDRS.get_ptr(peer) else {
            return Verdict::Passed;
        };
        // SAFETY: a live map value.
        let peer_sk = unsafe { *peer_sk };
        if check_options {
            let Some((lowat, peek_off)) = kernel::receive_options(peer_sk, &layout) else {
                return Verdict::Passed;
            };
            if options_need_tcp(lowat, peek_off) {
                return Verdict::Passed;
            }
        }
        if check_order {
            let (Some(write_seq), Some(pending), Some(copied)) = (
                kernel::write_seq(state.sk, &layout),
                kernel::write_pending(state.sk, &layout),
                kernel::copied_seq(peer_sk, &layout),
            ) else {
                return Verdict::Passed;
            };
            if !caught_up(write_seq, pending, copied) {
                return Verdict::Passed;
            }
        }
        if bounded {
            let Some(queued) = kernel::queued(peer_sk, &layout) else {
                return Verdict::Passed;
            };
            if !within_limit(u64::from(queued), size, limit) {
                return if resuming {
                    Verdict::Passed
                } else {
                    Verdict::QueueLimited
                };
            }
        }
    }
    if BYPASS_SOCKETS.redirect_msg(ctx, &mut peer, BPF_F_INGRESS.into()) != i64::from(SK_PASS) {
        return Verdict::Passed;
    }
    if resuming {
        Verdict::Resumed
    } else {
        Verdict::Redirected
    }
}
