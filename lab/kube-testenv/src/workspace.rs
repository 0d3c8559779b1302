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

/// The earlier commit whose agent the upgrade tests switch to and from
/// (`restart::version_changes_*`): its pinned maps have another layout than this
/// build's, so each switch releases the pinned datapath of the other build. A build that
/// loads on every kernel of the matrix (Linux 7.x's `tcp_bpf_recvmsg` included).
pub const PREVIOUS_AGENT_COMMIT: &str = "c8af2a5532a12b39a42cd25119d5e3d5780fb1b9";

/// The earlier commit whose agent the in-place upgrade test starts from
/// (`restart::same_layout_*`): the layout of its pinned maps is this build's and its
/// kernel object another, so this build replaces its programs in place, and so does it
/// this build's on the rollback.
pub const SAME_LAYOUT_AGENT_COMMIT: &str = "681e41fb411826662e4fafd1aabbd95dd4be34ee";

/// Every earlier commit whose agent the tests run. `cargo xtask test` builds each once
/// (`git archive` of it from this clone's history into [`previous_agent_dir`], then
/// `cargo build --release -p bypass-agent` there, all in one target directory,
/// [`previous_agents_target`], so the second build reuses the first's dependencies) and
/// copies its binary to [`previous_agent_bin`].
pub const PREVIOUS_AGENTS: [&str; 2] = [PREVIOUS_AGENT_COMMIT, SAME_LAYOUT_AGENT_COMMIT];

/// Where the agent of `commit` is built, under the target directory `target`: a work tree
/// of that commit, keyed by it.
pub fn previous_agent_dir(target: &Path, commit: &str) -> PathBuf {
    target.join("previous-agent").join(commit)
}

/// The target directory the earlier commits are built in.
pub fn previous_agents_target(target: &Path) -> PathBuf {
    target.join("previous-agent").join("target")
}

/// The agent binary of `commit`, copied beside [`previous_agent_dir`] once built.
pub fn previous_agent_bin(target: &Path, commit: &str) -> PathBuf {
    target
        .join("previous-agent")
        .join(format!("{commit}-{AGENT}"))
}

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
