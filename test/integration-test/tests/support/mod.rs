//! Helpers shared by the privileged tests: one measured exchange between the two pods
//! (`exchange`), the probe (`bypass-test-tool probe`: one TCP behaviour, observed by the
//! application) run inside the pods, an agent with extra flags, and counter deltas.

pub mod exchange;

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use bypass_common::Stat;
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};
use serde_json::Value;
use testbed::{Agent, AgentOpts, AgentStatus, Place, PodChild, TwoPods, names, spawn_in};

/// Ends the test, passing, when [`testbed::preflight`] (or the check given) says this machine cannot run a
/// privileged test (never under `CI=true`: there the missing capability or tool is the
/// error).
macro_rules! privileged {
    () => {
        crate::support::privileged!(testbed::preflight)
    };
    // With a stricter check, such as `testbed::require::preflight_iptables`.
    ($check:path) => {
        if !$check(crate::support::test_name!())? {
            return Ok(());
        }
    };
}
pub(crate) use privileged;

/// The enclosing test's name as the harness lists it (`module::test`), so that no test
/// writes its own name twice.
macro_rules! test_name {
    () => {{
        fn here() {}
        let path = std::any::type_name_of_val(&here);
        let path = path.strip_suffix("::here").unwrap_or(path);
        // Without the test binary's crate name.
        path.split_once("::").map_or(path, |(_, rest)| rest)
    }};
}
pub(crate) use test_name;

/// The prefix of everything these tests create (namespaces, bridge, cgroups, pins), so
/// they never meet another engineer's or suite's resources on a shared machine.
pub const PREFIX: &str = "br";

/// The two pods, named under [`PREFIX`].
pub fn two_pods() -> Result<TwoPods> {
    // Only the first call in a process sets it; every later one agrees.
    names::set_prefix(PREFIX).map_err(anyhow::Error::msg)?;
    TwoPods::new()
}

/// How long one probe side may run: a net for a hung probe, never a pace (kernel 6.1
/// under one TCG thread took longer than 120 s for ten thousand connections).
pub const PROBE_TIMEOUT: Duration = testbed::steps::NET;

/// The probe: the test tool's `probe` (`$BYPASS_TEST_TOOL_BIN`, else next to the test
/// binary's directory: `cargo xtask test` builds testbed's tool first).
pub fn probe_command() -> Result<Command> {
    testbed::tools::test_tool_command("probe")
}

/// A probe server in a pod.
pub struct ProbeServer {
    child: PodChild,
    _ready: testbed::steps::ReadyFile,
}

impl ProbeServer {
    /// Starts `bypass-test-tool probe server --listen ADDR <args>` in `pod` (or any
    /// [`Place`]) and waits until it listens.
    pub fn start(pod: &impl Place, listen: SocketAddr, args: &[String]) -> Result<Self> {
        let label: String = pod
            .label()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let ready = std::env::temp_dir().join(format!(
            "{}-probe-{}",
            names::resource(&names::unique_tag(), &label),
            listen.port()
        ));
        let _ = std::fs::remove_file(&ready);
        let mut cmd = probe_command()?;
        cmd.arg("server")
            .arg("--listen")
            .arg(listen.to_string())
            .arg("--ready-file")
            .arg(&ready)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let ready = testbed::steps::ReadyFile(ready);
        let child = spawn_in(pod, cmd)?.wait_ready(
            &ready.0,
            &format!("probe server on {listen}"),
            testbed::steps::NET,
        )?;
        Ok(Self {
            child,
            _ready: ready,
        })
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// Waits for its report.
    pub fn wait(self) -> Result<Value> {
        report("server", self.child.wait_output(PROBE_TIMEOUT)?)
    }
}

/// Runs `bypass-test-tool probe client --connect ADDR <args>` in `pod` to completion.
pub fn probe_client(pod: &impl Place, connect: SocketAddr, args: &[String]) -> Result<Value> {
    report(
        "client",
        spawn_probe_client(pod, connect, args)?.wait_output(PROBE_TIMEOUT)?,
    )
}

/// Starts `bypass-test-tool probe client --connect ADDR <args>` in `pod`; see
/// [`probe_report`].
pub fn spawn_probe_client(
    pod: &impl Place,
    connect: SocketAddr,
    args: &[String],
) -> Result<PodChild> {
    let mut cmd = probe_command()?;
    cmd.arg("client")
        .arg("--connect")
        .arg(connect.to_string())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    spawn_in(pod, cmd)
}

/// The report of a probe started with [`spawn_probe_client`], once it exits.
pub fn probe_report(child: PodChild) -> Result<Value> {
    report("client", child.wait_output(PROBE_TIMEOUT)?)
}

/// Server in pod b, client in pod a, same arguments; `(client, server)` reports.
pub fn probe_pair(pods: &TwoPods, port: u16, args: &[&str]) -> Result<(Value, Value)> {
    let args = to_strings(args);
    let server = ProbeServer::start(&pods.b, pods.b.v4_addr(port), &args)?;
    let client = probe_client(&pods.a, pods.b.v4_addr(port), &args)?;
    Ok((client, server.wait()?))
}

fn report(role: &str, out: std::process::Output) -> Result<Value> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "probe {role} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .with_context(|| format!("probe {role} printed no report"))?;
    serde_json::from_str(line).with_context(|| format!("probe {role} report: {line}"))
}

/// `args` as owned strings, as the probe and the agent take their arguments.
pub fn to_strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| (*s).to_owned()).collect()
}

/// A free TCP port on 127.0.0.1 (for an agent's metrics).
pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Whether the agent's status has an owner for `ip` (the address is a pod's).
pub fn owns(s: &AgentStatus, ip: std::net::IpAddr) -> bool {
    s.address_owners.iter().any(|o| o.address == ip)
}

/// A JSON field as u64 (0 when absent).
pub fn num(v: &Value, field: &str) -> u64 {
    v.get(field).and_then(Value::as_u64).unwrap_or(0)
}

/// The agent on `pods` with extra `run` flags.
pub fn agent_with(pods: &TwoPods, extra: &[&str]) -> Result<Agent> {
    let opts = AgentOpts {
        extra_args: to_strings(extra),
        ..pods.agent_opts()
    };
    Agent::start(&opts)
}

/// One pod's per-pod counters on `/metrics` (standalone: the pod is named by its lowest
/// address, with no namespace and no owner): `(bytes, connections)`, `(0, 0)` while it
/// has no series.
pub fn pod_counts(port: u16, pod: &testbed::Pod) -> Result<(u64, u64)> {
    let labels = format!("{{namespace=\"\",pod=\"{}\",owner=\"\"}}", pod.ipv4());
    let read = |name: &str| {
        testbed::agent::metric(port, &format!("{name}{labels}")).map_or(0, |v| v as u64)
    };
    Ok((
        read("bypass_pod_redirected_bytes_total"),
        read("bypass_pod_connections_total"),
    ))
}

/// Growth of a counter between two readings.
pub fn grew(before: &AgentStatus, after: &AgentStatus, f: impl Fn(&AgentStatus) -> u64) -> u64 {
    f(after).saturating_sub(f(before))
}

/// Every counter that grew between two readings, `name +n`, for messages.
pub fn growth(before: &AgentStatus, after: &AgentStatus) -> String {
    let grown: Vec<String> = Stat::ALL
        .iter()
        .filter_map(|&stat| {
            let n = grew(before, after, |s| s.counters.get(stat));
            (n > 0).then(|| format!("{} +{n}", stat.name()))
        })
        .collect();
    if grown.is_empty() {
        "no counter grew".to_owned()
    } else {
        grown.join(", ")
    }
}

/// Whether the agent's log shows `needle` within [`testbed::steps::NET`], a net (its stderr is read by a thread,
/// so a line can lag the state it reports; and a status read may show the previous
/// agent's pinned datapath attached before this agent has even loaded, which under
/// emulation takes seconds).
pub fn wait_for_log(agent: &Agent, needle: &str) -> bool {
    wait_for_log_line(agent, &[needle]).is_some()
}

/// [`wait_for_log`], failing with `what` and the agent's log when `needle` never came.
pub fn ensure_logged(agent: &Agent, needle: &str, what: &str) -> Result<()> {
    ensure!(wait_for_log(agent, needle), "{what}: {}", agent.stderr());
    Ok(())
}

/// [`wait_for_log`] for a line that holds each of `needles`: the first such line.
pub fn wait_for_log_line(agent: &Agent, needles: &[&str]) -> Option<String> {
    let deadline = Instant::now() + testbed::steps::NET;
    while Instant::now() < deadline {
        if let Some(line) = agent
            .stderr()
            .lines()
            .find(|l| needles.iter().all(|n| l.contains(n)))
        {
            return Some(line.to_owned());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// A held connection cut after its first `chunk` (status `mid`): the server read both
/// chunks, byte-exact, and the second took TCP (nothing more redirected, a cut seen).
/// How much of it sk_msg saw and passed before the socket left the SockHash is the
/// kernel's pace (on 6.1 under emulation, 589,824 of 1 MiB), so it is not counted.
pub fn ensure_second_chunk_by_tcp(
    what: &str,
    chunk: u64,
    mid: &AgentStatus,
    after: &AgentStatus,
    server: &Value,
    client: &Value,
) -> Result<()> {
    ensure!(
        server["ok"] == true && num(server, "received") == 2 * chunk,
        "the server lost or reordered bytes: {server} (client {client})"
    );
    ensure!(
        grew(mid, after, |s| s.counters.redirected_bytes) == 0
            && grew(mid, after, |s| s.counters.cut_seen) >= 1,
        "{what} was not moved to TCP: {mid:?} -> {after:?}"
    );
    Ok(())
}

/// SIGKILL to a process we started, then waits until it is gone (a zombie counts: its
/// files, and so the agent's pin directory lock, are released at exit).
pub fn sigkill(pid: u32) -> Result<()> {
    let child = Pid::from_raw(i32::try_from(pid).context("pid out of range")?);
    kill(child, Signal::SIGKILL).context("kill -9")?;
    let deadline = Instant::now() + testbed::steps::NET;
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // The state is the field after the parenthesised command name.
        let state = stat
            .rsplit(')')
            .next()
            .and_then(|r| r.split_whitespace().next());
        if matches!(state, None | Some("Z" | "X")) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "pid {pid} still alive {:?} after SIGKILL",
                testbed::steps::NET
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Files a test uses to step probes, in a directory removed on drop.
pub struct Steps {
    dir: PathBuf,
}

impl Steps {
    pub fn new(pods: &TwoPods, what: &str) -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("{}-{what}", pods.tag()));
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        Ok(Self { dir })
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    pub fn arg(&self, name: &str) -> String {
        self.file(name).display().to_string()
    }

    /// Lets every user create step files here (mode 1777, as /tmp): for a tool that
    /// runs as an unprivileged uid outside its own user namespace.
    pub fn open_to_all(&self) -> Result<()> {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o1777))
            .with_context(|| format!("chmod {}", self.dir.display()))
    }

    pub fn touch(&self, name: &str) -> Result<()> {
        std::fs::write(self.file(name), b"").context("touch")
    }

    pub fn wait(&self, name: &str) -> Result<()> {
        wait_file(&self.file(name))
    }
}

impl Drop for Steps {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Waits until `p` exists, at most [`testbed::steps::NET`].
pub fn wait_file(p: &Path) -> Result<()> {
    testbed::steps::wait_file(p, testbed::steps::NET)
}

/// A `hold` connection from pod a to pod b on `port`, its first chunk sent and
/// redirected: the server reads and verifies everything; the client has sent `chunk`
/// bytes (marked `sent` in `steps`) and sends `chunk` more once `more` is touched.
/// Returns the server, the client, and the agent's status once the first chunk was
/// redirected.
pub struct HoldPair {
    pub server: ProbeServer,
    pub client: PodChild,
    pub redirected: AgentStatus,
}

/// Waits until a connection started after `before` is paired, then lets its client
/// (started with `--wait-file` `paired` of `steps`) send. A first send before the
/// server's end is in the SockHash takes TCP, and, the server not reading, so does
/// everything after it (the order rule); in an emulated guest under load the server's
/// end can be inserted after the client's first write.
pub fn wait_paired(agent: &Agent, before: &AgentStatus, steps: &Steps) -> Result<()> {
    wait_paired_by(agent, before, steps, |s| s.counters.paired_pod)
}

/// [`wait_paired`] for a pairing that `paired` counts (pod to pod, loopback, ...).
pub fn wait_paired_by(
    agent: &Agent,
    before: &AgentStatus,
    steps: &Steps,
    paired: fn(&AgentStatus) -> u64,
) -> Result<()> {
    agent.wait_for(testbed::steps::STEP_WAIT, "the connection paired", |s| {
        grew(before, s, paired) >= 1
    })?;
    steps.touch("paired")
}

pub fn hold_pair(
    pods: &TwoPods,
    agent: &Agent,
    steps: &Steps,
    port: u16,
    chunk: u64,
) -> Result<HoldPair> {
    let to = pods.b.v4_addr(port);
    hold_in(&pods.a, &pods.b, to, agent, steps, chunk, |s| {
        s.counters.paired_pod
    })
}

/// A loopback hold in pod b on 127.0.0.1:`port` ([`hold_in`]), its first `chunk`
/// redirected.
pub fn loopback_hold(
    pods: &TwoPods,
    agent: &Agent,
    steps: &Steps,
    port: u16,
    chunk: u64,
) -> Result<HoldPair> {
    let to = SocketAddr::from(([127, 0, 0, 1], port));
    hold_in(&pods.b, &pods.b, to, agent, steps, chunk, |s| {
        s.counters.paired_loopback
    })
}

/// [`loopback_hold`], then the datapath's record of pod namespaces emptied, as pod churn
/// evicts from it: a cut can find pod b's namespace only by its owner.
pub fn loopback_hold_forgotten(
    pods: &TwoPods,
    agent: &Agent,
    steps: &Steps,
    port: u16,
    chunk: u64,
) -> Result<HoldPair> {
    use bypass_common::{IpKey, names::MAP_POD_NETNS};
    let hold = loopback_hold(pods, agent, steps, port, chunk)?;
    let forgotten = testbed::mapkeys::clear_pinned_hash::<u64, IpKey>(
        &agent.pin_dir().join("maps").join(MAP_POD_NETNS),
    )?;
    ensure!(forgotten >= 1, "{MAP_POD_NETNS} had no entry to lose");
    Ok(hold)
}

/// [`hold_pair`] from `client` to a server in `server` on `to`, paired as `paired`
/// counts (a loopback hold: both in one pod, `to` on 127.0.0.1).
pub fn hold_in(
    client: &impl Place,
    server: &impl Place,
    to: SocketAddr,
    agent: &Agent,
    steps: &Steps,
    chunk: u64,
    paired: fn(&AgentStatus) -> u64,
) -> Result<HoldPair> {
    let before = agent.stats()?;
    let hold = ["--case".to_owned(), "hold".to_owned()];
    let server = ProbeServer::start(server, to, &hold)?;
    let mut args = hold.to_vec();
    args.extend([
        "--bytes".to_owned(),
        chunk.to_string(),
        "--wait-file".to_owned(),
        steps.arg("paired"),
        "--mark-file".to_owned(),
        steps.arg("sent"),
        "--go-file".to_owned(),
        steps.arg("more"),
    ]);
    let client = spawn_probe_client(client, to, &args)?;
    wait_paired_by(agent, &before, steps, paired)?;
    steps.wait("sent")?;
    let redirected = agent.wait_for(testbed::steps::NET, "the first chunk redirected", |s| {
        grew(&before, s, |s| s.counters.redirected_bytes) >= chunk
    })?;
    Ok(HoldPair {
        server,
        client,
        redirected,
    })
}

/// Waits until `f` of the agent's status reaches `target`, for as long as it keeps
/// growing: fails once it stood still for [`testbed::steps::NET`], or `child` exited.
pub fn progress(
    agent: &testbed::Agent,
    child: &mut testbed::spawn::PodChild,
    what: &str,
    target: u64,
    f: impl Fn(&testbed::AgentStatus) -> u64,
) -> Result<()> {
    let mut last = 0;
    let mut moved = std::time::Instant::now();
    loop {
        let v = f(&agent.stats()?);
        if v >= target {
            return Ok(());
        }
        if v > last {
            last = v;
            moved = std::time::Instant::now();
        }
        anyhow::ensure!(
            moved.elapsed() < testbed::steps::NET,
            "{what}: {v} of {target}, none more for {:?}",
            testbed::steps::NET
        );
        if let Some(status) = child.try_wait()? {
            anyhow::bail!("{what}: {v} of {target}, and the process it waits on exited ({status})");
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}
