//! Takes leaving connections out of the SockHash. The programs mark a connection
//! leaving (`bypass_common::state::link_state::LEAVING`: a reader that splices, a
//! small-message stream, a cut) and say so on the event ring buffer; from then on
//! neither side redirects (but a sender draining a TCP-only reader of what it has not
//! read yet: `bypass_common::state::drains_first`). Once each side has read everything redirected to it, this
//! deletes both sockets from the SockHash: the kernel drops their psocks, which
//! restores their original protocol (net/core/sock_map.c, net/core/skmsg.c), so they
//! run as plain TCP — autocork, splice and zero-copy receive included. Deleting earlier
//! would drop unread bytes with the psock (net/core/skmsg.c, sk_psock_drop purges the
//! ingress queue).
//!
//! A thread of the agent reads the ring buffer and re-checks the connections it waits
//! for; it also removes the cut map's entries of connections that are gone. An event
//! the ring buffer could not hold (`leave_events_lost`) loses no leave: when that
//! counter moves, the thread scans the links for leaving connections, as it does when
//! it starts, at most once every [`RESCAN`].

use std::{
    collections::{BTreeMap, HashMap as StdHashMap},
    os::fd::AsFd as _,
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use aya::maps::{HashMap, MapData, RingBuf, SockHash};
use bypass_common::{
    Link, SockKey, Stat,
    names::{MAP_CUT, MAP_EVENTS, MAP_LINKS, MAP_SOCKETS, MAP_STATS},
    state::{LeaveEvent, link_state},
};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use tracing::{debug, warn};

use super::{
    PinLayout,
    maps::{Stats, open_pinned},
    worker::Worker,
};
use crate::error::AgentError;

/// How long the thread waits for an event before it looks at what it waits for again
/// (a reader that catches up sends no event).
pub const RECHECK: Duration = Duration::from_millis(50);

/// The longest a waiting connection whose counters did not move goes without being
/// looked at: each look that finds them as they were doubles its interval from
/// [`RECHECK`] up to this, so what waits costs in proportion to what changes, not to
/// how many wait (a pod can leave thousands of connections unread).
pub const MAX_RECHECK: Duration = Duration::from_secs(5);

/// The interval until the next look at a waiting connection, after one at `prev`
/// (pure): back to [`RECHECK`] when its counters `moved`, else doubled up to
/// [`MAX_RECHECK`].
pub fn next_interval(prev: Duration, moved: bool) -> Duration {
    if moved {
        RECHECK
    } else {
        (prev * 2).clamp(RECHECK, MAX_RECHECK)
    }
}

/// The shortest time between two scans of the links for leaving connections whose
/// event was lost: a pod that keeps the ring buffer full costs the agent one scan of
/// the links a second at most, not one per lost event ([`next_scan`]).
pub const RESCAN: Duration = Duration::from_secs(1);

/// How often the thread forgets what it no longer needs (cut entries and [`Gone`]
/// entries of connections that closed): on a clock, not per loop, whose pace the
/// events, and so the pods, set.
pub const SWEEP: Duration = Duration::from_secs(10);

/// The wait after a scan of the links that took `took` before the next may start
/// (pure): [`RESCAN`], or ten times the scan where that is longer, so that scans take
/// at most a tenth of the thread however large the links map or slow the node.
pub fn next_scan(took: Duration) -> Duration {
    RESCAN.max(took.saturating_mul(10))
}

/// Whether a scan of the links adds the connection of link `l` under `key` to those
/// waiting to leave (pure): it is leaving, and it is not one this thread already took
/// out (`gone`: the same key with the same sockets; a later connection under the key
/// has other cookies).
pub fn scan_adds(key: &SockKey, l: &Link, gone: &Gone) -> bool {
    l.state & link_state::LEAVING != 0 && gone.get(key) != Some(&l.cookie)
}

/// How long a link's counters must stay as they were when each side had read
/// everything before its sockets are deleted: a redirect counted on one CPU reaches
/// the peer's queue within the sender's system call, and this thread reads the
/// counters with plain loads (no barrier orders them on weakly ordered CPUs).
pub const SETTLE: Duration = Duration::from_millis(5);

/// A link's counters: bytes each side redirected, bytes each side read.
pub type Counts = ([u64; 2], [u64; 2]);

/// When a connection was last seen with every redirected byte read, and its counters
/// then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    counts: Counts,
    at: Instant,
}

/// Whether a connection seen with every byte read now (`counts` at `now`) may leave:
/// it was seen so before (`prev`), with the same counters, at least [`SETTLE`] ago.
pub fn may_go(prev: Option<Seen>, counts: Counts, now: Instant) -> bool {
    prev.is_some_and(|p| p.counts == counts && now.saturating_duration_since(p.at) >= SETTLE)
}

/// What to do with a connection waiting to leave, from its link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The link is gone (both sockets closed) or was never leaving: forget it.
    Forget,
    /// Bytes redirected one way or the other are not all read yet: wait.
    Wait {
        /// The counters now.
        counts: Counts,
    },
    /// Each side has read everything redirected to it: delete both sockets (the client
    /// socket under the link's key, the server's under `server`) once that holds for
    /// [`SETTLE`] ([`may_go`]).
    Delete {
        /// The server socket's key.
        server: SockKey,
        /// The counters now.
        counts: Counts,
    },
}

/// The step for a connection whose link is `link` (`None`: gone).
pub fn step(link: Option<&Link>) -> Step {
    let Some(l) = link else {
        return Step::Forget;
    };
    if l.state & link_state::LEAVING == 0 {
        return Step::Forget;
    }
    // Counted before each redirect (also those on their way), against what each side
    // read: equal both ways means nothing waits and nothing is coming.
    let counts = (l.tx_redir, l.rx_read);
    if l.tx_redir[0] == l.rx_read[1] && l.tx_redir[1] == l.rx_read[0] {
        Step::Delete {
            server: l.server,
            counts,
        }
    } else {
        Step::Wait { counts }
    }
}

/// A connection waiting to leave.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// When it was last seen with every byte read, and its counters then.
    seen: Option<Seen>,
    /// Its counters at the last look, and the interval after it ([`next_interval`]).
    last: Option<Counts>,
    interval: Duration,
}

impl Entry {
    const NEW: Self = Self {
        seen: None,
        last: None,
        interval: RECHECK,
    };
}

/// Connections waiting to leave, and when to look at each again, in the order they come
/// due: a look touches only those due, however many wait (a pod holding thousands of
/// unread leaving connections costs nothing between their looks).
#[derive(Debug, Default)]
struct Waiting {
    entries: StdHashMap<SockKey, Entry>,
    /// Each entry's key at `(due, n)`: one place per entry (`n` tells apart entries due
    /// at one instant).
    schedule: BTreeMap<(Instant, u64), SockKey>,
    scheduled: u64,
}

impl Waiting {
    /// Adds `key`, due at `now`, unless it waits already; whether it was added.
    fn add(&mut self, key: SockKey, now: Instant) -> bool {
        if self.entries.contains_key(&key) {
            return false;
        }
        self.put(key, Entry::NEW, now);
        true
    }

    /// Puts `key` back with `entry`, due at `due`.
    fn put(&mut self, key: SockKey, entry: Entry, due: Instant) {
        self.scheduled += 1;
        self.schedule.insert((due, self.scheduled), key);
        self.entries.insert(key, entry);
    }

    /// Takes out every entry due by `now`, in the order they came due.
    fn take_due(&mut self, now: Instant) -> Vec<(SockKey, Entry)> {
        let later = self.schedule.split_off(&(now, u64::MAX));
        let due = std::mem::replace(&mut self.schedule, later);
        due.into_values()
            .filter_map(|k| self.entries.remove(&k).map(|e| (k, e)))
            .collect()
    }
}

/// Connections this thread took out of the SockHash whose link is still there (until
/// both sockets close), with their sockets' cookies: a scan skips them, not a later
/// connection under the same key.
pub type Gone = StdHashMap<SockKey, [u64; 2]>;

/// The maps the thread works on, opened from the pins.
struct Maps {
    sockets: SockHash<MapData, SockKey>,
    links: HashMap<MapData, SockKey, Link>,
    cut: HashMap<MapData, SockKey, u8>,
    events: RingBuf<MapData>,
    stats: Stats,
}

impl Maps {
    fn open(pins: &PinLayout) -> Result<Self, AgentError> {
        Ok(Self {
            sockets: open_pinned(pins, MAP_SOCKETS)?,
            links: open_pinned(pins, MAP_LINKS)?,
            cut: open_pinned(pins, MAP_CUT)?,
            events: open_pinned(pins, MAP_EVENTS)?,
            stats: Stats::new(open_pinned(pins, MAP_STATS)?)?,
        })
    }

    /// Adds to `waiting` the connections leaving that it lacks, but those this thread
    /// took out already (`gone`, which it prunes on the way of connections that closed):
    /// at start (an adopted datapath) and after events were lost to a full ring.
    /// Returns how many it added.
    fn scan_leaving(&self, waiting: &mut Waiting, gone: &mut Gone) -> usize {
        let now = Instant::now();
        let mut added = 0;
        let mut still = Gone::with_capacity(gone.len());
        for (k, l) in self.links.iter().filter_map(Result::ok) {
            if gone.get(&k) == Some(&l.cookie) {
                still.insert(k, l.cookie);
            }
            if scan_adds(&k, &l, gone) && waiting.add(k, now) {
                added += 1;
            }
        }
        *gone = still;
        added
    }

    /// `leave_events_lost` now (0 if it cannot be read: the next read that can moves it).
    fn lost_events(&self) -> u64 {
        self.stats.get(Stat::LeaveEventsLost).unwrap_or(0)
    }

    /// Moves every event of the ring buffer into `waiting`.
    fn drain_events(&mut self, waiting: &mut Waiting) {
        let now = Instant::now();
        while let Some(item) = self.events.next() {
            if item.len() >= std::mem::size_of::<LeaveEvent>() {
                // SAFETY: the ring buffer item holds a `LeaveEvent` the programs wrote
                // (plain old data, any bit pattern valid); read unaligned.
                let ev: LeaveEvent =
                    unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<LeaveEvent>()) };
                waiting.add(ev.link, now);
            }
        }
    }

    /// Acts on each connection in `waiting`, recording in `gone` those it took out;
    /// returns how many left.
    fn settle(&mut self, waiting: &mut Waiting, gone: &mut Gone) -> u64 {
        let mut left = 0;
        let now = Instant::now();
        for (key, mut e) in waiting.take_due(now) {
            let key = &key;
            let link = self.links.get(key, 0).ok();
            match step(link.as_ref()) {
                Step::Forget => {
                    // Its cut entry goes with it: a later connection under the key
                    // is not this one.
                    if link.is_none() {
                        let _ = self.cut.remove(key);
                    }
                }
                Step::Wait { counts } => {
                    e.seen = None;
                    e.interval = next_interval(e.interval, e.last != Some(counts));
                    e.last = Some(counts);
                    waiting.put(*key, e, now + e.interval);
                }
                Step::Delete { counts, .. } if !may_go(e.seen, counts, now) => {
                    if e.seen.is_none_or(|s| s.counts != counts) {
                        e.seen = Some(Seen { counts, at: now });
                    }
                    e.interval = RECHECK;
                    waiting.put(*key, e, now);
                }
                Step::Delete { server, .. } => {
                    // Either may be gone already (closed): deleting the other is enough.
                    let a = self.sockets.remove(key);
                    let b = self.sockets.remove(&server);
                    if a.is_ok() || b.is_ok() {
                        left += 1;
                        debug!(?key, "connection left the SockHash");
                    }
                    if let Some(l) = &link {
                        gone.insert(*key, l.cookie);
                    }
                    let _ = self.cut.remove(key);
                }
            }
        }
        left
    }

    /// Forgets connections of `gone` whose link is gone or another connection's now.
    fn sweep_gone(&self, gone: &mut Gone) {
        gone.retain(|k, cookie| self.links.get(k, 0).is_ok_and(|l| l.cookie == *cookie));
    }

    /// Removes cut entries whose connection is gone.
    fn sweep_cut(&mut self) {
        let gone: Vec<SockKey> = self
            .cut
            .keys()
            .filter_map(Result::ok)
            .filter(|k| self.links.get(k, 0).is_err())
            .collect();
        for k in gone {
            let _ = self.cut.remove(&k);
        }
    }
}

/// The leave thread; stops when dropped.
pub struct Leaver {
    _thread: Worker,
}

impl Leaver {
    /// Starts the thread on the maps pinned under `pins`.
    pub fn start(pins: &PinLayout) -> Result<Self, AgentError> {
        let mut maps = Maps::open(pins)?;
        let thread = Worker::spawn("leaver", move |stop| {
            let mut waiting = Waiting::default();
            let mut gone = Gone::new();
            // Read before the scan: an event lost during it moves the counter past this.
            let mut lost = maps.lost_events();
            let started = Instant::now();
            maps.scan_leaving(&mut waiting, &mut gone);
            let mut next_look = Instant::now() + next_scan(started.elapsed());
            let mut next_sweep = Instant::now() + SWEEP;
            while !stop.load(Ordering::Relaxed) {
                let fd = maps.events.as_fd();
                let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
                let timeout = PollTimeout::try_from(RECHECK).unwrap_or(PollTimeout::NONE);
                if let Err(e) = poll(&mut fds, timeout)
                    && e != nix::errno::Errno::EINTR
                {
                    warn!(error = %e, "polling the leave events");
                    std::thread::sleep(RECHECK);
                }
                maps.drain_events(&mut waiting);
                if Instant::now() >= next_look {
                    let now_lost = maps.lost_events();
                    next_look = Instant::now() + RESCAN;
                    if now_lost != lost {
                        lost = now_lost;
                        let started = Instant::now();
                        let added = maps.scan_leaving(&mut waiting, &mut gone);
                        let took = started.elapsed();
                        next_look = Instant::now() + next_scan(took);
                        debug!(
                            added,
                            lost,
                            ?took,
                            "leave events were lost: scanned the links"
                        );
                    }
                }
                let left = maps.settle(&mut waiting, &mut gone);
                if left > 0
                    && let Err(e) = maps.stats.add_agent_only(Stat::Left, left)
                {
                    warn!(error = %e, "counting connections that left the SockHash");
                }
                if Instant::now() >= next_sweep {
                    maps.sweep_cut();
                    maps.sweep_gone(&mut gone);
                    next_sweep = Instant::now() + SWEEP;
                }
            }
        })
        .map_err(|source| AgentError::Io {
            action: "start the leave thread",
            path: pins.map(MAP_EVENTS),
            source,
        })?;
        Ok(Self { _thread: thread })
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

    #[test]
    fn a_look_takes_only_what_is_due_in_order() {
        let t0 = Instant::now();
        let mut w = Waiting::default();
        assert!(w.add(key(1), t0));
        assert!(!w.add(key(1), t0), "added twice");
        w.put(key(2), Entry::NEW, t0 + Duration::from_secs(5));
        w.put(key(3), Entry::NEW, t0 + Duration::from_secs(1));
        let ports = |v: Vec<(SockKey, Entry)>| -> Vec<u32> {
            v.into_iter().map(|(k, _)| k.local_port).collect()
        };
        assert_eq!(ports(w.take_due(t0)), [1]);
        assert_eq!(ports(w.take_due(t0)), Vec::<u32>::new());
        assert_eq!(ports(w.take_due(t0 + Duration::from_secs(6))), [3, 2]);
        assert!(w.entries.is_empty() && w.schedule.is_empty());
        // Put back at the instant it was taken: due at the next look, not lost.
        assert!(w.add(key(4), t0));
        let taken = w.take_due(t0);
        for (k, e) in taken {
            w.put(k, e, t0);
        }
        assert_eq!(ports(w.take_due(t0)), [4]);
    }

    fn leaving(tx: [u64; 2], rx: [u64; 2]) -> Link {
        Link {
            state: link_state::LEAVING,
            server: SockKey {
                local_port: 80,
                ..SockKey::default()
            },
            tx_redir: tx,
            rx_read: rx,
            ..Link::default()
        }
    }

    #[test]
    fn deletes_only_when_both_sides_read_everything() {
        assert_eq!(step(None), Step::Forget);
        let not_leaving = Link::default();
        assert_eq!(step(Some(&not_leaving)), Step::Forget);
        assert_eq!(
            step(Some(&leaving([10, 0], [0, 9]))),
            Step::Wait {
                counts: ([10, 0], [0, 9])
            },
            "server behind"
        );
        assert_eq!(
            step(Some(&leaving([10, 5], [4, 10]))),
            Step::Wait {
                counts: ([10, 5], [4, 10])
            },
            "client behind"
        );
        let done = leaving([10, 5], [5, 10]);
        assert_eq!(
            step(Some(&done)),
            Step::Delete {
                server: done.server,
                counts: ([10, 5], [5, 10]),
            }
        );
        assert_eq!(
            step(Some(&leaving([0, 0], [0, 0]))),
            Step::Delete {
                server: done.server,
                counts: ([0, 0], [0, 0]),
            },
            "nothing was ever redirected"
        );
    }

    #[test]
    fn a_connection_that_does_not_move_is_looked_at_less_and_less_often() {
        let mut i = RECHECK;
        let mut looks = 0;
        while i < MAX_RECHECK {
            i = next_interval(i, false);
            looks += 1;
        }
        assert_eq!(i, MAX_RECHECK, "capped");
        assert!(looks < 10, "{looks} looks to reach the cap");
        assert_eq!(next_interval(MAX_RECHECK, false), MAX_RECHECK);
        assert_eq!(
            next_interval(MAX_RECHECK, true),
            RECHECK,
            "moved: soon again"
        );
    }

    #[test]
    fn a_scan_adds_leaving_connections_but_those_already_taken_out() {
        let key = SockKey {
            local_port: 5000,
            ..SockKey::default()
        };
        let mut l = leaving([1, 0], [0, 1]);
        l.cookie = [7, 8];
        let mut gone = Gone::new();
        assert!(scan_adds(&key, &l, &gone), "leaving, never taken out");
        gone.insert(key, [7, 8]);
        assert!(!scan_adds(&key, &l, &gone), "taken out already");
        let mut later = l;
        later.cookie = [9, 10];
        assert!(
            scan_adds(&key, &later, &gone),
            "a later connection under the same key"
        );
        let staying = Link {
            cookie: [9, 10],
            ..Link::default()
        };
        assert!(!scan_adds(&key, &staying, &gone), "not leaving");
    }

    #[test]
    fn scans_take_at_most_a_tenth_of_the_thread() {
        assert_eq!(next_scan(Duration::from_millis(5)), RESCAN);
        assert_eq!(
            next_scan(Duration::from_millis(420)),
            Duration::from_millis(4200)
        );
    }

    #[test]
    fn goes_only_after_the_same_counters_held_for_the_settle_time() {
        let t0 = Instant::now();
        let c = ([10, 5], [5, 10]);
        assert!(!may_go(None, c, t0), "first seen: wait");
        let seen = Some(Seen { counts: c, at: t0 });
        assert!(!may_go(seen, c, t0 + SETTLE / 2), "too soon");
        assert!(may_go(seen, c, t0 + SETTLE));
        assert!(
            !may_go(seen, ([11, 5], [5, 11]), t0 + SETTLE),
            "a redirect came and was read meanwhile: seen again from now"
        );
    }
}
