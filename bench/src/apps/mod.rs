//! The apps scenario (`bypass-bench apps`, `cargo xtask bench --scenario apps`): real
//! applications between the two pods, each workload's rate with the bypass, on the
//! normal path and through the minimal redirect, interleaved in one run, same-CPU and
//! cross-CPU.
//!
//! Data flow: [`catalogue`] (pure) says what each workload runs and where; [`mode`]
//! starts the agent once as a user would and decides whether it needs
//! `--allow-unguarded`; `services` starts the servers through `testbed::apps`, `sweep`
//! switches the path (the qperf driver's `PathSwitch`) and runs every client each block
//! (`runners`) into a [`AppsResults`](crate::model::AppsResults); [`cells`] (pure) turns it into ratios,
//! spreads and verdicts, [`table`] (pure) into the tables.

pub mod catalogue;
pub mod cells;
pub mod mode;
mod runners;
mod services;
mod sweep;
pub mod table;

use std::path::{Path as FsPath, PathBuf};

use anyhow::{Context as _, Result, bail};
use testbed::{
    TwoPods,
    agent::AgentOpts,
    apps::{Needs, go, haproxy, iperf, java, nginx, node, postgres, redis},
};

use self::{
    catalogue::{Scale, Service, Workload},
    sweep::AppsRun,
};
use crate::{
    driver::{PathSwitch, Start, Steps, paths_of, progress, write_files},
    env,
    model::{AgentMode, AppsConfig, AppsResults, Path, WorkloadInfo},
};

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// The configuration (`workloads` by name, empty: all).
    pub config: AppsConfig,
    /// Where raw tool output is appended.
    pub raw_dir: PathBuf,
    /// The workspace (for the git commit).
    pub workspace: PathBuf,
}

/// The load average above which the machine is not quiet enough to measure.
const QUIET_LOAD: f64 = 1.5;

/// What the services of `workloads` run that is not here.
fn missing(workloads: &[Workload]) -> Vec<String> {
    let needs = |s: Service| -> Needs {
        match s {
            Service::Redis => redis::NEEDS,
            Service::Nginx => nginx::NEEDS,
            Service::Postgres => postgres::NEEDS,
            Service::Iperf => iperf::NEEDS,
            Service::GoCopyEcho
            | Service::GoCopyProxy
            | Service::GoReverseProxy
            | Service::Grpc => go::ALL,
            Service::HaproxySplice | Service::HaproxyNoSplice => haproxy::NEEDS,
            Service::JavaEcho => java::NEEDS,
            Service::NodeProxy => node::NEEDS,
        }
    };
    let mut m: Vec<String> = catalogue::services_of(workloads)
        .into_iter()
        .flat_map(|s| needs(s).missing())
        .collect();
    if workloads.iter().any(|w| w.client == catalogue::Client::Wrk) {
        m.extend(
            Needs {
                system: &["wrk"],
                built: &[],
            }
            .missing(),
        );
    }
    m.sort();
    m.dedup();
    m
}

/// Runs the apps scenario and returns everything it measured.
pub fn run(opts: &Options) -> Result<AppsResults> {
    let mut config = opts.config.clone();
    let workloads = catalogue::select(&config.workloads).map_err(anyhow::Error::msg)?;
    require(&workloads)?;
    let scale = if config.quick {
        Scale::Quick
    } else {
        Scale::Full
    };
    let mut start = Start::new(&opts.workspace, &opts.raw_dir, &config.placements)?;
    config.placements = std::mem::take(&mut start.placements);
    if config.placements.len() > Service::MAX_PLACEMENTS {
        bail!("at most {} placements", Service::MAX_PLACEMENTS);
    }
    if let Some(busy) = busy(&start.env.loadavg_start) {
        start.warnings.push(busy);
    }
    config.workloads = workloads.iter().map(|w| w.name.to_owned()).collect();
    let infos = workloads
        .iter()
        .map(|w| WorkloadInfo {
            name: w.name.to_owned(),
            what: w.describe(scale),
            unit: w.unit().to_owned(),
        })
        .collect();
    let pods = start.pods("apps: ")?;
    let (agent_opts, agent_mode) = agent_as_a_user_runs_it(&pods, &config.agent_args)?;
    let total = config.reps as usize
        * config.placements.len()
        * paths_of(config.minimal).len()
        * workloads.len();
    let mut results = AppsResults::new(config, start.env, infos);
    results.agent_mode = agent_mode;
    results.warnings = start.warnings;
    let mut run = AppsRun {
        scale,
        workloads,
        services: Vec::new(),
        paths: PathSwitch::new(agent_opts, pods.cgroup().to_path_buf()),
        pods,
        results,
        raw: start.raw,
        steps: Steps::new(total),
        hung: Default::default(),
    };
    let outcome = run.start_services().and_then(|()| run.sweep());
    // Stop the agent before the servers and the pods go.
    let r = &mut run.results;
    let stopped = run.paths.set(Path::Default, &mut r.agent, &mut r.warnings);
    outcome?;
    stopped?;
    run.results.env.loadavg_end = env::loadavg();
    run.results.env.duration_secs = run.steps.elapsed_secs();
    Ok(run.results)
}

/// Fails naming what the bench and `workloads` need that is not here.
fn require(workloads: &[Workload]) -> Result<()> {
    let mut missing_here = testbed::require::missing();
    missing_here.extend(missing(workloads));
    if !missing_here.is_empty() {
        bail!(
            "cannot run the apps bench: {} (`cargo xtask bench --scenario apps` installs and builds them)",
            missing_here.join("; ")
        );
    }
    Ok(())
}

/// A warning when the load average at the start (`loadavg`, its first field) says the
/// machine is not quiet.
fn busy(loadavg: &str) -> Option<String> {
    let load: f64 = loadavg
        .split_whitespace()
        .next()
        .and_then(|l| l.parse().ok())
        .unwrap_or(0.0);
    (load > QUIET_LOAD).then(|| {
        format!(
            "load average {loadavg} at the start (above {QUIET_LOAD}): other work shares the machine"
        )
    })
}

/// The agent's options for the pods with `args` added, and how it runs: started once as
/// a user starts it, with `--allow-unguarded` only when it refused to bypass without.
fn agent_as_a_user_runs_it(pods: &TwoPods, args: &[String]) -> Result<(AgentOpts, AgentMode)> {
    let mut agent_opts = pods.agent_opts();
    agent_opts.extra_args.extend(args.iter().cloned());
    let as_user = mode::probe(&agent_opts).context("start the agent as a user would")?;
    let mut agent_mode = mode::decide(as_user);
    agent_opts.allow_unguarded = agent_mode.allow_unguarded;
    agent_mode.command = format!("bypass-agent {}", agent_opts.args().join(" "));
    progress(&mode::describe(&agent_mode));
    Ok((agent_opts, agent_mode))
}

/// Writes `bench.json`, `table.txt`, `table.md` and `readme-snippet.md` into `dir`.
pub fn write_outputs(r: &AppsResults, dir: &FsPath) -> Result<Vec<PathBuf>> {
    write_files(
        dir,
        &[
            ("bench.json", serde_json::to_string_pretty(r)? + "\n"),
            ("table.txt", table::render(r)),
            ("table.md", table::render_markdown_full(r)),
            ("readme-snippet.md", table::render_markdown(r)),
        ],
    )
}

/// Where the results go unless `--out` says otherwise.
pub fn default_out() -> PathBuf {
    PathBuf::from("results/latest-apps")
}

#[cfg(test)]
mod tests;
