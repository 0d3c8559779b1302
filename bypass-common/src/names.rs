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
/// LRU hash: a connecting socket's key → the [`crate::state::Link`] of its connection,
/// written by the accepting side when it pairs, read by both sides' sends, removed when
/// the connecting socket closes.
pub const MAP_LINKS: &str = "BYPASS_LINKS";

/// Every map the agent pins, [`MAP_CONTROL`] last (its pin marks a complete datapath).
/// ([`MAP_SOCK_STATE`] is not pinned: only the programs use it.)
pub const PINNED_MAPS: [&str; 11] = [
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
    MAP_CONTROL,
];

/// The sock_ops program: inserts eligible established sockets.
pub const PROG_SOCKOPS: &str = "bypass_sockops";
/// The sk_msg program: redirects each send to the peer socket.
pub const PROG_SKMSG: &str = "bypass_skmsg";
/// The cgroup setsockopt program: refuses an upper-layer protocol (`TCP_ULP`, e.g.
/// kTLS) on an inserted socket, and records receive options its peer must honour.
pub const PROG_SOCKOPT: &str = "bypass_sockopt";

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
/// Capacity of the skip-port map.
pub const MAX_SKIP_PORTS: u32 = 256;
/// Capacity of the pod network namespace map (pods on one node, with room).
pub const DEFAULT_MAX_POD_NETNS: u32 = 4_096;
/// Istio's control-plane and sidecar-management ports, left alone by default: the
/// Envoy admin (15000), debug (15004), istiod xDS and CA (15010, 15012), istiod
/// monitoring (15014), webhook (15017), merged telemetry and health (15020, 15021), DNS
/// proxy (15053) and Envoy metrics (15090). The data ports (15001 outbound, 15006
/// inbound, 15008 HBONE) are not in it.
pub const DEFAULT_SKIP_PORTS: [u16; 10] = [
    15000, 15004, 15010, 15012, 15014, 15017, 15020, 15021, 15053, 15090,
];
/// Default bound on a peer's ingress queue ([`crate::control::SLOT_MAX_QUEUED`]).
pub const DEFAULT_MAX_QUEUED_BYTES: u32 = 64 << 20;
/// Default size under which a stream of sends takes the TCP path
/// ([`crate::control::SLOT_SMALL_STREAM`]): 0, off. The TCP path of a socket in the
/// SockHash pushes each message as it comes (net/ipv4/tcp_bpf.c, tcp_bpf_push), so it
/// does not coalesce a stream of small writes the way plain TCP does: measured, the
/// rule wins cross-CPU (qperf 1-16 B) and loses where the reader lags on its own CPU
/// (README, Performance).
pub const DEFAULT_SMALL_STREAM_BYTES: u32 = 0;
