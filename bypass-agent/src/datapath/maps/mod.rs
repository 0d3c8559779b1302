//! Typed views over the maps, usable from the loading agent or, through the pins, from
//! another process (`status`): one file per family of maps.

mod addresses;
mod control;
mod counters;
mod owners;
mod pairings;
mod pods;
mod ports;

pub use addresses::PodMaps;
pub use control::{Control, Identity};
pub use counters::Stats;
pub use owners::{OwnerMap, refusals};
pub use pairings::{CutMap, Pairings, owning_namespaces, side_is_pod, side_stands};
pub use pods::{PodCountsMap, add_counts, live_counts};
pub use ports::SkipPorts;

use std::{collections::BTreeMap, net::IpAddr};

use aya::{
    maps::{HashMap, Map, MapData, SockHash},
    programs::links::PinnedLink,
};
use bypass_common::{IpKey, SockKey, names};

use super::pins::PinLayout;
use crate::error::AgentError;

/// Number of keys in a SockHash.
pub fn count_keys(map: &SockHash<MapData, SockKey>) -> usize {
    map.keys().filter(Result::is_ok).count()
}

/// Opens the map `name` from its pin, as a [`Map`] or the aya map type `T` of its kind.
pub fn open_pinned<T>(layout: &PinLayout, name: &str) -> Result<T, AgentError>
where
    T: TryFrom<Map, Error: std::error::Error + Send + Sync + 'static>,
{
    let data = MapData::from_pin(layout.map(name)).map_err(|e| AgentError::open_map(name, e))?;
    typed(
        Map::from_map_data(data).map_err(|e| AgentError::open_map(name, e))?,
        name,
    )
}

/// Map `map` (named `name`) as the aya map type `T` of its kind.
pub fn typed<T>(map: Map, name: &str) -> Result<T, AgentError>
where
    T: TryFrom<Map, Error: std::error::Error + Send + Sync + 'static>,
{
    T::try_from(map).map_err(|e| AgentError::open_map(name, e))
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
    /// Each pinned tracing program's runs the kernel skipped ([`skipped_runs`]).
    pub skipped_runs: Vec<(&'static str, u64)>,
    /// Pod address owners (absent from a datapath of an older build).
    pub owners: Option<OwnerMap>,
    /// Refusals per pod address (absent from a datapath of an older build).
    pub refusals: BTreeMap<IpAddr, [u64; bypass_common::refusal::KINDS]>,
    /// Closed connections' counts per pod network namespace (absent from a datapath of
    /// an older build).
    pub pod_counts: Option<PodCountsMap>,
    /// Network namespace cookie → a pod address learned there
    /// ([`names::MAP_POD_NETNS`]), which names a namespace's pod where the agent
    /// observes no owners (`--netns-owners=any`).
    pub pod_netns: BTreeMap<u64, IpAddr>,
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
        let pinned = |link: &str| PinnedLink::from_pin(layout.link(link)).is_ok();
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
            sockets: open_pinned(layout, names::MAP_SOCKETS)?,
            pairings: Pairings::new(
                open(names::MAP_CONNECTORS)?,
                open(names::MAP_LINKS)?,
                open(names::MAP_CUT)?,
            )?,
            link_pinned: pinned(names::PIN_LINK_SOCKOPS),
            sockopt_pinned: pinned(names::PIN_LINK_SOCKOPT),
            guard_pinned: names::GUARD_HOOKS.iter().all(|h| pinned(h.program)),
            skipped_runs: skipped_runs(layout),
            owners: open(names::MAP_NETNS_OWNERS).and_then(OwnerMap::new).ok(),
            refusals: open(names::MAP_REFUSALS)
                .and_then(refusals)
                .unwrap_or_default(),
            pod_counts: open(names::MAP_POD_COUNTS).and_then(PodCountsMap::new).ok(),
            pod_netns: open_pinned::<HashMap<MapData, u64, IpKey>>(layout, names::MAP_POD_NETNS)
                .ok()
                .map(|m| {
                    m.iter()
                        .filter_map(Result::ok)
                        .map(|(n, ip)| (n, bypass_common::addr::ip_from_key(ip)))
                        .collect()
                })
                .unwrap_or_default(),
        })
    }

    /// What each pod network namespace's connections carried through the bypass: the
    /// closed ones' (the pod counts map), read first, then the open ones' (the links).
    /// A side that closes between the two reads is in neither for this reading (never
    /// in both); `None` for a datapath of an older build.
    pub fn pod_totals(&self) -> Option<BTreeMap<u64, bypass_common::PodCounts>> {
        let closed = self.pod_counts.as_ref()?.list();
        let links = self.pairings.links();
        Some(add_counts(closed, live_counts(&links)))
    }
}

/// Each tracing program whose link is pinned under `layout`, once, with how many of its
/// runs the kernel skipped because it was already running on the CPU (a task preempted
/// inside it: a preemptible kernel; see `features::GUARD_FMOD_RET`). A program whose
/// count cannot be read is left out.
pub fn skipped_runs(layout: &PinLayout) -> Vec<(&'static str, u64)> {
    let mut out: Vec<(&'static str, u64)> = Vec::new();
    for hook in names::all_hooks() {
        if out.iter().any(|(p, _)| *p == hook.program) {
            continue;
        }
        if let Ok(n) = super::rawbpf::skipped_runs(&layout.link(hook.program)) {
            out.push((hook.program, n));
        }
    }
    out
}
