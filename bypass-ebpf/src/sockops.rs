//! sock_ops: when a TCP connection is established and its two ends can be local pods,
//! give the socket its state, pair it with its peer when the peer is already known,
//! publish its address for its peer and insert it into the SockHash. Inserting attaches
//! the sk_msg program to the socket (net/core/sock_map.c, sock_map_link). When an
//! inserted socket closes, withdraw what it published.
//!
//! Three kinds of connection are paired (`bypass_common::state::hop`):
//! - pod address to pod address: each socket's key mirrors the other's;
//! - loopback inside a pod (a sidecar and its app): mirrored keys scoped to the pod's
//!   network namespace, so equal 127.0.0.1 tuples in two pods never meet;
//! - translated (iptables REDIRECT to a sidecar, kube-proxy's DNAT): the client's
//!   destination is not where the connection landed, so the accepting socket finds its
//!   client by the client's address and port, and proves it by the crossed initial
//!   sequence numbers.

use core::ptr::{addr_of, read_volatile};

use aya_ebpf::{
    bindings::{
        BPF_ANY, BPF_SK_STORAGE_GET_F_CREATE, BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB,
        BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB, BPF_SOCK_OPS_STATE_CB, BPF_SOCK_OPS_STATE_CB_FLAG,
        BPF_SOCK_OPS_TCP_CONNECT_CB, BPF_TCP_CLOSE,
    },
    btf_maps::lpm_trie::Key,
    helpers::generated::{bpf_get_netns_cookie, bpf_sk_storage_delete, bpf_sk_storage_get},
    macros::sock_ops,
    programs::SockOpsContext,
};
use bypass_common::{
    Connector, IpKey, Pairing, SockState, Stat,
    addr::{is_loopback, key_bytes},
    state::{hop, is_other_end},
    tx_mode,
};

use crate::{
    key,
    maps::{
        BYPASS_CONNECTORS, BYPASS_PAIRS, BYPASS_POD_ADDRS, BYPASS_POD_CIDRS, BYPASS_POD_NETNS,
        BYPASS_SERVICE_CIDRS, BYPASS_SKIP_PORTS, BYPASS_SOCK_ADDRS, BYPASS_SOCK_STATE,
        BYPASS_SOCKETS, map_ptr,
    },
    stats,
};

/// Why a socket was not inserted.
enum Skip {
    /// Not an establishment event, or not IPv4/IPv6.
    NotOurs,
    /// An end is not a pod address, data already left by TCP, or an accepted socket
    /// whose client is not a socket of this node's pods.
    Ineligible,
    /// A port is in the skip list.
    Port,
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
    if op == BPF_SOCK_OPS_TCP_CONNECT_CB {
        // A pod connecting anywhere marks its namespace as a pod's, so that its later
        // loopback connections (to its sidecar) qualify.
        let netns = netns_cookie(&ctx);
        if let Some(key) = key::from_sock_ops(ctx.ops, netns)
            && is_pod_address(&key.local_ip)
        {
            learn_netns(netns, &key.local_ip);
        }
        return 1;
    }
    match try_bypass_sockops(&ctx, op) {
        Ok(()) => stats::add(Stat::SocketsInserted, 1),
        Err(Skip::NotOurs) => {}
        Err(Skip::Ineligible) => stats::add(Stat::SocketsSkipped, 1),
        Err(Skip::Port) => stats::add(Stat::SkippedPorts, 1),
        Err(Skip::Failed) => stats::add(Stat::InsertFailures, 1),
    }
    // sock_ops return values only matter for ops that ask for a reply.
    1
}

#[inline(always)]
fn netns_cookie(ctx: &SockOpsContext) -> u64 {
    // SAFETY: the helper takes the program's context (kernels ≥ 5.15 allow it in
    // sock_ops).
    unsafe { bpf_get_netns_cookie(ctx.ops.cast()) }
}

// Keys are passed by reference to the socket's storage on purpose: by value they would
// be copied onto the 512-byte BPF stack.
#[allow(clippy::needless_borrows_for_generic_args)]
#[inline(always)]
fn try_bypass_sockops(ctx: &SockOpsContext, op: u32) -> Result<(), Skip> {
    let active = op == BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB;
    if !active && op != BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB {
        return Err(Skip::NotOurs);
    }
    let netns = netns_cookie(ctx);
    let key = key::from_sock_ops(ctx.ops, netns).ok_or(Skip::NotOurs)?;
    let (snd_nxt, rcv_nxt) = key::sequence(ctx.ops);
    let local_pod = is_pod_address(&key.local_ip);
    if local_pod {
        learn_netns(netns, &key.local_ip);
    }
    if skipped_port(key.local_port) || skipped_port(key.remote_port) {
        return Err(Skip::Port);
    }
    // The remote end of a connecting socket may also be a Service address that a DNAT
    // will land on a local pod.
    if !(local_pod || loopback_in_pod(&key.local_ip, netns))
        || !(is_pod_address(&key.remote_ip)
            || loopback_in_pod(&key.remote_ip, netns)
            || (active && is_service(&key.remote_ip)))
    {
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
    // SAFETY: non-null storage of this socket, sized for a `SockState`; written field by
    // field (a whole `SockState` on the stack would not fit beside the rest). A
    // connection established again on the same socket (after a disconnect) starts
    // afresh.
    let state = unsafe { &mut *state };
    state.key = key;
    state.tx_mode = tx_mode::UNDECIDED;
    state.hop = hop::UNPAIRED;
    // The address is only ever read back through bpf_probe_read_kernel; storing a
    // pointer in a map needs CAP_PERFMON (kernel/bpf/verifier.c, allow_ptr_leaks).
    state.sk = sk as u64;
    // The accepting side is established after its client (the client's callback runs
    // before it acknowledges the SYN-ACK, net/ipv4/tcp_input.c, tcp_finish_connect), so
    // it pairs the two. One with no client here (a pod on another node, a masqueraded
    // client) could never redirect nor be redirected to: it stays out of the map and off
    // tcp_bpf's paths.
    if !active && !pair(state, snd_nxt, rcv_nxt) {
        // SAFETY: `sk` is the context's non-null socket.
        unsafe { bpf_sk_storage_delete(map_ptr(&BYPASS_SOCK_STATE), sk.cast()) };
        return Err(Skip::Ineligible);
    }
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
        .insert(&state.key, state.sk, BPF_ANY.into())
        .map_err(|_| Skip::Failed)?;
    // SAFETY: the context pointer is valid for the program's run.
    if BYPASS_SOCKETS
        .update(&mut state.key, unsafe { &mut *ctx.ops }, BPF_ANY.into())
        .is_err()
    {
        let _ = BYPASS_SOCK_ADDRS.remove(&state.key);
        return Err(Skip::Failed);
    }
    if active {
        // The latest connecting socket on an end wins; the sequence check keeps an
        // older one (or another destination's) from being taken for it.
        let _ = BYPASS_CONNECTORS.insert(
            state.key.local_end(state.key.netns),
            Connector {
                key: state.key,
                snd_nxt,
                rcv_nxt,
            },
            BPF_ANY.into(),
        );
    } else {
        // Tell the client who its peer is; its next send picks this up.
        let _ = BYPASS_PAIRS.insert(
            &state.peer,
            Pairing {
                peer: state.key,
                hop: state.hop,
                reserved: 0,
            },
            BPF_ANY.into(),
        );
        if let Some(stat) = Stat::paired(state.hop) {
            stats::add(stat, 1);
        }
    }
    Ok(())
}

/// Finds the accepting socket `state`'s client and records it as its peer: the socket
/// under the mirrored key, or else the connecting socket on its remote end whose
/// sequence numbers cross with ours.
#[inline(always)]
fn pair(state: &mut SockState, snd_nxt: u32, rcv_nxt: u32) -> bool {
    let mirror = state.key.peer();
    if BYPASS_SOCK_ADDRS.get_ptr(mirror).is_some() {
        state.peer = mirror;
        state.hop = hop::of_mirror(&state.key);
        return true;
    }
    let Some(connector) = BYPASS_CONNECTORS.get_ptr(state.key.remote_end(state.key.netns)) else {
        return false;
    };
    // SAFETY: a live map value, read in place.
    let connector = unsafe { &*connector };
    if !is_other_end(connector, snd_nxt, rcv_nxt) {
        stats::add(Stat::PairRejected, 1);
        return false;
    }
    state.peer = connector.key;
    state.hop = hop::TRANSLATED;
    true
}

/// On the transition to TCP_CLOSE, what the socket published goes: the SockHash drops
/// the socket itself (net/core/sock_map.c, sock_map_unhash), and tcp_set_state runs
/// this callback before that (net/ipv4/tcp.c), well before the socket is freed.
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
    let _ = BYPASS_PAIRS.remove(key);
    let end = key.local_end(key.netns);
    if let Some(c) = BYPASS_CONNECTORS.get_ptr(end) {
        // SAFETY: a live map value.
        if unsafe { (*c).key } == key {
            let _ = BYPASS_CONNECTORS.remove(end);
        }
    }
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

/// Whether `ip` is inside a Service CIDR.
#[inline(always)]
fn is_service(ip: &IpKey) -> bool {
    BYPASS_SERVICE_CIDRS
        .get(&Key::new(128, key_bytes(*ip)))
        .is_some()
}

/// Whether `port` is in the skip list.
#[inline(always)]
fn skipped_port(port: u32) -> bool {
    BYPASS_SKIP_PORTS.get_ptr(port).is_some()
}

/// Whether `ip` is a pod address (never a loopback one).
#[inline(always)]
fn is_pod_address(ip: &IpKey) -> bool {
    !is_loopback(ip) && is_pod(ip)
}

/// Whether `ip` is loopback inside namespace `netns` whose pod address is still a pod
/// address (an opted-out or deleted pod's is not).
#[inline(always)]
fn loopback_in_pod(ip: &IpKey, netns: u64) -> bool {
    if !is_loopback(ip) {
        return false;
    }
    match BYPASS_POD_NETNS.get_ptr(netns) {
        // SAFETY: a live map value.
        Some(pod) => is_pod(&unsafe { *pod }),
        None => false,
    }
}

/// Records that namespace `netns` belongs to the pod whose address `ip` is (the caller
/// checked it is one).
#[inline(always)]
fn learn_netns(netns: u64, ip: &IpKey) {
    if let Some(known) = BYPASS_POD_NETNS.get_ptr(netns) {
        // SAFETY: a live map value.
        if unsafe { *known } == *ip {
            return;
        }
    }
    let _ = BYPASS_POD_NETNS.insert(netns, *ip, BPF_ANY.into());
}
