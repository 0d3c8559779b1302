//! The control words, and what a pinned datapath is.

use aya::maps::{Array, Map, MapData};
use bypass_common::{control, names};

use crate::error::AgentError;

/// The control words (slots in `bypass_common::control`).
pub struct Control(Array<MapData, u32>);

impl Control {
    /// Wraps the map.
    pub fn new(map: Map) -> Result<Self, AgentError> {
        Ok(Self(super::typed(map, names::MAP_CONTROL)?))
    }

    fn get(&self, slot: u32) -> Result<u32, AgentError> {
        self.0
            .get(&slot, 0)
            .map_err(|e| AgentError::map(names::MAP_CONTROL, format_args!("read slot {slot}"), e))
    }

    fn set(&mut self, slot: u32, v: u32) -> Result<(), AgentError> {
        self.0
            .set(slot, v, 0)
            .map_err(|e| AgentError::map(names::MAP_CONTROL, format_args!("write slot {slot}"), e))
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
        self.set(control::SLOT_CUT_GEN, control::next_cut_generation(g))
    }

    /// Cuts every connection: the next generation is recorded as a cut of everything
    /// before the generation moves to it, so a socket that sees it is cut whatever the
    /// cut map holds.
    pub fn cut_everything(&mut self) -> Result<(), AgentError> {
        let next = control::next_cut_generation(self.get(control::SLOT_CUT_GEN)?);
        self.set(control::SLOT_CUT_ALL, next)?;
        self.set(control::SLOT_CUT_GEN, next)
    }

    /// The cut generation and the generation of the last cut of everything (0: none),
    /// as [`bypass_common::Link::already_cut`] takes them.
    pub fn cut_generations(&self) -> Result<(u32, u32), AgentError> {
        Ok((
            self.get(control::SLOT_CUT_GEN)?,
            self.get(control::SLOT_CUT_ALL)?,
        ))
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

    /// Sets the pages of TCP memory from which sends take TCP
    /// (`control::SLOT_TCP_MEM_TIGHT`; 0: never).
    pub fn set_tcp_mem_tight(&mut self, pages: u32) -> Result<(), AgentError> {
        self.set(control::SLOT_TCP_MEM_TIGHT, pages)
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

    /// Records the layout of the pinned maps ([`bypass_common::layout::LAYOUT_VERSION`]).
    pub fn set_layout(&mut self, version: u32) -> Result<(), AgentError> {
        self.set(control::SLOT_LAYOUT, version)
    }

    /// The layout recorded (0: a datapath from before layouts were numbered).
    pub fn layout(&self) -> Result<u32, AgentError> {
        self.get(control::SLOT_LAYOUT)
    }

    /// Names the build whose tracing programs act.
    pub fn set_hooks_owner(&mut self, build: u32) -> Result<(), AgentError> {
        self.set(control::SLOT_HOOKS_OWNER, build)
    }

    /// The build whose tracing programs act.
    pub fn hooks_owner(&self) -> Result<u32, AgentError> {
        self.get(control::SLOT_HOOKS_OWNER)
    }

    /// Records the kernel self-test's results.
    pub fn set_checks(
        &mut self,
        results: bypass_common::checks::Results,
    ) -> Result<(), AgentError> {
        self.set(control::SLOT_CHECKS, results.0)
    }

    /// The kernel self-test's results recorded by the agent (none: no self-test ran).
    pub fn checks(&self) -> Result<bypass_common::checks::Results, AgentError> {
        Ok(bypass_common::checks::Results(
            self.get(control::SLOT_CHECKS)?,
        ))
    }

    /// The NetworkPolicies' fingerprint recorded (`control::SLOT_POLICIES`; 0: none).
    pub fn policies(&self) -> Result<u32, AgentError> {
        self.get(control::SLOT_POLICIES)
    }

    /// Records the NetworkPolicies' fingerprint.
    pub fn set_policies(&mut self, fingerprint: u32) -> Result<(), AgentError> {
        self.set(control::SLOT_POLICIES, fingerprint)
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
