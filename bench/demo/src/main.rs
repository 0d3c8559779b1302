//! `bypass-demo`: the bypass at work on this machine. Two pods on a bridge, the agent
//! attached to their cgroup; a bulk stream and a ping-pong between them with the bypass
//! and again with the agent stopped (the normal TCP path), both ends on one CPU and
//! then on two (a cross-CPU wake-up costs tens of µs on a small VM and can hide the
//! gain); a table of what moved where and how fast, and the agent's status. Everything
//! it creates is removed on exit.
//!
//! `bypass-demo peer ...` is `bypass-test-tool peer ...`: the demo starts itself as its
//! peers.

use std::{process::ExitCode, time::Duration};

use anyhow::{Context as _, Result, bail};
use clap::Parser;
use nix::{
    sched::{CpuSet, sched_getaffinity},
    unistd::Pid,
};
use testbed::{
    Agent, ClientArgs, PeerServer, Report, ServerArgs, TwoPods,
    peer::parse_size,
    pod_peers::{run_client, set_peer_program},
    require,
};

/// Show the same-node TCP bypass: throughput and round trips with and without it.
#[derive(Debug, Parser)]
#[command(name = "bypass-demo", about)]
struct Cli {
    /// Bytes in the bulk stream from pod a to pod b (K, M, G suffixes).
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    size: u64,
    /// Bytes per write in the stream.
    #[arg(long, default_value = "64K", value_parser = parse_size)]
    write_size: u64,
    /// Round trips in the ping-pong.
    #[arg(long, default_value_t = 10_000)]
    rounds: u64,
    /// Message size in the ping-pong.
    #[arg(long, default_value = "64", value_parser = parse_size)]
    msg_size: u64,
    /// CPU for the client in pod a; with --server-cpu, runs only that placement
    /// [default: same-CPU on the first CPU this process may use, then cross-CPU with
    /// the server on the second].
    #[arg(long, requires = "server_cpu")]
    client_cpu: Option<usize>,
    /// CPU for the server in pod b (see --client-cpu).
    #[arg(long, requires = "client_cpu")]
    server_cpu: Option<usize>,
}

/// Where the two ends run.
struct Placement {
    name: &'static str,
    client_cpu: usize,
    server_cpu: usize,
}

/// One path's results.
struct PathRun {
    stream: Report,
    stream_wire: u64,
    stream_redirected: Option<u64>,
    pingpong: Report,
    pingpong_wire: u64,
}

impl PathRun {
    fn ok(&self) -> bool {
        self.stream.ok && self.pingpong.ok
    }
}

fn main() -> ExitCode {
    let mut args = std::env::args_os();
    if args.nth(1).is_some_and(|a| a == "peer") {
        return testbed::peer::cli::main_from(std::env::args_os().skip(1));
    }
    let cli = Cli::parse();
    match demo(&cli) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("bypass-demo: some bytes did not arrive intact (see the table)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("bypass-demo: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn demo(cli: &Cli) -> Result<bool> {
    let missing = require::missing();
    if !missing.is_empty() {
        bail!("cannot run: {}", missing.join("; "));
    }
    set_peer_program(
        std::env::current_exe().context("find my own executable")?,
        vec!["peer".to_owned()],
    );
    let placements = match (cli.client_cpu, cli.server_cpu) {
        (Some(c), Some(s)) => vec![Placement {
            name: "as asked",
            client_cpu: c,
            server_cpu: s,
        }],
        _ => {
            let (first, second) = two_cpus()?;
            let mut p = vec![Placement {
                name: "same CPU",
                client_cpu: first,
                server_cpu: first,
            }];
            if second != first {
                p.push(Placement {
                    name: "cross CPU",
                    client_cpu: first,
                    server_cpu: second,
                });
            }
            p
        }
    };
    println!("Building two pods on a bridge, each in its own netns and cgroup...");
    let pods = TwoPods::new()?;
    println!("  pod a {} / {}  (client)", pods.a.ipv4(), pods.a.ipv6());
    println!("  pod b {} / {}  (server)", pods.b.ipv4(), pods.b.ipv6());
    for p in &placements {
        println!(
            "  {}: client pinned to CPU {}, server to CPU {}",
            p.name, p.client_cpu, p.server_cpu
        );
    }
    println!("  cgroup {}", pods.cgroup().display());
    // The demo runs its own peer tools, which never splice or map their sockets: on a
    // kernel without a read guard it bypasses with --allow-unguarded, and says so.
    let probe = testbed::kernel_probe()?;
    let mut agent = Agent::start(&pods.agent_opts())?;
    println!(
        "Agent (pid {}) attached, pod CIDRs {} {}",
        agent.pid(),
        pods.pod_cidr_v4(),
        pods.pod_cidr_v6()
    );
    if probe.read_guard {
        println!(
            "  read guard: on (splice and zero-copy receive of bypassed sockets are guarded)\n"
        );
    } else {
        println!(
            "  read guard: none on this kernel (it refuses BPF trampolines), so the agent runs\n  \
             with --allow-unguarded; by default it would not bypass here (bypass-agent probe)\n"
        );
    }

    let mut port = 7001;
    let mut bypass = Vec::new();
    for p in &placements {
        println!(
            "With the bypass, {}: {} stream, {} round trips...",
            p.name,
            bytes(cli.size),
            cli.rounds
        );
        bypass.push(run_path(cli, &pods, Some(&agent), port, p)?);
        port += 1;
    }
    let status = agent.status_text()?;
    let exit = agent.stop()?;
    if !exit.status.success() {
        bail!(
            "the agent exited with {}: {}",
            exit.status,
            exit.stderr.trim()
        );
    }
    println!("Agent stopped (detached, pins removed). Same again on the normal TCP path...\n");
    let mut tcp = Vec::new();
    for p in &placements {
        println!("Normal TCP path, {}...", p.name);
        tcp.push(run_path(cli, &pods, None, port, p)?);
        port += 1;
    }
    let mut ok = true;
    for ((p, b), t) in placements.iter().zip(&bypass).zip(&tcp) {
        println!(
            "\n== {} (client CPU {}, server CPU {}) ==",
            p.name, p.client_cpu, p.server_cpu
        );
        print_table(cli, b, t);
        ok &= b.ok() && t.ok();
    }
    println!("\nAgent status just before it was stopped (bypass-agent status):");
    for line in status.lines() {
        println!("  {line}");
    }
    Ok(ok)
}

/// The bulk stream then the ping-pong, pod a to pod b.
fn run_path(
    cli: &Cli,
    pods: &TwoPods,
    agent: Option<&Agent>,
    port: u16,
    placement: &Placement,
) -> Result<PathRun> {
    let (client_cpu, server_cpu) = (placement.client_cpu, placement.server_cpu);
    let addr = pods.b.v4_addr(port);
    let server_args = ServerArgs {
        cpus: vec![server_cpu],
        ..ServerArgs::new(2)
    };
    let server = PeerServer::start_with(&pods.b, addr, &server_args)?;
    let redirected = || -> Result<Option<u64>> {
        agent
            .map(|a| a.stats().map(|s| s.counters.redirected_bytes))
            .transpose()
    };

    let stream_args = ClientArgs {
        send: cli.size,
        msg_size: usize::try_from(cli.write_size)?,
        cpus: vec![client_cpu],
        ..ClientArgs::default()
    };
    let (r0, w0) = (redirected()?, pods.wire_bytes()?);
    let stream = run_client(&pods.a, addr, &stream_args)?;
    let (r1, w1) = (redirected()?, pods.wire_bytes()?);

    let pp_args = ClientArgs {
        cpus: vec![client_cpu],
        stream_base: 1,
        ..ClientArgs::pingpong(cli.rounds, usize::try_from(cli.msg_size)?)
    };
    let pingpong = run_client(&pods.a, addr, &pp_args)?;
    let w2 = pods.wire_bytes()?;
    let served = server.wait_timeout(Duration::from_secs(60))?;
    if !served.ok {
        bail!("the server saw bad bytes: {:?}", served.failures);
    }
    Ok(PathRun {
        stream,
        stream_wire: w1.saturating_sub(w0),
        stream_redirected: r0.zip(r1).map(|(a, b)| b.saturating_sub(a)),
        pingpong,
        pingpong_wire: w2.saturating_sub(w1),
    })
}

fn print_table(cli: &Cli, bypass: &PathRun, tcp: &PathRun) {
    let row = |name: &str, a: String, b: String| println!("  {name:<28} {a:>16}   {b:>16}");
    println!("  {:<28} {:>16}   {:>16}", "", "bypass", "TCP (no agent)");
    println!("{} stream, pod a -> pod b", bytes(cli.size));
    row("throughput", gbit(&bypass.stream), gbit(&tcp.stream));
    row(
        "bytes redirected",
        bypass.stream_redirected.map_or("-".into(), bytes),
        "- (agent stopped)".into(),
    );
    row(
        "bytes on the veths",
        bytes(bypass.stream_wire),
        bytes(tcp.stream_wire),
    );
    println!("{} round trips of {} B", cli.rounds, cli.msg_size);
    row(
        "mean round trip",
        rtt(&bypass.pingpong, |r| r.mean_us),
        rtt(&tcp.pingpong, |r| r.mean_us),
    );
    row(
        "p99 round trip",
        rtt(&bypass.pingpong, |r| r.p99_us),
        rtt(&tcp.pingpong, |r| r.p99_us),
    );
    row(
        "bytes on the veths",
        bytes(bypass.pingpong_wire),
        bytes(tcp.pingpong_wire),
    );
    let verdict = |p: &PathRun| {
        if p.ok() {
            "yes".to_owned()
        } else {
            "NO".to_owned()
        }
    };
    row("every byte in order", verdict(bypass), verdict(tcp));
}

fn gbit(r: &Report) -> String {
    if r.elapsed_secs <= 0.0 {
        return "-".into();
    }
    format!(
        "{:.2} Gbit/s",
        r.bytes_sent as f64 * 8.0 / r.elapsed_secs / 1e9
    )
}

fn rtt(r: &Report, f: impl Fn(&testbed::peer::Rtt) -> f64) -> String {
    r.rtt
        .as_ref()
        .map_or("-".into(), |x| format!("{:.1} us", f(x)))
}

fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Two CPUs this process may use (the same one twice if it has only one).
fn two_cpus() -> Result<(usize, usize)> {
    let set = sched_getaffinity(Pid::from_raw(0)).context("sched_getaffinity")?;
    let cpus: Vec<usize> = (0..CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .collect();
    match cpus.as_slice() {
        [] => bail!("no CPU in my affinity mask"),
        [only] => Ok((*only, *only)),
        [a, b, ..] => Ok((*a, *b)),
    }
}
