//! sock_ops: when a TCP connection is established and its two ends can be local pods,
//! give the socket its state and insert it into the SockHash (which attaches the sk_msg
//! program to it, net/core/sock_map.c, sock_map_link). A connecting socket publishes
//! itself ([`Connector`]); the accepting socket finds its client there, proves it by the
//! crossed initial sequence numbers, and writes the connection's [`Link`], which both
//! sides' sends read. When the connecting socket closes, what it published goes.
//!
//! Every key carries the socket's network namespace, so a socket elsewhere (a private
//! namespace holding a pod's addresses) never shares a key with a pod's; inserts never
//! replace (`BPF_NOEXIST`); pairing needs sequence numbers only the two ends saw. The
//! host's namespace (the node's own processes, hostNetwork pods) is never touched.
//!
//! Three kinds of connection are paired (`bypass_common::state::Hop`): pod address to
//! pod address, loopback inside a pod (a sidecar and its app, only in a namespace known
//! to be a pod's), and translated (iptables REDIRECT to a sidecar, kube-proxy's DNAT),
//! where the client's destination is not where the connection landed.

use core::ptr::{addr_of, addr_of_mut, read_volatile};

use aya_ebpf::{
    bindings::{
        BPF_ANY, BPF_NOEXIST, BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB,
        BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB, BPF_SOCK_OPS_STATE_CB, BPF_SOCK_OPS_STATE_CB_FLAG,
        BPF_SOCK_OPS_TCP_CONNECT_CB, BPF_TCP_CLOSE,
    },
    btf_maps::lpm_trie::Key,
    helpers::generated::{bpf_get_netns_cookie, bpf_get_socket_cookie, bpf_ktime_get_ns},
    macros::sock_ops,
    programs::SockOpsContext,
};
use bypass_common::{
    Connector, IpKey, Link, PodCounts, SockKey, SockState, Stat,
    addr::{is_loopback, key_bytes},
    control, refusal,
    state::{
        self, Hop, Pairing, flags, is_other_end, link_state, options_need_tcp, pairing, rx, side,
    },
    tx_mode,
};

use crate::{
    atomic, kernel, key, leave,
    maps::{
        BYPASS_BACKEND_KEY, BYPASS_CONNECTORS, BYPASS_CONTROL, BYPASS_EXCLUDED_ADDRS, BYPASS_LINKS,
        BYPASS_NETNS_OWNERS, BYPASS_POD_ADDRS, BYPASS_POD_CIDRS, BYPASS_POD_COUNTS,
        BYPASS_POD_NETNS, BYPASS_REFUSALS, BYPASS_SCRATCH, BYPASS_SERVICE_BACKENDS,
        BYPASS_SERVICE_CIDRS, BYPASS_SKIP_PORTS, BYPASS_SOCKETS, sock_state,
    },
    stats,
};

/// `TCPHDR_SYN` (include/net/tcp.h), as `skb_tcp_flags` carries it.
const TCP_FLAG_SYN: u32 = 0x02;

/// Why a socket was not inserted.
enum Skip {
    /// Not an establishment event, not IPv4/IPv6, or in the host's namespace.
    NotOurs,
    /// An end is not a pod address, data already left by TCP, or an accepted socket
    /// whose client is not a socket of this node's pods.
    Ineligible,
    /// A port is in the skip list.
    Port,
    /// The local pod address is not owned by the socket's network namespace.
    Foreign,
    /// An upper-layer protocol is attached (an MPTCP subflow).
    Ulp,
    /// An accepting socket whose client dialled an address this server is no backend
    /// of.
    Unreachable,
    /// No socket storage, no room in the SockHash (or the key is taken), or the kernel
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
    let netns = netns_cookie(&ctx);
    // The node's own sockets are never a pod's, whatever address they use (a bridge
    // CNI's gateway address lies inside the pod CIDR).
    if netns == kernel::host_netns() {
        return 1;
    }
    if op == BPF_SOCK_OPS_TCP_CONNECT_CB {
        // Remembered for good: a connecting socket that later reaches
        // PASSIVE_ESTABLISHED did a simultaneous open and is never a server.
        // SAFETY: context field load.
        let sk = unsafe { read_volatile(addr_of!((*ctx.ops).__bindgen_anon_2.sk)) };
        if !sk.is_null() {
            // SAFETY: `sk` is this program's context socket, checked non-null above.
            let _ = unsafe { crate::maps::active_open(sk, true) };
        }
        // A pod connecting anywhere marks its namespace as a pod's, so that its later
        // loopback connections (to its sidecar) qualify.
        if let Some(key) = key::from_sock_ops(ctx.ops, netns)
            && is_pod_address(&key.local_ip)
            && owns(&key.local_ip, netns)
        {
            learn_netns(netns, &key.local_ip);
        }
        return 1;
    }
    if op == BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB {
        forget_closed(&ctx);
    }
    match try_insert(&ctx, op, netns) {
        Ok(()) => stats::add(Stat::SocketsInserted, 1),
        Err(Skip::NotOurs) => {}
        Err(Skip::Ineligible) => stats::add(Stat::SocketsSkipped, 1),
        Err(Skip::Port) => stats::add(Stat::SkippedPorts, 1),
        Err(Skip::Foreign) => stats::add(Stat::ForeignNetns, 1),
        Err(Skip::Ulp) => stats::add(Stat::UlpSkipped, 1),
        Err(Skip::Unreachable) => stats::add(Stat::PairUnreachable, 1),
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

/// What the accepting side takes from its client's [`Connector`].
struct Client {
    key: SockKey,
    rcv_nxt: u32,
    cookie: u64,
    rx_tcp: u64,
    rx_limit: u32,
}

/// Inserts an established socket whose two ends can be local pods, and publishes it
/// (a client's [`Connector`]) or pairs it (a server's [`Link`]). Its steps are
/// `#[inline(always)]` functions that compile to the same sock_ops instructions as the
/// code they hold did inline (checked with llvm-objdump when they were named); what is
/// still written out here (the pod-address checks, the connector, the link) compiled to
/// another program when moved into a function, so it stays until a change of the
/// program is made on purpose (the stack is near its 512 bytes).
#[inline(always)]
fn try_insert(ctx: &SockOpsContext, op: u32, netns: u64) -> Result<(), Skip> {
    let active = op == BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB;
    if !active && op != BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB {
        return Err(Skip::NotOurs);
    }
    if !heartbeat_alive() {
        return Err(Skip::NotOurs);
    }
    let key = key::from_sock_ops(ctx.ops, netns).ok_or(Skip::NotOurs)?;
    check_handshake(ctx, active)?;
    let (snd_nxt, rcv_nxt) = key::sequence(ctx.ops);
    let local_pod = is_pod_address(&key.local_ip);
    let owned = local_pod && owns(&key.local_ip, netns);
    if owned {
        learn_netns(netns, &key.local_ip);
    }
    check_ports(&key)?;
    // The remote end of a connecting socket may also be a Service address that a DNAT
    // will land on a local pod.
    if !(local_pod || loopback_in_pod(&key.local_ip, netns))
        || !(is_pod_address(&key.remote_ip)
            || loopback_in_pod(&key.remote_ip, netns)
            || (active && is_service(&key.remote_ip)))
    {
        return Err(Skip::Ineligible);
    }
    check_local_owner(&key, local_pod, owned)?;
    check_nothing_sent(ctx)?;
    let own = kernel::established(ctx.ops).ok_or(Skip::Failed)?;
    check_send_path(&own, snd_nxt)?;
    check_no_simultaneous_open(ctx, active)?;
    // The accepting side is established after its client (the client's callback runs
    // before it acknowledges the SYN-ACK, net/ipv4/tcp_input.c, tcp_finish_connect).
    // One with no client here (a pod on another node, a masqueraded client) could never
    // redirect nor be redirected to: it stays out of the map and off tcp_bpf's paths.
    let client = if active {
        None
    } else {
        Some(proven_client(&key, snd_nxt, rcv_nxt)?)
    };
    let (state, cookie) = fresh_state(ctx, key, &own, rcv_nxt)?;
    insert_socket(ctx, state)?;
    match client {
        None => {
            state.link = state.key;
            state.side = side::CLIENT;
            // The latest connecting socket on an end wins; the sequence check keeps an
            // older one (or another namespace's) from being taken for it.
            let _ = BYPASS_CONNECTORS.insert(
                state.key.local_end(),
                Connector {
                    key: state.key,
                    snd_nxt,
                    rcv_nxt,
                    cookie,
                    rx_tcp: u64::from(state.rx_tcp),
                    rx_limit: own.rx_limit,
                    spent: 0,
                },
                BPF_ANY.into(),
            );
        }
        Some(client) => {
            state.link = client.key;
            state.side = side::SERVER;
            let kind = Hop::of(&client.key, &state.key);
            // The link makes the pair: until it exists neither side redirects. Written
            // after the insert, so a client that sees it finds this socket in the map,
            // and never over a live link (one left under the same key by a connection
            // not yet fully closed keeps its place: this one takes TCP). The connector
            // stays until its socket closes: a later accepting socket that claims the
            // same client end (a SNAT onto it) is then told apart by its sequence
            // numbers and counted (it spends the connector; this link stays). Each side
            // has read nothing yet, so its copied_seq is its rcv_nxt at establishment.
            let option = |t: u64| if t != 0 { rx::OPTION } else { 0 };
            let Some(new) = BYPASS_SCRATCH.get_ptr_mut(0) else {
                return Ok(());
            };
            // SAFETY: this CPU's scratch slot, a map value sized for a `Link`; written
            // field by field, then copied into the links map.
            let linked = unsafe {
                (*new).server = state.key;
                (*new).hop = kind as u32;
                (*new).state = 0;
                (*new).cookie = [client.cookie, cookie];
                (*new).tx_redir = [0, 0];
                (*new).rx_read = [0, 0];
                (*new).rx_flags = [option(client.rx_tcp), option(u64::from(state.rx_tcp))];
                (*new).rx_copied = [client.rcv_nxt, rcv_nxt];
                (*new).rx_limit = [client.rx_limit, own.rx_limit];
                // When it was made (plus one: 0 is "not recorded"), so that the agent
                // knows a later cut of everything has cut it (`Link::cut_by_all`).
                (*new).paired_gen = state.cut_gen.wrapping_add(1);
                BYPASS_LINKS.insert(&client.key, &*new, BPF_NOEXIST.into())
            };
            // Without a link (no room) the pair takes TCP; the socket stays inserted.
            if let (Ok(()), Some(l)) = (linked, BYPASS_LINKS.get_ptr_mut(&client.key)) {
                // SAFETY: the pair's entry in the links map, just found.
                unsafe { confirm_link(l, &client.key, kind) };
                // The agent takes an address from a pod (its owner lost or changed, its
                // pod opted out or gone), then walks the links to cut its connections.
                // A run that read the address as the pod's before that, and inserted
                // the link after the walk passed it, is cut here: confirm_link's fully
                // ordered atomic keeps these reads after the insert, so either the walk
                // sees the link or this sees the address taken.
                if !still_its_own(&state.key) || !still_its_own(&client.key) {
                    leave::cut(l, &client.key);
                }
            }
        }
    }
    Ok(())
}

/// Step of [`try_insert`]: a connecting socket must have been established by a SYN-ACK.
#[inline(always)]
fn check_handshake(ctx: &SockOpsContext, active: bool) -> Result<(), Skip> {
    // A connecting socket is established by the SYN-ACK it received; one in TCP_REPAIR
    // mode is established with no packet at all, with whatever sequence numbers its
    // owner set (net/ipv4/tcp_input.c, bpf_skops_established: no skb). Such a socket
    // could pose as a pod's client with the numbers of a handshake it never took part
    // in (another namespace's CAP_NET_ADMIN is enough): never insert it.
    // SAFETY: context field load.
    if active && unsafe { read_volatile(addr_of!((*ctx.ops).skb_tcp_flags)) } & TCP_FLAG_SYN == 0 {
        return Err(Skip::Ineligible);
    }
    Ok(())
}

/// Step of [`try_insert`]: neither port is in the skip list.
#[inline(always)]
fn check_ports(key: &SockKey) -> Result<(), Skip> {
    if skipped_port(key.local_port) || skipped_port(key.remote_port) {
        return Err(Skip::Port);
    }
    Ok(())
}

/// Step of [`try_insert`]: a local pod address is owned by the socket's namespace
/// (`owned`, as [`owns`] found it).
#[inline(always)]
fn check_local_owner(key: &SockKey, local_pod: bool, owned: bool) -> Result<(), Skip> {
    // Only the namespace that owns a pod address speaks for it: another one holding a
    // copy of the address (and of the ports and sequence numbers of a pod's
    // handshake, even after a handshake of its own) is never inserted, so it can
    // neither publish itself as a pod's client nor pair as its server.
    if local_pod && !owned {
        if owner_of(&key.local_ip).is_some() {
            refused(&key.local_ip, refusal::FOREIGN);
        }
        return Err(Skip::Foreign);
    }
    Ok(())
}

/// Step of [`try_insert`]: the socket has sent no data by TCP yet.
#[inline(always)]
fn check_nothing_sent(ctx: &SockOpsContext) -> Result<(), Skip> {
    // A socket that already sent data by TCP (TCP Fast Open with data in the SYN) must
    // stay there: its later bytes would overtake those on the wire.
    // SAFETY: context field load.
    if unsafe { read_volatile(addr_of!((*ctx.ops).data_segs_out)) } != 0 {
        return Err(Skip::Ineligible);
    }
    Ok(())
}

/// Step of [`try_insert`]: nothing of the socket's own keeps it on TCP's send path (bytes
/// queued, a Fast Open send, zero-copy, an upper-layer protocol).
#[inline(always)]
fn check_send_path(own: &kernel::Established, snd_nxt: u32) -> Result<(), Skip> {
    // Bytes already queued to TCP and not sent yet (a TCP Fast Open client's first
    // write without a cookie waits for the handshake's end) go by TCP too: later
    // redirected bytes would overtake them.
    // A TCP Fast Open send that is connecting goes on in plain tcp_sendmsg once the
    // handshake ends, with its data (net/ipv4/tcp.c, tcp_sendmsg_fastopen): those bytes
    // never pass sk_msg, so this socket must never redirect after them.
    if own.write_seq != snd_nxt || own.fastopen {
        return Err(Skip::Ineligible);
    }
    // A zero-copy sender (SO_ZEROCOPY, or a listener's inherited) keeps TCP's own send
    // path: a socket in a sockmap copies every send into an sk_msg and gives
    // MSG_ZEROCOPY no completion notifications.
    if own.zerocopy {
        return Err(Skip::Ineligible);
    }
    // An upper-layer protocol (an MPTCP subflow) owns the byte stream: never redirect
    // around it.
    if own.ulp {
        return Err(Skip::Ulp);
    }
    Ok(())
}

/// Step of [`try_insert`]: an accepting socket was not connected by its owner (a
/// simultaneous open).
#[inline(always)]
fn check_no_simultaneous_open(ctx: &SockOpsContext, active: bool) -> Result<(), Skip> {
    // A socket its owner connected that comes here as an accepting one did a
    // simultaneous open: no listener chose its initial sequence number, its owner may
    // have (TCP_REPAIR), and it could pose as the server of a handshake it never took
    // part in. Never a server.
    if !active {
        // SAFETY: context field load.
        let sk = unsafe { read_volatile(addr_of!((*ctx.ops).__bindgen_anon_2.sk)) };
        // SAFETY: `sk` is this program's context socket, checked non-null first.
        if sk.is_null() || unsafe { crate::maps::active_open(sk, false) } {
            return Err(Skip::Ineligible);
        }
    }
    Ok(())
}

/// Step of [`try_insert`]: the socket's storage, set for a new connection; returns it
/// with the socket's cookie.
// The key by value, moved into the storage as before this step had a name: by reference
// LLVM compiles sock_ops differently (another stack layout), a change to make on purpose.
#[inline(always)]
fn fresh_state(
    ctx: &SockOpsContext,
    key: SockKey,
    own: &kernel::Established,
    rcv_nxt: u32,
) -> Result<(&'static mut SockState, u64), Skip> {
    // SAFETY: context field load.
    let sk = unsafe { read_volatile(addr_of!((*ctx.ops).__bindgen_anon_2.sk)) };
    if sk.is_null() {
        return Err(Skip::Failed);
    }
    // SAFETY: the helper takes the program's context.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.ops.cast()) };
    // SAFETY: `sk` is this program's context socket, checked non-null above.
    let Some(state) = (unsafe { sock_state(sk, true) }) else {
        return Err(Skip::Failed);
    };
    // SAFETY: non-null storage of this socket, sized for a `SockState`; written field by
    // field (a whole `SockState` on the stack would not fit beside the rest). A
    // connection established again on the same socket (after a disconnect) starts
    // afresh (but for `readers`: a reader of the old connection may still be inside).
    let state = unsafe { &mut *state };
    state.key = key;
    state.side = side::NONE;
    state.tx_mode = tx_mode::UNDECIDED;
    state.small_run = 0;
    state.rx_tcp = u32::from(options_need_tcp(own.rcvlowat, own.peek_off));
    state.flags &= !flags::RX_FROZEN;
    // Nothing read yet: copied_seq is rcv_nxt.
    state.copied_last = u64::from(rcv_nxt);
    state.tcp_total = 0;
    state.read_total = 0;
    state.tx_msgs = 0;
    state.cp_msgs = 0;
    state.cp_redir = 0;
    state.done_msgs = 0;
    state.tcp_run = 0;
    state.cookie = cookie;
    // Cuts made before this connection existed are not its own: it checks from the
    // generation it was inserted at (a cut of everything made earlier spares it).
    state.cut_gen = BYPASS_CONTROL
        .get(control::SLOT_CUT_GEN)
        .copied()
        .unwrap_or(0);
    Ok((state, cookie))
}

/// Step of [`try_insert`]: asks for the state callback and inserts the socket into the
/// SockHash under its key.
#[inline(always)]
fn insert_socket(ctx: &SockOpsContext, state: &mut SockState) -> Result<(), Skip> {
    // The state callback withdraws what the socket published when it closes, so the
    // maps cannot fill with dead sockets (include/uapi/linux/bpf.h,
    // BPF_SOCK_OPS_STATE_CB).
    if ctx
        .set_cb_flags((ctx.cb_flags() | BPF_SOCK_OPS_STATE_CB_FLAG) as i32)
        .is_err()
    {
        return Err(Skip::Failed);
    }
    // Never replaces: a key names one socket.
    // SAFETY: the context pointer is valid for the program's run.
    if BYPASS_SOCKETS
        .update(&mut state.key, unsafe { &mut *ctx.ops }, BPF_NOEXIST.into())
        .is_err()
    {
        return Err(Skip::Failed);
    }
    state.flags |= flags::INSERTED;
    Ok(())
}

/// Step of [`try_insert`] once the pair's link is in the links map: the client's receive
/// option is carried over, and the pair counted.
///
/// # Safety
///
/// `l` must be a live value of the links map (`BYPASS_LINKS`).
#[inline(always)]
unsafe fn confirm_link(l: *mut Link, client: &SockKey, kind: Hop) {
    // The client may have asked for a receive option between our read of
    // its connector and the link's insert: it wrote the connector then, and
    // finds the link from now on. A fully ordered atomic between our insert
    // and our read of the connector (see sockopt::record_rx_tcp).
    // SAFETY: a live map value.
    unsafe { atomic::load_ordered(addr_of_mut!((*l).state)) };
    if connector_rx_tcp(client) {
        // SAFETY: a live map value; only its client's flag is or-ed.
        unsafe { atomic::or_u64(addr_of_mut!((*l).rx_flags[0]), rx::OPTION) };
    }
    stats::add(Stat::paired(kind), 1);
}

/// Whether the agent's heartbeat (`control::SLOT_HEARTBEAT`) is still ahead of
/// `CLOCK_MONOTONIC`: past it no agent tends the maps, and nothing new is inserted.
#[inline(always)]
fn heartbeat_alive() -> bool {
    let deadline = BYPASS_CONTROL
        .get(control::SLOT_HEARTBEAT)
        .copied()
        .unwrap_or(0);
    // SAFETY: a helper without arguments, allowed in every program type.
    control::heartbeat_alive(deadline, unsafe { bpf_ktime_get_ns() })
}

/// Step of [`try_insert`], accepting side only: its client, the connecting socket on
/// its remote end that could have reached it and whose initial sequence numbers cross
/// with its own. The first socket that gets this far with numbers that do not cross
/// spends the connector ([`Pairing::Spend`]): no later one is paired with it, so a pod
/// cannot try numbers for as long as the client lives. It comes after every other check
/// (this socket's own, made before this step, and reachability here): a socket refused
/// for another reason spends nothing.
#[inline(always)]
fn proven_client(key: &SockKey, snd_nxt: u32, rcv_nxt: u32) -> Result<Client, Skip> {
    let ptr = BYPASS_CONNECTORS
        .get_ptr_mut(key.remote_end())
        .ok_or(Skip::Ineligible)?;
    // SAFETY: a live map value, read in place (connectors live in an LRU map, whose
    // elements are reused at once: what is read here is checked again on the copy).
    let connector = unsafe { &*ptr };
    if !reachable(&connector.key, key) {
        refused(&key.local_ip, refusal::PAIRING);
        return Err(Skip::Unreachable);
    }
    // The claim, before any comparison: one fetching atomic or, so of the sockets that
    // get here at once on several CPUs, one finds the connector unclaimed and is the
    // only one compared. Only while the element is still this end's connector: one
    // reused for another end before this check is left alone. One reused between this
    // check and the claim (for another end, or for a later client on this end) is
    // claimed, and spent: that record's client takes TCP. One reused after the claim
    // has its bit cleared by the new record's write, which the reload after the copy
    // sees if that write is complete and nothing claimed the new record meanwhile (the
    // reload checks that a claim is there, not whose): docs/guarantees.md gives the
    // odds of what is left.
    if !connector.key.local_end().same(&key.remote_end()) {
        stats::add(Stat::PairRejected, 1);
        return Err(Skip::Ineligible);
    }
    // SAFETY: a live map value; `rx_limit` starts an aligned 64-bit word whose second
    // half is `spent` (asserted beside `Connector`).
    let old = unsafe {
        atomic::or_u64(
            addr_of_mut!((*ptr).rx_limit).cast::<u64>(),
            state::SPENT_IN_WORD,
        )
    };
    match pairing(old & state::SPENT_IN_WORD != 0, connector, snd_nxt, rcv_nxt) {
        Pairing::Pair => {}
        verdict => {
            if verdict == Pairing::Spend {
                stats::add(Stat::PairSpent, 1);
            }
            stats::add(Stat::PairRejected, 1);
            refused(&key.remote_ip, refusal::PAIRING);
            return Err(Skip::Ineligible);
        }
    }
    // A client on a pod address must still be in the namespace that owns it: one that
    // published itself before its namespace lost the address (its network cut, the
    // address contested) is not paired. (A connecting socket is inserted only on a pod
    // address or on loopback inside a pod.) Read in place, not copied onto the stack
    // (the stack is at its limit); an element reused meanwhile fails the checks below.
    if !is_loopback(&connector.key.local_ip) && !owns(&connector.key.local_ip, connector.key.netns)
    {
        stats::add(Stat::ForeignNetns, 1);
        return Err(Skip::Ineligible);
    }
    let client = Client {
        key: connector.key,
        rcv_nxt: connector.rcv_nxt,
        cookie: connector.cookie,
        rx_tcp: connector.rx_tcp,
        rx_limit: connector.rx_limit,
    };
    // The copy is the proven client's only if it names this end, the live element
    // still carries the sequence numbers compared, and its connection could reach this
    // socket (the reachability above was read from the element before the copy).
    // SAFETY: as above.
    if !client.key.local_end().same(&key.remote_end())
        || !is_other_end(unsafe { &*ptr }, snd_nxt, rcv_nxt)
    {
        stats::add(Stat::PairRejected, 1);
        return Err(Skip::Ineligible);
    }
    if !reachable(&client.key, key) {
        refused(&key.local_ip, refusal::PAIRING);
        return Err(Skip::Unreachable);
    }
    // Still the record this socket claimed: an element reused after the claim, and
    // written whole by a new connector (`spent` clear), would otherwise give the new
    // record a second comparison.
    // SAFETY: as for the claim.
    let word = unsafe { atomic::load_ordered(addr_of_mut!((*ptr).rx_limit).cast::<u64>()) };
    if word & state::SPENT_IN_WORD == 0 {
        stats::add(Stat::PairRejected, 1);
        return Err(Skip::Ineligible);
    }
    Ok(client)
}

/// Whether the packets of `client`'s connection could have reached `server`, so that
/// the server may be its peer. They reach the owner of the address they were sent to:
/// the server's namespace when it owns the (non-loopback) address the client dialled (nothing
/// translated, or a redirect to another port inside the server's namespace); any
/// socket of the client's own namespace (its own redirect to a sidecar); else only a
/// backend of the dialled Service address and port on this node, as the agent wrote
/// them ([`BYPASS_SERVICE_BACKENDS`]). Another pod's listener, fed a handshake crafted
/// with the client's sequence numbers, is none of these, whatever its sequence
/// numbers.
#[inline(always)]
fn reachable(client: &SockKey, server: &SockKey) -> bool {
    if client.netns == server.netns {
        return true;
    }
    // A loopback address is another host in every namespace: never the shortcut.
    if !is_loopback(&server.local_ip) && client.remote_ip == server.local_ip {
        return true;
    }
    let Some(k) = BYPASS_BACKEND_KEY.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: this CPU's scratch slot, sized for a `ServiceBackend`; written field by
    // field, then used as the lookup key in place (not copied onto the BPF stack).
    // Accepting sockets are established in softirq, which does not nest on a CPU; where
    // it can be preempted (PREEMPT_RT) another run may rewrite the slot in between: the
    // key is read back after the lookup, and a found entry counts only if it was this
    // connection's (else refused: it fails closed).
    unsafe {
        (*k).vip = client.remote_ip;
        (*k).target = server.local_ip;
        (*k).vip_port = client.remote_port;
        (*k).target_port = server.local_port;
        BYPASS_SERVICE_BACKENDS.get_ptr(&*k).is_some()
            && (*k).vip == client.remote_ip
            && (*k).target == server.local_ip
            && (*k).vip_port == client.remote_port
            && (*k).target_port == server.local_port
    }
}

/// Whether the connector of the client with `key` records a receive option (see
/// `sockopt::record_rx_tcp` for the order of the two sides' writes and reads).
#[inline(always)]
fn connector_rx_tcp(key: &SockKey) -> bool {
    match BYPASS_CONNECTORS.get_ptr(&key.local_end()) {
        // SAFETY: a live map value, read in place.
        Some(c) => unsafe { (*c).key == *key && (*c).rx_tcp != 0 },
        None => false,
    }
}

/// Removes the connector entry at `end` if it is still `owner`'s.
#[inline(always)]
fn remove_connector(end: &bypass_common::Endpoint, owner: &SockKey) {
    if let Some(c) = BYPASS_CONNECTORS.get_ptr(end) {
        // SAFETY: a live map value.
        if unsafe { (*c).key } == *owner {
            let _ = BYPASS_CONNECTORS.remove(end);
        }
    }
}

/// The storage of the program's socket, if it has any.
#[inline(always)]
fn existing_state(ctx: &SockOpsContext) -> Option<&'static mut SockState> {
    // SAFETY: context field load.
    let sk = unsafe { read_volatile(addr_of!((*ctx.ops).__bindgen_anon_2.sk)) };
    if sk.is_null() {
        return None;
    }
    // SAFETY: `sk` is this program's context socket, checked non-null above.
    let state = unsafe { sock_state(sk, false) }?;
    // SAFETY: non-null storage of this socket, sized for a `SockState`.
    Some(unsafe { &mut *state })
}

/// A socket established again after it closed (connect after a disconnect) is not its
/// old connection's any more, whether or not it is inserted again: its reads are no
/// longer counted against that connection, nor guarded by it.
#[inline(always)]
fn forget_closed(ctx: &SockOpsContext) {
    let Some(state) = existing_state(ctx) else {
        return;
    };
    if state.flags & flags::CLOSED != 0 {
        state.side = side::NONE;
        state.flags &= !(flags::CLOSED | flags::RX_FROZEN);
        state.rx_due = 0;
    }
}

/// On the transition to TCP_CLOSE: a connecting socket's connector goes, the socket
/// counts what its peer redirected to it, and the connection's link records that this
/// side closed; the second side to close removes it. The socket may still be read
/// (an application holds it until close(2), and a socket that half-closed first
/// closes on its peer's FIN with its peer's last redirected bytes queued), so it keeps
/// its side, and its read guard goes by its own counts from now on (guard.rs,
/// closed_guard). tcp_set_state runs this callback (net/ipv4/tcp.c) well before the
/// socket is freed.
#[inline(always)]
fn on_state_change(ctx: &SockOpsContext) {
    if ctx.arg(1) != BPF_TCP_CLOSE {
        return;
    }
    let Some(state) = existing_state(ctx) else {
        return;
    };
    // TCP_CLOSE may be set more than once (tcp_done, then the close of the file).
    if state.side == side::NONE || state.flags & flags::CLOSED != 0 {
        return;
    }
    state.flags |= flags::CLOSED;
    if state.side == side::CLIENT {
        remove_connector(&state.key.local_end(), &state.key);
    }
    if let Some(l) = BYPASS_LINKS.get_ptr_mut(&state.link) {
        let me = side::index(state.side);
        // SAFETY: a live map value: its cookie and the peer's count read, its state word
        // or-ed.
        unsafe {
            if read_volatile(addr_of!((*l).cookie[me])) == state.cookie {
                // The bit first, then the peer's count, both fully ordered: a send the
                // peer claims after this sees the bit and takes TCP (skmsg.rs, claim),
                // one claimed before is counted here. So `rx_due` is every byte that
                // will ever be redirected to this socket (or more, by a claim undone
                // after: then the guard refuses, never lets through early).
                // This side's own count is final: only its sends add to it, under its
                // lock (held here too), and a closed socket sends nothing more by
                // redirect (skmsg.rs, can_send). Read before the closed bit: once both
                // bits are set the peer may delete the link and the element be reused
                // at once. Added to the pod after the bit: the agent reads the pod
                // counts first, then adds the links whose side has no closed bit, so a
                // close between its two reads is missed for one read, never counted
                // twice (the agent keeps its export monotonic over that).
                let own = atomic::load_ordered(addr_of_mut!((*l).tx_redir[me]));
                let closed = link_state::closed(state.side);
                let before = atomic::or_u64(addr_of_mut!((*l).state), closed);
                state.rx_due =
                    atomic::load_ordered(addr_of_mut!((*l).tx_redir[side::peer_index(state.side)]));
                if before & closed == 0 {
                    count_for_pod(state, own);
                }
                if (before | closed) & link_state::BOTH_CLOSED == link_state::BOTH_CLOSED {
                    let _ = BYPASS_LINKS.remove(&state.link);
                }
            }
        }
    }
    // Freed with the socket. Until then it keeps its side: an application may still
    // read it (a socket that half-closed first closes on its peer's FIN, with the peer's
    // last redirected bytes still in its ingress queue), and the read guard and the
    // read accounting must still see it.
}

/// Adds a closing paired socket's `bytes` (its side's `tx_redir`) and its connection to
/// its pod's entry, by its network namespace: per-pod accounting at close, so sk_msg's
/// per-send cost is unchanged. Bounded by the map: only namespaces whose sockets are
/// inserted (those owning a pod address) get here, and the agent removes the entries
/// of namespaces that are gone; a full map loses the count, counted.
#[inline(always)]
fn count_for_pod(state: &SockState, bytes: u64) {
    let netns = state.key.netns;
    let conns = u64::from(PodCounts::counts_connection(
        state.side,
        netns,
        state.link.netns,
    ));
    if let Some(c) = BYPASS_POD_COUNTS.get_ptr_mut(netns) {
        // SAFETY: a live map value; fetching adds (other sockets of the pod close on
        // other CPUs).
        unsafe {
            atomic::add_u64(addr_of_mut!((*c).bytes), bytes);
            atomic::add_u64(addr_of_mut!((*c).connections), conns);
        }
        return;
    }
    let first = PodCounts {
        bytes,
        connections: conns,
    };
    if BYPASS_POD_COUNTS
        .insert(netns, first, BPF_NOEXIST.into())
        .is_ok()
    {
        return;
    }
    // Another socket of the pod created the entry meanwhile: add to it.
    if let Some(c) = BYPASS_POD_COUNTS.get_ptr_mut(netns) {
        // SAFETY: as above.
        unsafe {
            atomic::add_u64(addr_of_mut!((*c).bytes), bytes);
            atomic::add_u64(addr_of_mut!((*c).connections), conns);
        }
        return;
    }
    stats::add(Stat::PodCountsLost, 1);
}

/// Whether `ip` is a pod address: in the exact map, or inside a pod CIDR and not an
/// excluded (opted-out) address.
#[inline(always)]
fn is_pod(ip: &IpKey) -> bool {
    if BYPASS_POD_ADDRS.get_ptr(ip).is_some() {
        return true;
    }
    if BYPASS_POD_CIDRS
        .get(&Key::new(128, key_bytes(*ip)))
        .is_none()
    {
        return false;
    }
    BYPASS_EXCLUDED_ADDRS.get_ptr(ip).is_none()
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

/// Whether the local end of `key` still speaks for its pod, as [`try_insert`] and
/// [`proven_client`] judged it: a pod address its namespace owns, or loopback inside a
/// pod that still holds its address ([`loopback_in_pod`]).
#[inline(always)]
fn still_its_own(key: &SockKey) -> bool {
    if is_loopback(&key.local_ip) {
        loopback_in_pod(&key.local_ip, key.netns)
    } else {
        is_pod(&key.local_ip) && owns(&key.local_ip, key.netns)
    }
}

/// Whether `ip` is a pod address (never a loopback one).
#[inline(always)]
fn is_pod_address(ip: &IpKey) -> bool {
    !is_loopback(ip) && is_pod(ip)
}

/// Whether `ip` is loopback inside namespace `netns` whose pod address is still a pod
/// address (an opted-out or deleted pod's is not) and still the namespace's own (one it
/// lost, to another namespace or to none, is not: the record of what it learned stays
/// until evicted, and a cut finds the namespace by its owner only while it owns).
#[inline(always)]
fn loopback_in_pod(ip: &IpKey, netns: u64) -> bool {
    if !is_loopback(ip) {
        return false;
    }
    match BYPASS_POD_NETNS.get_ptr(netns) {
        Some(pod) => {
            // SAFETY: a live map value, copied.
            let pod = unsafe { *pod };
            is_pod(&pod) && owns(&pod, netns)
        }
        None => false,
    }
}

/// The cookie of the network namespace that owns pod address `ip`, as the agent
/// observed it.
#[inline(always)]
fn owner_of(ip: &IpKey) -> Option<u64> {
    // SAFETY: a live map value, copied.
    BYPASS_NETNS_OWNERS.get_ptr(ip).map(|o| unsafe { *o })
}

/// Whether namespace `netns` may use pod address `ip` as its own: it owns it, or the
/// agent turned the ownership check off (`control::SLOT_OWNERS_OFF`).
#[inline(always)]
fn owns(ip: &IpKey, netns: u64) -> bool {
    let off = BYPASS_CONTROL
        .get(control::SLOT_OWNERS_OFF)
        .copied()
        .unwrap_or(0);
    off != 0 || owner_of(ip) == Some(netns)
}

/// Counts a refusal of kind `kind` (`bypass_common::refusal`) for pod address `ip`.
// The counts by reference on purpose: by value they would be copied onto the BPF stack.
#[inline(always)]
fn refused(ip: &IpKey, kind: usize) {
    if kind >= refusal::KINDS {
        return;
    }
    if let Some(counts) = BYPASS_REFUSALS.get_ptr_mut(ip) {
        // SAFETY: a live map value; `kind` is in bounds (checked above).
        unsafe { atomic::add_u64(addr_of_mut!((*counts)[kind]), 1) };
        return;
    }
    let mut counts = [0u64; refusal::KINDS];
    counts[kind] = 1;
    // Two first refusals at once: one of them is lost, a count, never a decision.
    let _ = BYPASS_REFUSALS.insert(ip, &counts, BPF_NOEXIST.into());
}

/// Records that namespace `netns` (never the host's: the caller checked) belongs to the
/// pod whose address `ip` is (the caller checked it is one).
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
