//! Adopt or release what is pinned: the pinned datapath of this same build on this
//! cgroup, with the map sizes asked for, is kept as it is; any other (or `--reset`) is
//! released, so that this build loads afresh: its redirects switched off, its sock_ops
//! detached, the rest of its pins moved under `released/<n>/`, where its connections
//! drain (`drain.rs`).

use bypass_common::names::{MAP_CONNECTORS, MAP_CONTROL, MAP_LINKS, MAP_SOCKETS, PIN_LINK_SOCKOPS};
use tracing::{info, warn};

use super::{Config, Identity, Origin, PinLayout, maps, pins};
use crate::error::AgentError;

/// How the datapath comes to be under `pins`: [`Origin::Adopted`] when the pinned one
/// is this build (`identity`) and no reset is asked for; otherwise whatever is pinned is
/// released first, and where it went (`released/<n>`) is returned with the origin.
pub(super) fn adopt_or_release(
    pins: &PinLayout,
    config: &Config,
    identity: Identity,
) -> Result<(Origin, Option<PinLayout>), AgentError> {
    let finished = pins::finish_interrupted_release(pins)?;
    if finished > 0 {
        info!(
            released = finished,
            "finished moving a released datapath an earlier agent did not end moving"
        );
    }
    let pinned = pins::complete(pins);
    let sizes = pinned_sizes(pins);
    let resized = sizes.is_some_and(|s| !same_sizes(s, config.max_sockets));
    let adopt = pinned && !config.reset && !resized && pinned_identity(pins) == Some(identity);
    if adopt {
        return Ok((Origin::Adopted, None));
    }
    if pinned && resized {
        info!(pinned = ?sizes, max_sockets = config.max_sockets,
            "the pinned datapath's maps have another size than --max-sockets asks: replacing it");
    }
    let released = if pinned { release(pins) } else { None };
    let stale = pins::remove_stale(pins)?;
    if !stale.is_empty() {
        info!(pin_dir = %config.pin_dir.display(), removed = stale.len(), reset = config.reset,
            "removed the pins of an interrupted start");
    }
    let origin = if pinned {
        Origin::Replaced
    } else {
        Origin::Fresh
    };
    Ok((origin, released))
}

/// Releases the datapath pinned at the root of `pins`: its redirects are switched off
/// (its sockets send by TCP from now on, after what they queued: a peer reads its ingress
/// queue first), its sock_ops link is removed (no new connection enters its SockHash),
/// and the rest of its pins (maps, programs, the read accounting's, read guard's and
/// setsockopt hook's links) move under `released/<n>/`, where they stay attached to its
/// sockets while the leave thread drains them (`drain.rs`). Where the move fails, the
/// pins are removed at the caller's next step instead (its connections then finish by
/// TCP with its programs until they close, what a release did before drains). Returns
/// where it went.
fn release(pins: &PinLayout) -> Option<PinLayout> {
    if let Ok(map) = maps::open_pinned(pins, MAP_CONTROL)
        && let Ok(mut old) = maps::Control::new(map)
        && let Err(e) = old.set_enabled(false)
    {
        warn!(error = %e, "could not switch the released datapath's redirects off");
    }
    let sockops = pins.link(PIN_LINK_SOCKOPS);
    if let Err(e) = std::fs::remove_file(&sockops)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        warn!(error = %e, path = %sockops.display(),
            "could not detach the released datapath's sock_ops");
    }
    match pins::move_to_released(pins) {
        Ok(released) => {
            info!(released = %released.root().display(),
                "released the pinned datapath of another build, cgroup or size: redirects \
                 off, sock_ops detached; its connections drain (each leaves its SockHash once \
                 every byte redirected to it is read) and its pins go when none is left");
            Some(released)
        }
        Err(e) => {
            warn!(error = %e,
                "could not keep the released datapath for draining: its pins are removed, \
                 its connections finish by TCP with its programs");
            None
        }
    }
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
