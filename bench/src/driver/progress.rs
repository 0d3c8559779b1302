//! What a run tells as it goes: the `bench:` lines on stderr, each tool run's step with
//! the time elapsed and left, and the raw tool output appended to `tools.log` (a client's
//! run retried once, [`client_twice`]).

use std::{
    fs::{File, OpenOptions},
    io::Write as _,
    path::Path as FsPath,
    process::Output,
    time::Instant,
};

use anyhow::{Context as _, Result};

/// A `bench:` line on stderr.
pub(crate) fn progress(msg: &str) {
    eprintln!("bench: {msg}");
}

/// `MmSSs` (pure).
pub(crate) fn fmt_secs(s: f64) -> String {
    let s = s.max(0.0) as u64;
    format!("{}m{:02}s", s / 60, s % 60)
}

/// The tool runs of a sweep, counted as they are done.
#[derive(Debug)]
pub(crate) struct Steps {
    done: usize,
    total: usize,
    started: Instant,
}

impl Steps {
    /// `total` runs, starting now.
    pub(crate) fn new(total: usize) -> Self {
        Self {
            done: 0,
            total,
            started: Instant::now(),
        }
    }

    /// One run done: its line `[ n/total] msg (elapsed .., eta ..)`.
    pub(crate) fn tick(&mut self, msg: &str) {
        self.done += 1;
        let el = self.elapsed_secs();
        let eta = el / self.done as f64 * self.total.saturating_sub(self.done) as f64;
        progress(&format!(
            "[{:>3}/{}] {msg} (elapsed {}, eta {})",
            self.done,
            self.total,
            fmt_secs(el),
            fmt_secs(eta)
        ));
    }

    /// `n` runs left out (counted as done, without a line).
    pub(crate) fn skip(&mut self, n: usize) {
        self.done += n;
    }

    /// Seconds since the start.
    pub(crate) fn elapsed_secs(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }
}

/// The raw tool log, appended to; nothing is written when it could not be opened.
#[derive(Debug)]
pub(crate) struct RawLog(Option<File>);

impl RawLog {
    /// `tools.log` in `dir` (created).
    pub(crate) fn open(dir: &FsPath) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        Ok(Self(
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join("tools.log"))
                .ok(),
        ))
    }

    /// Appends `=== what` and `out`.
    pub(crate) fn write(&mut self, what: &str, out: &str) {
        if let Some(f) = &mut self.0 {
            let _ = writeln!(f, "=== {what}\n{out}");
        }
    }
}

/// Up to two runs of a tool's client, `run` starting one and waiting for it (`Err`: the
/// bench cannot go on; `Ok(Err(..))`: this run failed): the stdout of the first that
/// succeeds, appended to `raw` as `what`; a warning in `warnings` for each that failed.
pub(crate) fn client_twice(
    what: &str,
    raw: &mut RawLog,
    warnings: &mut Vec<String>,
    mut run: impl FnMut() -> Result<Result<Output>>,
) -> Result<Option<String>> {
    for attempt in 1..=2 {
        match run()? {
            Ok(out) if out.status.success() => {
                let text = String::from_utf8_lossy(&out.stdout).into_owned();
                raw.write(what, &text);
                return Ok(Some(text));
            }
            Ok(out) => warnings.push(format!(
                "{what} (attempt {attempt}): {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )),
            Err(e) => warnings.push(format!("{what} (attempt {attempt}): {e:#}")),
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_is_run_again_once_and_its_failures_warned_about() {
        use std::os::unix::process::ExitStatusExt as _;
        let output = |code: i32, stdout: &str, stderr: &str| Output {
            status: std::process::ExitStatus::from_raw(code << 8),
            stdout: stdout.into(),
            stderr: stderr.into(),
        };
        let (mut raw, mut warnings) = (RawLog(None), Vec::new());
        let mut runs = vec![Ok(output(0, "ok", "")), Ok(output(1, "", "boom\n"))];
        let got = client_twice("x", &mut raw, &mut warnings, || Ok(runs.pop().unwrap()));
        assert_eq!(got.unwrap().as_deref(), Some("ok"));
        assert_eq!(warnings, ["x (attempt 1): exit status: 1: boom"]);
        let got = client_twice("y", &mut raw, &mut warnings, || {
            Ok(Err(anyhow::anyhow!("hung")))
        });
        assert_eq!(got.unwrap(), None);
        assert_eq!(
            warnings[1..],
            ["y (attempt 1): hung", "y (attempt 2): hung"]
        );
    }

    #[test]
    fn seconds_as_minutes() {
        for (secs, shown) in [(0.0, "0m00s"), (125.7, "2m05s"), (-3.0, "0m00s")] {
            assert_eq!(fmt_secs(secs), shown, "{secs} s");
        }
    }
}
