//! The run: builds the two pods, starts the qperf and sockperf servers in pod `b` (one
//! per server CPU, pinned), then for each repetition and placement measures a block
//! with the bypass attached and a block detached (the agent stopped, so new connections
//! are not inserted), alternating which comes first so the agent toggles once per block:
//! bypass, default | default, bypass | bypass, default ... The floor is measured after
//! each pair of blocks, in the same run. Probes the agent's memory and CPU as it goes.

use std::{
    collections::BTreeMap,
    fs::OpenOptions,
    io::Write as _,
    net::IpAddr,
    path::{Path as FsPath, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use testbed::{Agent, AgentOpts, PodChild, TwoPods, spawn_in_on_cpus};

use crate::{
    env,
    floor::FloorResult,
    minimal::Minimal,
    model::{
        AgentProbe, Config, HopSample, Path, PctSample, Placement, ProbePhase, Prog, ProgSample,
        Results, SCHEMA, Sample, Scenario, Test,
    },
    procfs, progstats, qperf,
    scenario::{self, Setup},
    sockperf,
};

/// First qperf listen port; the server pinned to CPU n listens on this + n.
const QPERF_PORT: u16 = 19765;
/// First sockperf port; the server pinned to CPU n listens on this + n.
const SOCKPERF_PORT: u16 = 11111;

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// The configuration (sizes, durations, repetitions, placements).
    pub config: Config,
    /// Where raw tool output is appended (ignored by git).
    pub raw_dir: PathBuf,
    /// The workspace (for the git commit).
    pub workspace: PathBuf,
    /// Skip the floor.
    pub no_floor: bool,
}

/// Seconds a single tool run may take beyond its own duration.
pub(crate) const SLACK: Duration = Duration::from_secs(20);

struct AgentState {
    agent: Option<Agent>,
    /// (when, cpu ms) of the last probe of the running agent.
    last: Option<(Instant, f64)>,
}

struct Run<'a> {
    opts: &'a Options,
    // Drop order: the proxies before the pods they run in.
    setup: Setup,
    pods: TwoPods,
    server_ip: IpAddr,
    agent_opts: AgentOpts,
    /// Counters when the current bypassed block began (scenario runs).
    block_start: Option<std::collections::BTreeMap<String, u64>>,
    /// The programs' `bpf_stats` when the current block began.
    progs_start: Option<Vec<(Prog, ProgRef, progstats::Counts)>>,
    agent: AgentState,
    /// The minimal reference datapath, while attached.
    minimal: Option<Minimal>,
    /// Keeps `bpf_stats` on for the run.
    _stats: progstats::Enabled,
    results: Results,
    raw: Option<std::fs::File>,
    step: usize,
    total_steps: usize,
    started: Instant,
}

/// Where a program's `bpf_stats` are read.
#[derive(Clone, Debug)]
enum ProgRef {
    /// Pinned by the agent.
    Pinned(PathBuf),
    /// Loaded by the bench (the minimal datapath), by kernel id.
    Id(u32),
}

impl ProgRef {
    fn counts(&self) -> Result<progstats::Counts> {
        match self {
            ProgRef::Pinned(path) => progstats::pinned(path),
            ProgRef::Id(id) => progstats::by_id(*id),
        }
    }
}

/// What the veths and the agent's counters showed over one qperf run.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Observed {
    /// Bytes on the pods' veths.
    pub(crate) wire: Option<u64>,
    /// (redirected, passed) bytes the agent counted.
    pub(crate) delta: Option<(u64, u64)>,
}

/// One qperf client run's output, `out`, into samples of `results` (rep, placement,
/// path and size in `at`), with a warning for what looks wrong; returns the progress
/// line.
pub(crate) fn record_qperf(
    results: &mut Results,
    at: (u32, &Placement, Path, u32),
    what: &str,
    secs: u32,
    out: &str,
    tests: &[Test],
    observed: Observed,
) -> String {
    let (rep, p, path, size) = at;
    let mut r = match qperf::parse(out, tests) {
        Ok(r) => r,
        Err(e) => {
            results.warnings.push(format!("{what}: {e:#}"));
            return format!("{what}: unparsable");
        }
    };
    // qperf prints 0 ns when not one round trip completed (a stranded message).
    if r.latency_ns.is_some_and(|l| l <= 0.0) {
        results.warnings.push(format!(
            "{what}: tcp_lat completed no round trip in {secs} s; sample dropped"
        ));
        r.latency_ns = None;
    }
    let Observed { wire, delta } = observed;
    let payload = r.bw_bytes_per_sec.unwrap_or(0.0) * f64::from(secs);
    if let Some(w) = wire
        && let Some(problem) = wire_problem(path, w, payload, delta.map(|d| d.1))
    {
        results.warnings.push(format!("{what}: {problem}"));
    }
    for (test, value) in [
        (Test::TcpLat, r.latency_ns),
        (Test::TcpBw, r.bw_bytes_per_sec),
    ] {
        let Some(value) = value else { continue };
        results.samples.push(Sample {
            rep,
            placement: p.name.clone(),
            path,
            test,
            size,
            value,
            wire_bytes: wire,
            redirected_bytes: delta.map(|d| d.0),
            passed_bytes: delta.map(|d| d.1),
        });
    }
    format!(
        "{what}: lat {}, bw {}",
        r.latency_ns
            .map_or_else(|| "-".into(), |v| format!("{:.2} us", v / 1e3)),
        r.bw_bytes_per_sec
            .map_or_else(|| "-".into(), |v| format!("{:.1} MB/s", v / 1e6)),
    )
}

/// Keeps the placements whose CPUs exist, with a warning for each one left out; fails
/// when none is left.
pub(crate) fn fit_placements(
    config: &mut Config,
    cpus: usize,
    warnings: &mut Vec<String>,
) -> Result<()> {
    config.placements.retain(|p| {
        let ok = p.client_cpu < cpus && p.server_cpu < cpus;
        if !ok {
            warnings.push(format!(
                "placement {} skipped: only {cpus} CPUs",
                p.describe()
            ));
        }
        ok
    });
    if config.placements.is_empty() {
        bail!("no placement fits on {cpus} CPUs");
    }
    Ok(())
}

/// The raw tool log in `dir` (created), appended to; `None` if it cannot be opened.
pub(crate) fn open_raw_log(dir: &FsPath) -> Result<Option<std::fs::File>> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    Ok(OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("tools.log"))
        .ok())
}

/// Runs the bench and returns everything it measured.
pub fn run(opts: &Options) -> Result<Results> {
    if opts.config.scenario == Scenario::Cluster {
        return crate::cluster::run(opts);
    }
    for (tool, arg) in [("qperf", "--version"), ("sockperf", "--version")] {
        let ok = Command::new(tool)
            .arg(arg)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
        if !ok {
            bail!("{tool} is not installed: apt-get install -y qperf sockperf");
        }
    }
    let mut missing = testbed::require::missing();
    missing.extend(scenario::missing(opts.config.scenario));
    if !missing.is_empty() {
        bail!("cannot run the bench: {}", missing.join("; "));
    }
    let agent_bin = testbed::agent::agent_bin();
    let env = env::collect(&opts.workspace, &agent_bin);
    let mut config = opts.config.clone();
    let mut warnings = Vec::new();
    let cpus = env.cpus;
    fit_placements(&mut config, cpus, &mut warnings)?;
    let raw = open_raw_log(&opts.raw_dir)?;
    progress(&format!(
        "building two pods; agent {}; {} CPUs, load {}",
        agent_bin.display(),
        cpus,
        env.loadavg_start
    ));
    let pods = TwoPods::new().context("build the two-pod topology")?;
    let setup = Setup::apply(
        config.scenario,
        &pods,
        &config.placements,
        scenario::Ports {
            qperf: qperf_port,
            qperf_data: qperf_data_port,
            sockperf: sockperf_port,
        },
    )
    .with_context(|| format!("set up the {} scenario", config.scenario.name()))?;
    let server_ip = setup.target;
    let mut agent_opts = pods.agent_opts();
    agent_opts
        .extra_args
        .extend(setup.agent_args.iter().cloned());
    agent_opts
        .extra_args
        .extend(config.agent_args.iter().cloned());
    let per_block = config.sizes.len() + config.sockperf_sizes.len();
    let floor_steps = if opts.no_floor { 0 } else { config.sizes.len() };
    let blocks = paths_of(&config, true).len();
    let total_steps =
        config.reps as usize * config.placements.len() * (blocks * per_block + floor_steps);
    let mut env = env;
    env.addresses = format!("{} -> {}", pods.a.ipv4(), pods.b.ipv4());
    if config.scenario != Scenario::Default {
        progress(&format!(
            "scenario {}: {}; {}",
            config.scenario.name(),
            config.scenario.describe(),
            setup.summary
        ));
        env.addresses = format!("{}; {}", env.addresses, setup.summary);
    }
    let mut run = Run {
        opts,
        setup,
        server_ip,
        agent_opts,
        block_start: None,
        progs_start: None,
        agent: AgentState {
            agent: None,
            last: None,
        },
        minimal: None,
        _stats: progstats::enable()?,
        results: Results {
            schema: SCHEMA,
            config,
            env,
            samples: Vec::new(),
            percentiles: Vec::new(),
            agent: Vec::new(),
            hops: Vec::new(),
            programs: Vec::new(),
            warnings,
        },
        pods,
        raw,
        step: 0,
        total_steps,
        started: Instant::now(),
    };
    let servers = run.start_servers()?;
    let outcome = run.sweep();
    // Stop the agent before the servers and the pods go.
    let stopped = run.set_path(Path::Default);
    drop(servers);
    outcome?;
    stopped?;
    run.results.env.loadavg_end = env::loadavg();
    run.results.env.duration_secs = run.started.elapsed().as_secs_f64();
    Ok(run.results)
}

/// The measured paths of one block group, rotated by one each time so that every path
/// comes first, second, ... equally often: bypass, default[, minimal] | default[,
/// minimal], bypass | ...
pub(crate) fn paths_of(config: &Config, first: bool) -> Vec<Path> {
    let mut paths = vec![Path::Bypass, Path::Default];
    if config.minimal {
        paths.push(Path::Minimal);
    }
    if !first {
        paths.rotate_left(1);
    }
    paths
}

pub(crate) fn progress(msg: &str) {
    eprintln!("bench: {msg}");
}

pub(crate) fn fmt_secs(s: f64) -> String {
    let s = s.max(0.0) as u64;
    format!("{}m{:02}s", s / 60, s % 60)
}

impl Run<'_> {
    fn start_servers(&mut self) -> Result<Vec<PodChild>> {
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

    fn sweep(&mut self) -> Result<()> {
        let cfg = self.results.config.clone();
        // The first start also gives the idle probe.
        self.set_path(Path::Bypass)?;
        progress(&format!("agent idle for {:.0} s", cfg.idle_secs));
        std::thread::sleep(Duration::from_secs_f64(cfg.idle_secs));
        self.probe(ProbePhase::Idle)?;
        let mut order = paths_of(&cfg, true);
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
                        self.step += cfg.sockperf_sizes.len();
                    }
                    if path == Path::Bypass {
                        self.probe(ProbePhase::Sweep)?;
                    }
                    self.progs_end(rep, placement, path)?;
                    self.hops_end(rep, placement, path, &cfg)?;
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
    fn set_path(&mut self, path: Path) -> Result<()> {
        if path != Path::Minimal {
            self.minimal = None;
        }
        match (path, self.agent.agent.is_some()) {
            (Path::Bypass, false) => {
                let t = Instant::now();
                let agent = Agent::start(&self.agent_opts).context("start the agent")?;
                let snap = procfs::snapshot(agent.pid())?;
                self.results.agent.push(AgentProbe {
                    phase: ProbePhase::Started,
                    pid: agent.pid(),
                    rss_kib: snap.rss_kib,
                    hwm_kib: snap.hwm_kib,
                    cpu_ms: snap.cpu_ms,
                    wall_ms: t.elapsed().as_secs_f64() * 1e3,
                });
                self.agent.last = Some((Instant::now(), snap.cpu_ms));
                self.agent.agent = Some(agent);
            }
            (Path::Default | Path::Floor | Path::Minimal, true) => {
                if let Some(mut agent) = self.agent.agent.take() {
                    let exit = agent.stop().context("stop the agent")?;
                    if !exit.status.success() {
                        self.results.warnings.push(format!(
                            "agent exited with {}: {}",
                            exit.status,
                            exit.stderr.trim()
                        ));
                    }
                }
                self.agent.last = None;
            }
            _ => {}
        }
        if path == Path::Minimal && self.minimal.is_none() {
            self.minimal = Some(Minimal::attach(self.pods.cgroup())?);
        }
        Ok(())
    }

    /// The programs whose cost a block of `path` measures.
    fn programs(&self, path: Path) -> Result<Vec<(Prog, ProgRef)>> {
        use bypass_common::names::{PIN_PROGS_SUBDIR, PROG_SKMSG, PROG_SOCKOPS};
        Ok(match path {
            Path::Bypass => {
                let dir = self.agent_opts.pin_dir.join(PIN_PROGS_SUBDIR);
                vec![
                    (Prog::SkMsg, ProgRef::Pinned(dir.join(PROG_SKMSG))),
                    (Prog::SockOps, ProgRef::Pinned(dir.join(PROG_SOCKOPS))),
                ]
            }
            Path::Minimal => {
                let minimal = self
                    .minimal
                    .as_ref()
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
        let path = self.current_path();
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

    /// The path attached now.
    fn current_path(&self) -> Path {
        if self.agent.agent.is_some() {
            Path::Bypass
        } else if self.minimal.is_some() {
            Path::Minimal
        } else {
            Path::Default
        }
    }

    fn probe(&mut self, phase: ProbePhase) -> Result<()> {
        let (Some(agent), Some((when, cpu))) = (&self.agent.agent, self.agent.last) else {
            return Ok(());
        };
        let snap = procfs::snapshot(agent.pid())?;
        self.results.agent.push(AgentProbe {
            phase,
            pid: agent.pid(),
            rss_kib: snap.rss_kib,
            hwm_kib: snap.hwm_kib,
            cpu_ms: snap.cpu_ms - cpu,
            wall_ms: when.elapsed().as_secs_f64() * 1e3,
        });
        self.agent.last = Some((Instant::now(), snap.cpu_ms));
        Ok(())
    }

    /// The agent's counters now, every integer field of `status --json`.
    fn counters(&self) -> Result<std::collections::BTreeMap<String, u64>> {
        let agent = self
            .agent
            .agent
            .as_ref()
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
    fn hops_end(&mut self, rep: u32, p: &Placement, path: Path, cfg: &Config) -> Result<()> {
        let Some(before) = self.block_start.take() else {
            return Ok(());
        };
        let after = self.counters()?;
        let counters = scenario::delta(&before, &after);
        let qperf_conns = cfg.sizes.len() * cfg.tests.len();
        let sockperf_conns = if rep < cfg.sockperf_reps {
            cfg.sockperf_sizes.len()
        } else {
            0
        };
        let connections = (qperf_conns + sockperf_conns) as u64;
        for problem in scenario::hop_problems(cfg.scenario, connections, &counters) {
            self.results
                .warnings
                .push(format!("rep {rep} {} {}: {problem}", p.name, path.name()));
        }
        let shown: Vec<String> = scenario::HOP_COUNTERS
            .iter()
            .map(|&k| {
                format!(
                    "{k} {}",
                    counters
                        .get(k)
                        .map_or_else(|| "-".to_owned(), u64::to_string)
                )
            })
            .collect();
        progress(&format!(
            "rep {rep} {} bypass block, {connections} measured connections: {}",
            p.name,
            shown.join(", ")
        ));
        self.results.hops.push(HopSample {
            rep,
            placement: p.name.clone(),
            connections,
            counters,
        });
        Ok(())
    }

    fn log_raw(&mut self, what: &str, out: &str) {
        if let Some(f) = &mut self.raw {
            let _ = writeln!(f, "=== {what}\n{out}");
        }
    }

    fn tick(&mut self, msg: &str) {
        self.step += 1;
        let el = self.started.elapsed().as_secs_f64();
        let eta = if self.step > 0 {
            el / self.step as f64 * (self.total_steps.saturating_sub(self.step)) as f64
        } else {
            0.0
        };
        progress(&format!(
            "[{:>3}/{}] {} (elapsed {}, eta {})",
            self.step,
            self.total_steps,
            msg,
            fmt_secs(el),
            fmt_secs(eta)
        ));
    }

    /// Runs `cmd` in pod `a` pinned to `cpu`, returning stdout; one retry on failure.
    fn client(
        &mut self,
        what: &str,
        make: &dyn Fn() -> Command,
        cpu: usize,
        secs: u32,
    ) -> Result<Option<String>> {
        for attempt in 0..2 {
            let mut cmd = make();
            cmd.stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            let child = spawn_in_on_cpus(&self.pods.a, cmd, &[cpu])?;
            let timeout = Duration::from_secs(u64::from(secs) * 2 + 5) + SLACK;
            match child.wait_output(timeout) {
                Ok(out) if out.status.success() => {
                    let text = String::from_utf8_lossy(&out.stdout).into_owned();
                    self.log_raw(what, &text);
                    return Ok(Some(text));
                }
                Ok(out) => {
                    let msg = format!(
                        "{what} (attempt {}): {}: {}",
                        attempt + 1,
                        out.status,
                        String::from_utf8_lossy(&out.stderr).trim()
                    );
                    self.results.warnings.push(msg);
                }
                Err(e) => self
                    .results
                    .warnings
                    .push(format!("{what} (attempt {}): {e:#}", attempt + 1)),
            }
        }
        Ok(None)
    }

    fn wire_and_stats(&self) -> (Option<u64>, Option<(u64, u64)>) {
        let wire = self.pods.wire_bytes().ok();
        let stats = self
            .agent
            .agent
            .as_ref()
            .and_then(|a| a.stats().ok())
            .map(|s| (s.counters.redirected_bytes, s.counters.passed_bytes));
        (wire, stats)
    }

    fn qperf(&mut self, rep: u32, p: &Placement, path: Path, size: u32) -> Result<()> {
        let secs = self.results.config.qperf_secs;
        let (ip, port) = (self.server_ip, qperf_port(p.server_cpu));
        let data_port = self
            .setup
            .fixed_data_port
            .then(|| qperf_data_port(p.server_cpu));
        let tests = self.results.config.tests.clone();
        let what = format!("qperf rep {rep} {} {} size {size}", p.name, path.name());
        let (wire0, stats0) = self.wire_and_stats();
        let out = self.client(
            &what,
            &|| qperf::client_command(ip, port, data_port, size, secs, &tests),
            p.client_cpu,
            secs,
        )?;
        let (wire1, stats1) = self.wire_and_stats();
        let Some(out) = out else {
            self.tick(&format!("{what}: FAILED"));
            return Ok(());
        };
        let delta = stats0
            .zip(stats1)
            .map(|(a, b)| (b.0.saturating_sub(a.0), b.1.saturating_sub(a.1)));
        let observed = Observed {
            wire: wire0.zip(wire1).map(|(a, b)| b.saturating_sub(a)),
            delta,
        };
        let line = record_qperf(
            &mut self.results,
            (rep, p, path, size),
            &what,
            secs,
            &out,
            &tests,
            observed,
        );
        self.tick(&line);
        Ok(())
    }

    fn sockperf(&mut self, rep: u32, p: &Placement, path: Path, size: u32) -> Result<()> {
        let secs = self.results.config.sockperf_secs;
        let (ip, port) = (self.server_ip, sockperf_port(p.server_cpu));
        let what = format!("sockperf rep {rep} {} {} size {size}", p.name, path.name());
        let out = self.client(
            &what,
            &|| sockperf::client_command(ip, port, size, secs),
            p.client_cpu,
            secs,
        )?;
        let parsed = out.map(|o| sockperf::parse(&o));
        match parsed {
            Some(Ok(r)) => {
                self.results.percentiles.push(PctSample {
                    rep,
                    placement: p.name.clone(),
                    path,
                    size,
                    avg_ns: r.avg_ns,
                    p50_ns: r.p50_ns,
                    p99_ns: r.p99_ns,
                    p999_ns: r.p999_ns,
                    observations: r.observations,
                });
                self.tick(&format!(
                    "{what}: p50 {:.2} us, p99 {:.2} us, p99.9 {:.2} us",
                    r.p50_ns / 1e3,
                    r.p99_ns / 1e3,
                    r.p999_ns / 1e3
                ));
            }
            Some(Err(e)) => {
                self.results.warnings.push(format!("{what}: {e:#}"));
                self.tick(&format!("{what}: unparsable"));
            }
            None => self.tick(&format!("{what}: FAILED")),
        }
        Ok(())
    }

    fn floor(&mut self, rep: u32, p: &Placement, size: u32, with_pct: bool) -> Result<()> {
        let secs = self.results.config.floor_secs;
        let mut got = BTreeMap::new();
        for test in [Test::TcpLat, Test::TcpBw] {
            let what = format!("floor rep {rep} {} {} size {size}", p.name, test.name());
            match floor_once(test, size, secs, p) {
                Ok(r) => {
                    got.insert(test.name(), r);
                }
                Err(e) => self.results.warnings.push(format!("{what}: {e:#}")),
            }
        }
        let lat = got.get("tcp_lat").cloned();
        let bw = got.get("tcp_bw").and_then(|r| r.bw_bytes_per_sec);
        for (test, value) in [
            (Test::TcpLat, lat.as_ref().and_then(|r| r.latency_ns)),
            (Test::TcpBw, bw),
        ] {
            if let Some(value) = value {
                self.results.samples.push(Sample {
                    rep,
                    placement: p.name.clone(),
                    path: Path::Floor,
                    test,
                    size,
                    value,
                    wire_bytes: None,
                    redirected_bytes: None,
                    passed_bytes: None,
                });
            }
        }
        if with_pct
            && self.results.config.sockperf_sizes.contains(&size)
            && let Some(l) = &lat
            && let (Some(avg), Some(p50), Some(p99), Some(p999)) =
                (l.latency_ns, l.p50_ns, l.p99_ns, l.p999_ns)
        {
            self.results.percentiles.push(PctSample {
                rep,
                placement: p.name.clone(),
                path: Path::Floor,
                size,
                avg_ns: avg,
                p50_ns: p50,
                p99_ns: p99,
                p999_ns: p999,
                observations: l.observations,
            });
        }
        self.tick(&format!(
            "floor rep {rep} {} size {size}: lat {}, bw {}",
            p.name,
            lat.and_then(|l| l.latency_ns)
                .map_or_else(|| "-".into(), |v| format!("{:.2} us", v / 1e3)),
            bw.map_or_else(|| "-".into(), |v| format!("{:.1} MB/s", v / 1e6)),
        ));
        Ok(())
    }
}

/// What is wrong when a run's bytes on the wire contradict its path (pure): a bypassed
/// run puts only handshakes and ACK-less FINs on the wire, a default run puts every
/// payload byte there. `payload`: the bytes `tcp_bw` moved; `passed`: the bytes the
/// datapath chose to send by TCP (a small-message stream), on the wire on purpose.
pub fn wire_problem(path: Path, wire: u64, payload: f64, passed: Option<u64>) -> Option<String> {
    let w = wire as f64;
    let passed = passed.map_or(0.0, |p| p as f64);
    let redirected = (payload - passed).max(0.0);
    match path {
        Path::Bypass if w > 0.05 * redirected + 2.0 * passed && w > 1e6 => {
            Some(format!("{w:.0} bytes on the wire although bypassed"))
        }
        Path::Default if w < 0.5 * payload => Some(format!(
            "only {w:.0} bytes on the wire although not bypassed"
        )),
        _ => None,
    }
}

pub(crate) fn qperf_port(cpu: usize) -> u16 {
    QPERF_PORT + cpu as u16
}

/// qperf's data port for the server on `cpu`, when a scenario fixes it.
fn qperf_data_port(cpu: usize) -> u16 {
    scenario::QPERF_DATA_PORT + cpu as u16
}

fn sockperf_port(cpu: usize) -> u16 {
    SOCKPERF_PORT + cpu as u16
}

/// Runs `bypass-bench floor ...` (this executable) and parses its JSON line.
fn floor_once(test: Test, size: u32, secs: f64, p: &Placement) -> Result<FloorResult> {
    let exe = std::env::current_exe().context("find our own executable")?;
    let out = Command::new(exe)
        .args([
            "floor",
            "--test",
            test.name(),
            "--size",
            &size.to_string(),
            "--secs",
            &secs.to_string(),
            "--client-cpu",
            &p.client_cpu.to_string(),
            "--server-cpu",
            &p.server_cpu.to_string(),
        ])
        .stdin(Stdio::null())
        .output()
        .context("run the floor")?;
    if !out.status.success() {
        bail!(
            "floor failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    serde_json::from_slice(&out.stdout).context("parse the floor's output")
}

/// Writes `bench.json`, `table.txt`, `table.md` and `plot.svg` into `dir`; a scenario
/// run also `readme-snippet.md` (its ratios, ready for the README).
pub fn write_outputs(r: &Results, dir: &FsPath) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let mut files = vec![
        ("bench.json", serde_json::to_string_pretty(r)? + "\n"),
        ("table.txt", crate::report::render(r)),
        ("table.md", crate::report::render_markdown(r)),
        ("plot.svg", crate::plot::svg(r)),
    ];
    if r.config.scenario != Scenario::Default {
        files.push(("readme-snippet.md", crate::report::render_snippet(r)));
    }
    let mut written = Vec::new();
    for (name, text) in files {
        let path = dir.join(name);
        std::fs::write(&path, text).with_context(|| format!("write {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_problem_by_path() {
        // Bypassed: handshakes only, or bytes the datapath passed on purpose, are fine.
        assert_eq!(wire_problem(Path::Bypass, 4_000, 1e9, Some(0)), None);
        assert_eq!(
            wire_problem(Path::Bypass, 3_000_000, 1e9, Some(2_000_000)),
            None
        );
        let p = wire_problem(Path::Bypass, 900_000_000, 1e9, Some(0)).unwrap();
        assert!(p.contains("although bypassed"), "{p}");
        // The normal path carries every payload byte.
        assert_eq!(wire_problem(Path::Default, 2_000_000_000, 1e9, None), None);
        let p = wire_problem(Path::Default, 1_000, 1e9, None).unwrap();
        assert!(p.contains("although not bypassed"), "{p}");
    }
}
