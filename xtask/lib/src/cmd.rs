//! The one command runner of xtask, the testbed and the lab crates: runs child
//! processes, echoes each command line of a task (on stderr, like cargo, so a task's
//! stdout carries only its result), and names the command in every failure. The
//! flavours differ only in how the failure names it: [`output`] by its command line,
//! [`output_named`] by what it was for, [`run_program`] by program and arguments.

use std::{
    ffi::OsStr,
    path::Path,
    process::{Command, ExitStatus},
};

use anyhow::{Context as _, Result, bail};

/// Runs `cmd` with inherited stdio; fails unless it exits with status 0.
pub fn run(cmd: &mut Command) -> Result<()> {
    let status = status(cmd)?;
    if !status.success() {
        bail!("`{}` failed: {status}", display(cmd));
    }
    Ok(())
}

/// Runs `cmd` with its stdout sent to our stderr (installers: their chatter is progress,
/// not a result); fails unless it exits with status 0.
pub fn run_to_stderr(cmd: &mut Command) -> Result<()> {
    cmd.stdout(std::io::stderr());
    run(cmd)
}

/// Runs `cmd` with inherited stdio and returns its exit status, whatever it is.
pub fn status(cmd: &mut Command) -> Result<ExitStatus> {
    echo(cmd);
    cmd.status()
        .with_context(|| format!("could not start `{}`", display(cmd)))
}

/// Prints `+ <command line>` on stderr.
pub fn echo(cmd: &Command) {
    eprintln!("+ {}", display(cmd));
}

/// Runs `cmd` quietly and returns its stdout; fails with its stderr unless it exits with 0.
pub fn output(cmd: &mut Command) -> Result<String> {
    let out = output_bytes(cmd)?;
    String::from_utf8(out).with_context(|| format!("`{}` printed non-UTF-8", display(cmd)))
}

/// Runs `cmd` quietly and returns its raw stdout; fails with its stderr unless it exits
/// with 0.
pub fn output_bytes(cmd: &mut Command) -> Result<Vec<u8>> {
    match quiet(cmd) {
        Ok(stdout) => Ok(stdout),
        Err(Quiet::Start(e)) => {
            Err(e).with_context(|| format!("could not start `{}`", display(cmd)))
        }
        Err(Quiet::Failed(status, stderr)) => {
            bail!("`{}` failed: {status}\n{}", display(cmd), stderr.trim_end())
        }
    }
}

/// Runs `cmd` quietly; its stdout, or an error naming `what` with its status and stderr.
pub fn output_named(cmd: &mut Command, what: &str) -> Result<String> {
    match quiet(cmd) {
        Ok(stdout) => Ok(String::from_utf8_lossy(&stdout).into_owned()),
        Err(Quiet::Start(e)) => {
            Err(e).with_context(|| format!("{what}: could not start {:?}", cmd.get_program()))
        }
        Err(Quiet::Failed(status, stderr)) => bail!("{what} failed ({status}): {}", stderr.trim()),
    }
}

/// Runs `program args...` quietly, returns its stdout; fails with the command and its
/// stderr.
pub fn run_program(program: &str, args: &[&str]) -> Result<String> {
    match quiet(Command::new(program).args(args)) {
        Ok(stdout) => Ok(String::from_utf8_lossy(&stdout).into_owned()),
        Err(Quiet::Start(e)) => {
            Err(e).with_context(|| format!("cannot run {program} (is it installed and on PATH?)"))
        }
        Err(Quiet::Failed(status, stderr)) => bail!(
            "`{program} {}` failed ({status}): {}",
            args.join(" "),
            stderr.trim()
        ),
    }
}

/// Runs `ip args...`.
pub fn ip(args: &[&str]) -> Result<String> {
    run_program("ip", args)
}

/// Whether `program` can be started (it exits, whatever its status).
pub fn available(program: &str, probe_arg: &str) -> bool {
    Command::new(program).arg(probe_arg).output().is_ok()
}

/// Why a quiet run failed: it did not start, or it exited with `status` (and stderr).
enum Quiet {
    Start(std::io::Error),
    Failed(ExitStatus, String),
}

/// Runs `cmd` with its output captured; its stdout if it exits with 0.
fn quiet(cmd: &mut Command) -> std::result::Result<Vec<u8>, Quiet> {
    let out = cmd.output().map_err(Quiet::Start)?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        return Err(Quiet::Failed(out.status, stderr));
    }
    Ok(out.stdout)
}

/// The command line as a shell user would type it, with the variables we set in front.
pub fn display(cmd: &Command) -> String {
    let envs = cmd.get_envs().filter_map(|(key, value)| {
        // PATH is only ever extended; printing it would bury the command.
        let value = value?;
        (key != "PATH").then(|| format!("{}={}", key.display(), quote(value)))
    });
    let program = std::iter::once(quote(cmd.get_program()));
    let args = cmd.get_args().map(quote);
    envs.chain(program)
        .chain(args)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether `program` can be found in a directory on PATH.
pub fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|dir| is_executable(&dir.join(program)))
    })
}

/// Whether `path` is a regular file with an execute bit.
pub fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    path.metadata()
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

fn quote(word: &OsStr) -> String {
    let word = word.to_string_lossy();
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:+,@%".contains(c));
    if plain {
        word.into_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_quotes_only_what_needs_it() {
        let mut cmd = Command::new("cargo");
        cmd.args(["test", "--", "name with space", "it's"])
            .env("BYPASS_AGENT_BIN", "/t/bypass-agent")
            .env("PATH", "/x");
        assert_eq!(
            display(&cmd),
            r"BYPASS_AGENT_BIN=/t/bypass-agent cargo test -- 'name with space' 'it'\''s'"
        );
    }

    #[test]
    fn failure_shows_command_and_stderr() {
        let err = run_program("sh", &["-c", "echo boom >&2; exit 3"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("sh -c") && err.contains("boom"), "{err}");
        assert_eq!(run_program("sh", &["-c", "echo hi"]).unwrap(), "hi\n");
        assert!(run_program("/nonexistent/tool", &[]).is_err());
    }
}
