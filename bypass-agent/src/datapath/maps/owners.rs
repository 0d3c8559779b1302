//! Who owns each pod address, and the refusals counted per pod address.

use std::{collections::BTreeMap, net::IpAddr};

use aya::maps::{HashMap, Map, MapData};
use bypass_common::{IpKey, addr::ip_from_key, ip_key, names};

use crate::error::AgentError;

/// Pod address → the cookie of the network namespace that owns it
/// ([`names::MAP_NETNS_OWNERS`]).
pub struct OwnerMap(HashMap<MapData, IpKey, u64>);

impl OwnerMap {
    /// Wraps the map.
    pub fn new(map: Map) -> Result<Self, AgentError> {
        Ok(Self(super::typed(map, names::MAP_NETNS_OWNERS)?))
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
            AgentError::map(
                names::MAP_NETNS_OWNERS,
                format_args!("record {ip}'s owner"),
                e,
            )
        })
    }

    /// Forgets the owner of `ip`.
    pub fn remove(&mut self, ip: IpAddr) -> Result<(), AgentError> {
        match self.0.remove(&ip_key(ip)) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(AgentError::map(
                names::MAP_NETNS_OWNERS,
                format_args!("forget {ip}'s owner"),
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
        super::typed(map, names::MAP_REFUSALS)?;
    Ok(m.iter()
        .filter_map(Result::ok)
        .map(|(k, v)| (ip_from_key(k), v))
        .collect())
}
