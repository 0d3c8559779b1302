//! `cargo xtask build`: builds the agent (with its embedded kernel object) and says where
//! it is; `--check` also runs the formatter and clippy on the workspace.

use std::path::PathBuf;

use anyhow::{Context as _, Result, bail};

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
    cargo.args(["build", "--package", workspace::AGENT]);
    if !opts.debug {
        cargo.arg("--release");
    }
    cmd::run(&mut cargo)?;
    let profile = if opts.debug { "debug" } else { "release" };
    let agent = workspace::target_dir()?
        .join(profile)
        .join(workspace::AGENT);
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

/// `cargo fmt --check`, and clippy with warnings denied on the whole workspace: the host
/// crates for the host, the kernel crate for the BPF target (on the host its `no_std`
/// binary clashes with std's panic handler). Runs all three, then reports every failure.
fn lint(tools: &Tools) -> Result<()> {
    let mut fmt = tools.cargo()?;
    fmt.args(["fmt", "--all", "--check"]);
    let mut host = tools.cargo()?;
    host.args(["clippy", "--workspace", "--exclude", workspace::EBPF])
        .args(["--all-targets", "--", "-D", "warnings"]);
    let mut bpf = tools.cargo()?;
    // Unstable `-Z build-std` on the stable toolchain, as the agent's build script does.
    bpf.env("RUSTC_BOOTSTRAP", "1")
        .args(["clippy", "--package", workspace::EBPF, "--release"])
        .args(["--target", bpf_target(), "-Z", "build-std=core"])
        .args(["--", "-D", "warnings"]);
    let mut failed = Vec::new();
    for mut cargo in [fmt, host, bpf] {
        let status = cmd::status(&mut cargo)?;
        if !status.success() {
            failed.push(format!("`{}` ({status})", cmd::display(&cargo)));
        }
    }
    if !failed.is_empty() {
        bail!("{} failed", failed.join(", "));
    }
    println!("build: fmt and clippy clean");
    Ok(())
}

/// The BPF target of the host's byte order, as aya-build chooses it.
fn bpf_target() -> &'static str {
    if cfg!(target_endian = "big") {
        "bpfeb-unknown-none"
    } else {
        "bpfel-unknown-none"
    }
}
