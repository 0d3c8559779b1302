//! sk_msg: runs on every send of a socket in the SockHash. Redirects the message to the
//! peer socket's ingress queue when that is safe, otherwise lets it take the normal TCP
//! path. It never drops: every path returns SK_PASS, and `bpf_msg_redirect_hash`
//! changes nothing when the peer is missing (net/core/sock_map.c).

use core::ptr::{addr_of, read_volatile};

use aya_ebpf::{
    bindings::{BPF_F_INGRESS, sk_action::SK_PASS},
    helpers::generated::bpf_sk_storage_get,
    macros::sk_msg,
    programs::SkMsgContext,
};
use bypass_common::{Stat, control, tx_mode};

use crate::{
    key,
    maps::{BYPASS_CONTROL, BYPASS_SOCKETS, BYPASS_TX_MODE, map_ptr},
    stats,
};

#[sk_msg]
pub fn bypass_skmsg(ctx: SkMsgContext) -> u32 {
    let size = u64::from(ctx.size());
    if try_redirect(&ctx) {
        stats::add(Stat::RedirectedMessages, 1);
        stats::add(Stat::RedirectedBytes, size);
    } else {
        stats::add(Stat::PassedMessages, 1);
        stats::add(Stat::PassedBytes, size);
    }
    SK_PASS
}

/// Sets up the redirect and returns true, or returns false for the TCP path.
#[inline(always)]
fn try_redirect(ctx: &SkMsgContext) -> bool {
    // Storage was created when the socket was inserted; without it we cannot remember
    // that bytes went by TCP, so such a socket never redirects.
    // SAFETY: context field load.
    let sk = unsafe { read_volatile(addr_of!((*ctx.msg).__bindgen_anon_3.sk)) };
    if sk.is_null() {
        return false;
    }
    // SAFETY: `sk` is the context's non-null socket; the helper may return null.
    let mode = unsafe {
        bpf_sk_storage_get(
            map_ptr(&BYPASS_TX_MODE),
            sk.cast(),
            core::ptr::null_mut(),
            0,
        )
    }
    .cast::<u32>();
    if mode.is_null() {
        return false;
    }
    // SAFETY: non-null storage of this socket, sized for a u32.
    let mode = unsafe { &mut *mode };
    if *mode == tx_mode::TCP {
        return false;
    }
    let enabled = BYPASS_CONTROL.get(control::SLOT_ENABLED).copied() == Some(control::ENABLED);
    let redirected = enabled
        && match key::from_sk_msg(ctx.msg) {
            Some(key) => {
                let mut peer = key.peer();
                BYPASS_SOCKETS.redirect_msg(ctx, &mut peer, BPF_F_INGRESS.into())
                    == i64::from(SK_PASS)
            }
            None => false,
        };
    // Redirect → TCP is safe (the peer reads its redirected bytes first); TCP → redirect
    // is not, so the TCP mode is final.
    *mode = if redirected {
        tx_mode::REDIRECT
    } else {
        tx_mode::TCP
    };
    redirected
}
