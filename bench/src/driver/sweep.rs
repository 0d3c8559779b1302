//! The sweep: the bench servers, then for each repetition and placement a block per
//! path (attach or detach first), with the agent probed and the programs' cost and the
//! hop counters recorded around each block.

use std::{
    net::SocketAddr,
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use testbed::{PodChild, apps::listening::is_listening, spawn_in_on_cpus};

use super::{ProgRef, Run, paths_of, progress, qperf_port, record_hops, sockperf_port};
use crate::{
    model::{Path, Placement, ProbePhase, Prog, ProgSample},
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
        let mut addrs = Vec::new();
        for cpu in cpus {
            let (qperf_at, sockperf_at) = (qperf_port(cpu), sockperf_port(cpu));
            // qperf listens on the wildcard address (of IPv6, dual-stack, or of IPv4);
            // sockperf on the address it is given.
            let wildcard = vec![
                SocketAddr::from(([0u16; 8], qperf_at)),
                SocketAddr::from(([0u8; 4], qperf_at)),
            ];
            for (mut cmd, at) in [
                (qperf::server_command(qperf_at), wildcard),
                (
                    sockperf::server_command(self.setup.listen, sockperf_at),
                    vec![SocketAddr::new(self.setup.listen, sockperf_at)],
                ),
            ] {
                cmd.stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null());
                servers.push(spawn_in_on_cpus(&self.pods.b, cmd, &[cpu])?);
                addrs.push(at);
            }
        }
        for (server, at) in servers.iter_mut().zip(&addrs) {
            wait_listening(server, at)?;
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
                    self.hops_end(rep, placement)?;
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

    /// At the start of a bypassed block: remember the counters.
    fn hops_begin(&mut self, path: Path) -> Result<()> {
        self.block_start = None;
        if path == Path::Bypass {
            self.block_start = Some(self.counters()?);
        }
        Ok(())
    }

    /// At the end of a bypassed block: record how the counters grew and warn when a hop
    /// was not paired.
    fn hops_end(&mut self, rep: u32, p: &Placement) -> Result<()> {
        let Some(before) = self.block_start.take() else {
            return Ok(());
        };
        let after = self.counters()?;
        let shown = &scenario::HOP_COUNTERS;
        progress(&record_hops(
            &mut self.results,
            (rep, p),
            &before,
            &after,
            shown,
        ));
        Ok(())
    }
}

/// How long a bench server may take to listen: a net for a server that never does (its
/// port taken, its binary broken); the wait ends as soon as the socket is there.
const LISTEN_WAIT: Duration = Duration::from_secs(60);

/// Waits until `server` listens on one of `addrs` (in its pod's tables), or fails when
/// it exits first or never does.
fn wait_listening(server: &mut PodChild, addrs: &[SocketAddr]) -> Result<()> {
    let pid = server.pid();
    let deadline = Instant::now() + LISTEN_WAIT;
    loop {
        if let Some(st) = server.try_wait()? {
            bail!("a bench server exited at start ({st}); is {addrs:?} taken?");
        }
        let mut listens = false;
        for &addr in addrs {
            listens |= is_listening(pid, addr)?;
        }
        if listens {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("a bench server (pid {pid}) did not listen on {addrs:?} within {LISTEN_WAIT:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
