//! `cargo xtask build`: builds the agent (with its embedded kernel object) and says where
//! it is; `--check` also runs the formatter and clippy on the workspace.

use std::path::PathBuf;

use anyhow::{Context as _, Result};

use crate::{
    cmd,
    setup::{self, Tools},
    workspace,
};

/// Options of `cargo xtask build`, shared by the tasks that build first.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Build the debug profile (`target/debug/bypass-agent`) instead of release.
    #[arg(long)]
    pub debug: bool,
}

/// Arguments of `cargo xtask build`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub options: Options,
    /// Then run `cargo fmt --check` and `cargo clippy --workspace --all-targets -D warnings`.
    #[arg(long)]
    pub check: bool,
}

/// `cargo xtask build`.
pub fn run(args: &Args) -> Result<()> {
    let tools = setup::ensure(setup::Scope::Build)?;
    build_agent(&tools, &args.options)?;
    if args.check {
        lint(&tools)?;
    }
    Ok(())
}

/// Builds `bypass-agent` and returns the path of the binary.
pub fn build_agent(tools: &Tools, opts: &Options) -> Result<PathBuf> {
    let mut cargo = tools.cargo()?;
    cargo.args(["build", "--package", "bypass-agent"]);
    if !opts.debug {
        cargo.arg("--release");
    }
    cmd::run(&mut cargo)?;
    let profile = if opts.debug { "debug" } else { "release" };
    let agent = workspace::target_dir()?.join(profile).join("bypass-agent");
    let size = agent
        .metadata()
        .with_context(|| format!("the build succeeded but {} is missing", agent.display()))?
        .len();
    println!(
        "build: {} ({size} bytes, {:.1} MiB)",
        agent.display(),
        size as f64 / (1024.0 * 1024.0)
    );
    Ok(agent)
}

/// `cargo fmt --check` and clippy with warnings denied, on the whole workspace.
fn lint(tools: &Tools) -> Result<()> {
    cmd::run(tools.cargo()?.args(["fmt", "--all", "--check"]))?;
    cmd::run(tools.cargo()?.args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    println!("build: fmt and clippy clean");
    Ok(())
}
