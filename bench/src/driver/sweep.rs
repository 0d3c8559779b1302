//! The sweep: the bench servers, then for each repetition and placement a block per
//! path (attach or detach first), with the agent probed and the programs' cost and the
//! hop counters recorded around each block.

use std::{process::Stdio, time::Duration};

use anyhow::{Context as _, Result, bail};
use testbed::{PodChild, spawn_in_on_cpus};

use super::{ProgRef, Run, paths_of, progress, qperf_port, record_hops, sockperf_port};
use crate::{
    model::{Config, Path, Placement, ProbePhase, Prog, ProgSample, Scenario},
    qperf, scenario, sockperf,
};

impl Run<'_> {
    pub(super) fn start_servers(&mut self) -> Result<Vec<PodChild>> {
        let mut cpus: Vec<usize> = self
            .results
            .config
            .placements
            .iter()
            .map(|p| p.server_cpu)
            .collect();
        cpus.sort_unstable();
        cpus.dedup();
        let mut servers = Vec::new();
        for cpu in cpus {
            for mut cmd in [
                qperf::server_command(qperf_port(cpu)),
                sockperf::server_command(self.setup.listen, sockperf_port(cpu)),
            ] {
                cmd.stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null());
                servers.push(spawn_in_on_cpus(&self.pods.b, cmd, &[cpu])?);
            }
        }
        std::thread::sleep(Duration::from_millis(300));
        for s in &mut servers {
            if let Some(st) = s.try_wait()? {
                bail!("a bench server exited at start ({st}); is the port taken?");
            }
        }
        Ok(servers)
    }

    pub(super) fn sweep(&mut self) -> Result<()> {
        let cfg = self.results.config.clone();
        // The first start also gives the idle probe.
        self.set_path(Path::Bypass)?;
        progress(&format!("agent idle for {:.0} s", cfg.idle_secs));
        std::thread::sleep(Duration::from_secs_f64(cfg.idle_secs));
        self.probe(ProbePhase::Idle)?;
        let mut order = paths_of(cfg.minimal);
        for rep in 0..cfg.reps {
            for placement in &cfg.placements {
                for &path in &order {
                    self.set_path(path)?;
                    self.setup.check()?;
                    self.hops_begin(path)?;
                    self.progs_begin()?;
                    for &size in &cfg.sizes {
                        self.qperf(rep, placement, path, size)?;
                    }
                    if rep < cfg.sockperf_reps {
                        for &size in &cfg.sockperf_sizes {
                            self.sockperf(rep, placement, path, size)?;
                        }
                    } else {
                        self.steps.skip(cfg.sockperf_sizes.len());
                    }
                    if path == Path::Bypass {
                        self.probe(ProbePhase::Sweep)?;
                    }
                    self.progs_end(rep, placement, path)?;
                    self.hops_end(rep, placement, &cfg)?;
                }
                order.rotate_left(1);
                if !self.opts.no_floor {
                    for &size in &cfg.sizes {
                        self.floor(rep, placement, size, rep < cfg.sockperf_reps)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Attaches (starts the agent, or attaches the minimal datapath) or detaches.
    pub(super) fn set_path(&mut self, path: Path) -> Result<()> {
        let r = &mut self.results;
        self.paths.set(path, &mut r.agent, &mut r.warnings)
    }

    /// The programs whose cost a block of `path` measures.
    fn programs(&self, path: Path) -> Result<Vec<(Prog, ProgRef)>> {
        use bypass_common::names::{PIN_PROGS_SUBDIR, PROG_SKMSG, PROG_SOCKOPS};
        Ok(match path {
            Path::Bypass => {
                let dir = self.paths.agent_opts().pin_dir.join(PIN_PROGS_SUBDIR);
                vec![
                    (Prog::SkMsg, ProgRef::Pinned(dir.join(PROG_SKMSG))),
                    (Prog::SockOps, ProgRef::Pinned(dir.join(PROG_SOCKOPS))),
                ]
            }
            Path::Minimal => {
                let minimal = self
                    .paths
                    .minimal()
                    .context("minimal datapath not attached")?;
                let (sockops, skmsg) = minimal.program_ids()?;
                vec![
                    (Prog::SkMsg, ProgRef::Id(skmsg)),
                    (Prog::SockOps, ProgRef::Id(sockops)),
                ]
            }
            Path::Default | Path::Floor => Vec::new(),
        })
    }

    /// At the start of a block: the programs' `bpf_stats`.
    fn progs_begin(&mut self) -> Result<()> {
        self.progs_start = None;
        let path = self.paths.current();
        let mut start = Vec::new();
        for (prog, at) in self.programs(path)? {
            let counts = at.counts()?;
            start.push((prog, at, counts));
        }
        self.progs_start = Some(start);
        Ok(())
    }

    /// At the end of a block: how much the programs ran, and for how long.
    fn progs_end(&mut self, rep: u32, p: &Placement, path: Path) -> Result<()> {
        for (prog, at, before) in self.progs_start.take().unwrap_or_default() {
            let d = at.counts()?.since(before);
            self.results.programs.push(ProgSample {
                rep,
                placement: p.name.clone(),
                path,
                prog,
                runs: d.runs,
                ns: d.ns,
            });
        }
        Ok(())
    }

    fn probe(&mut self, phase: ProbePhase) -> Result<()> {
        self.paths.probe(phase, &mut self.results.agent)
    }

    /// The agent's counters now, every integer field of `status --json`.
    fn counters(&self) -> Result<std::collections::BTreeMap<String, u64>> {
        let agent = self
            .paths
            .agent()
            .context("no agent runs in a bypassed block")?;
        Ok(scenario::counters_of(&agent.status()?))
    }

    /// At the start of a bypassed block of a scenario run: remember the counters.
    fn hops_begin(&mut self, path: Path) -> Result<()> {
        self.block_start = None;
        if path == Path::Bypass && self.results.config.scenario != Scenario::Default {
            self.block_start = Some(self.counters()?);
        }
        Ok(())
    }

    /// At the end of a bypassed block of a scenario run: record how the counters grew
    /// and warn when a hop was not paired.
    fn hops_end(&mut self, rep: u32, p: &Placement, cfg: &Config) -> Result<()> {
        let Some(before) = self.block_start.take() else {
            return Ok(());
        };
        let after = self.counters()?;
        let qperf_conns = cfg.sizes.len() * cfg.tests.len();
        let sockperf_conns = if rep < cfg.sockperf_reps {
            cfg.sockperf_sizes.len()
        } else {
            0
        };
        let connections = (qperf_conns + sockperf_conns) as u64;
        let line = record_hops(
            &mut self.results,
            (rep, p),
            cfg.scenario,
            connections,
            &before,
            &after,
            &scenario::HOP_COUNTERS,
        );
        progress(&line);
        Ok(())
    }
}
