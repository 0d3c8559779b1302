//! Who owns each pod address, and the refusals counted per pod address.

use std::{collections::BTreeMap, net::IpAddr};

use aya::maps::{HashMap, Map, MapData};
use bypass_common::{IpKey, addr::ip_from_key, ip_key, names};

use super::open_err;
use crate::error::AgentError;

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
