//! Where things are: the workspace root, the pinned toolchain, the target directory, and
//! the `cargo` command that every task runs (in the root, with our tools first on PATH).

use std::{ffi::OsString, path::PathBuf, process::Command};

use anyhow::{Context as _, Result, anyhow, bail};

pub use kube_testenv::workspace::{
    AGENT, INTEGRATION_TEST, PREVIOUS_AGENTS, SAME_LAYOUT_AGENT_COMMIT, TEST_TOOL, TEST_TOOL_ENV,
    TESTBED, previous_agent_bin, previous_agent_dir, previous_agents_target, root, target_dir,
};

/// The kernel programs: built for the BPF target only (through the agent's build script),
/// so host-target tasks leave it out.
pub const EBPF: &str = "bypass-ebpf";
/// The bench's minimal reference programs: BPF target only too (through the bench's
/// build script).
pub const MINIMAL_EBPF: &str = "bypass-minimal-ebpf";
/// The bench's package (`cargo xtask bench` and `cargo xtask demo`); its binary has the
/// same name.
pub const BENCH: &str = "bypass-bench";

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
    fn prepends_once() {
        let dir = PathBuf::from("/opt/tools/bin");
        let path = prepend_path(std::slice::from_ref(&dir)).unwrap_or_default();
        let dirs: Vec<_> = std::env::split_paths(&path).collect();
        assert_eq!(dirs.first(), Some(&dir));
        assert_eq!(dirs.iter().filter(|d| **d == dir).count(), 1);
    }
}
