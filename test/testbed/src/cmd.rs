//! Running helper commands (`ip`) and turning a failure into an error that shows the
//! command line and its stderr.

use std::process::Command;

use anyhow::{Context as _, Result, bail};

/// Runs `program args...`, returns its stdout; fails with the command and its stderr.
pub fn run(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("cannot run {program} (is it installed and on PATH?)"))?;
    if !out.status.success() {
        bail!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `ip args...`.
pub fn ip(args: &[&str]) -> Result<String> {
    run("ip", args)
}

/// Whether `program` can be started (it exits, whatever its status).
pub fn available(program: &str, probe_arg: &str) -> bool {
    Command::new(program).arg(probe_arg).output().is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_shows_command_and_stderr() {
        let err = run("sh", &["-c", "echo boom >&2; exit 3"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("sh -c") && err.contains("boom"), "{err}");
        assert_eq!(run("sh", &["-c", "echo hi"]).unwrap(), "hi\n");
        assert!(run("/nonexistent/tool", &[]).is_err());
    }
}
