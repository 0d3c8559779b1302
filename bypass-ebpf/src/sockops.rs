//! sock_ops: when a TCP connection is established and both of its ends are pod
//! addresses, give the socket its state, publish its address for its peer and insert it
//! into the SockHash. Inserting attaches the sk_msg program to the socket
//! (net/core/sock_map.c, sock_map_link). When an inserted socket closes, withdraw its
//! address.

use core::ptr::{addr_of, read_volatile};

use aya_ebpf::{
    bindings::{
        BPF_ANY, BPF_SK_STORAGE_GET_F_CREATE, BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB,
        BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB, BPF_SOCK_OPS_STATE_CB, BPF_SOCK_OPS_STATE_CB_FLAG,
        BPF_TCP_CLOSE,
    },
    btf_maps::lpm_trie::Key,
    helpers::generated::bpf_sk_storage_get,
    macros::sock_ops,
    programs::SockOpsContext,
};
use bypass_common::{IpKey, SockState, Stat, addr::key_bytes, tx_mode};

use crate::{
    key,
    maps::{
        BYPASS_POD_ADDRS, BYPASS_POD_CIDRS, BYPASS_SOCK_ADDRS, BYPASS_SOCK_STATE, BYPASS_SOCKETS,
        map_ptr,
    },
    stats,
};

/// Why a socket was not inserted.
enum Skip {
    /// Not an establishment event, or not IPv4/IPv6.
    NotOurs,
    /// An end is not a pod address, or data already left by TCP.
    Ineligible,
    /// No socket storage, no room in the address map or the SockHash, or the kernel
    /// refused the state callback.
    Failed,
}

#[sock_ops]
pub fn bypass_sockops(ctx: SockOpsContext) -> u32 {
    let op = ctx.op();
    if op == BPF_SOCK_OPS_STATE_CB {
        on_state_change(&ctx);
        return 1;
    }
    match try_bypass_sockops(&ctx, op) {
        Ok(()) => stats::add(Stat::SocketsInserted, 1),
        Err(Skip::NotOurs) => {}
        Err(Skip::Ineligible) => stats::add(Stat::SocketsSkipped, 1),
        Err(Skip::Failed) => stats::add(Stat::InsertFailures, 1),
    }
    // sock_ops return values only matter for ops that ask for a reply.
    1
}

#[inline(always)]
fn try_bypass_sockops(ctx: &SockOpsContext, op: u32) -> Result<(), Skip> {
    if op != BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB && op != BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB {
        return Err(Skip::NotOurs);
    }
    let key = key::from_sock_ops(ctx.ops).ok_or(Skip::NotOurs)?;
    if !is_pod(&key.local_ip) || !is_pod(&key.remote_ip) {
        return Err(Skip::Ineligible);
    }
    // A socket that already sent data by TCP (TCP Fast Open) must stay there: its later
    // bytes would overtake those on the wire.
    // SAFETY: context field load.
    if unsafe { read_volatile(addr_of!((*ctx.ops).data_segs_out)) } != 0 {
        return Err(Skip::Ineligible);
    }
    // SAFETY: context field load.
    let sk = unsafe { read_volatile(addr_of!((*ctx.ops).__bindgen_anon_2.sk)) };
    if sk.is_null() {
        return Err(Skip::Failed);
    }
    // SAFETY: `sk` is the context's non-null socket; the helper may return null.
    let state = unsafe {
        bpf_sk_storage_get(
            map_ptr(&BYPASS_SOCK_STATE),
            sk.cast(),
            core::ptr::null_mut(),
            BPF_SK_STORAGE_GET_F_CREATE.into(),
        )
    }
    .cast::<SockState>();
    if state.is_null() {
        return Err(Skip::Failed);
    }
    // The address is only ever read back through bpf_probe_read_kernel; storing a
    // pointer in a map needs CAP_PERFMON (kernel/bpf/verifier.c, allow_ptr_leaks).
    let addr = sk as u64;
    // SAFETY: non-null storage of this socket, sized for a `SockState`. A connection
    // established again on the same socket (after a disconnect) starts afresh.
    unsafe {
        *state = SockState {
            key,
            tx_mode: tx_mode::UNDECIDED,
            reserved: 0,
            sk: addr,
        }
    };
    // The state callback withdraws the address when the socket closes, so the map
    // cannot fill with dead sockets (include/uapi/linux/bpf.h, BPF_SOCK_OPS_STATE_CB).
    if ctx
        .set_cb_flags((ctx.cb_flags() | BPF_SOCK_OPS_STATE_CB_FLAG) as i32)
        .is_err()
    {
        return Err(Skip::Failed);
    }
    // The address is published before the socket is in the SockHash, so a peer that can
    // redirect to it can also measure its queue. A full map keeps the socket out: its
    // peer could not bound what it queues.
    BYPASS_SOCK_ADDRS
        .insert(key, addr, BPF_ANY.into())
        .map_err(|_| Skip::Failed)?;
    let mut sock_key = key;
    // SAFETY: the context pointer is valid for the program's run.
    if BYPASS_SOCKETS
        .update(&mut sock_key, unsafe { &mut *ctx.ops }, BPF_ANY.into())
        .is_err()
    {
        let _ = BYPASS_SOCK_ADDRS.remove(key);
        return Err(Skip::Failed);
    }
    Ok(())
}

/// On the transition to TCP_CLOSE, the socket's address goes: the SockHash drops the
/// socket itself (net/core/sock_map.c, sock_map_unhash), and tcp_set_state runs this
/// callback before that (net/ipv4/tcp.c), well before the socket is freed.
#[inline(always)]
fn on_state_change(ctx: &SockOpsContext) {
    if ctx.arg(1) != BPF_TCP_CLOSE {
        return;
    }
    // SAFETY: context field load.
    let sk = unsafe { read_volatile(addr_of!((*ctx.ops).__bindgen_anon_2.sk)) };
    if sk.is_null() {
        return;
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
        return;
    }
    // SAFETY: non-null storage of this socket, sized for a `SockState`.
    let key = unsafe { (*state).key };
    let _ = BYPASS_SOCK_ADDRS.remove(key);
}

/// Whether `ip` is a pod address: in the exact map or inside a pod CIDR.
#[inline(always)]
fn is_pod(ip: &IpKey) -> bool {
    if BYPASS_POD_ADDRS.get_ptr(ip).is_some() {
        return true;
    }
    BYPASS_POD_CIDRS
        .get(&Key::new(128, key_bytes(*ip)))
        .is_some()
}
