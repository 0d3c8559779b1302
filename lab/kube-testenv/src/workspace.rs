//! Where things are: the workspace root, the target directory, and the packages the
//! tasks build by name.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, anyhow};

use crate::cmd;

/// The agent package; its binary has the same name.
pub const AGENT: &str = "bypass-agent";
/// The privileged tests (tests only: the tools they run are built from [`TESTBED`]).
pub const INTEGRATION_TEST: &str = "integration-test";
/// The testbed library and the tools the tests and the bench run.
pub const TESTBED: &str = "testbed";
/// [`TESTBED`]'s one binary, the test tool, with subcommands `peer`, `probe`, `proxy`
/// and `smoke`: the privileged tests (on the host and in the kernel VMs) and the bench
/// run it, the cluster's test image carries it at `/usr/local/bin/bypass-test-tool`,
/// and a foreign architecture's VM runs its `smoke`.
pub const TEST_TOOL: &str = "bypass-test-tool";
/// The variable that names the test tool's path (else the tests look beside their own
/// executable).
pub const TEST_TOOL_ENV: &str = "BYPASS_TEST_TOOL_BIN";

/// The workspace root: two levels above this crate's directory (`lab/kube-testenv`).
pub fn root() -> &'static Path {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .and_then(Path::parent)
        .unwrap_or(manifest_dir)
}

/// The cargo target directory, as `cargo metadata` reports it (honours CARGO_TARGET_DIR
/// and `.cargo/config.toml`).
pub fn target_dir() -> Result<PathBuf> {
    let json = cmd::output(Command::new("cargo").current_dir(root()).args([
        "metadata",
        "--format-version=1",
        "--no-deps",
    ]))?;
    let meta: serde_json::Value =
        serde_json::from_str(&json).context("`cargo metadata` printed invalid JSON")?;
    meta.get("target_directory")
        .and_then(|dir| dir.as_str())
        .map(PathBuf::from)
        .ok_or_else(|| anyhow!("`cargo metadata` has no target_directory"))
}
