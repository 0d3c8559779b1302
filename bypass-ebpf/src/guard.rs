//! The read guard: `splice(2)` from a socket and zero-copy receive (`mmap` of a socket,
//! then `TCP_ZEROCOPY_RECEIVE`) read only its TCP receive queue (net/ipv4/tcp.c,
//! tcp_splice_read, tcp_zerocopy_receive), never the ingress queue redirected bytes
//! wait in. Before either reads a bypassed socket, the guard records that the socket
//! reads that way (its peer sends to it by TCP from then on, and the connection leaves
//! the SockHash), and refuses the call while bytes redirected to it are unread or on
//! their way (`EINVAL`: splicing is not supported here; `ENODEV`: mapping is not), so
//! the application reads them with `read`/`recv` (Go's `io.Copy`, HAProxy and other
//! splicing proxies fall back so). `bypass_common::state::rx` says why no byte can slip
//! between the guard and a sender.
//!
//! The decision is made where the call starts (`do_splice`, which splice(2) and
//! io_uring's splice call; `vm_mmap_pgoff`, which mmap(2) calls), by programs that may
//! read the socket's storage, and kept for the calling thread until the call returns or
//! its permission check refused it. The call's permission check (`file_permission`,
//! `mmap_file`) applies it, as a BPF LSM program where the BPF LSM is active (from
//! Linux 6.2 on the kernel runs those on every call) or else as an fmod_ret program on
//! the `security_*` function, which may not read socket storage (and which the kernel
//! skips on a CPU where a preempted task is inside it: docs/limitations.md); since Linux
//! 6.8 `do_splice` checks before it reaches `splice_file_to_pipe`. The same check is
//! every `read(2)`'s: only the file and thread a decision names are refused.

use core::{
    ffi::c_void,
    ptr::{addr_of, addr_of_mut, read_volatile},
};

use aya_ebpf::{
    bindings::{BPF_ANY, file},
    helpers::generated::{bpf_get_current_pid_tgid, bpf_sock_from_file},
    macros::{fentry, fexit, lsm, tracepoint},
    programs::{FEntryContext, FExitContext, LsmContext, TracePointContext},
};
use bypass_common::{
    SockState, Stat,
    state::{Verdict, closed_drained, flags, rx, side},
};

use crate::{
    atomic, kernel, leave,
    maps::{BYPASS_GUARDING, BYPASS_LINKS, BYPASS_SPLICERS, BYPASS_VERDICTS, sock_state},
    sockopt, stats,
};

/// `MAY_READ` (include/linux/fs.h).
const MAY_READ: i32 = 4;
/// `MSG_OOB` and `MSG_TRUNC` (include/linux/socket.h): receive flags the ingress queue
/// does not honour (net/core/skmsg.c, sk_msg_recvmsg reads ordinary bytes for both).
const MSG_OOB: i32 = 1;
const MSG_TRUNC: i32 = 0x20;
/// `MSG_PEEK`: a receive that leaves the bytes queued.
const MSG_PEEK: i32 = 2;
/// `MSG_ERRQUEUE`: a receive of the error queue.
const MSG_ERRQUEUE: i32 = 0x2000;
/// `EAGAIN`: the urgent byte cannot be had now.
const EAGAIN: i32 = 11;
/// `EOPNOTSUPP`: a discarding read while redirected bytes wait.
const EOPNOTSUPP: i32 = 95;
/// `EINVAL`: what `splice(2)` returns for a file that cannot be spliced from.
const EINVAL: i32 = 22;
/// `ENODEV`: what `mmap(2)` returns for a file that cannot be mapped.
const ENODEV: i32 = 19;

/// The state of the bypassed socket behind `f`, if `f` is one.
///
/// # Safety
/// `f` must be a `struct file *` the program was given (a traced argument).
#[inline(always)]
unsafe fn file_state(f: *mut file) -> Option<&'static mut SockState> {
    if f.is_null() {
        return None;
    }
    // SAFETY: the helper returns the file's `struct socket`, or null if it is none.
    let sock = unsafe { bpf_sock_from_file(f) }.cast::<u8>().cast_const();
    if sock.is_null() {
        return None;
    }
    // SAFETY: a non-null `struct socket` BTF pointer.
    let sk = unsafe { kernel::socket_sk(sock) };
    if sk.is_null() {
        return None;
    }
    // SAFETY: a socket pointer the verifier knows; its storage or null.
    let state = unsafe { sock_state(sk.cast::<c_void>(), false) }?;
    // SAFETY: non-null storage of that socket, sized for a `SockState`.
    let state = unsafe { &mut *state };
    (state.side != side::NONE).then_some(state)
}

/// The calling thread's id.
#[inline(always)]
fn thread() -> u32 {
    // SAFETY: no arguments.
    unsafe { bpf_get_current_pid_tgid() as u32 }
}

#[fentry(function = "do_splice")]
pub fn bypass_splice_enter(ctx: FEntryContext) -> i32 {
    // long do_splice(struct file *in, loff_t *off_in, struct file *out, ...)
    decide(ctx.arg(0), rx::SPLICE, EINVAL);
    0
}

#[fexit(function = "do_splice")]
pub fn bypass_splice_exit(_ctx: FExitContext) -> i32 {
    forget();
    0
}

#[fentry(function = "vm_mmap_pgoff")]
pub fn bypass_mmap_enter(ctx: FEntryContext) -> i32 {
    // unsigned long vm_mmap_pgoff(struct file *file, unsigned long addr, ...)
    decide(ctx.arg(0), rx::ZEROCOPY, ENODEV);
    0
}

#[fexit(function = "vm_mmap_pgoff")]
pub fn bypass_mmap_exit(_ctx: FExitContext) -> i32 {
    forget();
    0
}

#[fentry(function = "security_socket_recvmsg")]
pub fn bypass_recv_enter(ctx: FEntryContext) -> i32 {
    // int security_socket_recvmsg(struct socket *sock, struct msghdr *msg, int size,
    // int flags): the permission check of every user receive (sock_recvmsg; recvmmsg's
    // later datagrams skip it, and the first one's decision holds for the socket). In
    // the same trampoline as the guard below and the return here, so a decision never
    // outlives its call.
    let (size, flags): (i32, i32) = (ctx.arg(2), ctx.arg(3));
    if wants_guard(size, flags) {
        decide_recv(ctx.arg(0), flags);
    }
    0
}

#[fexit(function = "security_socket_recvmsg")]
pub fn bypass_recv_exit(ctx: FExitContext) -> i32 {
    let (size, flags): (i32, i32) = (ctx.arg(2), ctx.arg(3));
    if wants_guard(size, flags) {
        forget();
    }
    0
}

/// Whether a receive of `size` bytes with `flags` is one the guard looks at: `MSG_OOB`
/// or `MSG_TRUNC`, not of the error queue (served before either receive queue,
/// net/ipv4/tcp_bpf.c), not of zero bytes (tcp_bpf_recvmsg returns 0 before reading).
#[inline(always)]
fn wants_guard(size: i32, flags: i32) -> bool {
    flags & (MSG_OOB | MSG_TRUNC) != 0 && flags & MSG_ERRQUEUE == 0 && size > 0
}

// The three checks below run as BPF LSM programs where the BPF LSM is active, else as
// fmod_ret programs on the `security_*` functions. Either way the trampoline runs no
// later program once one refused (arch_prepare_bpf_trampoline: the fmod_ret and int LSM
// hook programs), so what earlier programs decided is 0 whenever one of these runs, and
// is not read (its index differs too: the LSM hook mmap_file takes `reqprot` beside
// security_mmap_file's arguments). Each returns 0 or a constant errno: the verifier
// checks that a BPF LSM program returns within [-4095, 0], and before Linux 6.17 cannot
// follow a range through a negation.

#[lsm(hook = "socket_recvmsg")]
pub fn bypass_recv_guard(ctx: LsmContext) -> i32 {
    // int security_socket_recvmsg(struct socket *sock, struct msghdr *msg, int size,
    // int flags).
    let sock: *const u8 = ctx.arg(0);
    let (size, flags): (i32, i32) = (ctx.arg(2), ctx.arg(3));
    if !wants_guard(size, flags) {
        return 0;
    }
    apply_to(sock as u64)
}

#[lsm(hook = "file_permission")]
pub fn bypass_read_guard(ctx: LsmContext) -> i32 {
    // int security_file_permission(struct file *file, int mask).
    let f: *mut file = ctx.arg(0);
    let mask: i32 = ctx.arg(1);
    if mask & MAY_READ == 0 {
        return 0;
    }
    apply(f)
}

#[lsm(hook = "mmap_file")]
pub fn bypass_mmap_guard(ctx: LsmContext) -> i32 {
    // int security_mmap_file(struct file *file, unsigned long prot, unsigned long flags).
    let f: *mut file = ctx.arg(0);
    apply(f)
}

/// At the start of a receive with `MSG_OOB` or `MSG_TRUNC` on `sock`: if it is a
/// bypassed socket that still has its psock (its reads go through the ingress queue),
/// the answer TCP gives, or a refusal, before any byte is consumed:
/// - `MSG_OOB` with no urgent byte to read: `EINVAL`, as `tcp_recv_urg` answers; with
///   one that came by TCP, TCP's own path while nothing redirected waits (the ingress
///   queue is read first), else `EAGAIN`.
/// - `MSG_TRUNC`: the socket discards, so it reads only its TCP queue from now on (its
///   peer sends to it by TCP, the connection leaves the SockHash), and the call is
///   refused (`EOPNOTSUPP`) while bytes redirected to it are unread or on their way;
///   with `MSG_PEEK` it is only refused while redirected bytes are unread.
#[inline(always)]
fn decide_recv(sock: *const u8, flags: i32) {
    // A decision of this thread left by a call whose return was missed (an agent
    // restarted between the two) never applies to this one.
    forget();
    if sock.is_null() || !kernel::hooks_active() || !kernel::queued_fields() {
        return;
    }
    // SAFETY: the traced function's `struct socket *` argument.
    let sk = unsafe { kernel::socket_sk(sock) };
    if sk.is_null() {
        return;
    }
    // SAFETY: a socket pointer the verifier knows; its storage or null.
    let Some(state) = (unsafe { sock_state(sk, false) }) else {
        return;
    };
    // SAFETY: non-null storage of that socket, sized for a `SockState`.
    let state = unsafe { &mut *state };
    if state.side == side::NONE {
        return;
    }
    // SAFETY: the traced socket.
    let Some(q) = (unsafe { kernel::queued(sk) }) else {
        return;
    };
    if !q.psock {
        // Out of the SockHash: TCP answers.
        return;
    }
    let err = if flags & MSG_OOB != 0 {
        match q.urgent {
            Err(e) => e,
            // Announced, not arrived: tcp_recv_urg answers EAGAIN at once, where the
            // ingress queue's read would wait.
            Ok(false) => EAGAIN,
            Ok(true) if crate::fionread::unread_redirected(state) == 0 => return,
            Ok(true) => EAGAIN,
        }
    } else if flags & MSG_PEEK != 0 {
        // A peek discards nothing: it goes on only where TCP answers it, with nothing
        // redirected waiting and TCP bytes there (an empty socket's peek could wait,
        // and redirected bytes arriving meanwhile would be copied into the buffer);
        // else refused, and the socket stays as it is.
        if crate::fionread::unread_redirected(state) == 0 && q.tcp_inq > 0 {
            return;
        }
        EOPNOTSUPP
    } else if guard(state, rx::TRUNC) {
        return;
    } else {
        EOPNOTSUPP
    };
    record(sock as u64, err);
}

/// At the start of a splice from, or a mapping of, `f`: if it is a bypassed socket,
/// records that it reads only its TCP queue (`bit`) and, when bytes redirected to it
/// are unread or on their way, that this thread's call must fail with `err`.
#[inline(always)]
fn decide(f: *mut file, bit: u64, err: i32) {
    // A decision of this thread left by a call whose return was missed never applies to
    // this one.
    forget();
    if !kernel::hooks_active() {
        return;
    }
    // SAFETY: the traced function's file argument.
    let Some(state) = (unsafe { file_state(f) }) else {
        return;
    };
    if guard(state, bit) {
        return;
    }
    record(f as u64, err);
}

/// This thread's call on the file or socket at `id` is to fail with `err`.
#[inline(always)]
fn record(id: u64, err: i32) {
    let verdict = Verdict {
        file: id,
        err,
        reserved: 0,
    };
    // One decision per thread: a thread is in one such call at a time (one left by a
    // call whose return was missed was dropped by `forget` before this decision).
    if BYPASS_VERDICTS
        .insert(&thread(), &verdict, BPF_ANY.into())
        .is_ok()
        && let Some(n) = BYPASS_GUARDING.get_ptr_mut(0)
    {
        // SAFETY: a live array value.
        unsafe { atomic::add_u64(n, 1) };
    }
}

/// At the return of the call: its decision, if any, goes.
#[inline(always)]
fn forget() {
    if !guarding() || !kernel::hooks_active() {
        return;
    }
    drop_decision();
}

/// This thread's decision, if any, goes.
#[inline(always)]
fn drop_decision() {
    if BYPASS_VERDICTS.remove(&thread()).is_ok()
        && let Some(n) = BYPASS_GUARDING.get_ptr_mut(0)
    {
        // SAFETY: a live array value.
        unsafe { atomic::sub_u64(n, 1) };
    }
}

/// Whether any decision is outstanding (one array read for every check on the node).
#[inline(always)]
fn guarding() -> bool {
    BYPASS_GUARDING.get(0).is_some_and(|n| *n != 0)
}

/// At a permission check of `f`: the refusal this thread's call was decided to get,
/// else 0.
#[inline(always)]
fn apply(f: *mut file) -> i32 {
    apply_to(f as u64)
}

/// At a permission check of the file or socket at `id`: the refusal this thread's call
/// was decided to get, else 0.
#[inline(always)]
fn apply_to(id: u64) -> i32 {
    if !guarding() || !kernel::hooks_active() {
        return 0;
    }
    match BYPASS_VERDICTS.get_ptr(&thread()) {
        // SAFETY: a live map value of this thread's own.
        Some(v) if unsafe { (*v).file } == id => {
            stats::add(Stat::ReadsRefused, 1);
            // SAFETY: as above.
            let err = unsafe { (*v).err };
            // One call, one refusal: the decision goes with it, so one whose call's return
            // program the kernel skipped never refuses a later read(2) of the same file
            // by this thread.
            drop_decision();
            refusal(err)
        }
        _ => 0,
    }
}

/// The return value refusing with `err` (one of the errnos a decision records), as a
/// constant on every path.
#[inline(always)]
fn refusal(err: i32) -> i32 {
    if err == ENODEV {
        return -ENODEV;
    }
    if err == EOPNOTSUPP {
        return -EOPNOTSUPP;
    }
    if err == EAGAIN {
        return -EAGAIN;
    }
    -EINVAL
}

/// Records that the socket with `state` reads only its TCP queue (`bit`); whether the
/// call may go on: nothing redirected to it is unread or on its way.
#[inline(always)]
fn guard(state: &mut SockState, bit: u64) -> bool {
    if state.flags & flags::CLOSED != 0 {
        // Closed: every byte that will ever be redirected to it was counted at its
        // close, and what it read is its own count; its link may be gone, or another
        // connection's already.
        return closed_guard(state);
    }
    let ptr = match BYPASS_LINKS.get_ptr_mut(&state.link) {
        Some(ptr) => ptr,
        None => {
            // Not paired yet: the connector tells the accepting side that this socket
            // reads by TCP (the link it writes says so, and its sends take TCP). Looked
            // up again after that fully ordered write: a link written meanwhile may
            // already carry redirected bytes, and is checked as any other.
            sockopt::record_connector_rx_tcp(state);
            match BYPASS_LINKS.get_ptr_mut(&state.link) {
                Some(ptr) => ptr,
                // Never paired: nothing was ever redirected to it.
                None => return true,
            }
        }
    };
    let me = side::index(state.side);
    let peer = side::peer_index(state.side);
    // SAFETY: a live map value; this side's flags (or-ed, fully ordered) and the two
    // counters read after it (see `bypass_common::state::rx`).
    unsafe {
        if read_volatile(addr_of!((*ptr).cookie[me])) != state.cookie {
            return true;
        }
        let before = atomic::or_u64(addr_of_mut!((*ptr).rx_flags[me]), bit);
        if before & rx::TCP_ONLY == 0 {
            stats::add(Stat::TcpOnlyReaders, 1);
            leave::request(ptr, &state.link);
        }
        let sent = read_volatile(addr_of!((*ptr).tx_redir[peer]));
        let read = read_volatile(addr_of!((*ptr).rx_read[me]));
        if sent != read {
            return false;
        }
        // Nothing waits: no sender drains into this side from now on. Fully ordered,
        // then the peer's count once more: a send counted meanwhile (its sender read the
        // flags before this bit) makes the call wait (`bypass_common::state::rx::DRAINED`).
        atomic::or_u64(addr_of_mut!((*ptr).rx_flags[me]), rx::DRAINED);
        if atomic::load_ordered(addr_of_mut!((*ptr).tx_redir[peer])) != sent {
            return false;
        }
    }
    // Nothing waits and nothing will come: the TCP reads that follow are not ingress
    // reads, so what this side published as read stays.
    state.flags |= flags::RX_FROZEN;
    true
}

/// [`guard`] for a closed socket: the call may go on once the socket has read every
/// byte redirected to it (`rx_due`, counted at its close).
#[inline(always)]
fn closed_guard(state: &mut SockState) -> bool {
    if state.flags & flags::RX_FROZEN != 0 {
        return true;
    }
    // SAFETY: fields of live socket storage; readers may run at once.
    let (total, tcp) = unsafe {
        (
            atomic::load_ordered(addr_of_mut!(state.read_total)),
            atomic::load_ordered(addr_of_mut!(state.tcp_total)),
        )
    };
    if !closed_drained(state.rx_due, total, tcp) {
        return false;
    }
    state.flags |= flags::RX_FROZEN;
    true
}

#[tracepoint(category = "syscalls", name = "sys_enter_splice")]
pub fn bypass_splice_seen(_ctx: TracePointContext) -> u32 {
    // Where the read guard cannot run (the kernel refuses BPF trampolines), a process
    // that splices is remembered: from its next read of a bypassed socket on, that
    // socket gets no redirected bytes (recv::publish). The splice itself cannot be
    // refused here, so a socket first read with recv and then spliced while redirected
    // bytes wait for it can miss them: docs/limitations.md's limitation for such kernels.
    if !kernel::hooks_active() {
        return 0;
    }
    // SAFETY: no arguments.
    let tgid = (unsafe { bpf_get_current_pid_tgid() } >> 32) as u32;
    if BYPASS_SPLICERS.get_ptr(&tgid).is_none() {
        let _ = BYPASS_SPLICERS.insert(&tgid, &1, BPF_ANY.into());
        stats::add(Stat::TcpOnlyReaders, 1);
    }
    0
}
