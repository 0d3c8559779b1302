//! The `bypass-agent` under test, as a guard: started with `run`, ready once `status`
//! says attached, stopped with SIGTERM (or killed on drop), its pin directory removed
//! if it left one.

use std::{
    net::{Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Output, Stdio},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

use crate::spawn::{Gathered, drain};

/// How long [`http_get`] waits for the metrics server (connect, request, whole body):
/// a net.
pub const HTTP_TIMEOUT: Duration = crate::steps::NET;

/// How long `start` waits for the datapath to be attached: a net (loading and attaching
/// takes seconds under emulation).
pub const START_TIMEOUT: Duration = crate::steps::NET;
/// How long `stop` waits for a clean exit after SIGTERM: a net for an agent that
/// hangs, not a pace. Removing its pins releases the read guard's trampoline links, and
/// each release waits for an RCU tasks grace period, one after another: 21 s in all,
/// and once past 30 s, for `detach::sigterm_mid_stream_loses_nothing` (20 streams
/// running) in the 6.1 VM under one TCG thread.
pub const STOP_TIMEOUT: Duration = crate::steps::NET;

/// The agent binary: `$BYPASS_AGENT_BIN`, else `<workspace>/target/release/bypass-agent`
/// (build it with `cargo build --release -p bypass-agent`).
pub fn agent_bin() -> PathBuf {
    match std::env::var_os("BYPASS_AGENT_BIN") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/release/bypass-agent"),
    }
}

/// The agent of `commit` (one of [`xtask_lib::workspace::PREVIOUS_AGENTS`]), which
/// the upgrade tests switch to and from: `$BYPASS_PREVIOUS_AGENT_BIN_<commit>` (the
/// commit's first 7 characters), else where `cargo xtask test` builds it, under the
/// target directory the running test binary is in (`<target>/debug/deps/`).
pub fn previous_agent_bin(commit: &str) -> Result<PathBuf> {
    let short = commit.get(..7).unwrap_or(commit);
    if let Some(p) = std::env::var_os(format!("BYPASS_PREVIOUS_AGENT_BIN_{short}")) {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().context("find the running executable")?;
    // <target>/<profile>/deps/<test binary>, or <target>/<profile>/<binary>.
    let mut target = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if target.ends_with("deps") {
        target.pop();
    }
    target.pop();
    let bin = xtask_lib::workspace::previous_agent_bin(&target, commit);
    ensure!(
        bin.is_file(),
        "no agent of {commit} at {} (`cargo xtask test` builds it; or set \
         BYPASS_PREVIOUS_AGENT_BIN_{short})",
        bin.display()
    );
    Ok(bin)
}

/// A `Command` for the agent binary.
pub fn agent_command() -> Command {
    Command::new(agent_bin())
}

/// Runs the agent binary with `args` to its exit (killed past `timeout`), output
/// captured. For commands that must fail fast, such as `run` with bad input.
pub fn run_agent(args: &[&str], timeout: Duration) -> Result<Output> {
    let mut child = agent_command()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("start {}", agent_bin().display()))?;
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(st) = child.try_wait().context("wait for bypass-agent")? {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "`bypass-agent {}` still running after {timeout:?}; killed it",
                args.join(" ")
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Ok(Output {
        status,
        stdout: out.map_or_else(Vec::new, |h| h.join().unwrap_or_default()),
        stderr: err.map_or_else(Vec::new, |h| h.join().unwrap_or_default()),
    })
}

/// Options of `bypass-agent run`.
#[derive(Clone, Debug, Default)]
pub struct AgentOpts {
    /// `--pod-cidr` values.
    pub pod_cidrs: Vec<String>,
    /// `--pod-ip` values.
    pub pod_ips: Vec<String>,
    /// `--cgroup`.
    pub cgroup: PathBuf,
    /// `--pin-dir`.
    pub pin_dir: PathBuf,
    /// More arguments, appended as given.
    pub extra_args: Vec<String>,
    /// Environment variables set for the agent.
    pub env: Vec<(String, String)>,
    /// `--allow-unguarded`: the datapath tests exercise redirects on every kernel, the
    /// host's too, whether or not a read guard runs there.
    pub allow_unguarded: bool,
    /// The agent binary to run (`None`: [`agent_bin`]), e.g. [`previous_agent_bin`].
    pub binary: Option<PathBuf>,
}

impl AgentOpts {
    /// The `run` command line.
    pub fn args(&self) -> Vec<String> {
        let mut a = vec!["run".to_owned()];
        for c in &self.pod_cidrs {
            a.extend(["--pod-cidr".to_owned(), c.clone()]);
        }
        for ip in &self.pod_ips {
            a.extend(["--pod-ip".to_owned(), ip.clone()]);
        }
        a.extend(["--cgroup".to_owned(), self.cgroup.display().to_string()]);
        a.extend(["--pin-dir".to_owned(), self.pin_dir.display().to_string()]);
        if self.allow_unguarded {
            a.push("--allow-unguarded".to_owned());
        }
        a.extend(self.extra_args.iter().cloned());
        a
    }

    /// These options with `--max-queued-bytes bound` added.
    pub fn max_queued(mut self, bound: &str) -> Self {
        self.extra_args
            .extend(["--max-queued-bytes".to_owned(), bound.to_owned()]);
        self
    }
}

/// `status --json`, typed: the agent's own report, so the testbed reads what the agent
/// writes.
pub type AgentStatus = bypass_common::status::Report;

/// How a stopped agent exited.
#[derive(Debug)]
pub struct AgentExit {
    /// Exit status.
    pub status: ExitStatus,
    /// Everything it wrote to stderr.
    pub stderr: String,
}

impl AgentExit {
    /// The `redirected_bytes` of its `bypass detached` line (an agent run with
    /// `--log-json`): every byte redirected before its redirects went off.
    pub fn redirected_at_detach(&self) -> Option<u64> {
        self.stderr
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|v| v["fields"]["message"] == "bypass detached")
            .and_then(|v| v["fields"]["redirected_bytes"].as_u64())
    }
}

/// A running `bypass-agent run`.
pub struct Agent {
    child: Child,
    /// The binary it runs, whose `status` reads its pins.
    bin: PathBuf,
    running: bool,
    pin_dir: PathBuf,
    stderr: Gathered,
    stderr_reader: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("pid", &self.child.id())
            .field("pin_dir", &self.pin_dir)
            .finish()
    }
}

impl Agent {
    /// Starts the agent and waits until `status` reports it attached, or that it
    /// refused to attach (a kernel without a read guard, no `--allow-unguarded`: see
    /// [`Agent::refused`]).
    pub fn start(opts: &AgentOpts) -> Result<Self> {
        let bin = opts.binary.clone().unwrap_or_else(agent_bin);
        let mut child = Command::new(&bin)
            .args(opts.args())
            .envs(opts.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| {
                format!(
                    "start {} (build it: cargo build --release -p bypass-agent)",
                    bin.display()
                )
            })?;
        let (stderr, stderr_reader) = Gathered::start(child.stderr.take());
        let mut agent = Self {
            child,
            bin,
            running: true,
            pin_dir: opts.pin_dir.clone(),
            stderr,
            stderr_reader,
        };
        agent.wait_attached()?;
        Ok(agent)
    }

    fn wait_attached(&mut self) -> Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(st) = self.child.try_wait().context("wait for the agent")? {
                self.running = false;
                bail!(
                    "bypass-agent exited ({st}) before attaching: {}",
                    self.stderr().trim()
                );
            }
            if let Ok(s) = self.stats()
                && (s.attached || s.refused.is_some())
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "bypass-agent did not report attached within {START_TIMEOUT:?}: {}",
                    self.stderr().trim()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Polls `status` until `done` holds (what the test observes, not a sleep), at most
    /// `timeout`; fails naming `what` with the last status.
    pub fn wait_for(
        &self,
        timeout: Duration,
        what: &str,
        done: impl Fn(&AgentStatus) -> bool,
    ) -> Result<AgentStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            let st = self.stats()?;
            if done(&st) {
                return Ok(st);
            }
            if Instant::now() > deadline {
                bail!("waited {timeout:?} for {what}: {st:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Why the agent runs without attaching its sock_ops program, if it refused to.
    pub fn refused(&self) -> Result<Option<String>> {
        Ok(self.stats()?.refused)
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its pin directory.
    pub fn pin_dir(&self) -> &Path {
        &self.pin_dir
    }

    /// What it wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.text()
    }

    /// `bypass-agent status --json --pin-dir <its pin dir>`, by its own binary (another
    /// build's status may not read this one's pins).
    pub fn status(&self) -> Result<serde_json::Value> {
        let out = status_output_of(&self.bin, &["status", "--json", "--pin-dir"], &self.pin_dir)?;
        serde_json::from_slice(&out).context("parse bypass-agent status --json")
    }

    /// [`Agent::status`], typed.
    pub fn stats(&self) -> Result<AgentStatus> {
        Ok(serde_json::from_value(self.status()?)?)
    }

    /// `bypass-agent status --pin-dir <its pin dir>` (the text form).
    pub fn status_text(&self) -> Result<String> {
        let out = status_output_of(&self.bin, &["status", "--pin-dir"], &self.pin_dir)?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    /// SIGTERM, then waits for the exit.
    pub fn stop(&mut self) -> Result<AgentExit> {
        if self.running {
            // Our own child, not yet reaped: the pid is still its own.
            let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM);
        }
        let sent = Instant::now();
        let status = loop {
            if let Some(st) = self.child.try_wait().context("wait for the agent")? {
                break st;
            }
            if sent.elapsed() > STOP_TIMEOUT {
                let threads = thread_stacks(self.child.id());
                self.kill();
                bail!(
                    "bypass-agent did not exit within {STOP_TIMEOUT:?} of SIGTERM; killed it. \
                     Its threads then:\n{threads}\nIts log:\n{}",
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        eprintln!(
            "testbed: bypass-agent exited {:?} after SIGTERM",
            sent.elapsed()
        );
        self.running = false;
        if let Some(h) = self.stderr_reader.take() {
            let _ = h.join();
        }
        Ok(AgentExit {
            status,
            stderr: self.stderr(),
        })
    }

    /// [`Agent::stop`], and an error naming `who` unless it exited with success.
    pub fn stop_cleanly(&mut self, who: &str) -> Result<AgentExit> {
        let exit = self.stop()?;
        ensure!(
            exit.status.success(),
            "{who} exit {}: {}",
            exit.status,
            exit.stderr
        );
        Ok(exit)
    }

    fn kill(&mut self) {
        if self.running {
            let _ = self.child.kill();
            let _ = self.child.wait();
            self.running = false;
        }
    }
}

/// Each thread of process `pid`: its name, state, and kernel stack (where a stop that
/// hangs waits).
fn thread_stacks(pid: u32) -> String {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return format!("(no /proc/{pid}/task)");
    };
    let mut out = String::new();
    for t in tasks.filter_map(Result::ok) {
        let dir = t.path();
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
        let stat = read("stat");
        // The state is the field after the name's closing parenthesis.
        let state = stat.rsplit(") ").next().and_then(|r| r.split(' ').next());
        out += &format!(
            "{} {} {}\n{}",
            t.file_name().to_string_lossy(),
            read("comm").trim(),
            state.unwrap_or("?"),
            read("stack")
        );
    }
    out
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
        if let Err(e) = remove_pins(&self.pin_dir) {
            eprintln!("testbed: cleanup: {e:#}");
        }
    }
}

/// What `bypass-agent probe` finds on this kernel.
pub type KernelProbe = bypass_common::status::KernelProbe;

/// `bypass-agent probe --json`: whether this kernel has the read guard, so whether the
/// agent bypasses on it without `--allow-unguarded`.
pub fn kernel_probe() -> Result<KernelProbe> {
    let out = run_agent(&["probe", "--json"], crate::steps::NET)?;
    ensure!(
        out.status.success(),
        "bypass-agent probe failed: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "parse bypass-agent probe --json: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// `bypass-agent status --json --pin-dir DIR`, parsed.
pub fn status_json(pin_dir: &Path) -> Result<serde_json::Value> {
    let out = status_output(&["status", "--json", "--pin-dir"], pin_dir)?;
    serde_json::from_slice(&out).context("parse bypass-agent status --json")
}

/// The stdout of `bypass-agent ARGS PIN_DIR`, a `status` command; fails with its stderr.
fn status_output(args: &[&str], pin_dir: &Path) -> Result<Vec<u8>> {
    status_output_of(&agent_bin(), args, pin_dir)
}

/// [`status_output`] by the agent binary `bin`.
fn status_output_of(bin: &Path, args: &[&str], pin_dir: &Path) -> Result<Vec<u8>> {
    let out = Command::new(bin)
        .args(args)
        .arg(pin_dir)
        .output()
        .context("run bypass-agent status")?;
    if !out.status.success() {
        bail!(
            "bypass-agent status failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out.stdout)
}

/// Removes a pin directory a killed agent left: links first (that detaches), then
/// programs and maps, then the directories.
pub fn remove_pins(pin_dir: &Path) -> Result<()> {
    if !pin_dir.exists() {
        return Ok(());
    }
    for sub in ["links", "progs", "maps"] {
        let dir = pin_dir.join(sub);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            std::fs::remove_file(e.path())
                .with_context(|| format!("remove {}", e.path().display()))?;
        }
        std::fs::remove_dir(&dir).with_context(|| format!("remove {}", dir.display()))?;
    }
    std::fs::remove_dir(pin_dir).with_context(|| format!("remove {}", pin_dir.display()))
}

/// `GET path` on the agent's metrics server (`127.0.0.1:port`): status code and body.
/// Fails past [`HTTP_TIMEOUT`].
pub fn http_get(port: u16, path: &str) -> Result<(u16, String)> {
    http_get_at(SocketAddr::from((Ipv4Addr::LOCALHOST, port)), path)
}

/// `GET path` on a metrics server at `addr` (the agent of `deploy/` listens on the node's
/// address): status code and body. Fails past [`HTTP_TIMEOUT`].
pub fn http_get_at(addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    xtask_lib::http::get(addr, path, HTTP_TIMEOUT)
}

/// The value of one series on `/metrics`, e.g. `bypass_reconcile_errors_total{kind="watch"}`.
pub fn metric(port: u16, series: &str) -> Result<f64> {
    metric_at(SocketAddr::from((Ipv4Addr::LOCALHOST, port)), series)
}

/// [`metric`] on a metrics server at `addr`.
pub fn metric_at(addr: SocketAddr, series: &str) -> Result<f64> {
    let (code, body) = http_get_at(addr, "/metrics")?;
    ensure!(code == 200, "/metrics answered {code}");
    body.lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .and_then(|rest| rest.strip_prefix(' '))
        })
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("no series {series} in /metrics:\n{body}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_args() {
        let o = AgentOpts {
            pod_cidrs: vec!["10.0.0.0/24".into()],
            pod_ips: vec!["fd00::1".into()],
            cgroup: "/cg".into(),
            pin_dir: "/sys/fs/bpf/bt-x".into(),
            extra_args: vec!["--max-sockets".into(), "8".into()],
            env: Vec::new(),
            allow_unguarded: false,
            binary: None,
        };
        assert_eq!(
            o.args().join(" "),
            "run --pod-cidr 10.0.0.0/24 --pod-ip fd00::1 --cgroup /cg --pin-dir /sys/fs/bpf/bt-x --max-sockets 8"
        );
    }

    #[test]
    fn status_json_parses() {
        let v = serde_json::json!({
            "attached": true, "sockets": 2, "sockets_inserted": 2, "sockets_skipped": 0,
            "insert_failures": 0, "redirected_messages": 5, "redirected_bytes": 100,
            "passed_messages": 0, "passed_bytes": 0, "pod_cidrs": ["10.0.0.0/24"],
            "pod_addresses": [], "pin_dir": "/x"
        });
        let s: AgentStatus = serde_json::from_value(v).unwrap();
        assert!(s.attached);
        assert_eq!(s.counters.redirected_bytes, 100);
    }
}
