//! Polling until a check passes: the cluster's daemons coming up (xtask), the agent
//! following a label (the bench), a path taking effect (the cluster tests).

use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};

/// The net for anything the tests and the cluster's bring-up wait on that makes
/// progress at its machine's speed (a client run to its end, a daemon or pod starting, a
/// condition polled: the wait ends as soon as it holds). It catches a hang; a slower
/// machine, or one busy with the kernel matrix's guests beside the tests, never reaches
/// it. A test asserts what it observed, never how fast.
pub const NET: Duration = Duration::from_secs(900);

/// Runs `check` every `poll` until it succeeds; past `timeout`, its last error.
pub fn retry(
    timeout: Duration,
    poll: Duration,
    mut check: impl FnMut() -> Result<()>,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        match check() {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(_) => std::thread::sleep(poll),
        }
    }
}

/// [`retry`], with an error that names `what`, the timeout and the last failure.
pub fn wait_for(
    what: &str,
    timeout: Duration,
    poll: Duration,
    check: impl FnMut() -> Result<()>,
) -> Result<()> {
    retry(timeout, poll, check).map_err(|e| anyhow!("{what} not within {timeout:?}: {e:#}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_until_the_check_passes() {
        let mut calls = 0;
        wait_for("third call", Duration::from_secs(5), Duration::ZERO, || {
            calls += 1;
            anyhow::ensure!(calls == 3, "call {calls}");
            Ok(())
        })
        .unwrap();
        assert_eq!(calls, 3);
    }

    #[test]
    fn names_what_and_the_last_failure_past_the_timeout() {
        let e = wait_for("never", Duration::ZERO, Duration::ZERO, || {
            anyhow::bail!("still not")
        })
        .unwrap_err();
        assert_eq!(format!("{e:#}"), "never not within 0ns: still not");
    }
}
