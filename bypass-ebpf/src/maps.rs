//! The maps, declared under the names in `bypass_common::names`.

use aya_ebpf::{
    btf_maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray, RingBuf, SkStorage, SockHash},
    macros::btf_map,
};
use bypass_common::{
    Connector, Endpoint, IpKey, Link, PodCounts, SockKey, SockState, control,
    key::ServiceBackend,
    names::{
        DEFAULT_MAX_ADDRS, DEFAULT_MAX_CIDRS, DEFAULT_MAX_CUT, DEFAULT_MAX_POD_NETNS,
        DEFAULT_MAX_SERVICE_CIDRS, DEFAULT_MAX_SOCKETS, EVENTS_BYTES, MAX_POD_COUNTS, MAX_REFUSALS,
        MAX_SERVICE_BACKENDS, MAX_SKIP_PORTS, MAX_SPLICERS, MAX_VERDICTS,
    },
    refusal,
    state::{LeaveEvent, Verdict},
    stats::STAT_SLOTS,
};

/// Established pod-to-pod sockets. The agent may resize it at load time.
#[btf_map]
pub(crate) static BYPASS_SOCKETS: SockHash<SockKey, { DEFAULT_MAX_SOCKETS as usize }> =
    SockHash::new();

/// Pod CIDRs, IPv4 as `::ffff:0:0/96` prefixes.
#[btf_map]
pub(crate) static BYPASS_POD_CIDRS: LpmTrie<[u8; 16], u8, { DEFAULT_MAX_CIDRS as usize }> =
    LpmTrie::new();

/// Exact pod addresses.
#[btf_map]
pub(crate) static BYPASS_POD_ADDRS: HashMap<IpKey, u8, { DEFAULT_MAX_ADDRS as usize }> =
    HashMap::new();

/// Addresses that are never pod addresses, whatever CIDR holds them (opted-out pods).
#[btf_map]
pub(crate) static BYPASS_EXCLUDED_ADDRS: HashMap<IpKey, u8, { DEFAULT_MAX_ADDRS as usize }> =
    HashMap::new();

/// Per-CPU counters, indexed by `bypass_common::Stat`.
#[btf_map]
pub(crate) static BYPASS_STATS: PerCpuArray<u64, { STAT_SLOTS as usize }> = PerCpuArray::new();

/// Control words, slots in `bypass_common::control`.
#[btf_map]
pub(crate) static BYPASS_CONTROL: Array<u32, { control::SLOTS as usize }> = Array::new();

/// Each inserted socket's state, freed with the socket.
#[btf_map]
pub(crate) static BYPASS_SOCK_STATE: SkStorage<SockState> = SkStorage::new();

/// Sockets that connected (see `bypass_common::names::MAP_ACTIVE_OPEN`).
#[btf_map]
pub(crate) static BYPASS_ACTIVE_OPEN: SkStorage<u8> = SkStorage::new();

/// Service (ClusterIP) CIDRs, keyed like [`BYPASS_POD_CIDRS`].
#[btf_map]
pub(crate) static BYPASS_SERVICE_CIDRS: LpmTrie<
    [u8; 16],
    u8,
    { DEFAULT_MAX_SERVICE_CIDRS as usize },
> = LpmTrie::new();

/// Ports (host order) whose connections are left alone.
#[btf_map]
pub(crate) static BYPASS_SKIP_PORTS: HashMap<u32, u8, { MAX_SKIP_PORTS as usize }> = HashMap::new();

/// Network namespace cookie → a pod address seen as a local address there.
#[btf_map]
pub(crate) static BYPASS_POD_NETNS: LruHashMap<u64, IpKey, { DEFAULT_MAX_POD_NETNS as usize }> =
    LruHashMap::new();

/// Pod address → the cookie of the network namespace that owns it (see
/// `bypass_common::names::MAP_NETNS_OWNERS`); written only by the agent.
#[btf_map]
pub(crate) static BYPASS_NETNS_OWNERS: HashMap<IpKey, u64, { DEFAULT_MAX_ADDRS as usize }> =
    HashMap::new();

/// Service address and port → a backend on this node's pods (see
/// `bypass_common::names::MAP_SERVICE_BACKENDS`); written only by the agent.
#[btf_map]
pub(crate) static BYPASS_SERVICE_BACKENDS: HashMap<
    ServiceBackend,
    u8,
    { MAX_SERVICE_BACKENDS as usize },
> = HashMap::new();

/// One [`ServiceBackend`] of scratch space per CPU: sock_ops builds the key of a
/// lookup in [`BYPASS_SERVICE_BACKENDS`] there, off the 512-byte BPF stack.
#[btf_map]
pub(crate) static BYPASS_BACKEND_KEY: PerCpuArray<ServiceBackend, 1> = PerCpuArray::new();

/// Pod address → refusals by kind (`bypass_common::names::MAP_REFUSALS`).
#[btf_map]
pub(crate) static BYPASS_REFUSALS: LruHashMap<
    IpKey,
    [u64; refusal::KINDS],
    { MAX_REFUSALS as usize },
> = LruHashMap::new();

/// Network namespace cookie → what its pod's closed connections carried
/// (`bypass_common::names::MAP_POD_COUNTS`); added to by sock_ops at close only.
#[btf_map]
pub(crate) static BYPASS_POD_COUNTS: HashMap<u64, PodCounts, { MAX_POD_COUNTS as usize }> =
    HashMap::new();

/// Each inserted connecting socket, by its local end. The agent sizes it
/// like the SockHash.
#[btf_map]
pub(crate) static BYPASS_CONNECTORS: LruHashMap<
    Endpoint,
    Connector,
    { DEFAULT_MAX_SOCKETS as usize },
> = LruHashMap::new();

/// Each paired connection, by its connecting socket's key. The agent sizes it like the
/// SockHash. Not an LRU map: a live link is never evicted; it goes when the second of
/// its sockets closes (or the agent sweeps it after sock_ops was detached).
#[btf_map]
pub(crate) static BYPASS_LINKS: HashMap<SockKey, Link, { DEFAULT_MAX_SOCKETS as usize }> =
    HashMap::new();

/// One `Link` of scratch space per CPU: sock_ops builds a new link there, since it
/// does not fit on the 512-byte BPF stack beside the rest.
#[btf_map]
pub(crate) static BYPASS_SCRATCH: PerCpuArray<Link, 1> = PerCpuArray::new();

/// Connections the agent cut, by their link key (see `bypass_common::names::MAP_CUT`).
#[btf_map]
pub(crate) static BYPASS_CUT: HashMap<SockKey, u8, { DEFAULT_MAX_CUT as usize }> = HashMap::new();

/// Processes seen calling `splice(2)`, where the read guard cannot run.
#[btf_map]
pub(crate) static BYPASS_SPLICERS: LruHashMap<u32, u8, { MAX_SPLICERS as usize }> =
    LruHashMap::new();

/// The read guard's decisions, by thread ([`bypass_common::names::MAP_VERDICTS`]).
#[btf_map]
pub(crate) static BYPASS_VERDICTS: HashMap<u32, Verdict, { MAX_VERDICTS as usize }> =
    HashMap::new();

/// How many decisions [`BYPASS_VERDICTS`] holds ([`bypass_common::names::MAP_GUARDING`]).
#[btf_map]
pub(crate) static BYPASS_GUARDING: Array<u64, 1> = Array::new();

/// Connections that started to leave the SockHash, for the agent.
#[btf_map]
pub(crate) static BYPASS_EVENTS: RingBuf<LeaveEvent, { EVENTS_BYTES as usize }> = RingBuf::new();

/// The [`BYPASS_SOCK_STATE`] storage of the socket `sk`, created zeroed when `create`
/// is set; `None` when it has none (or it could not be created).
///
/// # Safety
/// `sk` must be the running program's own context socket, non-null: another socket
/// (one found in a map) would have its state read or created here.
#[inline(always)]
pub(crate) unsafe fn sock_state<S>(sk: *mut S, create: bool) -> Option<*mut SockState> {
    let flags = if create {
        u64::from(aya_ebpf::bindings::BPF_SK_STORAGE_GET_F_CREATE)
    } else {
        0
    };
    // SAFETY: the caller passes its context's non-null socket; the helper returns that
    // socket's storage or null.
    let state = unsafe {
        aya_ebpf::helpers::generated::bpf_sk_storage_get(
            map_ptr(&BYPASS_SOCK_STATE),
            sk.cast(),
            core::ptr::null_mut(),
            flags,
        )
    }
    .cast::<SockState>();
    (!state.is_null()).then_some(state)
}

/// Marks the running program's context socket `sk` as one that connected (`create`), or
/// says whether it is one.
///
/// # Safety
/// As [`sock_state`]: `sk` must be the running program's own context socket, non-null.
#[inline(always)]
pub(crate) unsafe fn active_open<S>(sk: *mut S, create: bool) -> bool {
    let flags = if create {
        u64::from(aya_ebpf::bindings::BPF_SK_STORAGE_GET_F_CREATE)
    } else {
        0
    };
    // SAFETY: the caller passes its context's non-null socket; the helper returns that
    // socket's storage or null.
    let mark = unsafe {
        aya_ebpf::helpers::generated::bpf_sk_storage_get(
            map_ptr(&BYPASS_ACTIVE_OPEN),
            sk.cast(),
            core::ptr::null_mut(),
            flags,
        )
    };
    !mark.is_null()
}

/// Address of a BTF map definition, as the helpers take it.
#[inline(always)]
pub(crate) fn map_ptr<T>(map: &'static T) -> *mut core::ffi::c_void {
    core::ptr::from_ref(map).cast_mut().cast()
}
