//! The pinned Rust toolchain and its components, installed through rustup when missing.

use std::{path::PathBuf, process::Command};

use anyhow::{Result, bail};
use xtask_lib::{cmd, workspace::ToolchainSpec};

/// An installed toolchain.
pub struct Toolchain {
    /// The rustup name, e.g. `1.95.0`.
    pub channel: String,
    /// `rustc --print sysroot`; its `lib/` holds the `libLLVM` that bpf-linker must use.
    pub sysroot: PathBuf,
}

/// Installs the toolchain or its missing components; records what it did in `done`.
pub fn ensure(spec: &ToolchainSpec, done: &mut Vec<String>) -> Result<Toolchain> {
    if !cmd::on_path("rustup") {
        bail!(
            "rustup is not on PATH: install it (https://rustup.rs) or `source ~/.cargo/env`; \
             the project needs rustup to pin toolchain {}",
            spec.channel
        );
    }
    let channel = spec.channel.as_str();
    let list = || cmd::output(Command::new("rustup").args(["toolchain", "list"]));
    if installed_name(&list()?, channel).is_none() {
        eprintln!("setup: installing Rust toolchain {channel}");
        let mut install = Command::new("rustup");
        install.args(["toolchain", "install", channel, "--profile", "minimal"]);
        if !spec.components.is_empty() {
            install.args(["--component", &spec.components.join(",")]);
        }
        cmd::run_to_stderr(&mut install)?;
        done.push(format!(
            "installed toolchain {channel} with {}",
            spec.components.join(", ")
        ));
    }
    let Some(name) = installed_name(&list()?, channel) else {
        bail!("rustup does not list toolchain {channel} after installing it");
    };
    let host = name
        .strip_prefix(&format!("{channel}-"))
        .unwrap_or_default();
    let installed = cmd::output(Command::new("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        channel,
    ]))?;
    let missing = missing_components(&installed, &spec.components, host);
    if !missing.is_empty() {
        eprintln!(
            "setup: adding {} to toolchain {channel}",
            missing.join(", ")
        );
        cmd::run_to_stderr(
            Command::new("rustup")
                .args(["component", "add", "--toolchain", channel])
                .args(&missing),
        )?;
        done.push(format!("added {} to {channel}", missing.join(", ")));
    }
    let sysroot =
        cmd::output(Command::new("rustup").args(["run", channel, "rustc", "--print", "sysroot"]))?;
    Ok(Toolchain {
        channel: channel.to_owned(),
        sysroot: PathBuf::from(sysroot.trim()),
    })
}

/// Adds the standard library of `target` to the toolchain unless it is there; records
/// it in `done`.
pub fn ensure_target(channel: &str, target: &str, done: &mut Vec<String>) -> Result<()> {
    let installed = cmd::output(Command::new("rustup").args([
        "target",
        "list",
        "--installed",
        "--toolchain",
        channel,
    ]))?;
    if has_target(&installed, target) {
        return Ok(());
    }
    eprintln!("setup: adding target {target} to toolchain {channel}");
    cmd::run_to_stderr(Command::new("rustup").args([
        "target",
        "add",
        "--toolchain",
        channel,
        target,
    ]))?;
    done.push(format!("added target {target} to {channel}"));
    Ok(())
}

/// Whether `rustup target list --installed` shows `target`.
fn has_target(installed: &str, target: &str) -> bool {
    installed.lines().any(|l| l.trim() == target)
}

/// The full name (`1.95.0-x86_64-unknown-linux-gnu`) under which `rustup toolchain list`
/// shows `channel`.
fn installed_name(list: &str, channel: &str) -> Option<String> {
    list.lines()
        .filter_map(|line| line.split_whitespace().next())
        .find(|name| {
            *name == channel
                || name
                    .strip_prefix(channel)
                    .is_some_and(|rest| rest.starts_with('-'))
        })
        .map(str::to_owned)
}

/// The `wanted` components that `rustup component list --installed` does not show.
/// Installed names carry the host triple (`clippy-x86_64-unknown-linux-gnu`) except
/// target-independent ones (`rust-src`).
fn missing_components(installed: &str, wanted: &[String], host: &str) -> Vec<String> {
    wanted
        .iter()
        .filter(|want| {
            let with_host = format!("{want}-{host}");
            !installed
                .lines()
                .map(str::trim)
                .any(|have| have == want.as_str() || have == with_host)
        })
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIST: &str = "stable-x86_64-unknown-linux-gnu (default)\n\
                        nightly-x86_64-unknown-linux-gnu\n\
                        1.95.0-x86_64-unknown-linux-gnu (active)\n";

    #[test]
    fn finds_the_pinned_toolchain() {
        assert_eq!(
            installed_name(LIST, "1.95.0").as_deref(),
            Some("1.95.0-x86_64-unknown-linux-gnu")
        );
        assert!(installed_name(LIST, "nightly").is_some());
        assert_eq!(installed_name(LIST, "1.95"), None);
        assert_eq!(installed_name(LIST, "1.96.0"), None);
    }

    #[test]
    fn finds_installed_targets() {
        let list = "aarch64-unknown-linux-gnu\nx86_64-unknown-linux-gnu\n";
        assert!(has_target(list, "aarch64-unknown-linux-gnu"));
        assert!(!has_target(list, "aarch64-unknown-linux-musl"));
    }

    #[test]
    fn lists_missing_components() {
        let installed = "cargo-x86_64-unknown-linux-gnu\nclippy-x86_64-unknown-linux-gnu\n\
                         rust-src\nrust-std-x86_64-unknown-linux-gnu\n\
                         rustc-x86_64-unknown-linux-gnu\n";
        let wanted = ["rust-src", "rustfmt", "clippy", "rust"].map(String::from);
        assert_eq!(
            missing_components(installed, &wanted, "x86_64-unknown-linux-gnu"),
            ["rustfmt", "rust"]
        );
    }
}
