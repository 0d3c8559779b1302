//! The skip-port list.

use std::collections::BTreeSet;

use aya::maps::{HashMap, Map, MapData};
use bypass_common::names;

use crate::error::AgentError;

/// Ports whose connections the datapath leaves alone.
pub struct SkipPorts(HashMap<MapData, u32, u8>);

impl SkipPorts {
    /// Wraps the map.
    pub fn new(map: Map) -> Result<Self, AgentError> {
        Ok(Self(super::typed(map, names::MAP_SKIP_PORTS)?))
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
            self.0.remove(&u32::from(p)).map_err(|e| {
                AgentError::map(names::MAP_SKIP_PORTS, format_args!("remove port {p}"), e)
            })?;
        }
        for p in add {
            self.0.insert(u32::from(p), 1, 0).map_err(|e| {
                let what = format!("add port {p} (at most {} ports)", names::MAX_SKIP_PORTS);
                AgentError::map(names::MAP_SKIP_PORTS, what, e)
            })?;
        }
        Ok(())
    }
}
