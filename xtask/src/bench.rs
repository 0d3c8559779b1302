//! `cargo xtask bench`: setup and build, then `bypass-bench run` (package `bypass-bench`,
//! in `benches/`) against the built agent. Results go to `results/latest/`: the table,
//! `bench.json` with every raw sample, and `plot.svg`. Needs root.

use anyhow::Result;

use crate::{build, cmd, setup};

/// The bench package; its binary is `bypass-bench`.
const BENCH: &str = "bypass-bench";

/// Arguments of `cargo xtask bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub build: build::Options,
    /// Under two minutes: one repetition, cross-CPU only (`bypass-bench run --quick`).
    #[arg(long)]
    pub quick: bool,
    /// More arguments for `bypass-bench run` (see `bypass-bench run --help`).
    #[arg(last = true)]
    pub bench: Vec<String>,
}

/// `cargo xtask bench`.
pub fn run(args: &Args) -> Result<()> {
    let tools = setup::ensure(setup::Scope::All)?;
    let agent = build::build_agent(&tools, &args.build)?;
    let mut cargo = tools.cargo()?;
    cargo.env("BYPASS_AGENT_BIN", &agent).args([
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
    cmd::run(cargo.args(&args.bench))
}
