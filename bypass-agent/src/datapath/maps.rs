//! Typed views over the maps, usable from the loading agent or, through the pins, from
//! another process (`status`).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use aya::maps::{
    Array, HashMap, Map, MapData, PerCpuArray, SockHash,
    lpm_trie::{Key, LpmTrie},
};
use bypass_common::{
    Connector, Counters, Endpoint, IpKey, Link, SockKey, Stat, addr::ip_from_key, control, ip_key,
    key::ServiceBackend, names,
};

use super::pins::PinLayout;
use crate::{backend::Backend, cidr::PodCidr, error::AgentError};

fn open_err(name: &str, e: impl std::error::Error + Send + Sync + 'static) -> AgentError {
    AgentError::bpf(format!("open map {name}"), e)
}

/// The address maps: pod CIDRs, exact pod addresses, excluded addresses, Service
/// (ClusterIP) CIDRs, Service backends.
pub struct PodMaps {
    cidrs: Trie,
    addrs: AddrSet,
    excluded: AddrSet,
    services: Trie,
    backends: HashMap<MapData, ServiceBackend, u8>,
}

impl PodMaps {
    /// Wraps the five maps.
    pub fn new(
        cidrs: Map,
        addrs: Map,
        excluded: Map,
        services: Map,
        backends: Map,
    ) -> Result<Self, AgentError> {
        Ok(Self {
            backends: HashMap::try_from(backends)
                .map_err(|e| open_err(names::MAP_SERVICE_BACKENDS, e))?,
            cidrs: LpmTrie::try_from(cidrs).map_err(|e| open_err(names::MAP_POD_CIDRS, e))?,
            addrs: AddrSet::new(addrs, names::MAP_POD_ADDRS, "pod")?,
            excluded: AddrSet::new(excluded, names::MAP_EXCLUDED_ADDRS, "excluded")?,
            services: LpmTrie::try_from(services)
                .map_err(|e| open_err(names::MAP_SERVICE_CIDRS, e))?,
        })
    }

    /// Adds an address that is never a pod address (an opted-out pod's).
    pub fn insert_excluded(&mut self, ip: IpAddr) -> Result<(), AgentError> {
        self.excluded.insert(ip)
    }

    /// Removes an excluded address.
    pub fn remove_excluded(&mut self, ip: IpAddr) -> Result<(), AgentError> {
        self.excluded.remove(ip)
    }

    /// The excluded addresses in the map now.
    pub fn excluded(&self) -> BTreeSet<IpAddr> {
        self.excluded.list()
    }

    /// Adds a Service (ClusterIP) CIDR.
    pub fn insert_service_cidr(&mut self, cidr: &PodCidr) -> Result<(), AgentError> {
        trie_insert(
            &mut self.services,
            cidr,
            "Service",
            names::MAP_SERVICE_CIDRS,
        )
    }

    /// Removes a Service CIDR.
    pub fn remove_service_cidr(&mut self, cidr: &PodCidr) -> Result<(), AgentError> {
        trie_remove(&mut self.services, cidr, "Service")
    }

    /// The Service CIDRs in the trie now.
    pub fn service_cidrs(&self) -> BTreeSet<PodCidr> {
        trie_cidrs(&self.services)
    }

    /// Adds a Service backend.
    pub fn insert_service_backend(&mut self, b: &Backend) -> Result<(), AgentError> {
        self.backends.insert(b.key(), 1, 0).map_err(|e| {
            AgentError::bpf(
                format!(
                    "insert Service backend {b} into {} (full at {} entries? keep fewer Service ports on this node's pods)",
                    names::MAP_SERVICE_BACKENDS,
                    names::MAX_SERVICE_BACKENDS
                ),
                e,
            )
        })
    }

    /// Removes a Service backend.
    pub fn remove_service_backend(&mut self, b: &Backend) -> Result<(), AgentError> {
        match self.backends.remove(&b.key()) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(AgentError::bpf(
                format!(
                    "remove Service backend {b} from {}",
                    names::MAP_SERVICE_BACKENDS
                ),
                e,
            )),
        }
    }

    /// The Service backends in the map now.
    pub fn service_backends(&self) -> BTreeSet<Backend> {
        self.backends
            .keys()
            .filter_map(Result::ok)
            .filter_map(|k| Backend::from_key(&k))
            .collect()
    }

    /// Adds a pod CIDR.
    pub fn insert_cidr(&mut self, cidr: &PodCidr) -> Result<(), AgentError> {
        trie_insert(&mut self.cidrs, cidr, "pod", names::MAP_POD_CIDRS)
    }

    /// Removes a pod CIDR.
    pub fn remove_cidr(&mut self, cidr: &PodCidr) -> Result<(), AgentError> {
        trie_remove(&mut self.cidrs, cidr, "pod")
    }

    /// Adds a pod address.
    pub fn insert_addr(&mut self, ip: IpAddr) -> Result<(), AgentError> {
        self.addrs.insert(ip)
    }

    /// Removes a pod address.
    pub fn remove_addr(&mut self, ip: IpAddr) -> Result<(), AgentError> {
        self.addrs.remove(ip)
    }

    /// The CIDRs in the trie now.
    pub fn cidrs(&self) -> BTreeSet<PodCidr> {
        trie_cidrs(&self.cidrs)
    }

    /// The exact addresses in the map now.
    pub fn addrs(&self) -> BTreeSet<IpAddr> {
        self.addrs.list()
    }
}

/// Pod address → the cookie of the network namespace that owns it
/// ([`names::MAP_NETNS_OWNERS`]).
pub struct OwnerMap(HashMap<MapData, IpKey, u64>);

impl OwnerMap {
    /// Wraps the map.
    pub fn new(map: Map) -> Result<Self, AgentError> {
        Ok(Self(
            HashMap::try_from(map).map_err(|e| open_err(names::MAP_NETNS_OWNERS, e))?,
        ))
    }

    /// Its entries now.
    pub fn list(&self) -> BTreeMap<IpAddr, u64> {
        self.0
            .iter()
            .filter_map(Result::ok)
            .map(|(k, v)| (ip_from_key(k), v))
            .collect()
    }

    /// Records `netns` as the owner of `ip`.
    pub fn set(&mut self, ip: IpAddr, netns: u64) -> Result<(), AgentError> {
        self.0.insert(ip_key(ip), netns, 0).map_err(|e| {
            AgentError::bpf(
                format!("record the owner of {ip} in {}", names::MAP_NETNS_OWNERS),
                e,
            )
        })
    }

    /// Forgets the owner of `ip`.
    pub fn remove(&mut self, ip: IpAddr) -> Result<(), AgentError> {
        match self.0.remove(&ip_key(ip)) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(AgentError::bpf(
                format!("forget the owner of {ip} in {}", names::MAP_NETNS_OWNERS),
                e,
            )),
        }
    }
}

/// Refusals per pod address, by kind ([`names::MAP_REFUSALS`]).
pub fn refusals(
    map: Map,
) -> Result<BTreeMap<IpAddr, [u64; bypass_common::refusal::KINDS]>, AgentError> {
    let m: HashMap<MapData, IpKey, [u64; bypass_common::refusal::KINDS]> =
        HashMap::try_from(map).map_err(|e| open_err(names::MAP_REFUSALS, e))?;
    Ok(m.iter()
        .filter_map(Result::ok)
        .map(|(k, v)| (ip_from_key(k), v))
        .collect())
}

/// A set of addresses (`IpKey` → unused `u8`).
struct AddrSet {
    map: HashMap<MapData, IpKey, u8>,
    name: &'static str,
    what: &'static str,
}

impl AddrSet {
    fn new(map: Map, name: &'static str, what: &'static str) -> Result<Self, AgentError> {
        Ok(Self {
            map: HashMap::try_from(map).map_err(|e| open_err(name, e))?,
            name,
            what,
        })
    }

    fn insert(&mut self, ip: IpAddr) -> Result<(), AgentError> {
        self.map.insert(ip_key(ip), 1, 0).map_err(|e| {
            AgentError::bpf(
                format!("add {} address {ip} to {}", self.what, self.name),
                e,
            )
        })
    }

    fn remove(&mut self, ip: IpAddr) -> Result<(), AgentError> {
        self.map
            .remove(&ip_key(ip))
            .map_err(|e| AgentError::bpf(format!("remove {} address {ip}", self.what), e))
    }

    fn list(&self) -> BTreeSet<IpAddr> {
        self.map
            .keys()
            .filter_map(Result::ok)
            .map(ip_from_key)
            .collect()
    }
}

type Trie = LpmTrie<MapData, [u8; 16], u8>;

fn trie_insert(trie: &mut Trie, cidr: &PodCidr, what: &str, map: &str) -> Result<(), AgentError> {
    let (len, bytes) = cidr.trie_key();
    trie.insert(&Key::new(len, bytes), 1, 0)
        .map_err(|e| AgentError::bpf(format!("add {what} CIDR {cidr} to {map}"), e))
}

fn trie_remove(trie: &mut Trie, cidr: &PodCidr, what: &str) -> Result<(), AgentError> {
    let (len, bytes) = cidr.trie_key();
    trie.remove(&Key::new(len, bytes))
        .map_err(|e| AgentError::bpf(format!("remove {what} CIDR {cidr}"), e))
}

fn trie_cidrs(trie: &Trie) -> BTreeSet<PodCidr> {
    trie.keys()
        .filter_map(Result::ok)
        .filter_map(|k| PodCidr::from_trie_key(k.prefix_len(), k.data()))
        .collect()
}

/// The per-CPU counter array.
pub struct Stats(PerCpuArray<MapData, u64>);

impl Stats {
    /// Wraps the map.
    pub fn new(map: Map) -> Result<Self, AgentError> {
        Ok(Self(
            PerCpuArray::try_from(map).map_err(|e| open_err(names::MAP_STATS, e))?,
        ))
    }

    /// Adds `n` to a slot the programs never write ([`Stat::Left`]): a read-modify-write
    /// from user space would lose concurrent kernel increments of any other slot.
    pub fn add_agent_only(&mut self, stat: Stat, n: u64) -> Result<(), AgentError> {
        debug_assert_eq!(stat, Stat::Left, "a slot the programs write");
        let err = |e| AgentError::bpf(format!("add to counter {}", stat.name()), e);
        let mut values: Vec<u64> = self.0.get(&stat.index(), 0).map_err(err)?.to_vec();
        if let Some(first) = values.first_mut() {
            *first = first.wrapping_add(n);
        }
        let values = aya::maps::PerCpuValues::try_from(values).map_err(|e| AgentError::Io {
            action: "build the per-CPU values of",
            path: std::path::PathBuf::from(names::MAP_STATS),
            source: e,
        })?;
        self.0.set(stat.index(), values, 0).map_err(err)
    }

    /// Sums every slot over CPUs.
    pub fn read(&self) -> Result<Counters, AgentError> {
        let mut c = Counters::default();
        for stat in Stat::ALL {
            let per_cpu = self
                .0
                .get(&stat.index(), 0)
                .map_err(|e| AgentError::bpf(format!("read counter {}", stat.name()), e))?;
            c.set(stat, per_cpu.iter().copied().fold(0u64, u64::wrapping_add));
        }
        Ok(c)
    }
}

/// Ports whose connections the datapath leaves alone.
pub struct SkipPorts(HashMap<MapData, u32, u8>);

impl SkipPorts {
    /// Wraps the map.
    pub fn new(map: Map) -> Result<Self, AgentError> {
        Ok(Self(
            HashMap::try_from(map).map_err(|e| open_err(names::MAP_SKIP_PORTS, e))?,
        ))
    }

    /// The ports in the map now.
    pub fn ports(&self) -> BTreeSet<u16> {
        self.0
            .keys()
            .filter_map(Result::ok)
            .filter_map(|p| u16::try_from(p).ok())
            .collect()
    }

    /// Makes the map hold exactly `want`.
    pub fn set(&mut self, want: &BTreeSet<u16>) -> Result<(), AgentError> {
        let (add, remove) = crate::sync::diff(&self.ports(), want);
        for p in remove {
            self.0
                .remove(&u32::from(p))
                .map_err(|e| AgentError::bpf(format!("remove skip port {p}"), e))?;
        }
        for p in add {
            self.0.insert(u32::from(p), 1, 0).map_err(|e| {
                AgentError::bpf(
                    format!(
                        "add skip port {p} to {} (at most {} ports)",
                        names::MAP_SKIP_PORTS,
                        names::MAX_SKIP_PORTS
                    ),
                    e,
                )
            })?;
        }
        Ok(())
    }
}

/// The control words (slots in `bypass_common::control`).
pub struct Control(Array<MapData, u32>);

impl Control {
    /// Wraps the map.
    pub fn new(map: Map) -> Result<Self, AgentError> {
        Ok(Self(
            Array::try_from(map).map_err(|e| open_err(names::MAP_CONTROL, e))?,
        ))
    }

    fn get(&self, slot: u32) -> Result<u32, AgentError> {
        self.0
            .get(&slot, 0)
            .map_err(|e| AgentError::bpf(format!("read control slot {slot}"), e))
    }

    fn set(&mut self, slot: u32, v: u32) -> Result<(), AgentError> {
        self.0
            .set(slot, v, 0)
            .map_err(|e| AgentError::bpf(format!("write control slot {slot}"), e))
    }

    fn get64(&self, lo: u32, hi: u32) -> Result<u64, AgentError> {
        Ok(u64::from(self.get(lo)?) | (u64::from(self.get(hi)?) << 32))
    }

    fn set64(&mut self, lo: u32, hi: u32, v: u64) -> Result<(), AgentError> {
        // Truncations are the point: the two halves.
        self.set(lo, (v & 0xffff_ffff) as u32)?;
        self.set(hi, (v >> 32) as u32)
    }

    /// Pins the map (consumes the view: a pinned map is reopened from its pin).
    pub fn pin(self, path: &std::path::Path) -> Result<(), aya::pin::PinError> {
        self.0.pin(path)
    }

    /// Bumps the cut generation, so every socket looks its connection up in the cut
    /// map again.
    pub fn bump_cut_generation(&mut self) -> Result<(), AgentError> {
        let g = self.get(control::SLOT_CUT_GEN)?;
        self.set(control::SLOT_CUT_GEN, g.wrapping_add(1))
    }

    /// Allows or stops redirects.
    pub fn set_enabled(&mut self, on: bool) -> Result<(), AgentError> {
        let v = if on {
            control::ENABLED
        } else {
            control::DISABLED
        };
        self.set(control::SLOT_ENABLED, v)
    }

    /// Whether redirects are allowed.
    pub fn enabled(&self) -> Result<bool, AgentError> {
        Ok(self.get(control::SLOT_ENABLED)? == control::ENABLED)
    }

    /// Records which object and cgroup the pinned datapath belongs to.
    pub fn set_identity(&mut self, id: Identity) -> Result<(), AgentError> {
        self.set64(control::SLOT_OBJECT_LO, control::SLOT_OBJECT_HI, id.object)?;
        self.set64(control::SLOT_CGROUP_LO, control::SLOT_CGROUP_HI, id.cgroup)
    }

    /// Which object and cgroup the pinned datapath belongs to.
    pub fn identity(&self) -> Result<Identity, AgentError> {
        Ok(Identity {
            object: self.get64(control::SLOT_OBJECT_LO, control::SLOT_OBJECT_HI)?,
            cgroup: self.get64(control::SLOT_CGROUP_LO, control::SLOT_CGROUP_HI)?,
        })
    }

    /// Sets the bound on a peer's ingress queue (0: none).
    pub fn set_max_queued(&mut self, bytes: u32) -> Result<(), AgentError> {
        self.set(control::SLOT_MAX_QUEUED, bytes)
    }

    /// The bound on a peer's ingress queue (0: none).
    pub fn max_queued(&self) -> Result<u32, AgentError> {
        self.get(control::SLOT_MAX_QUEUED)
    }

    /// Sets the size under which a stream of sends takes the TCP path (0: never).
    pub fn set_small_stream(&mut self, bytes: u32) -> Result<(), AgentError> {
        self.set(control::SLOT_SMALL_STREAM, bytes)
    }

    /// The size under which a stream of sends takes the TCP path (0: never).
    pub fn small_stream(&self) -> Result<u32, AgentError> {
        self.get(control::SLOT_SMALL_STREAM)
    }

    /// Sets how many bytes a direction may send by TCP while it waits to come back
    /// before its connection leaves the SockHash (0: never).
    pub fn set_leave_after(&mut self, bytes: u32) -> Result<(), AgentError> {
        self.set(control::SLOT_LEAVE_AFTER, bytes)
    }

    /// Records whether the agent refuses to bypass this node.
    pub fn set_refused(&mut self, refused: bool) -> Result<(), AgentError> {
        self.set(control::SLOT_REFUSED, u32::from(refused))
    }

    /// Whether the agent refuses to bypass this node.
    pub fn refused(&self) -> Result<bool, AgentError> {
        Ok(self.get(control::SLOT_REFUSED)? != 0)
    }

    /// Records the [`bypass_common::layout::features`] bits the programs were loaded
    /// with.
    pub fn set_features(&mut self, bits: u32) -> Result<(), AgentError> {
        self.set(control::SLOT_FEATURES, bits)
    }

    /// The features the programs were loaded with.
    pub fn features(&self) -> Result<u32, AgentError> {
        self.get(control::SLOT_FEATURES)
    }

    /// Turns the namespace ownership check off (`any`) or on
    /// (`control::SLOT_OWNERS_OFF`).
    pub fn set_owners_off(&mut self, off: bool) -> Result<(), AgentError> {
        self.set(control::SLOT_OWNERS_OFF, u32::from(off))
    }

    /// Whether the namespace ownership check is off.
    pub fn owners_off(&self) -> Result<bool, AgentError> {
        Ok(self.get(control::SLOT_OWNERS_OFF)? != 0)
    }

    /// Sets the heartbeat deadline (`control::SLOT_HEARTBEAT`).
    pub fn set_heartbeat(&mut self, deadline: u32) -> Result<(), AgentError> {
        self.set(control::SLOT_HEARTBEAT, deadline)
    }

    /// The heartbeat deadline (`control::SLOT_HEARTBEAT`).
    pub fn heartbeat_deadline(&self) -> Result<u32, AgentError> {
        self.get(control::SLOT_HEARTBEAT)
    }

    /// The agent's own state word.
    pub fn agent_state(&self) -> Result<u32, AgentError> {
        self.get(control::SLOT_AGENT_STATE)
    }

    /// Sets the agent's own state word.
    pub fn set_agent_state(&mut self, v: u32) -> Result<(), AgentError> {
        self.set(control::SLOT_AGENT_STATE, v)
    }
}

/// What a pinned datapath is: the object's fingerprint and the cgroup it serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    /// FNV-1a of the embedded ELF object.
    pub object: u64,
    /// Inode (cgroup id) of the attach cgroup.
    pub cgroup: u64,
}

/// Number of keys in a SockHash.
pub fn count_keys(map: &SockHash<MapData, SockKey>) -> usize {
    map.keys().filter(Result::is_ok).count()
}

/// The pairing maps: connecting sockets not yet paired, and the links of paired
/// connections. Their entries are removed when the connecting socket closes, by the
/// sock_ops state callback, which only runs while sock_ops is attached.
pub struct Pairings {
    connectors: HashMap<MapData, Endpoint, Connector>,
    links: HashMap<MapData, SockKey, Link>,
    cut: HashMap<MapData, SockKey, u8>,
}

impl Pairings {
    /// Wraps the three maps.
    pub fn new(connectors: Map, links: Map, cut: Map) -> Result<Self, AgentError> {
        Ok(Self {
            connectors: HashMap::try_from(connectors)
                .map_err(|e| open_err(names::MAP_CONNECTORS, e))?,
            links: HashMap::try_from(links).map_err(|e| open_err(names::MAP_LINKS, e))?,
            cut: HashMap::try_from(cut).map_err(|e| open_err(names::MAP_CUT, e))?,
        })
    }

    /// Entries in the two maps.
    pub fn len(&self) -> (usize, usize) {
        (
            self.connectors.keys().filter(Result::is_ok).count(),
            self.links.keys().filter(Result::is_ok).count(),
        )
    }

    /// Cuts the connections that touch `excluded` addresses — at either end, or as the
    /// pod a loopback end's namespace belongs to (`pod_netns`: namespace cookie → the
    /// pod address learned there): their link keys go into the cut map. The caller
    /// then bumps the cut generation; each socket of such a connection sees the cut at
    /// its next send or read, and the connection leaves the SockHash (so an opt-out
    /// also moves established connections to plain TCP). Returns how many were cut.
    pub fn cut(
        &mut self,
        excluded: &BTreeSet<IpAddr>,
        pod_netns: &HashMap<MapData, u64, IpKey>,
    ) -> Result<usize, AgentError> {
        if excluded.is_empty() {
            return Ok(0);
        }
        let keys: std::collections::HashSet<IpKey> =
            excluded.iter().map(|ip| ip_key(*ip)).collect();
        let owners: std::collections::HashMap<u64, IpKey> =
            pod_netns.iter().filter_map(Result::ok).collect();
        let entries: Vec<(SockKey, Link)> = self.links.iter().filter_map(Result::ok).collect();
        self.cut_keys(links_to_cut(&entries, &keys, &owners))
    }

    /// Cuts every connection (see [`Pairings::cut`]). Returns how many were cut.
    pub fn cut_all(&mut self) -> Result<usize, AgentError> {
        let keys: Vec<SockKey> = self.links.keys().filter_map(Result::ok).collect();
        self.cut_keys(keys)
    }

    /// Puts the link keys `keys` into the cut map; returns how many were not there.
    fn cut_keys(&mut self, keys: impl IntoIterator<Item = SockKey>) -> Result<usize, AgentError> {
        let mut cut = 0;
        for key in keys {
            // Already cut or leaving: nothing to add.
            if self.cut.get(&key, 0).is_ok() {
                continue;
            }
            self.cut
                .insert(key, 0, 0)
                .map_err(|e| AgentError::bpf(format!("write map {}", names::MAP_CUT), e))?;
            cut += 1;
        }
        Ok(cut)
    }

    /// Removes the entries of connecting sockets that are no longer in the SockHash:
    /// they closed while sock_ops was detached, so no state callback removed them. Only
    /// safe while sock_ops is detached (an insert adds the socket before its entries).
    /// Returns how many went.
    pub fn sweep(&mut self, sockets: &SockHash<MapData, SockKey>) -> Result<usize, AgentError> {
        // A user-space lookup in a SockHash with 4-byte values fails (net/core/sock_map.c,
        // sock_map_lookup_sys wants 8): compare against its keys instead.
        let alive: std::collections::HashSet<SockKey> =
            sockets.keys().filter_map(Result::ok).collect();
        let connectors: Vec<(Endpoint, SockKey)> = self
            .connectors
            .iter()
            .filter_map(Result::ok)
            .map(|(end, c)| (end, c.key))
            .collect();
        let links: Vec<SockKey> = self.links.keys().filter_map(Result::ok).collect();
        let mut swept = 0;
        for (end, key) in connectors {
            if !alive.contains(&key) {
                swept += gone(self.connectors.remove(&end), names::MAP_CONNECTORS)?;
            }
        }
        for key in stale_keys(&links, |k| alive.contains(k)) {
            swept += gone(self.links.remove(&key), names::MAP_LINKS)?;
        }
        Ok(swept)
    }
}

/// 1 if an entry was removed, 0 if it was already gone.
fn gone(r: Result<(), aya::maps::MapError>, map: &str) -> Result<usize, AgentError> {
    match r {
        Ok(()) => Ok(1),
        Err(aya::maps::MapError::KeyNotFound) => Ok(0),
        Err(e) => Err(AgentError::bpf(format!("sweep {map}"), e)),
    }
}

/// The links (by their client key) whose connection touches an address in `excluded`:
/// an end of either socket, or the pod owning either socket's namespace.
pub fn links_to_cut(
    entries: &[(SockKey, Link)],
    excluded: &std::collections::HashSet<IpKey>,
    owners: &std::collections::HashMap<u64, IpKey>,
) -> Vec<SockKey> {
    let touches = |k: &SockKey| {
        excluded.contains(&k.local_ip)
            || excluded.contains(&k.remote_ip)
            || owners.get(&k.netns).is_some_and(|ip| excluded.contains(ip))
    };
    entries
        .iter()
        .filter(|(client, link)| touches(client) || touches(&link.server))
        .map(|(client, _)| *client)
        .collect()
}

/// The keys whose socket is gone, in the order given.
pub fn stale_keys(keys: &[SockKey], alive: impl Fn(&SockKey) -> bool) -> Vec<SockKey> {
    keys.iter().copied().filter(|k| !alive(k)).collect()
}

/// Opens the map `name` from its pin.
pub fn open_pinned(layout: &PinLayout, name: &str) -> Result<Map, AgentError> {
    let data = MapData::from_pin(layout.map(name)).map_err(|e| open_err(name, e))?;
    Map::from_map_data(data).map_err(|e| open_err(name, e))
}

/// Everything `status` reads, opened from the pins of a running agent.
pub struct PinnedView {
    /// Address maps.
    pub pod_maps: PodMaps,
    /// Counters.
    pub stats: Stats,
    /// Control word.
    pub control: Control,
    /// The SockHash.
    pub sockets: SockHash<MapData, SockKey>,
    /// The pairing maps.
    pub pairings: Pairings,
    /// The skip-port list.
    pub skip_ports: SkipPorts,
    /// Whether the sock_ops link is pinned and alive.
    pub link_pinned: bool,
    /// Whether the setsockopt link is pinned and alive.
    pub sockopt_pinned: bool,
    /// Whether the read guard's links are pinned and alive.
    pub guard_pinned: bool,
    /// Pod address owners (absent from a datapath of an older build).
    pub owners: Option<OwnerMap>,
    /// Refusals per pod address (absent from a datapath of an older build).
    pub refusals: BTreeMap<IpAddr, [u64; bypass_common::refusal::KINDS]>,
}

impl PinnedView {
    /// Opens the pins under `layout`.
    pub fn open(layout: &PinLayout) -> Result<Self, AgentError> {
        if !layout.map(names::MAP_STATS).exists() {
            return Err(AgentError::NotPinned {
                path: layout.root().to_path_buf(),
            });
        }
        let open = |name: &str| open_pinned(layout, name);
        Ok(Self {
            pod_maps: PodMaps::new(
                open(names::MAP_POD_CIDRS)?,
                open(names::MAP_POD_ADDRS)?,
                open(names::MAP_EXCLUDED_ADDRS)?,
                open(names::MAP_SERVICE_CIDRS)?,
                open(names::MAP_SERVICE_BACKENDS)?,
            )?,
            skip_ports: SkipPorts::new(open(names::MAP_SKIP_PORTS)?)?,
            stats: Stats::new(open(names::MAP_STATS)?)?,
            control: Control::new(open(names::MAP_CONTROL)?)?,
            sockets: SockHash::try_from(open(names::MAP_SOCKETS)?)
                .map_err(|e| open_err(names::MAP_SOCKETS, e))?,
            pairings: Pairings::new(
                open(names::MAP_CONNECTORS)?,
                open(names::MAP_LINKS)?,
                open(names::MAP_CUT)?,
            )?,
            link_pinned: aya::programs::links::PinnedLink::from_pin(
                layout.link(names::PIN_LINK_SOCKOPS),
            )
            .is_ok(),
            sockopt_pinned: aya::programs::links::PinnedLink::from_pin(
                layout.link(names::PIN_LINK_SOCKOPT),
            )
            .is_ok(),
            guard_pinned: names::GUARD_HOOKS.iter().all(|h| {
                aya::programs::links::PinnedLink::from_pin(layout.link(h.program)).is_ok()
            }),
            owners: open(names::MAP_NETNS_OWNERS)
                .ok()
                .and_then(|m| OwnerMap::new(m).ok()),
            refusals: open(names::MAP_REFUSALS)
                .ok()
                .and_then(|m| refusals(m).ok())
                .unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_keys_are_those_gone() {
        let k = |p| SockKey {
            local_port: p,
            ..SockKey::default()
        };
        let keys = [k(1), k(2), k(3)];
        assert_eq!(
            stale_keys(&keys, |key| key.local_port == 2),
            vec![k(1), k(3)]
        );
        assert!(stale_keys(&keys, |_| true).is_empty());
    }

    #[test]
    fn links_touching_excluded_addresses_are_cut() {
        let ip = |s: &str| ip_key(s.parse().unwrap());
        let lo = ip("127.0.0.1");
        let (a, b, c) = (ip("10.0.0.1"), ip("10.0.0.2"), ip("10.0.0.3"));
        let key = |l, r, netns| SockKey::new(l, r, 1, 2, netns);
        let link = |server: SockKey| Link {
            server,
            ..Link::default()
        };
        let entries = [
            (key(a, b, 10), link(key(b, a, 20))),
            (key(a, c, 10), link(key(c, a, 30))),
            (key(lo, lo, 20), link(key(lo, lo, 20))),
            (key(lo, lo, 30), link(key(lo, lo, 30))),
        ];
        let excluded: std::collections::HashSet<IpKey> = [b].into();
        let owners: std::collections::HashMap<u64, IpKey> = [(10, a), (20, b), (30, c)].into();
        assert_eq!(
            links_to_cut(&entries, &excluded, &owners),
            vec![key(a, b, 10), key(lo, lo, 20)],
            "pod to pod with b, and b's own loopback; not a to c, nor c's loopback"
        );
        assert!(links_to_cut(&entries, &Default::default(), &owners).is_empty());
    }
}
