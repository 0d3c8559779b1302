//! `cargo xtask bench`: setup and build, then `bypass-bench run` (package `bypass-bench`,
//! in `bench/`) against the built agent. Results go to `results/latest/`: the table,
//! `bench.json` with every raw sample, and `plot.svg`. `--scenario mesh` (also builds
//! the test tool, whose `proxy` is the sidecar proxy) and `--scenario clusterip` run the
//! same sweep through a sidecar chain or a ClusterIP DNAT into
//! `results/latest-<scenario>/`.
//! `--scenario cluster` runs it between two real pods of the one-node cluster: it brings
//! the cluster up if it is not (and down afterwards), loads the images of `cargo xtask
//! image` (the test image carries qperf), and hands `kubectl` to the bench, which
//! deploys `deploy/` and switches the bypass by the node label. `--scenario apps` builds
//! the apps suite's own programs (Go, Java, Node.js) beside the bench and runs
//! `bypass-bench apps`: real applications instead of qperf, into
//! `results/latest-apps/`. `--scenario scale` runs `bypass-bench scale`: one agent
//! against an API server and etcd (no kubelet) holding a large cluster's objects, under
//! churn, into `results/scale/latest/`. Needs root.

use std::{path::Path, process::Command};

use anyhow::{Result, bail};
use xtask_lib::{cmd, workspace};

use crate::{build, image, setup};

/// Where the apps scenario finds the suite's built programs (testbed's
/// `apps::bins::APPS_DIR_ENV`; xtask does not link testbed).
const APPS_DIR_ENV: &str = "BYPASS_APPS_DIR";

/// The path between the bench's client and server (`bypass-bench run --scenario`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// Pod address to pod address; writes results/latest.
    Default,
    /// Through a sidecar proxy in each pod behind iptables REDIRECT (app → sidecar →
    /// sidecar → app); writes results/latest-mesh.
    Mesh,
    /// To a Service VIP DNATed by kube-proxy-shaped iptables chains; writes
    /// results/latest-clusterip.
    Clusterip,
    /// Between two real pods of the one-node cluster (`cargo xtask cluster`), the
    /// DaemonSet of deploy/ switched by the node label; writes results/latest-cluster.
    Cluster,
    /// Real applications (redis, nginx, PostgreSQL, iperf3, Go, HAProxy, Java, Node.js,
    /// gRPC) between the two pods; writes results/latest-apps.
    Apps,
    /// One agent against an API server holding a large cluster's objects, under churn
    /// (`bypass-bench scale --help`); writes results/scale/latest.
    Scale,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Default => "default",
            Scenario::Mesh => "mesh",
            Scenario::Clusterip => "clusterip",
            Scenario::Cluster => "cluster",
            Scenario::Apps => "apps",
            Scenario::Scale => "scale",
        }
    }
}

/// Arguments of `cargo xtask bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub build: build::Options,
    /// Under two minutes: one repetition, cross-CPU only (`bypass-bench run --quick`;
    /// apps: every workload once, short).
    #[arg(long)]
    pub quick: bool,
    /// The path measured: default, mesh, clusterip, cluster, apps or scale.
    #[arg(long, value_enum, default_value = "default")]
    pub scenario: Scenario,
    /// More arguments for `bypass-bench run` (see `bypass-bench run --help`).
    #[arg(last = true)]
    pub bench: Vec<String>,
}

/// `cargo xtask bench`.
pub fn run(args: &Args) -> Result<()> {
    let tools = setup::ensure(setup::Scope::All)?;
    let agent = build::build_agent(&tools, &args.build)?;
    let mut cargo = bench_command(&tools, &agent)?;
    if args.scenario == Scenario::Mesh {
        // Release: the proxies' cost is part of what the mesh scenario measures.
        cargo.env(workspace::TEST_TOOL_ENV, image::build_test_tool(&tools)?);
    }
    if args.scenario == Scenario::Apps {
        let dir = crate::apps::build("release")?;
        cargo.env(APPS_DIR_ENV, dir);
    }
    // The apps and scale scenarios are their own subcommands: their options are not the
    // sweep's.
    cargo.arg(match args.scenario {
        Scenario::Apps => "apps",
        Scenario::Scale => "scale",
        _ => "run",
    });
    if args.quick {
        if args.scenario == Scenario::Scale {
            bail!("--quick: the scale scenario sets its size by its own options (-- --help)");
        }
        cargo.arg("--quick");
    }
    if !matches!(
        args.scenario,
        Scenario::Default | Scenario::Apps | Scenario::Scale
    ) {
        cargo.args(["--scenario", args.scenario.name()]);
    }
    cargo.args(&args.bench);
    if args.scenario == Scenario::Cluster {
        return on_cluster(&tools, &agent, &mut cargo);
    }
    cmd::run(&mut cargo)
}

/// `cargo run` of the bench's binary in release against `agent`, up to its subcommand
/// (`cargo xtask demo` runs it too).
pub fn bench_command(tools: &setup::Tools, agent: &Path) -> Result<Command> {
    let mut cargo = tools.cargo()?;
    cargo.env("BYPASS_AGENT_BIN", agent).args([
        "run",
        "--release",
        "--package",
        workspace::BENCH,
        "--bin",
        workspace::BENCH,
        "--",
    ]);
    Ok(cargo)
}

/// Runs `bench` (the bench's cargo command) against the one-node cluster
/// ([`crate::cluster::with_cluster`]).
fn on_cluster(tools: &setup::Tools, agent: &Path, bench: &mut Command) -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "the cluster scenario runs kubelet and containerd: run `cargo xtask bench --scenario cluster` as root"
        );
    }
    crate::cluster::with_cluster(tools, agent, None, bench, cmd::run)
}
