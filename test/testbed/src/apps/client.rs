//! Where a workload's process runs ([`On`]: a pod, optionally pinned to CPUs) and
//! running a client to its end: killed at its timeout, output captured, its JSON report
//! parsed.

use std::{
    process::{Command, Output, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use serde::de::DeserializeOwned;

use super::gate::Gate;
use crate::{
    spawn::{PodChild, spawn_in_on_cpus},
    topology::Pod,
};

/// A pod, and the CPUs its process may run on (empty: any).
#[derive(Clone, Copy, Debug)]
pub struct On<'a> {
    /// The pod.
    pub pod: &'a Pod,
    /// CPUs (a bench pins same-CPU and cross-CPU runs; the tests leave it empty).
    pub cpus: &'a [usize],
}

impl<'a> From<&'a Pod> for On<'a> {
    fn from(pod: &'a Pod) -> Self {
        Self { pod, cpus: &[] }
    }
}

impl On<'_> {
    /// Starts `cmd` there.
    pub fn spawn(&self, cmd: Command) -> Result<PodChild> {
        spawn_in_on_cpus(self.pod, cmd, self.cpus)
    }
}

/// Runs `cmd` there to its end, stdout and stderr captured, at most `timeout` (then it
/// is killed and this fails, naming `what`). The exit status is the caller's to judge.
pub fn run(on: On<'_>, mut cmd: Command, what: &str, timeout: Duration) -> Result<Output> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    on.spawn(cmd)?
        .wait_output(timeout)
        .with_context(|| format!("{what} in pod {}", on.pod.name()))
}

/// [`run`] for a client held at `gate`: once it is connected, `before_go` runs (a test
/// waits there for the pairing it wants to see), then the gate opens.
pub fn run_gated(
    on: On<'_>,
    mut cmd: Command,
    what: &str,
    timeout: Duration,
    gate: &Gate,
    before_go: impl FnOnce() -> Result<()>,
) -> Result<Output> {
    cmd.args(gate.args())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = on.spawn(cmd)?;
    gate.wait_connected(&mut child, timeout)
        .with_context(|| format!("{what} in pod {}", on.pod.name()))?;
    before_go()?;
    gate.open()?;
    child
        .wait_output(timeout)
        .with_context(|| format!("{what} in pod {}", on.pod.name()))
}

/// Runs `cmd` outside the pods (set-up work such as `initdb`) to its end, output
/// captured; it must exit 0 within `timeout`. Returns its stdout as text.
pub fn run_here(mut cmd: Command, what: &str, timeout: Duration) -> Result<String> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd.spawn().with_context(|| format!("start {what}"))?;
    let out = PodChild::adopt(child, what).wait_output(timeout)?;
    if !out.status.success() {
        bail!("{what} failed ({}): {}", out.status, output_tail(&out));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// [`run`], and it must exit 0; returns its stdout as text.
pub fn run_ok(on: On<'_>, cmd: Command, what: &str, timeout: Duration) -> Result<String> {
    let out = run(on, cmd, what, timeout)?;
    if !out.status.success() {
        bail!("{what} failed ({}): {}", out.status, output_tail(&out));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The last JSON line of a client's stdout, typed; whatever its exit status (the suite's
/// clients exit 1 on a failure they report). Fails with its stderr when there is none.
pub fn json_report<T: DeserializeOwned>(out: &Output, what: &str) -> Result<T> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .with_context(|| {
            format!(
                "{what} printed no report ({}): {}",
                out.status,
                output_tail(out)
            )
        })?;
    serde_json::from_str(line).with_context(|| format!("{what} report: {line}"))
}

/// The end of a process's stderr and stdout, for an error message.
pub fn output_tail(out: &Output) -> String {
    let tail = |b: &[u8]| {
        let s = String::from_utf8_lossy(b);
        let s = s.trim();
        let start = s.len().saturating_sub(2000);
        s.get(start..).unwrap_or(s).to_owned()
    };
    format!(
        "stderr: {} | stdout: {}",
        tail(&out.stderr),
        tail(&out.stdout)
    )
}
