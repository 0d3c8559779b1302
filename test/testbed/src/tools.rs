//! Finding the testbed's tools (the test tool `bypass-test-tool`, whose subcommands are
//! the peer, the probe, the proxy and the smoke test, and the apps suite's programs in
//! `apps/`): an environment variable names one, else it sits next to the running
//! executable (or next to its `deps/` directory, for cargo's test binaries).

use std::{path::PathBuf, process::Command};

use anyhow::{Context as _, Result, bail};
use xtask_lib::workspace::{TEST_TOOL, TEST_TOOL_ENV};

/// The test tool: `$BYPASS_TEST_TOOL_BIN` if set, else `bypass-test-tool` beside the
/// running executable.
pub fn test_tool() -> Result<PathBuf> {
    tool_bin(TEST_TOOL, TEST_TOOL_ENV)
}

/// A command that runs the test tool's `subcommand` (`peer`, `probe`, `proxy`, `smoke`),
/// its own arguments to follow.
pub fn test_tool_command(subcommand: &str) -> Result<Command> {
    let mut cmd = Command::new(test_tool()?);
    cmd.arg(subcommand);
    Ok(cmd)
}

/// The tool `name`: `$env` if set, else `name` beside the running executable.
fn tool_bin(name: &str, env: &str) -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(env) {
        return Ok(PathBuf::from(p));
    }
    let p = beside_exe(name)?;
    if !p.is_file() {
        bail!(
            "no {name} at {} (cargo build -p testbed --bins, or set {env})",
            p.display()
        );
    }
    Ok(p)
}

/// The directory `name` of built programs: `$env` if set, else `name` beside the running
/// executable (`cargo xtask test` builds the apps suite's programs there).
pub fn tool_dir(name: &str, env: &str) -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(env) {
        return Ok(PathBuf::from(p));
    }
    let p = beside_exe(name)?;
    if !p.is_dir() {
        bail!(
            "no {name} directory at {} (cargo xtask test builds it, or set {env})",
            p.display()
        );
    }
    Ok(p)
}

/// `name` in the running executable's directory (its parent for cargo's `deps/`).
fn beside_exe(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe().context("find the running executable")?;
    let mut dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    Ok(dir.join(name))
}
