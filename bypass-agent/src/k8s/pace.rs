//! When the controller runs a full pass (pure). A change to this node (its Node, its
//! pods, a namespace) or a completed listing is applied at once; a change elsewhere in
//! the cluster (a Service, an EndpointSlice, a ServiceCIDR) and the periodic resync wait
//! until [`MIN_INTERVAL`] after the last pass, so a cluster's churn costs at most one
//! pass an interval, not one per event (results/scale/README.md). Either waits, too,
//! [`QUIET`] times the last pass's length after it: a pod that patches its own
//! metadata many times a second (each event of this node's) gets one pass per such
//! spell, and the passes take at most a fifth of a core however fast events come. The
//! passes stay level-triggered: each reads the whole stores, so whatever waited is
//! applied by the next one.

use std::time::{Duration, Instant};

use super::watch::{Item, Source};
pub(super) use crate::owners::QUIET;

/// The shortest time between two passes for cluster-wide changes: kube-proxy's default
/// `--iptables-min-sync-period`. A Service backend on this node waits at most this long.
pub(super) const MIN_INTERVAL: Duration = Duration::from_secs(1);

/// How soon a change needs a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Urgency {
    /// Within [`MIN_INTERVAL`] of the last pass.
    Batched,
    /// At once.
    Now,
}

/// How soon the watch item `item` needs a pass: this node's objects and completed
/// listings at once, cluster-wide objects batched; an error needs none (the stores did
/// not change).
pub(super) fn urgency((source, item): &Item) -> Option<Urgency> {
    match item {
        Err(_) => None,
        Ok(true) => Some(Urgency::Now),
        Ok(false) => Some(match source {
            Source::Node | Source::Pods | Source::Namespaces => Urgency::Now,
            Source::ServiceCidrs | Source::Services | Source::EndpointSlices => Urgency::Batched,
        }),
    }
}

/// What waits for a pass, and when the last one ran.
#[derive(Debug, Default)]
pub(super) struct Pace {
    pending: Option<Urgency>,
    last: Option<Instant>,
    /// [`QUIET`] times the last pass's length after its end.
    not_before: Option<Instant>,
}

impl Pace {
    /// Something changed that needs a pass `urgency` soon.
    pub(super) fn note(&mut self, urgency: Urgency) {
        self.pending = self.pending.max(Some(urgency));
    }

    /// When the next pass is due: `None` when nothing waits; `now` or earlier when it
    /// is due now.
    pub(super) fn due(&self, now: Instant) -> Option<Instant> {
        let by_kind = match (self.pending?, self.last) {
            (Urgency::Now, _) | (Urgency::Batched, None) => now,
            (Urgency::Batched, Some(last)) => last + MIN_INTERVAL,
        };
        Some(self.not_before.map_or(by_kind, |t| t.max(by_kind)))
    }

    /// Whether a pass is due at `now`.
    pub(super) fn is_due(&self, now: Instant) -> bool {
        self.due(now).is_some_and(|t| t <= now)
    }

    /// A pass that started at `started` ended at `ended`, busy for `busy` of that (its
    /// waits on the API server left out): everything noted before `started` is applied.
    /// The next waits [`QUIET`] times `busy`, at most [`MIN_INTERVAL`]: a tenant that
    /// makes passes long cannot stretch the wait for a cut past it.
    pub(super) fn ran(&mut self, started: Instant, busy: Duration, ended: Instant) {
        self.pending = None;
        self.last = Some(started);
        self.not_before = Some(ended + (busy * QUIET).min(MIN_INTERVAL));
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::watcher;

    use super::*;

    #[test]
    fn a_change_to_this_node_is_due_at_once_even_right_after_a_pass() {
        let t0 = Instant::now();
        let mut pace = Pace::default();
        assert_eq!(pace.due(t0), None, "nothing waits");
        pace.ran(t0, Duration::ZERO, t0);
        pace.note(Urgency::Now);
        assert!(pace.is_due(t0));
    }

    #[test]
    fn passes_for_this_node_are_paced_by_their_own_length() {
        let t0 = Instant::now();
        let took = Duration::from_millis(50);
        let mut pace = Pace::default();
        pace.note(Urgency::Now);
        assert!(pace.is_due(t0), "the first pass does not wait");
        pace.ran(t0, took, t0 + took);
        // A pod patching itself in a loop: its events come on, one pass waits for them
        // all, QUIET times the last pass after it.
        let end = t0 + took;
        for _ in 0..1_000 {
            pace.note(Urgency::Now);
        }
        assert!(!pace.is_due(end));
        assert_eq!(pace.due(end), Some(end + took * QUIET));
        let next = end + took * QUIET;
        assert!(pace.is_due(next));
        pace.ran(next, took, next + took);
        assert_eq!(pace.due(next + took), None, "one pass applied all of them");
        // After a quiet spell, a change is applied at once again.
        let later = next + Duration::from_secs(5);
        pace.note(Urgency::Now);
        assert_eq!(pace.due(later), Some(later));
        // A pass made long (or waiting on the API server) delays the next by at most
        // MIN_INTERVAL.
        pace.ran(
            later,
            Duration::from_secs(3),
            later + Duration::from_secs(30),
        );
        pace.note(Urgency::Now);
        assert_eq!(
            pace.due(later + Duration::from_secs(30)),
            Some(later + Duration::from_secs(30) + MIN_INTERVAL)
        );
    }

    #[test]
    fn cluster_changes_wait_for_the_interval_and_make_one_pass() {
        let t0 = Instant::now();
        let mut pace = Pace::default();
        pace.note(Urgency::Batched);
        assert!(pace.is_due(t0), "the first pass does not wait");
        pace.ran(t0, Duration::ZERO, t0);
        let t1 = t0 + MIN_INTERVAL / 10;
        for _ in 0..500 {
            pace.note(Urgency::Batched);
        }
        assert!(!pace.is_due(t1));
        assert_eq!(pace.due(t1), Some(t0 + MIN_INTERVAL));
        let t2 = t0 + MIN_INTERVAL;
        assert!(pace.is_due(t2));
        pace.ran(t2, Duration::ZERO, t2);
        assert_eq!(pace.due(t2), None, "one pass applied all of them");
        // A local change among them does not wait.
        pace.note(Urgency::Batched);
        pace.note(Urgency::Now);
        pace.note(Urgency::Batched);
        assert!(pace.is_due(t2));
    }

    #[test]
    fn this_nodes_objects_and_listings_are_urgent_the_clusters_batched() {
        let event = |s| urgency(&(s, Ok(false)));
        for s in [Source::Node, Source::Pods, Source::Namespaces] {
            assert_eq!(event(s), Some(Urgency::Now), "{s:?}");
        }
        for s in [
            Source::ServiceCidrs,
            Source::Services,
            Source::EndpointSlices,
        ] {
            assert_eq!(event(s), Some(Urgency::Batched), "{s:?}");
            assert_eq!(urgency(&(s, Ok(true))), Some(Urgency::Now), "listed {s:?}");
        }
        let failed = (Source::Services, Err(watcher::Error::NoResourceVersion));
        assert_eq!(urgency(&failed), None);
    }
}
