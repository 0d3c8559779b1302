//! `cargo xtask bench`: setup and build, then `bypass-bench run` (package `bypass-bench`,
//! in `benches/`) against the built agent. Results go to `results/latest/`: the table,
//! `bench.json` with every raw sample, and `plot.svg`. `--scenario mesh` (also builds
//! the sidecar proxy `bypass-proxy`) and `--scenario clusterip` run the same sweep
//! through a sidecar chain or a ClusterIP DNAT into `results/latest-<scenario>/`.
//! Needs root.

use anyhow::{Context as _, Result};

use crate::{build, cmd, setup, workspace};

/// The bench package; its binary is `bypass-bench`.
const BENCH: &str = "bypass-bench";
/// The sidecar proxy of the mesh scenario, a binary of `integration-test`.
const PROXY: &str = "bypass-proxy";

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
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Default => "default",
            Scenario::Mesh => "mesh",
            Scenario::Clusterip => "clusterip",
        }
    }
}

/// Arguments of `cargo xtask bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub build: build::Options,
    /// Under two minutes: one repetition, cross-CPU only (`bypass-bench run --quick`).
    #[arg(long)]
    pub quick: bool,
    /// The path measured: default, mesh or clusterip.
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
    let mut cargo = tools.cargo()?;
    cargo.env("BYPASS_AGENT_BIN", &agent);
    if args.scenario == Scenario::Mesh {
        cargo.env("BYPASS_PROXY_BIN", build_proxy(&tools)?);
    }
    cargo.args([
        "run",
        "--release",
        "--package",
        BENCH,
        "--bin",
        BENCH,
        "--",
        "run",
    ]);
    if args.quick {
        cargo.arg("--quick");
    }
    if args.scenario != Scenario::Default {
        cargo.args(["--scenario", args.scenario.name()]);
    }
    cmd::run(cargo.args(&args.bench))
}

/// Builds `bypass-proxy` (release: the proxies' cost is part of what the mesh scenario
/// measures) and returns its path.
fn build_proxy(tools: &setup::Tools) -> Result<std::path::PathBuf> {
    let mut cargo = tools.cargo()?;
    cargo.args([
        "build",
        "--release",
        "--package",
        workspace::INTEGRATION_TEST,
        "--bin",
        PROXY,
    ]);
    cmd::run(&mut cargo)?;
    let proxy = workspace::target_dir()?.join("release").join(PROXY);
    proxy
        .metadata()
        .with_context(|| format!("the build succeeded but {} is missing", proxy.display()))?;
    Ok(proxy)
}
