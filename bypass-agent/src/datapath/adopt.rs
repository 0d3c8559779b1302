//! Adopt, upgrade or release what is pinned: the pinned datapath of this same build on
//! this cgroup, with the map sizes asked for, is kept as it is; one of another build with
//! the same layout has its programs replaced in place; any other (or `--reset`) is
//! switched to TCP and its pins removed, so that this build loads afresh.

use bypass_common::names::{MAP_CONNECTORS, MAP_CONTROL, MAP_LINKS, MAP_SOCKETS};
use tracing::{info, warn};

use super::{Config, Identity, Origin, PinLayout, maps, pins};
use crate::error::AgentError;

/// How the datapath comes to be under `pins`: [`Origin::Adopted`] when the pinned one
/// is this build (`identity`) and no reset is asked for; [`Origin::Upgraded`] when it is
/// another build of this layout on this cgroup with the same sizes; otherwise whatever is
/// pinned is released first.
pub(super) fn adopt_or_release(
    pins: &PinLayout,
    config: &Config,
    identity: Identity,
) -> Result<Origin, AgentError> {
    let pinned = pins::complete(pins);
    let sizes = pinned_sizes(pins);
    let resized = sizes.is_some_and(|s| !same_sizes(s, config.max_sockets));
    let kept = pinned && !config.reset && !resized;
    if kept && pinned_identity(pins) == Some(identity) {
        return Ok(Origin::Adopted);
    }
    if kept && upgradable(pins, identity) {
        return Ok(Origin::Upgraded);
    }
    if pinned && resized {
        info!(pinned = ?sizes, max_sockets = config.max_sockets,
            "the pinned datapath's maps have another size than --max-sockets asks: replacing it");
    }
    release(pins, config, pinned)
}

/// Whether the pinned datapath's programs can be replaced in place by this build's: its
/// maps have this build's layout and it runs on the same cgroup.
fn upgradable(pins: &PinLayout, identity: Identity) -> bool {
    let Ok(control) = maps::open_pinned(pins, MAP_CONTROL).and_then(maps::Control::new) else {
        return false;
    };
    control.layout().ok() == Some(bypass_common::layout::LAYOUT_VERSION)
        && control
            .identity()
            .is_ok_and(|i| i.cgroup == identity.cgroup)
}

/// Releases whatever is pinned (`pinned`: a complete datapath): its redirects are
/// switched off and its pins removed, so that this build loads afresh.
pub(super) fn release(
    pins: &PinLayout,
    config: &Config,
    pinned: bool,
) -> Result<Origin, AgentError> {
    // Whenever a control map is pinned, even by a datapath not complete (a start killed
    // while it replaced a program's pin): the released datapath's sockets keep its
    // programs until they close; from now on they send by TCP (redirect to TCP is always
    // safe), so no program without an agent keeps redirecting on maps no one tends.
    if let Ok(map) = maps::open_pinned(pins, MAP_CONTROL)
        && let Ok(mut old) = maps::Control::new(map)
        && let Err(e) = old.set_enabled(false)
    {
        warn!(error = %e, "could not switch the released datapath's redirects off");
    }
    let stale = pins::remove_stale(pins)?;
    if !stale.is_empty() {
        info!(pin_dir = %config.pin_dir.display(), removed = stale.len(), reset = config.reset,
            "released a pinned datapath of another build, cgroup or an interrupted start; \
             its connections finish on the TCP path");
    }
    Ok(if pinned {
        Origin::Replaced
    } else {
        Origin::Fresh
    })
}

/// The identity recorded in a pinned control map, if it can be read.
fn pinned_identity(pins: &PinLayout) -> Option<Identity> {
    let control = maps::Control::new(maps::open_pinned(pins, MAP_CONTROL).ok()?).ok()?;
    control.identity().ok()
}

/// The sizes of the maps `--max-sockets` sizes (SockHash, connectors, links), as
/// pinned; `None` if one cannot be read (then the identity alone decides).
fn pinned_sizes(pins: &PinLayout) -> Option<[u32; 3]> {
    let size = |name| {
        aya::maps::MapInfo::from_pin(pins.map(name))
            .ok()
            .map(|i| i.max_entries())
    };
    Some([size(MAP_SOCKETS)?, size(MAP_CONNECTORS)?, size(MAP_LINKS)?])
}

/// Whether pinned map sizes are what `max_sockets` makes (pure).
pub(super) fn same_sizes(pinned: [u32; 3], max_sockets: u32) -> bool {
    pinned.iter().all(|&n| n == max_sockets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_max_sockets_is_not_adopted() {
        assert!(same_sizes([65_536; 3], 65_536));
        assert!(!same_sizes([65_536; 3], 262_144));
        assert!(!same_sizes([65_536, 65_536, 1024], 65_536));
    }
}
