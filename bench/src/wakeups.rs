//! Research probe: why small-message streams are slower through the bypass. A TCP
//! stream between the pods (our own sender and receiver, pinned), with the bypass
//! attached and detached; each side reports from `getrusage` how often it slept
//! (voluntary context switches: each one is a wake-up the other side paid for) and
//! its CPU time, per message. `bypass-bench wakeups` runs it; `stream-send` and
//! `stream-recv` are its two processes.

use std::{
    io::{ErrorKind, Read as _, Write as _},
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use serde::{Deserialize, Serialize};
use testbed::{Agent, TwoPods, spawn_in_on_cpus};

use crate::{model::Placement, report::size_label};

/// What one side of a stream reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SideReport {
    /// Bytes moved.
    pub bytes: u64,
    /// read/write calls that moved data.
    pub calls: u64,
    /// Voluntary context switches (the process slept and had to be woken).
    pub nvcsw: u64,
    /// Involuntary context switches (preempted).
    pub nivcsw: u64,
    /// User + system CPU, ns.
    pub cpu_ns: u64,
    /// Wall time of the transfer, ns.
    pub wall_ns: u64,
}

fn rusage() -> (u64, u64, u64) {
    use nix::sys::{
        resource::{UsageWho, getrusage},
        time::{TimeVal, TimeValLike as _},
    };
    let Ok(ru) = getrusage(UsageWho::RUSAGE_SELF) else {
        return (0, 0, 0);
    };
    let ns = |t: TimeVal| u64::try_from(t.num_nanoseconds()).unwrap_or(0);
    (
        u64::try_from(ru.voluntary_context_switches()).unwrap_or(0),
        u64::try_from(ru.involuntary_context_switches()).unwrap_or(0),
        ns(ru.user_time()) + ns(ru.system_time()),
    )
}

fn delta(before: (u64, u64, u64), bytes: u64, calls: u64, wall: Duration) -> SideReport {
    let after = rusage();
    SideReport {
        bytes,
        calls,
        nvcsw: after.0 - before.0,
        nivcsw: after.1 - before.1,
        cpu_ns: after.2 - before.2,
        wall_ns: wall.as_nanos() as u64,
    }
}

/// The receiver: accepts one connection on `listen`, reads at most `size` bytes per
/// read until EOF (as qperf's `tcp_bw` server does), prints its report as JSON.
pub fn recv(listen: SocketAddr, size: u32) -> Result<SideReport> {
    let l = TcpListener::bind(listen).with_context(|| format!("listen on {listen}"))?;
    let (mut s, _) = l.accept().context("accept")?;
    let mut buf = vec![0u8; size as usize];
    let (mut bytes, mut calls) = (0u64, 0u64);
    let before = rusage();
    let start = Instant::now();
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                bytes += n as u64;
                calls += 1;
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(delta(before, bytes, calls, start.elapsed()))
}

/// The sender: connects to `to`, writes `size`-byte messages for `secs` seconds, shuts
/// down its side, prints its report as JSON.
pub fn send(to: SocketAddr, size: u32, secs: f64) -> Result<SideReport> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut s = loop {
        match TcpStream::connect(to) {
            Ok(s) => break s,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e).with_context(|| format!("connect to {to}")),
        }
    };
    let buf = vec![0u8; size as usize];
    let duration = Duration::from_secs_f64(secs);
    let mut calls = 0u64;
    let before = rusage();
    let start = Instant::now();
    while start.elapsed() < duration {
        s.write_all(&buf)?;
        calls += 1;
    }
    let wall = start.elapsed();
    let report = delta(before, calls * u64::from(size), calls, wall);
    s.shutdown(Shutdown::Write)?;
    Ok(report)
}

/// One measured stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WakeupSample {
    /// `bypass` or `default`.
    pub path: String,
    /// Placement name.
    pub placement: String,
    /// Message size.
    pub size: u32,
    /// The sender's report.
    pub sender: SideReport,
    /// The receiver's report.
    pub receiver: SideReport,
}

impl WakeupSample {
    /// Messages per second sent.
    pub fn msgs_per_sec(&self) -> f64 {
        self.sender.calls as f64 / (self.sender.wall_ns as f64 / 1e9)
    }

    /// Receiver sleeps per 1000 messages.
    pub fn recv_sleeps_per_kmsg(&self) -> f64 {
        self.receiver.nvcsw as f64 * 1000.0 / self.sender.calls.max(1) as f64
    }

    /// Sender sleeps per 1000 messages.
    pub fn send_sleeps_per_kmsg(&self) -> f64 {
        self.sender.nvcsw as f64 * 1000.0 / self.sender.calls.max(1) as f64
    }

    /// Messages per receiver read.
    pub fn msgs_per_read(&self) -> f64 {
        self.sender.calls as f64 / self.receiver.calls.max(1) as f64
    }

    /// Sender + receiver CPU per message, ns.
    pub fn cpu_ns_per_msg(&self) -> f64 {
        (self.sender.cpu_ns + self.receiver.cpu_ns) as f64 / self.sender.calls.max(1) as f64
    }
}

fn side(mut cmd: Command, pods: &TwoPods, in_b: bool, cpu: usize) -> Result<testbed::PodChild> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let pod = if in_b { &pods.b } else { &pods.a };
    spawn_in_on_cpus(pod, cmd, &[cpu])
}

fn parse_side(child: testbed::PodChild, secs: f64) -> Result<SideReport> {
    let out = child.wait_output(Duration::from_secs_f64(secs + 20.0))?;
    if !out.status.success() {
        bail!(
            "stream side failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    serde_json::from_slice(&out.stdout).context("parse a stream side's report")
}

/// Runs the probe: for each rep, placement and size, a stream detached and attached.
pub fn run(
    sizes: &[u32],
    placements: &[Placement],
    secs: f64,
    reps: u32,
) -> Result<Vec<WakeupSample>> {
    let exe = std::env::current_exe().context("find our own executable")?;
    let pods = TwoPods::new()?;
    let mut samples = Vec::new();
    let mut port = 21000u16;
    for _ in 0..reps {
        for p in placements {
            for path in ["default", "bypass"] {
                let agent = if path == "bypass" {
                    Some(Agent::start(&pods.agent_opts())?)
                } else {
                    None
                };
                for &size in sizes {
                    port += 1;
                    let addr = pods.b.v4_addr(port);
                    let mut r = Command::new(&exe);
                    r.args(["stream-recv", "--listen", &addr.to_string(), "--size"])
                        .arg(size.to_string());
                    let receiver = side(r, &pods, true, p.server_cpu)?;
                    std::thread::sleep(Duration::from_millis(50));
                    let mut s = Command::new(&exe);
                    s.args(["stream-send", "--connect", &addr.to_string(), "--size"])
                        .arg(size.to_string())
                        .args(["--secs", &secs.to_string()]);
                    let sender = side(s, &pods, false, p.client_cpu)?;
                    let sender = parse_side(sender, secs)?;
                    let receiver = parse_side(receiver, secs)?;
                    let sample = WakeupSample {
                        path: path.into(),
                        placement: p.name.clone(),
                        size,
                        sender,
                        receiver,
                    };
                    eprintln!(
                        "wakeups: {} {path:<7} {:>5} B: {:>9.0} msg/s, receiver sleeps {:>6.1}/1000 msg, {:>6.1} msg/read, sender sleeps {:>6.1}/1000 msg, CPU {:>6.0} ns/msg",
                        p.name,
                        size,
                        sample.msgs_per_sec(),
                        sample.recv_sleeps_per_kmsg(),
                        sample.msgs_per_read(),
                        sample.send_sleeps_per_kmsg(),
                        sample.cpu_ns_per_msg()
                    );
                    samples.push(sample);
                }
                if let Some(mut a) = agent {
                    a.stop()?;
                }
            }
        }
    }
    Ok(samples)
}

/// The probe's table: one row per placement, size and path (medians over reps).
pub fn render(samples: &[WakeupSample], placements: &[Placement], sizes: &[u32]) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:<10} {:>5} {:<8} {:>11} {:>14} {:>9} {:>14} {:>11}",
        "placement",
        "size",
        "path",
        "msg/s",
        "rx sleeps/1k",
        "msg/read",
        "tx sleeps/1k",
        "CPU ns/msg"
    );
    let med = |v: Vec<f64>| crate::stats::summarize(&v).map_or(f64::NAN, |s| s.median);
    for p in placements {
        for &size in sizes {
            for path in ["bypass", "default"] {
                let s: Vec<&WakeupSample> = samples
                    .iter()
                    .filter(|s| s.placement == p.name && s.size == size && s.path == path)
                    .collect();
                if s.is_empty() {
                    continue;
                }
                let _ = writeln!(
                    o,
                    "{:<10} {:>5} {:<8} {:>11.0} {:>14.1} {:>9.1} {:>14.1} {:>11.0}",
                    p.name,
                    size_label(size),
                    path,
                    med(s.iter().map(|x| x.msgs_per_sec()).collect()),
                    med(s.iter().map(|x| x.recv_sleeps_per_kmsg()).collect()),
                    med(s.iter().map(|x| x.msgs_per_read()).collect()),
                    med(s.iter().map(|x| x.send_sleeps_per_kmsg()).collect()),
                    med(s.iter().map(|x| x.cpu_ns_per_msg()).collect()),
                );
            }
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_stream_reports_both_sides() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        drop(l);
        let rx = std::thread::spawn(move || recv(addr, 64).unwrap());
        let tx = send(addr, 64, 0.05).unwrap();
        let rx = rx.join().unwrap();
        assert_eq!(tx.bytes, rx.bytes);
        assert!(tx.calls > 0 && rx.calls > 0);
        let s = WakeupSample {
            path: "default".into(),
            placement: "x".into(),
            size: 64,
            sender: tx,
            receiver: rx,
        };
        assert!(s.msgs_per_sec() > 0.0);
        assert!(
            render(
                &[s],
                &[Placement {
                    name: "x".into(),
                    client_cpu: 0,
                    server_cpu: 0
                }],
                &[64]
            )
            .contains("default")
        );
    }
}
