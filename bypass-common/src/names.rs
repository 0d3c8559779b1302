//! Map names, program names and pin layout. The kernel side declares its maps under
//! these names; the agent looks them up and pins them under the same names.

/// SockHash of established pod-to-pod sockets, keyed by [`crate::SockKey`].
pub const MAP_SOCKETS: &str = "BYPASS_SOCKETS";
/// LPM trie of pod CIDRs, keyed by an `lpm_trie::Key<IpKey>` (IPv4 as `::ffff:0:0/96`).
pub const MAP_POD_CIDRS: &str = "BYPASS_POD_CIDRS";
/// Hash of exact pod addresses (`IpKey` → `u8`, the value is unused).
pub const MAP_POD_ADDRS: &str = "BYPASS_POD_ADDRS";
/// Hash of addresses that are never pod addresses even inside a pod CIDR (`IpKey` →
/// `u8`, unused): opted-out pods' and hostNetwork pods', so an opt-out holds whatever
/// CIDR covers the address.
pub const MAP_EXCLUDED_ADDRS: &str = "BYPASS_EXCLUDED_ADDRS";
/// Per-CPU `u64` counters indexed by [`crate::Stat`].
pub const MAP_STATS: &str = "BYPASS_STATS";
/// `Array<u32>` of [`crate::control::SLOTS`] control words.
pub const MAP_CONTROL: &str = "BYPASS_CONTROL";
/// Socket-local storage holding each inserted socket's [`crate::SockState`].
pub const MAP_SOCK_STATE: &str = "BYPASS_SOCK_STATE";
/// LPM trie of Service ClusterIP ranges (same key as [`MAP_POD_CIDRS`]): a pod's
/// connection to such an address is inserted, in case kube-proxy's DNAT lands it on a
/// pod of this node.
pub const MAP_SERVICE_CIDRS: &str = "BYPASS_SERVICE_CIDRS";
/// Hash of ports (`u32`, host order → `u8`, unused) whose connections are left alone.
pub const MAP_SKIP_PORTS: &str = "BYPASS_SKIP_PORTS";
/// LRU hash: network namespace cookie → the pod address (`IpKey`) a socket of that
/// namespace was seen with. Loopback connections are bypassed only in a namespace whose
/// pod address is still a pod address (so the per-pod opt-out covers them too).
pub const MAP_POD_NETNS: &str = "BYPASS_POD_NETNS";
/// LRU hash: a connecting socket's local [`crate::key::Endpoint`] →
/// [`crate::state::Connector`], for the accepting side of a translated connection.
pub const MAP_CONNECTORS: &str = "BYPASS_CONNECTORS";
/// Hash: a connecting socket's key → the [`crate::state::Link`] of its connection,
/// written by the accepting side when it pairs (never over a live one), read and
/// updated by both sides' sends and reads, removed when the second of its two sockets
/// closes.
pub const MAP_LINKS: &str = "BYPASS_LINKS";
/// Hash: a connecting socket's key → `u8` (unused): connections the agent cut (an
/// opted-out pod's, a pod whose network went away). Their sockets see it at their next
/// send or read ([`crate::control::SLOT_CUT_GEN`]) and the connection leaves the
/// SockHash.
pub const MAP_CUT: &str = "BYPASS_CUT";
/// LRU hash: a process (tgid) → `u8` (unused): processes seen calling `splice(2)`,
/// where the read guard cannot run; their sockets get no redirected bytes from their
/// next read on.
pub const MAP_SPLICERS: &str = "BYPASS_SPLICERS";
/// Hash: a pod address (`IpKey`) → the cookie (`u64`) of the network namespace that
/// owns it, as the agent observed it (an interface there holding the address whose
/// peer or lower device is in the node's own namespace: a pod's veth, netkit or
/// ipvlan end). While [`crate::control::SLOT_OWNERS_OFF`] is 0, a socket whose local
/// address is a pod address is inserted only in that address's owning namespace, so
/// no other namespace can pose as a pod, whatever copies of its addresses, ports and
/// sequence numbers it holds.
pub const MAP_NETNS_OWNERS: &str = "BYPASS_NETNS_OWNERS";
/// LRU hash: a pod address (`IpKey`) → `[u64; 2]`, how many times a socket was refused
/// for it, by [`crate::refusal`] kind: a socket of another namespace that used the
/// address while a pod owns it, and an accepted socket whose client on that address
/// had other sequence numbers. Per pod, for the agent's status and metrics.
pub const MAP_REFUSALS: &str = "BYPASS_REFUSALS";
/// Hash: a [`crate::key::ServiceBackend`] → `u8` (unused): each Service address and
/// port with a backend on this node's pods, written only by the agent (from the
/// Services and EndpointSlices, or `--service-backend`). A connection whose client
/// dialled another address than the one its server listens on is paired across
/// network namespaces only through such an entry.
pub const MAP_SERVICE_BACKENDS: &str = "BYPASS_SERVICE_BACKENDS";
/// Hash: a network namespace cookie (`u64`) → [`crate::state::PodCounts`]: what the
/// closed connections of the pod owning that namespace carried through the bypass.
/// sock_ops adds a socket's own counts (`Link::tx_redir` of its side) when it closes, so
/// sk_msg pays nothing per send for it; the agent adds the open connections' counts
/// from the links at each read, and removes the entries of namespaces that are gone. Keyed by namespace, not address: a namespace cookie is never
/// reused, so a new pod given an old pod's address never inherits its counts.
pub const MAP_POD_COUNTS: &str = "BYPASS_POD_COUNTS";
/// Ring buffer of [`crate::state::LeaveEvent`]s: connections that started to leave the
/// SockHash, for the agent to delete their sockets from it once each side has read
/// what was redirected to it.
pub const MAP_EVENTS: &str = "BYPASS_EVENTS";

/// Hash: a thread (tid) → [`crate::state::Verdict`]: the read guard's decision for
/// the splice or mapping that thread is making, from the call's entry to its return.
/// Only the programs use it (not pinned).
pub const MAP_VERDICTS: &str = "BYPASS_VERDICTS";
/// `Array<u64>` of one: how many [`MAP_VERDICTS`] entries there are, so a permission
/// check of any file on the node costs one array read while none is (not pinned).
pub const MAP_GUARDING: &str = "BYPASS_GUARDING";

/// Socket-local storage (`u8`, unused) of every socket sock_ops saw connect
/// (`BPF_SOCK_OPS_TCP_CONNECT_CB`): such a socket reaching `PASSIVE_ESTABLISHED` did a
/// simultaneous open, with sequence numbers its owner may have chosen (`TCP_REPAIR`),
/// and is never inserted as a server.
pub const MAP_ACTIVE_OPEN: &str = "BYPASS_ACTIVE_OPEN";

/// Every map the agent pins, [`MAP_CONTROL`] last (its pin marks a complete datapath):
/// every map that holds state, so that another build of the same layout adopts them
/// all, its programs reading what the established sockets' state says (the programs'
/// per-CPU scratch space alone is not pinned).
pub const PINNED_MAPS: [&str; 22] = [
    MAP_SOCKETS,
    MAP_POD_CIDRS,
    MAP_POD_ADDRS,
    MAP_EXCLUDED_ADDRS,
    MAP_STATS,
    MAP_SERVICE_CIDRS,
    MAP_SKIP_PORTS,
    MAP_POD_NETNS,
    MAP_CONNECTORS,
    MAP_LINKS,
    MAP_CUT,
    MAP_SPLICERS,
    MAP_EVENTS,
    MAP_NETNS_OWNERS,
    MAP_REFUSALS,
    MAP_SERVICE_BACKENDS,
    MAP_POD_COUNTS,
    MAP_SOCK_STATE,
    MAP_ACTIVE_OPEN,
    MAP_VERDICTS,
    MAP_GUARDING,
    MAP_CONTROL,
];

/// The sock_ops program: inserts eligible established sockets.
pub const PROG_SOCKOPS: &str = "bypass_sockops";
/// The sk_msg program: redirects each send to the peer socket.
pub const PROG_SKMSG: &str = "bypass_skmsg";
/// The cgroup setsockopt program: refuses an upper-layer protocol (`TCP_ULP`, e.g.
/// kTLS) on an inserted socket, and records receive options its peer must honour.
pub const PROG_SOCKOPT: &str = "bypass_sockopt";

/// Where a tracing program attaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HookKind {
    /// At a kernel function's entry (fentry; a BPF trampoline).
    Entry,
    /// At a kernel function's return (fexit; a BPF trampoline).
    Exit,
    /// At a kernel `security_*` function as fmod_ret (a BPF trampoline), able to refuse
    /// the call; the program is declared as an LSM program of the same hook (the same
    /// context), whether or not the BPF LSM is active.
    Guard,
    /// At a static tracepoint, typed by BTF (`tp_btf/<target>`).
    TracePoint,
    /// At a system call's entry tracepoint (`syscalls/sys_enter_<target>`).
    Syscall,
}

/// A tracing program of the object and where it attaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hook {
    /// The program's name.
    pub program: &'static str,
    /// How it attaches.
    pub kind: HookKind,
    /// The kernel function, LSM hook, tracepoint or system call it attaches to.
    pub target: &'static str,
}

/// A bypassed socket's read returned (tracepoint `sock_recv_length`, Linux >= 6.4),
/// where the kernel runs no BPF trampolines.
pub const PROG_READ: &str = "bypass_read";
/// A read of a bypassed socket enters `tcp_bpf_recvmsg` (counted in flight).
pub const PROG_READ_ENTER: &str = "bypass_read_enter";
/// ...and returns.
pub const PROG_READ_EXIT: &str = "bypass_read_exit";
/// A splice starts (`do_splice`: splice(2), io_uring's splice): the guard decides.
pub const PROG_SPLICE_ENTER: &str = "bypass_splice_enter";
/// That splice returns: its decision goes.
pub const PROG_SPLICE_EXIT: &str = "bypass_splice_exit";
/// A mapping starts (`vm_mmap_pgoff`: mmap(2)): the guard decides.
pub const PROG_MMAP_ENTER: &str = "bypass_mmap_enter";
/// That mapping returns: its decision goes.
pub const PROG_MMAP_EXIT: &str = "bypass_mmap_exit";
/// The read guard: the splice's permission check (`security_file_permission`) fails
/// as its entry decided.
pub const PROG_READ_GUARD: &str = "bypass_read_guard";
/// The mapping guard: the mapping's check (`security_mmap_file`) likewise.
pub const PROG_MMAP_GUARD: &str = "bypass_mmap_guard";
/// A receive with `MSG_OOB` or `MSG_TRUNC` is checked (`security_socket_recvmsg`):
/// the guard decides.
pub const PROG_RECV_ENTER: &str = "bypass_recv_enter";
/// That receive returns: its decision goes.
pub const PROG_RECV_EXIT: &str = "bypass_recv_exit";
/// The receive guard: the receive's permission check (`security_socket_recvmsg`) fails
/// as its entry decided.
pub const PROG_RECV_GUARD: &str = "bypass_recv_guard";
/// Where the read guard cannot run: a process calls `splice(2)`.
pub const PROG_SPLICE_SEEN: &str = "bypass_splice_seen";
/// The FIONREAD compensation (where the kernel self-test found FIONREAD wrong): the
/// answer of `ioctl(SIOCINQ)` on a socket in the SockHash, corrected as it returns.
pub const PROG_FIONREAD: &str = "bypass_fionread";

/// Publishing reads, where the kernel runs no BPF trampolines but has the
/// `sock_recv_length` tracepoint.
pub const READ_HOOKS: [Hook; 1] = [Hook {
    program: PROG_READ,
    kind: HookKind::TracePoint,
    target: "sock_recv_length",
}];

/// Publishing reads where the kernel runs BPF trampolines: the readers in flight are
/// counted (the exit attached before the entry, so no exit misses its entry).
pub const READ_TRAMPOLINE_HOOKS: [Hook; 2] = [
    Hook {
        program: PROG_READ_EXIT,
        kind: HookKind::Exit,
        target: "tcp_bpf_recvmsg",
    },
    Hook {
        program: PROG_READ_ENTER,
        kind: HookKind::Entry,
        target: "tcp_bpf_recvmsg",
    },
];

/// The read guard, where the kernel runs BPF trampolines, in the order the agent
/// attaches them: the exits, then the checks that apply the decisions, then the
/// entries that make them. The decision is made at the entry of the call (`do_splice`,
/// `vm_mmap_pgoff`), before its permission check (since Linux 6.8 `do_splice` checks
/// before it reaches `splice_file_to_pipe`), by a program that may read the socket's
/// storage; the check's fmod_ret program, which may not (`bpf_sk_storage_get` is not
/// allowed to it), only applies it.
pub const GUARD_HOOKS: [Hook; 9] = [
    Hook {
        program: PROG_SPLICE_EXIT,
        kind: HookKind::Exit,
        target: "do_splice",
    },
    Hook {
        program: PROG_MMAP_EXIT,
        kind: HookKind::Exit,
        target: "vm_mmap_pgoff",
    },
    Hook {
        program: PROG_RECV_EXIT,
        kind: HookKind::Exit,
        target: "security_socket_recvmsg",
    },
    Hook {
        program: PROG_READ_GUARD,
        kind: HookKind::Guard,
        target: "security_file_permission",
    },
    Hook {
        program: PROG_MMAP_GUARD,
        kind: HookKind::Guard,
        target: "security_mmap_file",
    },
    Hook {
        program: PROG_RECV_GUARD,
        kind: HookKind::Guard,
        target: "security_socket_recvmsg",
    },
    Hook {
        program: PROG_SPLICE_ENTER,
        kind: HookKind::Entry,
        target: "do_splice",
    },
    Hook {
        program: PROG_MMAP_ENTER,
        kind: HookKind::Entry,
        target: "vm_mmap_pgoff",
    },
    Hook {
        program: PROG_RECV_ENTER,
        kind: HookKind::Entry,
        target: "security_socket_recvmsg",
    },
];

/// Where the read guard cannot run: processes that splice are watched.
pub const WATCH_HOOKS: [Hook; 1] = [Hook {
    program: PROG_SPLICE_SEEN,
    kind: HookKind::Syscall,
    target: "splice",
}];

/// The FIONREAD compensation, where it runs: the return of `sk_ioctl` (Linux >= 6.5),
/// or of `tcp_ioctl` before (both put the answer at the user pointer they take third).
pub const FIONREAD_HOOKS: [Hook; 2] = [
    Hook {
        program: PROG_FIONREAD,
        kind: HookKind::Exit,
        target: "sk_ioctl",
    },
    Hook {
        program: PROG_FIONREAD,
        kind: HookKind::Exit,
        target: "tcp_ioctl",
    },
];

/// Every tracing program's hook, of every kind a load may attach (a program may appear
/// under more than one: the FIONREAD compensation's two candidate functions).
pub fn all_hooks() -> impl Iterator<Item = &'static Hook> {
    READ_HOOKS
        .iter()
        .chain(&READ_TRAMPOLINE_HOOKS)
        .chain(&GUARD_HOOKS)
        .chain(&WATCH_HOOKS)
        .chain(&FIONREAD_HOOKS)
}

/// Default pin directory on bpffs.
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/bypass";
/// Sub-directory of the pin directory that holds the maps.
pub const PIN_MAPS_SUBDIR: &str = "maps";
/// Sub-directory of the pin directory that holds the programs.
pub const PIN_PROGS_SUBDIR: &str = "progs";
/// Sub-directory of the pin directory that holds links.
pub const PIN_LINKS_SUBDIR: &str = "links";
/// Name of the pinned sock_ops cgroup link.
pub const PIN_LINK_SOCKOPS: &str = "sockops_cgroup";
/// Name of the pinned setsockopt cgroup link.
pub const PIN_LINK_SOCKOPT: &str = "sockopt_cgroup";

/// Default capacity of the SockHash (sockets, i.e. two per bypassed connection).
pub const DEFAULT_MAX_SOCKETS: u32 = 65_536;
/// Default capacity of the pod CIDR trie.
pub const DEFAULT_MAX_CIDRS: u32 = 1_024;
/// Default capacity of the exact pod address map.
pub const DEFAULT_MAX_ADDRS: u32 = 16_384;
/// Default capacity of the Service CIDR trie.
pub const DEFAULT_MAX_SERVICE_CIDRS: u32 = 64;
/// Capacity of the Service backend map ([`MAP_SERVICE_BACKENDS`]): Service ports
/// times their backends on this node's pods.
pub const MAX_SERVICE_BACKENDS: u32 = 16_384;
/// Capacity of the skip-port map.
pub const MAX_SKIP_PORTS: u32 = 256;
/// Capacity of the splicing-process map ([`MAP_SPLICERS`]).
pub const MAX_SPLICERS: u32 = 4_096;
/// Capacity of the verdict map ([`MAP_VERDICTS`]): threads splicing or mapping a
/// bypassed socket at once.
pub const MAX_VERDICTS: u32 = 16_384;
/// Capacity of the cut map ([`MAP_CUT`]).
pub const DEFAULT_MAX_CUT: u32 = 16_384;
/// Size of the leave-event ring buffer ([`MAP_EVENTS`]), bytes (a power of two, a
/// multiple of the page size): room for thousands of events between two reads.
pub const EVENTS_BYTES: u32 = 256 * 1024;
/// Capacity of the pod network namespace map (pods on one node, with room).
pub const DEFAULT_MAX_POD_NETNS: u32 = 4_096;
/// Capacity of the [`MAP_POD_COUNTS`] hash: pod network namespaces on one node, with
/// room (as [`DEFAULT_MAX_POD_NETNS`]). Not an LRU map: an entry is never evicted
/// (its pod's counter would go back); when full, a closing connection's counts are
/// not added ([`crate::Stat::PodCountsLost`]).
pub const MAX_POD_COUNTS: u32 = DEFAULT_MAX_POD_NETNS;
/// Capacity of the [`MAP_REFUSALS`] LRU hash (addresses refused for).
pub const MAX_REFUSALS: u32 = 4_096;
/// Istio's control-plane and sidecar-management ports, left alone by default: the
/// Envoy admin (15000), debug (15004), istiod xDS and CA (15010, 15012), istiod
/// monitoring (15014), webhook (15017), merged telemetry and health (15020, 15021), DNS
/// proxy (15053) and Envoy metrics (15090). The data ports (15001 outbound, 15006
/// inbound, 15008 HBONE) are not in it.
pub const DEFAULT_SKIP_PORTS: [u16; 10] = [
    15000, 15004, 15010, 15012, 15014, 15017, 15020, 15021, 15053, 15090,
];
/// Bound on what may wait for a reader ([`crate::control::SLOT_MAX_QUEUED`]) when
/// `net.ipv4.tcp_rmem` cannot be read: Linux's own default for its third value, the
/// size TCP lets a receive buffer grow to (net/ipv4/tcp.c, tcp_init_mem).
pub const DEFAULT_MAX_QUEUED_BYTES: u32 = 6 << 20;
/// Default of [`crate::control::SLOT_LEAVE_AFTER`]: a stream still waiting to come back
/// to redirects after this many bytes by TCP (its reader never catches up while it
/// writes) runs better as plain TCP than as TCP inside the SockHash, which copies each
/// write into a message first (net/ipv4/tcp_bpf.c, tcp_bpf_sendmsg).
pub const DEFAULT_LEAVE_AFTER: u32 = 4 << 20;
/// What a waiting message is charged besides its bytes when the kernel's BTF has no
/// `struct sk_msg` size: [`crate::layout::message_cost`] of its slab size on 6.x
/// (kmalloc-1k).
pub const DEFAULT_MSG_COST: u32 = 1024 + crate::layout::PAGE_COST;
/// Default size under which a stream of sends makes its connection leave the SockHash
/// ([`crate::control::SLOT_SMALL_STREAM`]): the SockHash sends each small write as a
/// message of its own (net/ipv4/tcp_bpf.c, tcp_bpf_sendmsg), where plain TCP coalesces
/// them (autocork).
pub const DEFAULT_SMALL_STREAM_BYTES: u32 = 256;
