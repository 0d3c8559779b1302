//! The drain observer, for the agent's drain of a datapath an upgrade or a rollback
//! released (`bypass-agent/src/datapath/drain.rs`): a read of one of its sockets that
//! reaches plain `tcp_recvmsg` is noted with its time. `tcp_bpf_recvmsg` calls
//! `tcp_recvmsg` only when the socket's psock has nothing in its ingress queue
//! (net/ipv4/tcp_bpf.c: no psock, or `sk_psock_queue_empty` checked first), and once
//! the released datapath's redirects are off nothing enters that queue again: so the
//! socket has nothing redirected left unread, even where the released read accounting
//! missed a read (a BPF trampoline updated while a read sleeps inside
//! `tcp_bpf_recvmsg` skips that read's fexit programs, kernel/bpf/trampoline.c,
//! `bpf_tramp_image_put`). Only sockets the agent put in the map are noted; every other
//! TCP read costs one hash lookup, while a drain runs.

use core::ffi::c_void;

use aya_ebpf::{
    helpers::generated::{bpf_get_socket_cookie, bpf_ktime_get_ns},
    macros::fentry,
    programs::FEntryContext,
};

use crate::maps::BYPASS_DRAIN_SEEN;

#[fentry(function = "tcp_recvmsg")]
pub fn bypass_drain_seen(ctx: FEntryContext) -> i32 {
    // int tcp_recvmsg(struct sock *sk, struct msghdr *msg, size_t len, int flags,
    // int *addr_len)
    let sk: *mut c_void = ctx.arg(0);
    if sk.is_null() {
        return 0;
    }
    // SAFETY: the traced socket argument (a BTF `struct sock *`): the helper reads its
    // cookie (bpf_get_socket_ptr_cookie for tracing programs, Linux >= 5.12).
    let cookie = unsafe { bpf_get_socket_cookie(sk) };
    if cookie == 0 {
        return 0;
    }
    if let Some(seen) = BYPASS_DRAIN_SEEN.get_ptr_mut(cookie) {
        // SAFETY: a live value of the map; only this program writes it, and any write
        // of a later time is right.
        unsafe { core::ptr::write_volatile(seen, bpf_ktime_get_ns()) };
    }
    0
}
