//! Full-map warnings. When the SockHash (or the socket address map, sized alike) is full,
//! sock_ops cannot insert a new connection: it takes the normal path and
//! `insert_failures` grows. Nothing breaks, but the operator should know; the kernel
//! side cannot log at that rate, so a thread of the agent polls the counter and warns,
//! at most once per interval, with what happened since the last warning.

use std::time::{Duration, Instant};

use tracing::warn;

use super::{
    maps::Stats,
    worker::{Worker, nap_until},
};

/// How often the counter is read.
pub const POLL: Duration = Duration::from_secs(1);
/// At most one warning per this long.
pub const WARN_EVERY: Duration = Duration::from_secs(30);

/// One warning to log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Warning {
    /// Failures since the last warning (or since the agent started).
    pub new_failures: u64,
    /// The counter's value now.
    pub total: u64,
}

/// Decides when the growth of `insert_failures` deserves a warning: at the first
/// growth, then at most once per `every`, summing the failures in between.
#[derive(Debug)]
pub struct FailureAlarm {
    every: Duration,
    /// Counter value at the last warning (or when watching started).
    reported: u64,
    last_warning: Option<Instant>,
}

impl FailureAlarm {
    /// Starts from the counter's current value: failures from before (an adopted
    /// datapath keeps its counters) were some earlier agent's to report.
    pub fn new(start: u64, every: Duration) -> Self {
        Self {
            every,
            reported: start,
            last_warning: None,
        }
    }

    /// The counter read `total` at `now`: a warning, or none yet.
    pub fn observe(&mut self, total: u64, now: Instant) -> Option<Warning> {
        if total < self.reported {
            // Counters went back: a reloaded datapath. Start over from here.
            self.reported = total;
            return None;
        }
        if total == self.reported {
            return None;
        }
        if let Some(last) = self.last_warning
            && now.duration_since(last) < self.every
        {
            return None;
        }
        let w = Warning {
            new_failures: total - self.reported,
            total,
        };
        self.reported = total;
        self.last_warning = Some(now);
        Some(w)
    }
}

/// The polling thread; stops when dropped.
pub struct Watcher {
    _thread: Worker,
}

impl Watcher {
    /// Watches `stats` (a handle of its own on the pinned counters) for a SockHash of
    /// `capacity` sockets.
    pub fn start(stats: Stats, capacity: u32) -> std::io::Result<Self> {
        let start = stats.read().map(|c| c.insert_failures).unwrap_or(0);
        let thread = Worker::spawn("map-pressure", move |stop| {
            let mut alarm = FailureAlarm::new(start, WARN_EVERY);
            let mut next = Instant::now() + POLL;
            while nap_until(stop, next) {
                next += POLL;
                let Ok(c) = stats.read() else { continue };
                if let Some(w) = alarm.observe(c.insert_failures, Instant::now()) {
                    warn!(
                        new_failures = w.new_failures,
                        insert_failures = w.total,
                        max_sockets = capacity,
                        "sockets could not be inserted (SockHash or address map full, see \
                         --max-sockets): those connections use the normal TCP path"
                    );
                }
            }
        })?;
        Ok(Self { _thread: thread })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_growth_warns_then_rate_limited() {
        let t0 = Instant::now();
        let s = |secs| t0 + Duration::from_secs(secs);
        let mut a = FailureAlarm::new(10, Duration::from_secs(30));
        assert_eq!(a.observe(10, s(1)), None, "no growth");
        assert_eq!(
            a.observe(12, s(2)),
            Some(Warning {
                new_failures: 2,
                total: 12
            })
        );
        assert_eq!(a.observe(20, s(3)), None, "within the interval");
        assert_eq!(a.observe(25, s(31)), None, "still within");
        assert_eq!(
            a.observe(26, s(32)),
            Some(Warning {
                new_failures: 14,
                total: 26
            }),
            "everything since the last warning"
        );
        assert_eq!(a.observe(26, s(100)), None, "no growth, no warning");
    }

    #[test]
    fn counters_that_restart_are_followed() {
        let t0 = Instant::now();
        let mut a = FailureAlarm::new(50, Duration::from_secs(30));
        assert_eq!(a.observe(3, t0), None);
        assert_eq!(
            a.observe(4, t0),
            Some(Warning {
                new_failures: 1,
                total: 4
            })
        );
    }
}
