//! What the apps tests share: the bed (two pods and the agent, or no agent when
//! `BYPASS_APPS_NO_AGENT=1`, to check a workload itself), the programs a test needs
//! (missing: skipped, or failed under `CI=true`), waiting for pairings before a gated
//! client sends, and the counter assertions: paired, and redirected at least the
//! payload where the datapath's rules say it must be.

use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use testbed::{
    Agent, AgentOpts, AgentStatus, TwoPods,
    apps::{Needs, On},
};

use crate::support::{grew, growth};

/// Set to run every workload without the agent (the counters are then not checked):
/// how a workload is checked to be right on its own.
pub const NO_AGENT_ENV: &str = "BYPASS_APPS_NO_AGENT";

/// How long a gated client waits for its connections' pairing.
pub const PAIRING_TIMEOUT: Duration = testbed::steps::NET;

/// Checks that `needs` are here: `Ok(true)` to go on; `Ok(false)` to skip (printed);
/// `Err` under `CI=true`, where a missing program fails the test.
pub fn programs_here(test: &str, needs: &[Needs]) -> Result<bool> {
    let missing: Vec<String> = needs.iter().flat_map(Needs::missing).collect();
    if missing.is_empty() {
        return Ok(true);
    }
    if testbed::require::in_ci() {
        bail!("{test}: cannot run under CI: {}", missing.join("; "));
    }
    eprintln!("SKIPPED {test}: {}", missing.join("; "));
    Ok(false)
}

/// Ends the test, passing, when this machine cannot run it (never under `CI=true`):
/// not privileged, or a program of `needs` missing.
macro_rules! app_test {
    ($($needs:expr),+ $(,)?) => {
        crate::support::privileged!();
        if !crate::apps::support::programs_here(crate::support::test_name!(), &[$($needs),+])? {
            return Ok(());
        }
    };
}
pub(crate) use app_test;

/// Two pods, and the agent on them unless [`NO_AGENT_ENV`] is set.
pub struct Bed {
    // Drop order: the agent first, then the pods.
    pub agent: Option<Agent>,
    pub pods: TwoPods,
    /// Why the agent did not attach (a kernel without a read guard, started as users
    /// start it): every workload then runs on plain TCP, and nothing may be inserted.
    refused: Option<String>,
    started: Instant,
}

impl Bed {
    /// The agent with `--allow-unguarded`: on a kernel with a read guard that changes
    /// nothing; on one without, the datapath runs anyway, for workloads that never
    /// splice or map their sockets (docs/limitations.md's limitation for such kernels).
    pub fn new() -> Result<Self> {
        Self::with(true)
    }

    /// The agent as a user starts it (no `--allow-unguarded`): on a kernel without a
    /// read guard it refuses to attach, and the workload must run exactly as on TCP.
    /// For the workloads that splice.
    pub fn as_users_run() -> Result<Self> {
        Self::with(false)
    }

    fn with(allow_unguarded: bool) -> Result<Self> {
        let started = Instant::now();
        let pods = crate::support::two_pods()?;
        let (agent, refused) = if std::env::var_os(NO_AGENT_ENV).is_some_and(|v| v == "1") {
            eprintln!("{NO_AGENT_ENV}=1: without the agent, counters not checked");
            (None, None)
        } else {
            let agent = Agent::start(&AgentOpts {
                allow_unguarded,
                ..pods.agent_opts()
            })?;
            let refused = agent.refused()?;
            if let Some(why) = &refused {
                eprintln!("the agent refused to attach: {why}");
            }
            (Some(agent), refused)
        };
        Ok(Self {
            agent,
            pods,
            refused,
            started,
        })
    }

    /// Pod a (the clients' side).
    pub fn a(&self) -> On<'_> {
        On::from(&self.pods.a)
    }

    /// Pod b (the servers' side).
    pub fn b(&self) -> On<'_> {
        On::from(&self.pods.b)
    }

    /// The agent's counters (all zero without an agent).
    pub fn stats(&self) -> Result<AgentStatus> {
        self.agent
            .as_ref()
            .map_or(Ok(AgentStatus::default()), Agent::stats)
    }

    /// Counters now, to measure a workload from.
    pub fn mark(&self) -> Result<Mark> {
        Ok(Mark {
            before: self.stats()?,
            wire: self.pods.wire_bytes()?,
        })
    }

    /// Waits until `paired_pod` grew by at least `n` since `mark` (a gated client's
    /// connections, and a proxy's to its upstream, paired on both ends), at most
    /// [`PAIRING_TIMEOUT`]; at once without an agent.
    pub fn wait_paired(&self, mark: &Mark, n: u64) -> Result<()> {
        let Some(agent) = &self.agent else {
            return Ok(());
        };
        if self.refused.is_some() {
            return Ok(());
        }
        let deadline = Instant::now() + PAIRING_TIMEOUT;
        loop {
            let now = agent.stats()?;
            let paired = grew(&mark.before, &now, |s| s.counters.paired_pod);
            if paired >= n {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "{paired} of {n} connections paired within {PAIRING_TIMEOUT:?}: {}",
                    growth(&mark.before, &now)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// What the workload since `mark` did to the counters and the wire.
    pub fn since(&self, mark: &Mark) -> Result<Delta> {
        Ok(Delta {
            before: mark.before.clone(),
            after: self.stats()?,
            wire: self.pods.wire_bytes()?.saturating_sub(mark.wire),
            measured: self.agent.is_some(),
            refused: self.refused.clone(),
        })
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        eprintln!(
            "apps: the pods, the agent and the workload took {:.1} s",
            self.started.elapsed().as_secs_f64()
        );
    }
}

/// Counters at the start of a workload.
pub struct Mark {
    before: AgentStatus,
    wire: u64,
}

/// The counters' growth over a workload, and the bytes on the veths meanwhile.
pub struct Delta {
    pub before: AgentStatus,
    pub after: AgentStatus,
    pub wire: u64,
    /// False without an agent: nothing to assert.
    pub measured: bool,
    /// Why the agent did not attach: then nothing may have been inserted.
    pub refused: Option<String>,
}

impl Delta {
    pub fn grew(&self, f: impl Fn(&AgentStatus) -> u64) -> u64 {
        grew(&self.before, &self.after, f)
    }

    /// One line: every counter that grew, and the wire.
    pub fn summary(&self) -> String {
        format!(
            "{}; veths carried {} B",
            growth(&self.before, &self.after),
            self.wire
        )
    }

    /// At least `connections` connections paired pod to pod (both ends inserted), no
    /// insert failed, and at least `payload` bytes redirected socket to socket, unless
    /// the datapath's own rules moved a direction to TCP, which it counts (a client's
    /// send before its pairing, a reader `--max-queued-bytes` behind, a small-message
    /// stream, a reader seen splicing, the node's TCP memory near its limit): then every
    /// byte of the payload must have gone one of the two ways, or the connection left
    /// the SockHash, after which its bytes take plain TCP where no program sees them
    /// (the workload's own check vouches for them). The TCP way is the larger of what
    /// sk_msg counted and what the veths carried: the kernel sends some messages by TCP
    /// without running sk_msg (docs/limitations.md, "passed_bytes misses some TCP sends").
    pub fn expect_bypassed(&self, workload: &str, connections: u64, payload: u64) -> Result<()> {
        eprintln!("{workload}: {}", self.summary());
        if !self.measured {
            return Ok(());
        }
        self.expect_paired(workload, connections)?;
        if self.refused.is_some() {
            return Ok(());
        }
        let redirected = self.grew(|s| s.counters.redirected_bytes);
        let moved = self.moved_to_tcp();
        if moved == 0 {
            ensure!(
                redirected >= payload,
                "{workload}: {redirected} B redirected, want at least {payload} B: {}",
                self.summary()
            );
            return Ok(());
        }
        let passed = self.grew(|s| s.counters.passed_bytes);
        let leaving = self.grew(|s| s.counters.leave_requests);
        eprintln!(
            "{workload}: {moved} time(s) a direction moved to TCP by the datapath's rules, \
             {leaving} connection(s) leaving the SockHash: {redirected} B redirected, \
             {passed} B by TCP inside it, {} B on the veths",
            self.wire
        );
        ensure!(
            leaving > 0 || redirected + passed.max(self.wire) >= payload,
            "{workload}: {redirected} B redirected, {passed} B by TCP and {} B on the \
             veths, want at least {payload} B redirected and by TCP together: {}",
            self.wire,
            self.summary()
        );
        Ok(())
    }

    /// Times the datapath moved a direction to TCP by its rules.
    pub fn moved_to_tcp(&self) -> u64 {
        self.grew(|s| s.counters.unpaired_sends)
            + self.grew(|s| s.counters.queue_limited)
            + self.grew(|s| s.counters.small_streams)
            + self.grew(|s| s.counters.tcp_only_readers)
            + self.grew(|s| s.counters.leave_requests)
            + self.grew(|s| s.counters.cut_seen)
            + self.grew(|s| s.counters.memory_tight)
    }

    /// At least `connections` connections paired pod to pod, each end inserted, and no
    /// insert failed: the bypass took the connections, whatever then carried the bytes.
    pub fn expect_paired(&self, workload: &str, connections: u64) -> Result<()> {
        if !self.measured {
            return Ok(());
        }
        if let Some(why) = &self.refused {
            let inserted = self.grew(|s| s.counters.sockets_inserted);
            ensure!(
                inserted == 0,
                "{workload}: the agent refused to attach ({why}), yet {inserted} sockets \
                 were inserted: {}",
                self.summary()
            );
            eprintln!("{workload}: plain TCP, the agent having refused to attach");
            return Ok(());
        }
        let paired = self.grew(|s| s.counters.paired_pod);
        let inserted = self.grew(|s| s.counters.sockets_inserted);
        ensure!(
            paired >= connections && inserted >= 2 * connections,
            "{workload}: {paired} connections paired and {inserted} sockets inserted, want at \
             least {connections} and {}: {}",
            2 * connections,
            self.summary()
        );
        ensure!(
            self.grew(|s| s.counters.insert_failures) == 0,
            "{workload}: inserts failed: {}",
            self.summary()
        );
        Ok(())
    }
}

impl Delta {
    /// The workload's connections were paired, and the read guard saw a socket read
    /// with splice(2) (its peer then sent to it by TCP): or the agent refused to attach
    /// and nothing was inserted.
    pub fn expect_spliced_to_tcp(&self, workload: &str, connections: u64) -> Result<()> {
        eprintln!("{workload}: {}", self.summary());
        self.expect_paired(workload, connections)?;
        if !self.measured || self.refused.is_some() {
            return Ok(());
        }
        ensure!(
            self.grew(|s| s.counters.tcp_only_readers) >= 1,
            "{workload}: no socket was seen reading with splice: {}",
            self.summary()
        );
        Ok(())
    }
}
