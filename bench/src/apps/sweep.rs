//! The apps run's loop: for each repetition and placement a block per path (the order
//! rotated by one after each placement, as the qperf sweep does), and in each block
//! every workload's client once, with the veths' bytes and, bypassed, the agent's
//! counters read around it. A run that fails is recorded with its reason (and a
//! server that died with it started again); one that hung until its client's timeout
//! is not run again, its later repetitions recorded as not run.

use std::{collections::BTreeMap, time::Instant};

use anyhow::{Context as _, Result};
use testbed::{TwoPods, apps::On};

use super::{
    catalogue::{Scale, Workload},
    mode, runners,
    services::Started,
};
use crate::{
    driver::{PathSwitch, RawLog, Steps, paths_of, progress},
    model::{AppSample, AppsResults, Path, Placement, ProbePhase},
    scenario,
};

/// Longest failure message kept in a sample (the raw log has all of it).
const FAILURE_CHARS: usize = 400;

/// `text` on one line (white space squeezed), at most `max` characters.
fn one_line(text: &str, max: usize) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match line.char_indices().nth(max) {
        Some((end, _)) => format!("{}...", &line[..end]),
        None => line,
    }
}

/// A run in progress.
pub(super) struct AppsRun {
    pub(super) scale: Scale,
    pub(super) workloads: Vec<Workload>,
    // Drop order: the servers, then the agent, then the pods they run in.
    pub(super) services: Vec<Started>,
    pub(super) paths: PathSwitch,
    pub(super) pods: TwoPods,
    pub(super) results: AppsResults,
    pub(super) raw: RawLog,
    pub(super) steps: Steps,
    /// (workload, placement, path) that hung until the client's timeout: not run
    /// again (a failure that ends at once, a lost byte seen as an early EOF, is run
    /// again: how often it fails is part of the result).
    pub(super) hung: std::collections::BTreeSet<(String, String, Path)>,
}

/// What the veths and the agent's counters showed at one moment.
struct Observation {
    wire: Option<u64>,
    counters: Option<BTreeMap<String, u64>>,
}

impl AppsRun {
    /// Starts every service for every placement.
    pub(super) fn start_services(&mut self) -> Result<()> {
        let services = super::catalogue::services_of(&self.workloads);
        for (i, p) in self.results.config.placements.clone().iter().enumerate() {
            for &s in &services {
                let t = Instant::now();
                let started = Started::start(s, &self.pods, i, p, self.scale)
                    .with_context(|| format!("start {} for {}", s.servers(), p.name))?;
                progress(&format!(
                    "{}: {} on {} ready ({:.1} s)",
                    p.name,
                    s.servers(),
                    started.front,
                    t.elapsed().as_secs_f64()
                ));
                self.services.push(started);
            }
        }
        Ok(())
    }

    /// Every block of every repetition.
    pub(super) fn sweep(&mut self) -> Result<()> {
        let cfg = self.results.config.clone();
        let mut order = paths_of(cfg.minimal);
        for rep in 0..cfg.reps {
            for (i, p) in cfg.placements.iter().enumerate() {
                for &path in &order {
                    self.begin_block(i, p, path)?;
                    for w in self.workloads.clone() {
                        self.run_one(rep, i, p, path, &w)?;
                    }
                    if path == Path::Bypass {
                        self.paths
                            .probe(ProbePhase::Sweep, &mut self.results.agent)?;
                    }
                }
                order.rotate_left(1);
            }
        }
        Ok(())
    }

    /// Switches to `path`, restarts the services that must be fresh in every block,
    /// and at the first bypassed block records how the agent runs.
    fn begin_block(&mut self, index: usize, p: &Placement, path: Path) -> Result<()> {
        let r = &mut self.results;
        self.paths.set(path, &mut r.agent, &mut r.warnings)?;
        if path == Path::Bypass && r.agent_mode.as_run.is_none() {
            let agent = self.paths.agent().context("no agent in a bypassed block")?;
            let status = agent.stats()?;
            r.agent_mode.as_run = Some(mode::guard_status(&status));
            progress(&mode::describe(&r.agent_mode));
        }
        for i in 0..self.services.len() {
            let s = &self.services[i];
            if s.placement == index && s.service.fresh_per_block() {
                self.restart(i, p)?;
            }
        }
        Ok(())
    }

    /// Stops the service at `i` (its ports freed) and starts it again.
    fn restart(&mut self, i: usize, p: &Placement) -> Result<()> {
        let old = self.services.remove(i);
        let (service, index) = (old.service, old.placement);
        drop(old);
        let new = Started::start(service, &self.pods, index, p, self.scale)
            .with_context(|| format!("start {} again for {}", service.servers(), p.name))?;
        self.services.insert(i, new);
        Ok(())
    }

    fn observe(&self) -> Result<Observation> {
        let counters = match self.paths.agent() {
            Some(a) => Some(scenario::counters_of(&a.status()?)),
            None => None,
        };
        Ok(Observation {
            wire: self.pods.wire_bytes().ok(),
            counters,
        })
    }

    /// One run of `w`'s client, into a sample.
    fn run_one(
        &mut self,
        rep: u32,
        index: usize,
        p: &Placement,
        path: Path,
        w: &Workload,
    ) -> Result<()> {
        let what = format!("rep {rep} {} {} {}", p.name, path.name(), w.name);
        let key = (w.name.to_owned(), p.name.clone(), path);
        let mut sample = AppSample {
            rep,
            placement: p.name.clone(),
            path,
            workload: w.name.to_owned(),
            value: None,
            latency_us: None,
            secs: 0.0,
            failure: None,
            skipped: false,
            wire_bytes: None,
            counters: BTreeMap::new(),
        };
        if self.hung.contains(&key) {
            sample.failure = Some("not run: hung in an earlier repetition".into());
            sample.skipped = true;
            self.results.samples.push(sample);
            self.steps.tick(&format!("{what}: not run (hung before)"));
            return Ok(());
        }
        let service = self
            .services
            .iter()
            .position(|s| s.placement == index && s.service == w.service)
            .context("the workload's service is not running")?;
        let before = self.observe()?;
        let started = Instant::now();
        let cpus = [p.client_cpu];
        let a = On {
            pod: &self.pods.a,
            cpus: &cpus,
        };
        let outcome = runners::run(w, &self.services[service], a, self.scale);
        sample.secs = started.elapsed().as_secs_f64();
        let after = self.observe()?;
        sample.wire_bytes = before
            .wire
            .zip(after.wire)
            .map(|(b, a)| a.saturating_sub(b));
        if let (Some(b), Some(a)) = (&before.counters, &after.counters) {
            sample.counters = scenario::delta(b, a);
        }
        let line = match outcome {
            Ok(o) => {
                sample.value = Some(o.value);
                sample.latency_us = o.latency_us;
                format!(
                    "{what}: {} {}{}",
                    crate::report::text::fmt_value(o.value),
                    w.unit(),
                    o.latency_us
                        .map_or_else(String::new, |l| format!(", mean latency {l:.0} us"))
                )
            }
            Err(e) => {
                let full = format!("{e:#}");
                self.raw.write(&what, &full);
                let short = one_line(&full, FAILURE_CHARS);
                self.results
                    .warnings
                    .push(format!("{what} failed: {short}"));
                sample.failure = Some(short);
                if sample.secs >= self.scale.client_timeout().as_secs_f64() {
                    self.hung.insert(key);
                }
                self.revive(service, p)?;
                format!("{what}: FAILED")
            }
        };
        self.results.samples.push(sample);
        self.steps.tick(&line);
        Ok(())
    }

    /// Starts the service at `i` again if one of its processes exited.
    fn revive(&mut self, i: usize, p: &Placement) -> Result<()> {
        if let Err(e) = self.services[i].ensure_running() {
            self.results
                .warnings
                .push(format!("{}: a server exited, started again: {e:#}", p.name));
            self.restart(i, p)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[test]
    fn failures_fit_on_one_line() {
        assert_eq!(
            one_line("wrk failed:\n  Usage:   wrk", 100),
            "wrk failed: Usage: wrk"
        );
        assert_eq!(one_line("abcdef", 3), "abc...");
        assert_eq!(one_line("abc", 3), "abc");
    }
}
