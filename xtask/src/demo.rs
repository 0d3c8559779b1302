//! `cargo xtask demo`: setup and build, then `bypass-bench demo` (package `bypass-bench`,
//! in `bench/`): the bench at small scale, against the built agent.

use anyhow::Result;
use xtask_lib::cmd;

use crate::{bench, build, setup};

/// Arguments of `cargo xtask demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub build: build::Options,
    /// Given to `bypass-bench demo` (see `bypass-bench demo --help`).
    #[arg(last = true)]
    pub demo: Vec<String>,
}

/// `cargo xtask demo`.
pub fn run(args: &Args) -> Result<()> {
    let tools = setup::ensure(setup::Scope::All)?;
    let agent = build::build_agent(&tools, &args.build)?;
    cmd::run(
        bench::bench_command(&tools, &agent)?
            .arg("demo")
            .args(&args.demo),
    )
}
