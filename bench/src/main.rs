//! `bypass-bench`: parses the command line and hands it to the library. `run` is the
//! bench (`cargo xtask bench` builds and starts it); `demo` is the bench at small scale
//! (`cargo xtask demo`); `apps` is its real-application
//! scenario (`cargo xtask bench --scenario apps`); `scale` is one agent against an API
//! server holding a large cluster's objects (`cargo xtask bench --scenario scale`);
//! `report` redoes the tables (and plot)
//! from a saved `bench.json` of either; `floor` and `floor-peer` are the Unix-socket
//! floor's two processes, started by `run`.

use std::{
    path::{Path as FsPath, PathBuf},
    process::ExitCode,
};

use anyhow::{Context as _, Result, bail};
use bench::{
    apps, demo, driver,
    model::{AppsConfig, Config, Placement, SIZES, Saved, Scenario, Test},
    report,
};
use clap::{Args, Parser, Subcommand, ValueEnum};

/// Bench of the same-node TCP bypass against the normal path and the Unix-socket floor.
#[derive(Debug, Parser)]
#[command(name = "bypass-bench", version)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Placements {
    /// Same-CPU and cross-CPU.
    Both,
    /// Client and server on CPU 0.
    Same,
    /// Client on CPU 0, server on CPU 1.
    Cross,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run the bench (root): two pods, qperf and sockperf with the bypass attached and
    /// detached, the floor, the agent's cost. The agent binary is $BYPASS_AGENT_BIN or
    /// target/release/bypass-agent.
    Run(SweepArgs),
    /// The demo (root; `cargo xtask demo`): the bench at small scale, as a first look.
    /// qperf at 64 B and 16 KiB and sockperf at 64 B between two pods, with the bypass
    /// and on the normal TCP path, same-CPU then cross-CPU, one repetition (about a
    /// minute); then what moved where. Fails when the bypass did not bypass.
    Demo {
        /// Where the table and JSON go.
        #[arg(long, default_value = "results/raw/demo")]
        out: PathBuf,
        /// Where raw tool output is appended (git-ignored).
        #[arg(long, default_value = "results/raw")]
        raw: PathBuf,
    },
    /// Run the real applications (root): each workload of `testbed::apps` (redis, nginx,
    /// PostgreSQL, iperf3, Go, HAProxy, Java, Node.js, gRPC) bypassed, on the normal path
    /// and through the minimal redirect, interleaved, same-CPU and cross-CPU. The agent is
    /// started as a user starts it, with --allow-unguarded only where it refuses without.
    /// The suite's own programs are found in $BYPASS_APPS_DIR or apps/ beside this binary.
    Apps(AppsArgs),
    /// One agent against a real API server (etcd and kube-apiserver, no kubelet) holding
    /// a large cluster's objects, created by the bench; an idle window, then churn of pod,
    /// EndpointSlice and NetworkPolicy updates (root: the agent loads its datapath). The
    /// agent's CPU, peak memory, reconcile passes, the latency of a change to one of its
    /// node's pods, and the watches it holds. Writes scale.json and scale.md.
    Scale {
        #[command(flatten)]
        opts: bench::scale::Options,
        /// Where scale.json and scale.md go.
        #[arg(long, default_value = bench::scale::DEFAULT_OUT)]
        out: PathBuf,
    },
    /// Redo table.txt, table.md (plot.svg, readme-snippet.md) from a bench.json.
    Report {
        /// The bench.json.
        #[arg(long, default_value = "results/latest/bench.json")]
        from: PathBuf,
        /// Where to write [default: beside the JSON].
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// The floor's client (started by `run`): prints one JSON line.
    Floor {
        #[arg(long, value_enum)]
        test: Test,
        #[arg(long)]
        size: u32,
        #[arg(long)]
        secs: f64,
        #[arg(long)]
        client_cpu: usize,
        #[arg(long)]
        server_cpu: usize,
    },
    /// Research probe (root): TCP streams between the pods, bypass attached and
    /// detached; sleeps (wake-ups) and CPU per message on each side.
    Wakeups {
        /// Message sizes, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,16,64,256,4096")]
        sizes: Vec<u32>,
        /// Seconds per stream.
        #[arg(long, default_value_t = 1.0)]
        secs: f64,
        /// Repetitions.
        #[arg(long, default_value_t = 3)]
        reps: u32,
        /// Placements.
        #[arg(long, value_enum, default_value = "both")]
        placement: Placements,
        /// Also write the samples as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// The probe's receiver (started by `wakeups`).
    StreamRecv {
        #[arg(long)]
        listen: std::net::SocketAddr,
        #[arg(long)]
        size: u32,
    },
    /// The probe's sender (started by `wakeups`).
    StreamSend {
        #[arg(long)]
        connect: std::net::SocketAddr,
        #[arg(long)]
        size: u32,
        #[arg(long)]
        secs: f64,
    },
    /// The floor's peer (started by `floor`, socket on stdin).
    FloorPeer {
        #[arg(long, value_enum)]
        test: Test,
        #[arg(long)]
        size: u32,
        #[arg(long)]
        cpu: usize,
    },
}

/// `run`'s options.
#[derive(Debug, Args)]
struct SweepArgs {
    /// Under two minutes: one repetition, cross-CPU only, sockperf shortened.
    #[arg(long)]
    quick: bool,
    /// Interleaved repetitions [default: 5, quick: 1].
    #[arg(long)]
    reps: Option<u32>,
    /// Seconds per qperf test [default: 1].
    #[arg(long)]
    secs: Option<u32>,
    /// Placements [default: both, quick: cross].
    #[arg(long, value_enum)]
    placement: Option<Placements>,
    /// Message sizes, comma-separated [default: 1,4,16,64,256,1024,4096,16384].
    #[arg(long, value_delimiter = ',')]
    sizes: Option<Vec<u32>>,
    /// sockperf sizes, comma-separated; 0 to skip sockperf [default: 64,16384].
    #[arg(long, value_delimiter = ',')]
    sockperf_sizes: Option<Vec<u32>>,
    /// qperf tests, comma-separated [default: tcp_lat,tcp_bw].
    #[arg(long, value_enum, value_delimiter = ',')]
    tests: Option<Vec<Test>>,
    /// Skip the Unix-socket floor (always skipped in the mesh and clusterip
    /// scenarios: it has no chain to compare with, and the default run measures it).
    #[arg(long)]
    no_floor: bool,
    /// Skip the minimal reference redirect (`bench/minimal-ebpf`), measured by
    /// default in every scenario as a third path beside bypass and default.
    #[arg(long)]
    no_minimal: bool,
    /// One more argument for `bypass-agent run` (repeat it; e.g.
    /// `--agent-arg=--small-stream-bytes=0`), recorded in the JSON.
    #[arg(long = "agent-arg", allow_hyphen_values = true)]
    agent_args: Vec<String>,
    /// The path between client and server: default (pod to pod), mesh (through a
    /// sidecar proxy in each pod behind iptables REDIRECT), clusterip (a Service VIP
    /// DNATed by kube-proxy-shaped iptables chains), cluster (two real pods of the
    /// one-node cluster, the DaemonSet switched by the node label; qperf only: no
    /// sockperf, floor or minimal datapath; run it through `cargo xtask bench`).
    #[arg(long, value_enum, default_value = "default")]
    scenario: Scenario,
    /// Where the table, JSON and plot go [default: results/latest, or
    /// results/latest-<scenario>].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Where raw tool output is appended (git-ignored).
    #[arg(long, default_value = "results/raw")]
    raw: PathBuf,
}

/// `apps`' options.
#[derive(Debug, Args)]
struct AppsArgs {
    /// A smoke check: every workload once (one repetition), short, cross-CPU only.
    #[arg(long)]
    quick: bool,
    /// Interleaved repetitions [default: 3, quick: 1].
    #[arg(long)]
    reps: Option<u32>,
    /// Placements [default: both, quick: cross].
    #[arg(long, value_enum)]
    placement: Option<Placements>,
    /// Workloads by name, comma-separated [default: all].
    #[arg(long, value_delimiter = ',')]
    workloads: Vec<String>,
    /// Skip the minimal reference redirect.
    #[arg(long)]
    no_minimal: bool,
    /// One more argument for `bypass-agent run` (repeat it), recorded in the JSON.
    #[arg(long = "agent-arg", allow_hyphen_values = true)]
    agent_args: Vec<String>,
    /// Where the JSON and tables go [default: results/latest-apps].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Where raw tool output is appended (git-ignored).
    #[arg(long, default_value = "results/raw")]
    raw: PathBuf,
}

/// The placements asked for, or both (one, cross-CPU, when `quick`).
fn placements_of(p: Option<Placements>, quick: bool) -> Vec<Placement> {
    let p = p.unwrap_or(if quick {
        Placements::Cross
    } else {
        Placements::Both
    });
    match p {
        Placements::Both => vec![Placement::cross_cpu(), Placement::same_cpu()],
        Placements::Same => vec![Placement::same_cpu()],
        Placements::Cross => vec![Placement::cross_cpu()],
    }
}

/// Repetitions asked for, or `default` (1 when `quick`); at least 1.
fn reps_of(reps: Option<u32>, quick: bool, default: u32) -> Result<u32> {
    let reps = reps.unwrap_or(if quick { 1 } else { default });
    if reps == 0 {
        bail!("--reps must be at least 1");
    }
    Ok(reps)
}

fn main() -> ExitCode {
    match real_main() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Our resource prefix on this machine: netns, bridge, veths, cgroups and pin
/// directories of the bench are named `bb...`.
const RESOURCE_PREFIX: &str = "bb";

fn real_main() -> Result<()> {
    testbed::names::set_prefix(RESOURCE_PREFIX).map_err(anyhow::Error::msg)?;
    match Cli::parse().command {
        Cmd::Run(args) => sweep(args),
        Cmd::Demo { out, raw } => demo(&out, &raw),
        Cmd::Apps(args) => apps(args),
        Cmd::Scale { opts, out } => scale(&opts, &out),
        Cmd::Report { from, out } => report(&from, out),
        Cmd::Floor {
            test,
            size,
            secs,
            client_cpu,
            server_cpu,
        } => print_json(&bench::floor::client(
            test, size, secs, client_cpu, server_cpu,
        )?),
        Cmd::FloorPeer { test, size, cpu } => bench::floor::peer(test, size, cpu),
        Cmd::Wakeups {
            sizes,
            secs,
            reps,
            placement,
            json,
        } => wakeups(&sizes, secs, reps, placement, json.as_deref()),
        Cmd::StreamRecv { listen, size } => print_json(&bench::wakeups::recv(listen, size)?),
        Cmd::StreamSend {
            connect,
            size,
            secs,
        } => print_json(&bench::wakeups::send(connect, size, secs)?),
    }
}

/// The workspace this binary was built in (for the git commit and deploy/).
fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Prints a run's table, then the files written.
fn show(table: &str, written: &[PathBuf]) {
    println!("{table}");
    for w in written {
        println!("wrote {}", w.display());
    }
}

/// Prints one JSON line (a helper process's answer to the bench).
fn print_json(value: &impl serde::Serialize) -> Result<()> {
    println!("{}", serde_json::to_string(value)?);
    Ok(())
}

/// `run`: the configuration from the options, the sweep, its files and table.
fn sweep(a: SweepArgs) -> Result<()> {
    let reps = reps_of(a.reps, a.quick, 5)?;
    let quick = a.quick;
    let config = Config {
        quick,
        reps,
        sockperf_reps: reps.min(3),
        qperf_secs: a.secs.unwrap_or(1).max(1),
        sockperf_secs: if quick { 2 } else { 3 },
        floor_secs: if quick { 0.5 } else { 1.0 },
        sizes: a.sizes.unwrap_or_else(|| SIZES.to_vec()),
        sockperf_sizes: a
            .sockperf_sizes
            .unwrap_or_else(|| vec![64, 16384])
            .into_iter()
            .filter(|&s| s > 0)
            .collect(),
        placements: placements_of(a.placement, quick),
        tests: a.tests.unwrap_or_else(|| vec![Test::TcpLat, Test::TcpBw]),
        idle_secs: if quick { 1.0 } else { 3.0 },
        minimal: !a.no_minimal,
        agent_args: a.agent_args,
        scenario: a.scenario,
    };
    let opts = driver::Options {
        config,
        raw_dir: a.raw,
        workspace: workspace(),
        no_floor: a.no_floor || a.scenario != Scenario::Default,
    };
    let results = driver::run(&opts)?;
    let written =
        driver::write_outputs(&results, &a.out.unwrap_or_else(|| a.scenario.default_out()))?;
    show(&report::render(&results), &written);
    Ok(())
}

/// `demo`: the guard line, the small run, what moved where, and the verdict.
fn demo(out: &FsPath, raw: &FsPath) -> Result<()> {
    // The demo runs the agent with --allow-unguarded, as the tests do: it says whether
    // that mattered here, first and last.
    let guard = demo::guard_line(&testbed::kernel_probe()?);
    println!("{guard}");
    let results = demo::run(&workspace(), raw)?;
    let written = driver::write_outputs(&results, out)?;
    println!("{}", report::render(&results));
    println!("{}", demo::moved(&results));
    for w in written {
        println!("wrote {}", w.display());
    }
    let problems = demo::problems(&results);
    if !problems.is_empty() {
        bail!(
            "the bypass did not do its job in this run:\n  {}",
            problems.join("\n  ")
        );
    }
    println!(
        "every run went the way its path says: the bypassed runs redirected their bytes, the TCP runs put theirs on the veths"
    );
    println!("{guard}");
    Ok(())
}

/// `apps`: the workloads' run, its files and tables.
fn apps(a: AppsArgs) -> Result<()> {
    let opts = apps::Options {
        config: AppsConfig {
            quick: a.quick,
            reps: reps_of(a.reps, a.quick, 3)?,
            placements: placements_of(a.placement, a.quick),
            minimal: !a.no_minimal,
            agent_args: a.agent_args,
            workloads: a.workloads,
        },
        raw_dir: a.raw,
        workspace: workspace(),
    };
    let results = apps::run(&opts)?;
    let written = apps::write_outputs(&results, &a.out.unwrap_or_else(apps::default_out))?;
    show(&apps::table::render(&results), &written);
    Ok(())
}

/// `scale`: the run against the API server, its files and table.
fn scale(opts: &bench::scale::Options, out: &FsPath) -> Result<()> {
    let results = bench::scale::run(opts)?;
    let written = bench::scale::write_outputs(&results, out)?;
    show(&bench::scale::render(&results), &written);
    Ok(())
}

/// `report`: the files and table of a saved `bench.json` again, a sweep's or an apps
/// run's.
fn report(from: &FsPath, out: Option<PathBuf>) -> Result<()> {
    let text = std::fs::read_to_string(from).with_context(|| format!("read {}", from.display()))?;
    let dir = out.unwrap_or_else(|| {
        from.parent()
            .map_or_else(|| PathBuf::from("."), PathBuf::from)
    });
    match Saved::parse(&text).context("parse bench.json")? {
        Saved::Apps(r) => show(&apps::table::render(&r), &apps::write_outputs(&r, &dir)?),
        Saved::Sweep(r) => show(&report::render(&r), &driver::write_outputs(&r, &dir)?),
    }
    Ok(())
}

/// `wakeups`: the probe's table, and its samples as JSON where asked.
fn wakeups(
    sizes: &[u32],
    secs: f64,
    reps: u32,
    placement: Placements,
    json: Option<&FsPath>,
) -> Result<()> {
    let placements = placements_of(Some(placement), false);
    let samples = bench::wakeups::run(sizes, &placements, secs, reps)?;
    print!("{}", bench::wakeups::render(&samples, &placements, sizes));
    if let Some(path) = json {
        std::fs::write(path, serde_json::to_string_pretty(&samples)?)
            .with_context(|| format!("write {}", path.display()))?;
    }
    Ok(())
}
