//! sock_ops: when a TCP connection is established and both of its ends are pod
//! addresses, give the socket a `tx_mode` and insert it into the SockHash. Inserting
//! attaches the sk_msg program to the socket (net/core/sock_map.c, sock_map_link).

use core::ptr::{addr_of, read_volatile};

use aya_ebpf::{
    bindings::{
        BPF_ANY, BPF_SK_STORAGE_GET_F_CREATE, BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB,
        BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB,
    },
    btf_maps::lpm_trie::Key,
    helpers::generated::bpf_sk_storage_get,
    macros::sock_ops,
    programs::SockOpsContext,
};
use bypass_common::{IpKey, Stat, addr::key_bytes, tx_mode};

use crate::{
    key,
    maps::{BYPASS_POD_ADDRS, BYPASS_POD_CIDRS, BYPASS_SOCKETS, BYPASS_TX_MODE, map_ptr},
    stats,
};

/// Why a socket was not inserted.
enum Skip {
    /// Not an establishment event, or not IPv4/IPv6.
    NotOurs,
    /// An end is not a pod address, or data already left by TCP.
    Ineligible,
    /// No socket storage or no room in the SockHash.
    Failed,
}

#[sock_ops]
pub fn bypass_sockops(ctx: SockOpsContext) -> u32 {
    match try_bypass_sockops(&ctx) {
        Ok(()) => stats::add(Stat::SocketsInserted, 1),
        Err(Skip::NotOurs) => {}
        Err(Skip::Ineligible) => stats::add(Stat::SocketsSkipped, 1),
        Err(Skip::Failed) => stats::add(Stat::InsertFailures, 1),
    }
    // sock_ops return values only matter for ops that ask for a reply.
    1
}

#[inline(always)]
fn try_bypass_sockops(ctx: &SockOpsContext) -> Result<(), Skip> {
    let op = ctx.op();
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
    let mode = unsafe {
        bpf_sk_storage_get(
            map_ptr(&BYPASS_TX_MODE),
            sk.cast(),
            core::ptr::null_mut(),
            BPF_SK_STORAGE_GET_F_CREATE.into(),
        )
    }
    .cast::<u32>();
    if mode.is_null() {
        return Err(Skip::Failed);
    }
    // SAFETY: non-null storage of this socket, sized for a u32.
    unsafe { *mode = tx_mode::UNDECIDED };
    let mut key = key;
    BYPASS_SOCKETS
        // SAFETY: the context pointer is valid for the program's run.
        .update(&mut key, unsafe { &mut *ctx.ops }, BPF_ANY.into())
        .map_err(|_| Skip::Failed)
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
