//! Runs child processes: echoes each command line (on stderr, like cargo, so a task's
//! stdout carries only its result), and names the command in every failure.

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
    let out = cmd
        .output()
        .with_context(|| format!("could not start `{}`", display(cmd)))?;
    if !out.status.success() {
        bail!(
            "`{}` failed: {}\n{}",
            display(cmd),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim_end()
        );
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
}
