//! The agent's heartbeat: a thread moves the deadline in the control map
//! (`bypass_common::control::SLOT_HEARTBEAT`) forward while the agent lives. When it
//! stops (the agent exited leaving its datapath pinned, was killed, or hangs), sock_ops
//! inserts nothing new once the deadline passes, so a datapath never goes on bypassing
//! new connections on maps no agent tends (a recycled address of an opted-out pod, a
//! node label nobody obeys). The deadline is in seconds of `CLOCK_MONOTONIC`, the clock
//! `bpf_ktime_get_ns` reads (kernel/bpf/helpers.c).

use std::time::{Duration, Instant};

use bypass_common::control;
use tracing::warn;

use super::{
    maps::Control,
    worker::{Worker, nap_until},
};
use crate::error::AgentError;

/// Default `--heartbeat-seconds`: long enough for a rolling update's new pod to start
/// and adopt (new connections meanwhile take TCP, nothing is lost), short enough that a
/// removed agent's datapath stops taking new connections within a minute.
pub const DEFAULT_TTL_SECS: u32 = 60;

/// `CLOCK_MONOTONIC` now, in nanoseconds.
pub fn now_ns() -> Result<u64, AgentError> {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_err(|e| {
        AgentError::System {
            action: "read CLOCK_MONOTONIC",
            source: e.into(),
        }
    })?;
    let secs = u64::try_from(ts.tv_sec()).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec()).unwrap_or(0);
    Ok(secs
        .saturating_mul(control::NSEC_PER_SEC)
        .saturating_add(nanos))
}

/// How long until the heartbeat `deadline` passes; `None` once it has.
pub fn remaining(deadline: u32) -> Option<Duration> {
    let left = control::heartbeat_remaining(deadline, now_ns().ok()?);
    (left > 0).then(|| Duration::from_secs(left))
}

/// How often a heartbeat of `ttl` seconds is refreshed: three times per period, so one
/// late wake-up does not let it lapse.
pub fn period(ttl: u32) -> Duration {
    Duration::from_millis((u64::from(ttl) * 1000 / 3).max(500))
}

/// Writes a deadline `ttl` seconds from now, and the TCP memory threshold again (the
/// sysctl may have changed; [`super::tcp_mem`]: a failure to read it was told at start).
pub fn beat(control: &mut Control, ttl: u32) -> Result<(), AgentError> {
    let _ = super::tcp_mem::refresh(control);
    control.set_heartbeat(control::heartbeat_deadline(now_ns()?, ttl))
}

/// The refreshing thread; stops when dropped (the deadline then runs out by itself).
pub struct Beater {
    _thread: Worker,
}

impl Beater {
    /// Beats now on `control` (a handle of its own on the pinned control map), then
    /// every [`period`] from a thread.
    pub fn start(mut control: Control, ttl: u32) -> Result<Self, AgentError> {
        beat(&mut control, ttl)?;
        let every = period(ttl);
        let thread = Worker::spawn("heartbeat", move |stop| {
            let mut next = Instant::now() + every;
            let mut failing = false;
            while nap_until(stop, next) {
                next = Instant::now() + every;
                match beat(&mut control, ttl) {
                    Ok(()) => failing = false,
                    Err(e) if !failing => {
                        failing = true;
                        warn!(error = %e, "heartbeat not written: once it lapses, new connections take the normal TCP path");
                    }
                    Err(_) => {}
                }
            }
        })
        .map_err(|source| AgentError::System {
            action: "start the heartbeat thread",
            source,
        })?;
        Ok(Self { _thread: thread })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refreshed_well_within_its_period() {
        assert_eq!(period(60), Duration::from_secs(20));
        assert_eq!(period(1), Duration::from_millis(500));
        assert_eq!(period(0), Duration::from_millis(500));
    }

    #[test]
    fn the_clock_is_the_programs_clock() {
        // bpf_ktime_get_ns is CLOCK_MONOTONIC: never zero on a running system, and
        // not going back.
        let a = now_ns().unwrap();
        let b = now_ns().unwrap();
        assert!(a > 0 && b >= a);
        assert!(remaining(0).is_none());
        let d = control::heartbeat_deadline(now_ns().unwrap(), 30);
        assert!(remaining(d).is_some_and(|r| r <= Duration::from_secs(30)));
    }
}
