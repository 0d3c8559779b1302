//! What a privileged test needs, checked up front: root, the agent binary, `ip`, a
//! cgroup2 mount. Missing pieces skip the test with a printed reason, except under
//! `CI=true`, where they fail it.

use anyhow::{Result, bail};
use xtask_lib::cmd;

use crate::{agent::agent_bin, cgroup::cgroup2_mount};

/// Whether we run under CI (`CI=true`, any case, or `CI=1`).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// What is missing for a privileged test, if anything.
pub fn missing() -> Vec<String> {
    let mut m = Vec::new();
    if !nix::unistd::geteuid().is_root() {
        m.push("not running as root (the tests create namespaces and load eBPF)".to_owned());
    }
    let bin = agent_bin();
    if !bin.is_file() {
        m.push(format!(
            "no agent binary at {} (cargo build --release -p bypass-agent, or set BYPASS_AGENT_BIN)",
            bin.display()
        ));
    }
    if !cmd::available("ip", "-V") {
        m.push("`ip` (iproute2) is not installed".to_owned());
    }
    if let Err(e) = cgroup2_mount() {
        m.push(format!("{e:#}"));
    }
    m
}

/// `Ok(true)`: go ahead. `Ok(false)`: something is missing, the reason was printed,
/// skip. `Err`: something is missing and `CI=true`, so the test must fail.
pub fn preflight(test: &str) -> Result<bool> {
    let m = missing();
    if m.is_empty() {
        return Ok(true);
    }
    if in_ci() {
        bail!("{test}: cannot run under CI: {}", m.join("; "));
    }
    eprintln!("SKIPPED {test}: {}", m.join("; "));
    Ok(false)
}

/// [`preflight`], and iptables/ip6tables must work in a namespace (the tests that write
/// rules: under CI a failure, else a skip).
pub fn preflight_iptables(test: &str) -> Result<bool> {
    if !preflight(test)? {
        return Ok(false);
    }
    if let Some(why) = crate::iptables::missing() {
        if in_ci() {
            bail!("{test}: cannot run under CI: {why}");
        }
        eprintln!("SKIPPED {test}: {why}");
        return Ok(false);
    }
    Ok(true)
}
