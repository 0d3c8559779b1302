//! Switching the pods' path between blocks, for every testbed scenario (the qperf sweep
//! and the apps scenario alike): the agent started (bypass) or stopped (default, so new
//! connections are not inserted), or the minimal reference redirect attached instead;
//! the agent's memory and CPU probed as it runs, and its counters and the veths' bytes
//! read around a run.

use std::{path::PathBuf, time::Instant};

use anyhow::{Context as _, Result};
use testbed::{Agent, AgentOpts, TwoPods};

use crate::{
    minimal::Minimal,
    model::{AgentProbe, Counted, Path, ProbePhase},
    procfs,
};

/// What is attached to the pods' cgroup now, and how to change it.
pub(crate) struct PathSwitch {
    /// How the agent is started (`bypass-agent run` as a user runs it).
    opts: AgentOpts,
    /// The pods' parent cgroup, where the minimal datapath attaches.
    cgroup: PathBuf,
    agent: Option<Agent>,
    /// (when, cpu ms) of the last probe of the running agent.
    last: Option<(Instant, f64)>,
    /// The minimal reference datapath, while attached.
    minimal: Option<Minimal>,
}

impl PathSwitch {
    /// Nothing attached yet; the agent will be started with `opts`, the minimal
    /// datapath attached to `cgroup`.
    pub(crate) fn new(opts: AgentOpts, cgroup: PathBuf) -> Self {
        Self {
            opts,
            cgroup,
            agent: None,
            last: None,
            minimal: None,
        }
    }

    /// How the agent is started.
    pub(crate) fn agent_opts(&self) -> &AgentOpts {
        &self.opts
    }

    /// The running agent, in a bypassed block.
    pub(crate) fn agent(&self) -> Option<&Agent> {
        self.agent.as_ref()
    }

    /// The attached minimal datapath, in a minimal block.
    pub(crate) fn minimal(&self) -> Option<&Minimal> {
        self.minimal.as_ref()
    }

    /// Attaches `path` (starts the agent, or attaches the minimal datapath) or detaches
    /// (stops the agent: its exit, when not clean, goes to `warnings`). A start is
    /// probed into `probes`.
    pub(crate) fn set(
        &mut self,
        path: Path,
        probes: &mut Vec<AgentProbe>,
        warnings: &mut Vec<String>,
    ) -> Result<()> {
        if path != Path::Minimal {
            self.minimal = None;
        }
        match (path, self.agent.is_some()) {
            (Path::Bypass, false) => {
                let t = Instant::now();
                let agent = Agent::start(&self.opts).context("start the agent")?;
                let snap = procfs::snapshot(agent.pid())?;
                probes.push(AgentProbe {
                    phase: ProbePhase::Started,
                    pid: agent.pid(),
                    rss_kib: snap.rss_kib,
                    hwm_kib: snap.hwm_kib,
                    cpu_ms: snap.cpu_ms,
                    wall_ms: t.elapsed().as_secs_f64() * 1e3,
                });
                self.last = Some((Instant::now(), snap.cpu_ms));
                self.agent = Some(agent);
            }
            (Path::Default | Path::Floor | Path::Minimal, true) => {
                if let Some(mut agent) = self.agent.take() {
                    let exit = agent.stop().context("stop the agent")?;
                    if !exit.status.success() {
                        warnings.push(format!(
                            "agent exited with {}: {}",
                            exit.status,
                            exit.stderr.trim()
                        ));
                    }
                }
                self.last = None;
            }
            _ => {}
        }
        if path == Path::Minimal && self.minimal.is_none() {
            self.minimal = Some(Minimal::attach(&self.cgroup)?);
        }
        Ok(())
    }

    /// The path attached now.
    pub(crate) fn current(&self) -> Path {
        if self.agent.is_some() {
            Path::Bypass
        } else if self.minimal.is_some() {
            Path::Minimal
        } else {
            Path::Default
        }
    }

    /// The running agent's memory, and the CPU it used since the previous probe, into
    /// `probes`; nothing when no agent runs.
    pub(crate) fn probe(&mut self, phase: ProbePhase, probes: &mut Vec<AgentProbe>) -> Result<()> {
        let (Some(agent), Some((when, cpu))) = (&self.agent, self.last) else {
            return Ok(());
        };
        let snap = procfs::snapshot(agent.pid())?;
        probes.push(AgentProbe {
            phase,
            pid: agent.pid(),
            rss_kib: snap.rss_kib,
            hwm_kib: snap.hwm_kib,
            cpu_ms: snap.cpu_ms - cpu,
            wall_ms: when.elapsed().as_secs_f64() * 1e3,
        });
        self.last = Some((Instant::now(), snap.cpu_ms));
        Ok(())
    }

    /// The bytes the pods put on their veths so far, and what the agent has counted
    /// when it runs, each where it could be read: the two ends of an
    /// [`Observed`](super::Observed).
    pub(crate) fn wire_and_stats(&self, pods: &TwoPods) -> (Option<u64>, Option<Counted>) {
        let wire = pods.wire_bytes().ok();
        let stats = self
            .agent
            .as_ref()
            .and_then(|a| a.stats().ok())
            .map(|s| Counted {
                redirected: s.counters.redirected_bytes,
                passed: s.counters.passed_bytes,
                left: s.counters.leave_requests,
            });
        (wire, stats)
    }
}
