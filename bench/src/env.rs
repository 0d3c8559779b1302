//! The environment a run is recorded with: kernel, CPUs, memory, tool versions, git
//! commit, load.

use std::{path::Path, process::Command};

use crate::model::Environment;

/// Runs `cmd args` and returns its stdout (or stderr when stdout is empty), first line,
/// trimmed; `unknown` when it cannot run.
fn first_line(cmd: &str, args: &[&str]) -> String {
    match Command::new(cmd).args(args).output() {
        Ok(out) => {
            let text = if out.stdout.is_empty() {
                out.stderr
            } else {
                out.stdout
            };
            String::from_utf8_lossy(&text)
                .lines()
                .map(str::trim)
                .find(|l| !l.is_empty())
                .unwrap_or("unknown")
                .to_owned()
        }
        Err(_) => "unknown".to_owned(),
    }
}

/// The first `key : value` value in a /proc text.
fn proc_field(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == key).then(|| v.trim().to_owned())
    })
}

/// `/proc/loadavg`, first three fields.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Online CPUs.
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// MemTotal, KiB (0 when unknown).
pub fn mem_total_kib() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    proc_field(&meminfo, "MemTotal")
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// `uname -r`.
pub fn kernel() -> String {
    first_line("uname", &["-r"])
}

/// Collects the environment; `workspace` is the git work tree.
pub fn collect(workspace: &Path, agent_bin: &Path) -> Environment {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let ws = workspace.display().to_string();
    let commit = first_line("git", &["-C", &ws, "rev-parse", "HEAD"]);
    let dirty = Command::new("git")
        .args(["-C", &ws, "status", "--porcelain", "--untracked-files=no"])
        .output()
        .map(|o| !o.stdout.is_empty())
        .unwrap_or(false);
    let agent = agent_bin.display().to_string();
    Environment {
        kernel: kernel(),
        cpus: cpus(),
        cpu_model: proc_field(&cpuinfo, "model name").unwrap_or_else(|| "unknown".into()),
        mem_total_kib: mem_total_kib(),
        qperf_version: first_line("qperf", &["--version"]),
        sockperf_version: first_line("sockperf", &["--version"]),
        agent_version: first_line(&agent, &["--version"]),
        agent_bin: agent,
        git_commit: if dirty {
            format!("{commit}+dirty")
        } else {
            commit
        },
        loadavg_start: loadavg(),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        started_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        ..Environment::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_fields() {
        let t = "processor\t: 0\nmodel name\t: Some CPU @ 2.0GHz\n";
        assert_eq!(
            proc_field(t, "model name").as_deref(),
            Some("Some CPU @ 2.0GHz")
        );
        assert_eq!(proc_field(t, "nope"), None);
    }

    #[test]
    fn missing_tool_is_unknown() {
        assert_eq!(first_line("/nonexistent/tool", &[]), "unknown");
    }
}
