//! The FIONREAD compensation: FIONREAD (`ioctl(SIOCINQ)`) on a socket in the SockHash
//! answered as TCP answers it, every byte waiting whichever way it came, on kernels
//! whose sockmap does not. Which part the kernel misses is what the agent's kernel
//! self-test saw (`bypass_common::checks`), loaded as a feature bit:
//! - [`features::FIONREAD_ADD_TCP`]: kernels of the sockmap "Fix FIONREAD" series
//!   without its later fix answer from the psock's ingress queue alone
//!   (net/ipv4/tcp_bpf.c, tcp_bpf_ioctl), so bytes that came by TCP (a first send
//!   before pairing, a direction past its bound) are missing: `tcp_inq` is added.
//! - [`features::FIONREAD_ADD_INGRESS`]: kernels before that series answer with
//!   `tcp_ioctl` alone, so bytes redirected and not read yet are missing: what the
//!   socket's peer redirected to it less what it read out of its ingress queue is added
//!   (`bypass_common::state::ingress_read`), at most what its receive queues hold.
//!
//! Not compensated: io_uring's `SOCKET_URING_OP_SIOCINQ` (Linux 6.7), which calls the
//! protocol's ioctl directly.
//! It runs when the call that put the answer in the caller's memory returns (`sk_ioctl`
//! since Linux 6.5, `tcp_ioctl` before: both take the user pointer third and return
//! 0), and writes the corrected answer over it with `bpf_probe_write_user`, which a
//! kernel under lockdown refuses at load: the agent then reports FIONREAD wrong.

use core::{
    ffi::c_void,
    ptr::{addr_of, addr_of_mut, read_volatile},
};

use aya_ebpf::{
    helpers::generated::{bpf_probe_read_user, bpf_probe_write_user},
    macros::fexit,
    programs::FExitContext,
};
use bypass_common::{
    SockState,
    layout::features,
    state::{flags, ingress_read, pending, side},
};

use crate::{
    atomic, kernel,
    maps::{BYPASS_LINKS, sock_state},
};

/// `SIOCINQ` (= `FIONREAD`, include/uapi/asm-generic/ioctls.h).
const SIOCINQ: u32 = 0x541b;

#[fexit(function = "sk_ioctl")]
pub fn bypass_fionread(ctx: FExitContext) -> i32 {
    // int sk_ioctl(struct sock *sk, unsigned int cmd, void __user *arg), or
    // int tcp_ioctl(struct sock *sk, int cmd, unsigned long arg) before Linux 6.5.
    let sk: *mut c_void = ctx.arg(0);
    let cmd: u32 = ctx.arg(1);
    let arg: u64 = ctx.arg(2);
    if cmd != SIOCINQ
        || !matches!(ctx.ret::<i32>(), Ok(0))
        || sk.is_null()
        || arg == 0
        || !kernel::hooks_active()
    {
        return 0;
    }
    // Only sockets this datapath inserted: another program's sockmap is its own.
    // SAFETY: the traced socket argument; its storage or none.
    let Some(state) = (unsafe { sock_state(sk, false) }) else {
        return 0;
    };
    // SAFETY: non-null storage of that socket, sized for a `SockState`.
    let state = unsafe { &mut *state };
    if state.side == side::NONE {
        return 0;
    }
    // SAFETY: the traced socket argument.
    let Some(q) = (unsafe { kernel::queued(sk) }) else {
        return 0;
    };
    // Without a psock the kernel answered with tcp_ioctl, which is right (a socket
    // whose connection left the SockHash).
    if !q.psock {
        return 0;
    }
    let mut missing = 0u64;
    if kernel::feature(features::FIONREAD_ADD_TCP) {
        missing += u64::from(q.tcp_inq);
    }
    if kernel::feature(features::FIONREAD_ADD_INGRESS) {
        // The accounting errs high here (a byte TCP skipped, an urgent one, moved
        // copied_seq with no read returning it): never more than the receive queues
        // hold, which counts redirected bytes at their size.
        missing += unread_redirected(state).min(u64::from(q.rmem_alloc));
    }
    if missing == 0 {
        return 0;
    }
    let user = arg as *mut c_void;
    let mut answer: i32 = 0;
    // SAFETY: reads 4 bytes of the calling task's memory at the pointer it passed (the
    // helper fails cleanly on a bad address).
    let read = unsafe {
        bpf_probe_read_user(
            addr_of_mut!(answer).cast(),
            core::mem::size_of::<i32>() as u32,
            user,
        )
    };
    if read != 0 || answer < 0 {
        return 0;
    }
    let total = (answer as u64).saturating_add(missing).min(i32::MAX as u64) as i32;
    // SAFETY: writes the 4-byte answer where the kernel has just written it, in the
    // calling task's memory, at the pointer it passed to ioctl(2).
    unsafe {
        bpf_probe_write_user(
            user,
            addr_of!(total).cast(),
            core::mem::size_of::<i32>() as u32,
        );
    }
    0
}

/// Bytes redirected to the socket with `state` and not read yet: what its peer
/// redirected (counted before each redirect, so at most a message on its way more than
/// what waits) less what it read out of its ingress queue. A closed socket counts what
/// was due to it when it closed (its link may be gone).
#[inline(always)]
pub(crate) fn unread_redirected(state: &mut SockState) -> u64 {
    // SAFETY: fields of live socket storage; readers may run at once.
    let read = unsafe {
        ingress_read(
            atomic::load_ordered(addr_of_mut!(state.read_total)),
            atomic::load_ordered(addr_of_mut!(state.tcp_total)),
        )
    };
    if state.flags & flags::CLOSED != 0 {
        return pending(state.rx_due, read);
    }
    let Some(link) = BYPASS_LINKS.get_ptr_mut(&state.link) else {
        return 0;
    };
    let me = side::index(state.side);
    // SAFETY: a live map value: its cookie read (elements are reused at once), the
    // peer's count loaded.
    unsafe {
        if read_volatile(addr_of!((*link).cookie[me])) != state.cookie {
            return 0;
        }
        pending(
            atomic::load_ordered(addr_of_mut!((*link).tx_redir[side::peer_index(state.side)])),
            read,
        )
    }
}
