//! The per-CPU counter array of the stats catalogue.

use aya::maps::{Map, MapData, PerCpuArray, PerCpuValues};
use bypass_common::{Counters, Stat, names};

use crate::error::{AgentError, BoxError};

/// The per-CPU counter array.
pub struct Stats(PerCpuArray<MapData, u64>);

impl Stats {
    /// Wraps the map.
    pub fn new(map: Map) -> Result<Self, AgentError> {
        Ok(Self(super::typed(map, names::MAP_STATS)?))
    }

    /// Adds `n` to a slot the programs never write ([`Stat::Left`]): a read-modify-write
    /// from user space would lose concurrent kernel increments of any other slot.
    pub fn add_agent_only(&mut self, stat: Stat, n: u64) -> Result<(), AgentError> {
        debug_assert_eq!(stat, Stat::Left, "a slot the programs write");
        let what = format!("add to counter {}", stat.name());
        let err = |e: BoxError| AgentError::map(names::MAP_STATS, &what, e);
        let mut values: Vec<u64> = self
            .0
            .get(&stat.index(), 0)
            .map_err(|e| err(e.into()))?
            .to_vec();
        if let Some(first) = values.first_mut() {
            *first = first.wrapping_add(n);
        }
        let values = PerCpuValues::try_from(values).map_err(|e| err(e.into()))?;
        self.0
            .set(stat.index(), values, 0)
            .map_err(|e| err(e.into()))
    }

    /// One slot summed over CPUs.
    pub fn get(&self, stat: Stat) -> Result<u64, AgentError> {
        let per_cpu = self.0.get(&stat.index(), 0).map_err(|e| {
            AgentError::map(
                names::MAP_STATS,
                format_args!("read counter {}", stat.name()),
                e,
            )
        })?;
        Ok(per_cpu.iter().copied().fold(0u64, u64::wrapping_add))
    }

    /// Sums every slot over CPUs.
    pub fn read(&self) -> Result<Counters, AgentError> {
        let mut c = Counters::default();
        for stat in Stat::ALL {
            c.set(stat, self.get(stat)?);
        }
        Ok(c)
    }
}
