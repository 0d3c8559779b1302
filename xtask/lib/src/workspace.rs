//! Where things are: the workspace root, the pinned toolchain, the target directory, the
//! packages the tasks build by name, and the `cargo` command that every task runs (in the
//! root, with our tools first on PATH).

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, anyhow, bail};

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
/// The kernel programs: built for the BPF target only (through the agent's build script),
/// so host-target tasks leave it out.
pub const EBPF: &str = "bypass-ebpf";
/// The bench's minimal reference programs: BPF target only too (through the bench's
/// build script).
pub const MINIMAL_EBPF: &str = "bypass-minimal-ebpf";
/// The bench's package (`cargo xtask bench` and `cargo xtask demo`); its binary has the
/// same name.
pub const BENCH: &str = "bypass-bench";

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

/// The workspace root: two levels above this crate's directory (`xtask/lib`).
pub fn root() -> &'static Path {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .and_then(Path::parent)
        .unwrap_or(manifest_dir)
}

/// `${XDG_CACHE_HOME:-~/.cache}/bypass/<what>`: what is downloaded or built once for
/// every checkout (Go, the apps' modules, the kernels).
pub fn cache_dir(what: &str) -> Result<PathBuf> {
    cache_dir_of(what, |key| std::env::var_os(key))
}

fn cache_dir_of(what: &str, var: impl Fn(&str) -> Option<OsString>) -> Result<PathBuf> {
    let set = |key| var(key).filter(|v| !v.is_empty()).map(PathBuf::from);
    set("XDG_CACHE_HOME")
        .or_else(|| set("HOME").map(|home| home.join(".cache")))
        .map(|cache| cache.join("bypass").join(what))
        .ok_or_else(|| anyhow!("neither XDG_CACHE_HOME nor HOME is set"))
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

/// The toolchain pinned in `rust-toolchain.toml`, which rustc and bpf-linker share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolchainSpec {
    /// `channel`, e.g. `1.95.0`.
    pub channel: String,
    /// `components`, e.g. `rust-src`, `rustfmt`, `clippy`.
    pub components: Vec<String>,
}

impl ToolchainSpec {
    /// Reads `rust-toolchain.toml` at the workspace root.
    pub fn load() -> Result<Self> {
        let path = root().join("rust-toolchain.toml");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("could not read {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("in {}", path.display()))
    }

    /// Reads the `channel` and `components` keys of the `[toolchain]` table. The file is
    /// ours and small, so a line reader is enough (no TOML dependency).
    pub fn parse(text: &str) -> Result<Self> {
        let value = |key: &str| {
            text.lines()
                .map(|line| line.split('#').next().unwrap_or_default().trim())
                .find_map(|line| {
                    let (k, v) = line.split_once('=')?;
                    (k.trim() == key).then(|| v.trim().to_owned())
                })
        };
        let unquote = |s: &str| s.trim().trim_matches('"').to_owned();
        let channel = value("channel")
            .map(|v| unquote(&v))
            .filter(|c| !c.is_empty())
            .ok_or_else(|| anyhow!("no `channel = \"...\"` in [toolchain]"))?;
        let components = match value("components") {
            None => Vec::new(),
            Some(list) => {
                let Some(inner) = list.strip_prefix('[').and_then(|l| l.strip_suffix(']')) else {
                    bail!("`components` must be a one-line list, e.g. [\"rust-src\"]");
                };
                inner
                    .split(',')
                    .map(unquote)
                    .filter(|c| !c.is_empty())
                    .collect()
            }
        };
        Ok(Self {
            channel,
            components,
        })
    }
}

/// Runs `cargo` in the workspace root with `path_dirs` in front of PATH, so the tools
/// setup installed (bpf-linker) are the ones the build finds.
pub fn cargo(path_dirs: &[PathBuf]) -> Result<Command> {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(root())
        .env("PATH", prepend_path(path_dirs)?);
    Ok(cmd)
}

/// PATH with `dirs` in front (each only once).
pub fn prepend_path(dirs: &[PathBuf]) -> Result<OsString> {
    let current = std::env::var_os("PATH").unwrap_or_default();
    let rest = std::env::split_paths(&current).filter(|p| !dirs.contains(p));
    std::env::join_paths(dirs.iter().cloned().chain(rest))
        .context("a tool directory contains ':' and cannot go on PATH")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_our_toolchain_file() {
        let spec = ToolchainSpec::parse(
            "# comment\n[toolchain]\nchannel = \"1.95.0\" # pinned\n\
             components = [\"rust-src\", \"rustfmt\", \"clippy\"]\nprofile = \"minimal\"\n",
        );
        assert_eq!(
            spec.ok(),
            Some(ToolchainSpec {
                channel: "1.95.0".into(),
                components: vec!["rust-src".into(), "rustfmt".into(), "clippy".into()],
            })
        );
    }

    #[test]
    fn the_checked_in_file_parses() {
        let spec = ToolchainSpec::load();
        assert!(spec.is_ok_and(|s| !s.channel.is_empty()));
    }

    #[test]
    fn rejects_a_file_without_channel() {
        assert!(ToolchainSpec::parse("[toolchain]\nprofile = \"minimal\"\n").is_err());
    }

    #[test]
    fn the_cache_is_under_xdg_else_home() {
        let of = |xdg: &str, home: &str| {
            cache_dir_of("go", |k| {
                Some(OsString::from(if k == "HOME" { home } else { xdg }))
            })
            .ok()
        };
        assert_eq!(of("/x", "/h"), Some(PathBuf::from("/x/bypass/go")));
        assert_eq!(of("", "/h"), Some(PathBuf::from("/h/.cache/bypass/go")));
        assert_eq!(of("", ""), None);
    }

    #[test]
    fn prepends_once() {
        let dir = PathBuf::from("/opt/tools/bin");
        let path = prepend_path(std::slice::from_ref(&dir)).unwrap_or_default();
        let dirs: Vec<_> = std::env::split_paths(&path).collect();
        assert_eq!(dirs.first(), Some(&dir));
        assert_eq!(dirs.iter().filter(|d| **d == dir).count(), 1);
    }
}
