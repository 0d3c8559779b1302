//! Drains the datapaths that an upgrade or a rollback released, so that no connection
//! stays in a SockHash no agent tends.
//!
//! A release ([`super::adopt`]) switches the old datapath's redirects off, removes its
//! sock_ops link (new connections go to the new datapath) and moves the rest of its pins
//! under `<pin dir>/released/<n>/` ([`pins::move_to_released`]): its read accounting
//! (`tcp_bpf_recvmsg`'s entry and return, or the `sock_recv_length` tracepoint), its read
//! guard and its setsockopt hook (the `TCP_ULP` refusal) stay attached, as they were, to
//! the sockets its SockHash still holds. Every connection of a released datapath is
//! leaving ([`Leaving::All`]): this deletes its two sockets from the old SockHash once
//! each side has read what was redirected to it (the old link's `tx_redir` against
//! `rx_read`, decided as the leave thread decides for one connection: [`leaver::settle`]).
//! Where the kernel runs BPF trampolines the released read accounting can miss a read
//! (an fexit program is skipped for a call in flight when its trampoline is updated,
//! kernel/bpf/trampoline.c, `bpf_tramp_image_put`: a reader asleep in
//! `tcp_bpf_recvmsg` while this build attaches its own hooks, or a rollback's build
//! its own), and then its `rx_read` stays short for good. So a release there also
//! attaches this build's drain observer (`bypass_drain_seen`, pinned with the released
//! datapath): a read of a released socket that reaches plain `tcp_recvmsg` after the
//! release proves it has nothing redirected left unread ([`emptied`]).
//! The kernel then drops their psocks and restores their protocol (net/core/sock_map.c,
//! net/core/skmsg.c): they run as plain TCP (FIONREAD, splice, autotuned buffers, none of
//! tcp_bpf's differences). Sockets the old datapath never paired had nothing redirected
//! to them and go at once. When the old SockHash holds no socket, its pins are removed
//! (links first) and nothing of it is left in the kernel.
//!
//! The leave thread runs this pass; a later agent of any build that knows `released/`
//! carries on where an earlier one stopped (restarted, rolled back and upgraded again).
//! What this reads of an old build, and so what every build must keep for the next one to
//! drain it, is listed in docs/design.md (Upgrades).

use std::{
    collections::{BTreeMap, HashMap as StdHashMap, HashSet, btree_map::Entry},
    time::Instant,
};

use aya::maps::{HashMap, MapData, MapInfo, SockHash};
use bypass_common::{
    Link, SockKey,
    names::{MAP_DRAIN_SEEN, MAP_LINKS, MAP_SOCKETS},
};
use tracing::{info, warn};

use super::{
    PinLayout,
    leaver::{self, Leaving, RECHECK, SETTLE, Waiting},
    maps::open_pinned,
    pins,
};
use crate::error::AgentError;

/// What a pass does with the sockets of a released SockHash (pure: [`plan`]).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Connections (by their link's key) with a socket still in the SockHash: each
    /// leaves once each side has read what was redirected to it.
    pub linked: Vec<SockKey>,
    /// Sockets no link names: never paired, so nothing was ever redirected to them.
    pub unlinked: Vec<SockKey>,
}

/// The plan for a released SockHash holding `keys`, whose links are `links`.
pub fn plan(keys: &[SockKey], links: &[(SockKey, Link)]) -> Plan {
    let present: HashSet<&SockKey> = keys.iter().collect();
    let mut named: HashSet<&SockKey> = HashSet::new();
    let mut linked = Vec::new();
    for (client, link) in links {
        named.insert(client);
        named.insert(&link.server);
        if present.contains(client) || present.contains(&link.server) {
            linked.push(*client);
        }
    }
    let unlinked = keys
        .iter()
        .filter(|k| !named.contains(k))
        .copied()
        .collect();
    Plan { linked, unlinked }
}

/// The key of the drain observer's map that holds when the drain began
/// (`bpf_ktime_get_ns`); no socket has cookie 0.
pub const SEEN_SINCE_KEY: u64 = 0;

/// Which sides of a released link (client 0, server 1) the drain observer proved have
/// nothing redirected left unread: a read of that side's socket reached `tcp_recvmsg`
/// (`seen`, `bpf_ktime_get_ns`; `None` or 0: never) at least [`SETTLE`] after the drain
/// began (`since`: a redirect decided before the redirects were switched off has landed
/// by then, as the leave thread assumes).
pub fn emptied(seen: [Option<u64>; 2], since: u64) -> [bool; 2] {
    let settle = u64::try_from(SETTLE.as_nanos()).unwrap_or(u64::MAX);
    let after = since.saturating_add(settle);
    seen.map(|t| t.is_some_and(|t| t != 0 && since != 0 && t >= after))
}

/// Whether a socket seen unlinked since `first` may go at `now`: seen so for
/// [`SETTLE`] (a pairing that was running when the old sock_ops was detached has
/// written its link by then).
pub fn unlinked_may_go(first: Instant, now: Instant) -> bool {
    now.saturating_duration_since(first) >= SETTLE
}

/// One released datapath, opened from its pins.
struct Released {
    sockets: SockHash<MapData, SockKey>,
    links: HashMap<MapData, SockKey, Link>,
    /// The drain observer's map and when the drain began, where one is attached.
    seen: Option<(HashMap<MapData, u64, u64>, u64)>,
    waiting: Waiting,
    unlinked: StdHashMap<SockKey, Instant>,
    /// Connections this agent took out of it.
    left: u64,
}

impl Released {
    /// Opens the maps a drain reads, checking their layout is the one this build knows.
    fn open(layout: &PinLayout) -> Result<Self, AgentError> {
        let not = |reason: String| AgentError::NotDrainable {
            path: layout.root().to_path_buf(),
            reason,
        };
        if !pins::released_complete(layout) {
            return Err(not(
                "its release was interrupted before its maps were moved".into(),
            ));
        }
        for (name, key, value) in [
            (MAP_SOCKETS, size_of::<SockKey>(), None),
            (MAP_LINKS, size_of::<SockKey>(), Some(size_of::<Link>())),
        ] {
            let info = MapInfo::from_pin(layout.map(name))
                .map_err(|e| not(format!("map {name} cannot be read: {e}")))?;
            let sizes = (info.key_size() as usize, info.value_size() as usize);
            if sizes.0 != key || value.is_some_and(|v| v != sizes.1) {
                return Err(not(format!(
                    "map {name} has keys of {} B and values of {} B, where this build's are {key} B \
                     and {} B",
                    sizes.0,
                    sizes.1,
                    value.map_or_else(|| "any".to_owned(), |v| v.to_string())
                )));
            }
        }
        let err = |name: &str, e| AgentError::bpf(format!("open map {name}"), e);
        let seen = layout
            .map(MAP_DRAIN_SEEN)
            .exists()
            .then(|| -> Result<_, AgentError> {
                let map: HashMap<MapData, u64, u64> =
                    HashMap::try_from(open_pinned(layout, MAP_DRAIN_SEEN)?)
                        .map_err(|e| err(MAP_DRAIN_SEEN, e))?;
                let since = map.get(&SEEN_SINCE_KEY, 0).unwrap_or(0);
                Ok((map, since))
            })
            .transpose()?;
        Ok(Self {
            seen,
            sockets: SockHash::try_from(open_pinned(layout, MAP_SOCKETS)?)
                .map_err(|e| err(MAP_SOCKETS, e))?,
            links: HashMap::try_from(open_pinned(layout, MAP_LINKS)?)
                .map_err(|e| err(MAP_LINKS, e))?,
            waiting: Waiting::new(),
            unlinked: StdHashMap::new(),
            left: 0,
        })
    }

    fn keys(&self) -> Vec<SockKey> {
        self.sockets.keys().filter_map(Result::ok).collect()
    }

    /// Deletes what may go; returns how many connections left.
    fn pass(&mut self, now: Instant) -> u64 {
        let links: Vec<(SockKey, Link)> = self.links.iter().filter_map(Result::ok).collect();
        let plan = plan(&self.keys(), &links);
        for key in &plan.linked {
            self.waiting.entry(*key).or_insert(None);
        }
        let (map, sockets, seen) = (&self.links, &mut self.sockets, &self.seen);
        let proven = |l: &Link| match seen {
            Some((seen, since)) => emptied(l.cookie.map(|c| seen.get(&c, 0).ok()), *since),
            None => [false; 2],
        };
        let mut left = leaver::settle(
            &mut self.waiting,
            Leaving::All,
            now,
            |key| map.get(key, 0).ok(),
            proven,
            |key, server| {
                // Either may be gone already (closed): deleting the other is enough.
                let a = sockets.remove(key);
                let b = sockets.remove(server);
                a.is_ok() || b.is_ok()
            },
        );
        self.unlinked.retain(|k, _| plan.unlinked.contains(k));
        for key in plan.unlinked {
            let first = *self.unlinked.entry(key).or_insert(now);
            if unlinked_may_go(first, now) {
                if self.sockets.remove(&key).is_ok() {
                    left += 1;
                }
                self.unlinked.remove(&key);
            }
        }
        self.left += left;
        left
    }
}

/// The drain of every datapath released under one pin directory.
pub struct Drain {
    root: PinLayout,
    open: BTreeMap<u32, Released>,
    last: Option<Instant>,
}

impl Drain {
    /// A drain of the datapaths released under `root`'s pin directory.
    pub fn new(root: &PinLayout) -> Self {
        Self {
            root: root.clone(),
            open: BTreeMap::new(),
            last: None,
        }
    }

    /// One pass over every released datapath, at most once per [`RECHECK`]; returns how
    /// many connections left a SockHash. A datapath whose SockHash is empty has its pins
    /// removed; one that cannot be drained too, with a warning.
    pub fn tick(&mut self, now: Instant) -> u64 {
        if self
            .last
            .is_some_and(|l| now.saturating_duration_since(l) < RECHECK)
        {
            return 0;
        }
        self.last = Some(now);
        let listed = match pins::released(&self.root) {
            Ok(listed) => listed,
            Err(e) => {
                warn!(error = %e, "listing the released datapaths");
                return 0;
            }
        };
        self.open.retain(|n, _| listed.iter().any(|(m, _)| m == n));
        let mut left = 0;
        for (n, layout) in listed {
            let r = match self.open.entry(n) {
                Entry::Occupied(open) => open.into_mut(),
                Entry::Vacant(slot) => match Released::open(&layout) {
                    Ok(r) => {
                        info!(released = %layout.root().display(), sockets = r.keys().len(),
                            "draining a released datapath: each of its connections leaves its \
                             SockHash once each side has read what was redirected to it");
                        slot.insert(r)
                    }
                    Err(e) => {
                        warn!(error = %e, "removing the pins of a released datapath");
                        remove(&layout);
                        continue;
                    }
                },
            };
            left += r.pass(now);
            if r.keys().is_empty() {
                info!(released = %layout.root().display(), left = r.left,
                    "a released datapath drained: its connections run as plain TCP; its pins \
                     are removed");
                remove(&layout);
                self.open.remove(&n);
                // The last one gone, `released/` goes too (it fails while another is
                // there).
                let _ = std::fs::remove_dir(self.root.released_dir());
            }
        }
        left
    }
}

/// Removes a released datapath's pins (its links first: its programs detach).
fn remove(layout: &PinLayout) {
    if let Err(e) = pins::remove_released(layout) {
        warn!(error = %e, released = %layout.root().display(),
            "removing a released datapath's pins");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(port: u32) -> SockKey {
        SockKey {
            local_port: port,
            ..SockKey::default()
        }
    }

    fn link(server: u32) -> Link {
        Link {
            server: key(server),
            ..Link::default()
        }
    }

    #[test]
    fn linked_while_either_socket_is_there_unlinked_never_paired() {
        let links = [(key(1), link(2)), (key(3), link(4)), (key(5), link(6))];
        // 1 and 2 there; only 4 of its pair (its client closed); 5 and 6 gone; 7 never
        // paired.
        let p = plan(&[key(1), key(2), key(4), key(7)], &links);
        assert_eq!(p.linked, vec![key(1), key(3)]);
        assert_eq!(p.unlinked, vec![key(7)]);
        assert_eq!(plan(&[], &links), Plan::default());
        assert_eq!(
            plan(&[key(9)], &[]),
            Plan {
                linked: vec![],
                unlinked: vec![key(9)]
            }
        );
    }

    #[test]
    fn a_side_is_proven_emptied_by_a_tcp_read_after_the_settle_time() {
        let since = 1_000_000_000;
        let settle = u64::try_from(SETTLE.as_nanos()).unwrap();
        assert_eq!(emptied([None, None], since), [false, false]);
        assert_eq!(
            emptied([Some(0), Some(since + settle)], since),
            [false, true],
            "0: the socket never read by TCP since"
        );
        assert_eq!(
            emptied([Some(since + settle - 1), Some(since - 5)], since),
            [false, false],
            "too early: a redirect decided before the release may still land"
        );
        assert_eq!(
            emptied([Some(since + settle), Some(u64::MAX)], 0),
            [false, false],
            "no start recorded: nothing is proven"
        );
    }

    #[test]
    fn an_unlinked_socket_goes_after_the_settle_time() {
        let t0 = Instant::now();
        assert!(!unlinked_may_go(t0, t0));
        assert!(!unlinked_may_go(t0, t0 + SETTLE / 2));
        assert!(unlinked_may_go(t0, t0 + SETTLE));
    }
}
