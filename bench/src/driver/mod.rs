//! The run: builds the two pods, starts the qperf and sockperf servers in pod `b` (one
//! per server CPU, pinned), then for each repetition and placement measures a block
//! with the bypass attached and a block detached (the agent stopped, so new connections
//! are not inserted), alternating which comes first so the agent toggles once per block:
//! bypass, default | default, bypass | bypass, default ... The floor is measured after
//! each pair of blocks, in the same run. Probes the agent's memory and CPU as it goes.
//!
//! `plan` (pure) fits the placements, orders the paths and numbers the ports; the
//! sweep's blocks are in `sweep`, the tool runs in `tools`; `switch` changes the path
//! between blocks (the apps scenario uses it too); `record` (pure) turns a
//! tool's output into samples and warnings; `progress` tells how the run goes;
//! `output` writes the files.

mod output;
mod plan;
mod progress;
mod record;
mod sweep;
mod switch;
mod tools;

use std::{
    net::IpAddr,
    path::{Path as FsPath, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use testbed::TwoPods;

pub use output::{write_files, write_outputs};
use plan::{fit_placements, qperf_data_port, sockperf_port};
pub(crate) use plan::{paths_of, qperf_port};
pub(crate) use progress::{RawLog, Steps, client_twice, progress};
pub use record::wire_problem;
pub(crate) use record::{Observed, qperf_what, record_hops, record_qperf};
pub(crate) use switch::PathSwitch;

use crate::{
    env,
    model::{Config, Environment, Path, Placement, Prog, Results, Scenario},
    progstats,
    scenario::{self, Setup},
};

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

struct Run<'a> {
    opts: &'a Options,
    // Drop order: the proxies before the pods they run in.
    setup: Setup,
    pods: TwoPods,
    server_ip: IpAddr,
    /// Counters when the current bypassed block began.
    block_start: Option<std::collections::BTreeMap<String, u64>>,
    /// The programs' `bpf_stats` when the current block began.
    progs_start: Option<Vec<(Prog, ProgRef, progstats::Counts)>>,
    /// The agent, the minimal datapath or neither.
    paths: PathSwitch,
    /// Keeps `bpf_stats` on for the run.
    _stats: progstats::Enabled,
    results: Results,
    raw: RawLog,
    steps: Steps,
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

/// What every run starts from: the environment, the placements that fit on this
/// machine (with a warning for each left out), the raw log.
pub(crate) struct Start {
    pub(crate) env: Environment,
    pub(crate) placements: Vec<Placement>,
    pub(crate) warnings: Vec<String>,
    pub(crate) raw: RawLog,
}

impl Start {
    /// Collects the environment (`workspace` for the git commit), fits `placements`,
    /// opens the raw log under `raw_dir`.
    pub(crate) fn new(
        workspace: &FsPath,
        raw_dir: &FsPath,
        placements: &[Placement],
    ) -> Result<Self> {
        let env = env::collect(workspace, &testbed::agent::agent_bin());
        let (mut placements, mut warnings) = (placements.to_vec(), Vec::new());
        fit_placements(&mut placements, env.cpus, &mut warnings)?;
        let raw = RawLog::open(raw_dir)?;
        Ok(Self {
            env,
            placements,
            warnings,
            raw,
        })
    }

    /// Builds the two pods (saying so, `prefix` first) and records their addresses.
    pub(crate) fn pods(&mut self, prefix: &str) -> Result<TwoPods> {
        let env = &mut self.env;
        progress(&format!(
            "{prefix}building two pods; agent {}; {} CPUs, load {}",
            env.agent_bin, env.cpus, env.loadavg_start
        ));
        let pods = TwoPods::new().context("build the two-pod topology")?;
        env.addresses = format!("{} -> {}", pods.a.ipv4(), pods.b.ipv4());
        Ok(pods)
    }
}

/// Fails naming what is not installed of the bench's tools and `scenario`'s needs.
fn require(scenario: Scenario) -> Result<()> {
    for tool in ["qperf", "sockperf"] {
        let ok = Command::new(tool)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
        if !ok {
            bail!("{tool} is not installed: apt-get install -y qperf sockperf");
        }
    }
    let mut missing = testbed::require::missing();
    missing.extend(scenario::missing(scenario));
    if !missing.is_empty() {
        bail!("cannot run the bench: {}", missing.join("; "));
    }
    Ok(())
}

/// Runs the bench and returns everything it measured.
pub fn run(opts: &Options) -> Result<Results> {
    if opts.config.scenario == Scenario::Cluster {
        return crate::cluster::run(opts);
    }
    require(opts.config.scenario)?;
    let mut config = opts.config.clone();
    let mut start = Start::new(&opts.workspace, &opts.raw_dir, &config.placements)?;
    config.placements = std::mem::take(&mut start.placements);
    let pods = start.pods("")?;
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
    let mut agent_opts = pods.agent_opts();
    agent_opts
        .extra_args
        .extend(setup.agent_args.iter().cloned());
    agent_opts
        .extra_args
        .extend(config.agent_args.iter().cloned());
    if config.scenario != Scenario::Default {
        progress(&format!(
            "scenario {}: {}; {}",
            config.scenario.name(),
            config.scenario.describe(),
            setup.summary
        ));
        start.env.addresses = format!("{}; {}", start.env.addresses, setup.summary);
    }
    let total_steps = total_steps(&config, opts.no_floor);
    let mut run = Run {
        opts,
        server_ip: setup.target,
        setup,
        block_start: None,
        progs_start: None,
        paths: PathSwitch::new(agent_opts, pods.cgroup().to_path_buf()),
        _stats: progstats::enable()?,
        results: Results::new(config, start.env, start.warnings),
        pods,
        raw: start.raw,
        steps: Steps::new(total_steps),
    };
    let servers = run.start_servers()?;
    let outcome = run.sweep();
    // Stop the agent before the servers and the pods go.
    let stopped = run.set_path(Path::Default);
    drop(servers);
    outcome?;
    stopped?;
    run.results.env.loadavg_end = env::loadavg();
    run.results.env.duration_secs = run.steps.elapsed_secs();
    Ok(run.results)
}

/// The tool runs of `config`: per repetition and placement, qperf and sockperf on each
/// path, and the floor unless `no_floor`.
fn total_steps(config: &Config, no_floor: bool) -> usize {
    let per_block = config.sizes.len() + config.sockperf_sizes.len();
    let floor_steps = if no_floor { 0 } else { config.sizes.len() };
    let blocks = paths_of(config.minimal).len();
    config.reps as usize * config.placements.len() * (blocks * per_block + floor_steps)
}
