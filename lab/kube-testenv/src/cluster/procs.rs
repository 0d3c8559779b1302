//! The cluster's daemons: started in their own process group with a log each, recorded
//! as `name pid` lines, and stopped only if the pid still runs the binary of that name.

use std::{
    fs::OpenOptions,
    os::unix::process::CommandExt as _,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

/// Starts `program args` with stdout and stderr appended to `<logs>/<name>.log`, and
/// appends `name pid` to `pids`.
pub fn spawn(name: &str, program: &Path, args: &[String], logs: &Path, pids: &Path) -> Result<u32> {
    let child = logged(program, args, &logs.join(format!("{name}.log")))?
        .process_group(0)
        .spawn()
        .with_context(|| format!("start {}", program.display()))?;
    let pid = child.id();
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(pids)
        .with_context(|| format!("open {}", pids.display()))?;
    std::io::Write::write_all(&mut f, format!("{name} {pid}\n").as_bytes())?;
    Ok(pid)
}

/// `program args` with stdin closed and stdout and stderr appended to `log`.
pub fn logged(program: &Path, args: &[String], log: &Path) -> Result<Command> {
    let out = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("open {}", log.display()))?;
    let err = out.try_clone()?;
    let mut command = Command::new(program);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    Ok(command)
}

/// Parses the `name pid` lines (pure).
pub fn parse_pids(text: &str) -> Vec<(String, u32)> {
    text.lines()
        .filter_map(|l| {
            let (name, pid) = l.trim().split_once(' ')?;
            Some((name.to_owned(), pid.trim().parse().ok()?))
        })
        .collect()
}

/// Whether `pid` runs a binary called `name` (a recycled pid is someone else's).
pub fn runs(pid: u32, name: &str) -> bool {
    std::fs::read_link(format!("/proc/{pid}/exe"))
        .ok()
        .and_then(|exe| {
            exe.file_name()
                .and_then(|n| n.to_str())
                .map(|n| n.trim_end_matches(" (deleted)") == name)
        })
        .unwrap_or(false)
}

/// SIGTERM, up to `grace`, then SIGKILL; waits until it is gone.
pub fn stop(pid: u32, name: &str, grace: Duration) -> Result<()> {
    if !runs(pid, name) {
        return Ok(());
    }
    let pid_t = nix::unistd::Pid::from_raw(i32::try_from(pid)?);
    let _ = nix::sys::signal::kill(pid_t, nix::sys::signal::Signal::SIGTERM);
    let deadline = Instant::now() + grace;
    while runs(pid, name) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    if runs(pid, name) {
        let _ = nix::sys::signal::kill(pid_t, nix::sys::signal::Signal::SIGKILL);
        let deadline = Instant::now() + Duration::from_secs(10);
        while runs(pid, name) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        if runs(pid, name) {
            bail!("{name} (pid {pid}) did not exit after SIGKILL");
        }
    }
    Ok(())
}

/// How often `up` and `down` poll for a daemon or pod to be ready or gone.
pub const POLL: Duration = Duration::from_millis(500);

/// The last lines of a log, for error messages.
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pid_lines() {
        assert_eq!(
            parse_pids("etcd 12\nkubelet 34\nbad\nx y\n"),
            [("etcd".to_owned(), 12), ("kubelet".to_owned(), 34)]
        );
    }

    #[test]
    fn a_pid_runs_only_its_own_binary() {
        let me = std::process::id();
        let exe = std::env::current_exe().unwrap();
        let name = exe.file_name().unwrap().to_str().unwrap();
        assert!(runs(me, name));
        assert!(!runs(me, "kubelet"));
    }
}
