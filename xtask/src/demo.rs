//! `cargo xtask demo`: setup and build, then the `bypass-demo` binary (package
//! `bypass-demo`, in `bench/demo/`), which shows the bypass at work against the built agent.

use anyhow::Result;

use crate::{build, setup, workspace};
use kube_testenv::cmd;

/// Arguments of `cargo xtask demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub build: build::Options,
    /// Given to `bypass-demo`.
    #[arg(last = true)]
    pub demo: Vec<String>,
}

/// `cargo xtask demo`.
pub fn run(args: &Args) -> Result<()> {
    let tools = setup::ensure(setup::Scope::All)?;
    let agent = build::build_agent(&tools, &args.build)?;
    cmd::run(
        tools
            .cargo()?
            .env("BYPASS_AGENT_BIN", &agent)
            .args([
                "run",
                "--release",
                "--package",
                workspace::DEMO,
                "--bin",
                workspace::DEMO,
                "--",
            ])
            .args(&args.demo),
    )
}
