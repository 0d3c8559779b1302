//! `bypass-test-tool smoke`: the agent's smoke test on a machine with nothing but the
//! kernel, the agent and this binary (a VM of another architecture, where the host's `ip`
//! does not run). Two "pods" — network namespaces joined by a veth pair, made by this
//! program itself — each in its own child cgroup of the cgroup the agent attaches to; the
//! testbed's peer (this binary, `bypass-test-tool peer ...`) moves `--bytes` each way,
//! every byte checked; prints one JSON line: both reports, the agent's status after, and
//! the growth of its redirected bytes. Exits 0 only when the bytes were exact and the
//! growth is above zero. Needs root, a cgroup2 mount and `BYPASS_AGENT_BIN`.

mod iface;
mod netlink;

use std::{
    fs::File,
    net::{Ipv4Addr, SocketAddr},
    os::fd::AsRawFd as _,
    path::PathBuf,
    process::{Command, ExitCode, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use clap::Args;
use serde_json::{Value, json};
use testbed::{Agent, AgentOpts, CgroupGuard, Place, PodChild, Report, spawn_in};

/// Where pod `a` and pod `b` live, and the interface name in each.
const POD_CIDR: &str = "10.250.0.0/24";
const ADDR_A: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 1);
const ADDR_B: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 2);
const IFNAME: &str = "eth0";
const PORT: u16 = 5000;
/// How long one transfer may take under emulation.
const TRANSFER_TIMEOUT: Duration = testbed::steps::NET;
/// The start of the names of the run's cgroup, pin directory and ready file, followed by
/// this process's id (results/kernels/ records the pin directory).
const NAME: &str = "bypass-smoke";

/// The agent's smoke test: two namespaces, a checked transfer each way, one JSON line.
#[derive(Debug, Args)]
pub struct Cli {
    /// Bytes each way.
    #[arg(long, default_value_t = 4 << 20)]
    bytes: u64,
}

/// One pod: its cgroup (below the agent's) and its namespace.
struct Pod {
    // Drop order: processes killed, then the namespace.
    cgroup: CgroupGuard,
    netns: File,
    label: String,
}

impl Place for Pod {
    fn label(&self) -> &str {
        &self.label
    }

    fn cgroup(&self) -> &CgroupGuard {
        &self.cgroup
    }

    fn netns_path(&self) -> Option<PathBuf> {
        Some(iface::path_of(&self.netns))
    }
}

/// Runs the smoke test and prints its verdict; exits 0 only when it passed.
pub fn main(cli: Cli) -> ExitCode {
    match run(&cli) {
        Ok(verdict) => {
            println!("{verdict}");
            if verdict["pass"] == true {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            println!("{}", json!({ "pass": false, "error": format!("{e:#}") }));
            ExitCode::FAILURE
        }
    }
}

fn run(cli: &Cli) -> Result<Value> {
    let tag = std::process::id();
    let parent = CgroupGuard::create(&format!("{NAME}-{tag}"))?;
    let a = pod(&parent, "a")?;
    let b = pod(&parent, "b")?;
    netlink::add_veth(IFNAME, a.netns.as_raw_fd(), IFNAME, b.netns.as_raw_fd())?;
    iface::configure(&a.netns, IFNAME, ADDR_A, 24).context("pod a")?;
    iface::configure(&b.netns, IFNAME, ADDR_B, 24).context("pod b")?;
    let mut agent = Agent::start(&AgentOpts {
        pod_cidrs: vec![POD_CIDR.to_owned()],
        cgroup: parent.path().to_path_buf(),
        pin_dir: PathBuf::from(format!("/sys/fs/bpf/{NAME}-{tag}")),
        allow_unguarded: true,
        ..AgentOpts::default()
    })?;
    let before = agent.stats()?.counters.redirected_bytes;
    let (client, server) = transfer(&a, &b, cli.bytes)?;
    let status = agent.status()?;
    let after = agent.stats()?.counters.redirected_bytes;
    let exit = agent.stop()?;
    let exact = client.ok
        && server.ok
        && client.bytes_sent == cli.bytes
        && client.bytes_received == cli.bytes
        && server.bytes_received == cli.bytes
        && server.bytes_sent == cli.bytes;
    let grew = after.saturating_sub(before);
    let warnings: Vec<&str> = exit
        .stderr
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .collect();
    Ok(json!({
        "pass": exact && grew > 0 && exit.status.success(),
        "bytes": cli.bytes,
        "exact": exact,
        "redirected_bytes_before": before,
        "redirected_bytes_after": after,
        "redirected_bytes_grew": grew,
        "client": client,
        "server": server,
        "status": status,
        "agent_exit": exit.status.code(),
        "agent_warnings": warnings,
    }))
}

/// A pod: a child cgroup of `parent` and a fresh namespace.
fn pod(parent: &CgroupGuard, label: &str) -> Result<Pod> {
    Ok(Pod {
        cgroup: parent.child(&format!("pod-{label}"))?,
        netns: iface::new_netns()?,
        label: format!("pod {label}"),
    })
}

/// This binary as the testbed's peer (its `peer` subcommand).
fn peer() -> Result<Command> {
    let mut cmd = Command::new(std::env::current_exe().context("find this executable")?);
    cmd.arg("peer")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    Ok(cmd)
}

/// A server in `b`, a client in `a`, `bytes` each way; their reports.
fn transfer(a: &Pod, b: &Pod, bytes: u64) -> Result<(Report, Report)> {
    let listen = SocketAddr::from((ADDR_B, PORT));
    let ready = std::env::temp_dir().join(format!("{NAME}-{}-ready", std::process::id()));
    let _ = std::fs::remove_file(&ready);
    let mut cmd = peer()?;
    cmd.args([
        "server",
        "--listen",
        &listen.to_string(),
        "--connections",
        "1",
    ])
    .arg("--ready-file")
    .arg(&ready);
    let mut server = spawn_in(b, cmd)?;
    let deadline = Instant::now() + testbed::steps::NET;
    while !ready.exists() {
        if server.try_wait()?.is_some() || Instant::now() > deadline {
            let out = server.wait_output(Duration::from_secs(1))?;
            bail!(
                "the server did not listen: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut cmd = peer()?;
    cmd.args(["client", "--connect", &listen.to_string()])
        .args(testbed::ClientArgs::bulk(bytes).args());
    let client = report("client", spawn_in(a, cmd)?)?;
    let server = report("server", server)?;
    let _ = std::fs::remove_file(&ready);
    Ok((client, server))
}

/// The last JSON line of a peer's stdout.
fn report(role: &str, child: PodChild) -> Result<Report> {
    let out = child.wait_output(TRANSFER_TIMEOUT)?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let Some(line) = stdout.lines().rev().find(|l| l.starts_with('{')) else {
        bail!(
            "the {role} exited ({}) without a report: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    };
    serde_json::from_str(line).with_context(|| format!("the {role}'s report: {line}"))
}
