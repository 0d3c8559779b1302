//! Adopt or release what is pinned: the pinned datapath of this same build on this
//! cgroup is kept as it is; any other (or `--reset`) is switched to TCP and its pins
//! removed, so that this build loads afresh.

use bypass_common::names::MAP_CONTROL;
use tracing::{info, warn};

use super::{Config, Identity, Origin, PinLayout, maps, pins};
use crate::error::AgentError;

/// How the datapath comes to be under `pins`: [`Origin::Adopted`] when the pinned one
/// is this build (`identity`) and no reset is asked for; otherwise whatever is pinned is
/// released first.
pub(super) fn adopt_or_release(
    pins: &PinLayout,
    config: &Config,
    identity: Identity,
) -> Result<Origin, AgentError> {
    let pinned = pins::complete(pins);
    let adopt = pinned && !config.reset && pinned_identity(pins) == Some(identity);
    if adopt {
        return Ok(Origin::Adopted);
    }
    if pinned {
        // The released datapath's sockets keep its programs until they close;
        // from now on they send by TCP (redirect to TCP is always safe), so no
        // program without an agent keeps redirecting on maps no one tends.
        if let Ok(map) = maps::open_pinned(pins, MAP_CONTROL)
            && let Ok(mut old) = maps::Control::new(map)
            && let Err(e) = old.set_enabled(false)
        {
            warn!(error = %e, "could not switch the released datapath's redirects off");
        }
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
