//! Full maps: with a SockHash of 4 sockets, the connections that do not fit take the
//! normal path, byte-exact; `insert_failures` counts their connecting sockets (the
//! accepting sides, with no client in the map, are skipped); the agent warns, once per
//! interval however many fail; and once the connections close, new ones are bypassed
//! again (their address entries went with them); `status` says the failures come from a
//! full SockHash. Another program's sk_msg program loaded on the node (Merbridge's
//! `mb_msg_redir` here) is named by `status` with its owner. Near the node's TCP memory
//! limit (`net.ipv4.tcp_mem`) a writer's sends take TCP and wait as TCP's do, never
//! failing with `ENOMEM`. Leave events the ring buffer cannot hold lose no leave.

use crate::support::privileged;

use std::time::Instant;

use bypass_agent::datapath::insert_failure_warning::{POLL, WARN_EVERY};

use crate::support::{
    ProbeServer, Steps, agent_with, ensure_logged, grew, num, probe_report, progress,
    spawn_probe_client, two_pods,
};
use anyhow::{Result, ensure};
use testbed::{Agent, ClientArgs, PeerClient, PeerServer, Report, TwoPods};

/// Ten connections open at once for about 2 s, 2 MiB each way.
fn ten_at_once(pods: &TwoPods, agent: &Agent, port: u16) -> Result<(Report, Report)> {
    let args = ClientArgs {
        streams: 10,
        msg_size: 16 * 1024,
        rate: 1 << 20,
        ..ClientArgs::bulk(2 << 20)
    };
    let before = agent.status()?;
    let wire0 = pods.wire_bytes()?;
    let addr = pods.b.v4_addr(port);
    let server = PeerServer::start(&pods.b, addr, 10)?;
    let client = PeerClient::spawn(&pods.a, addr, &args)?;
    let (client, server) = (client.wait()?, server.wait()?);
    let after = agent.status()?;
    let wire = pods.wire_bytes()? - wire0;
    ensure!(client.ok && server.ok, "{client:?} {server:?}");
    ensure!(
        client.bytes_sent == 10 * args.send && server.bytes_received == 10 * args.send,
        "c2s: {client:?}"
    );
    ensure!(
        server.bytes_sent == 10 * args.recv && client.bytes_received == 10 * args.recv,
        "s2c: {server:?}"
    );
    let grew = |k: &str| num(&after, k) - num(&before, k);
    eprintln!(
        "10 connections, SockHash of 4: inserted +{}, insert_failures +{}, redirected +{} B, \
         passed +{} B, wire {wire} B",
        grew("sockets_inserted"),
        grew("insert_failures"),
        grew("redirected_bytes"),
        grew("passed_bytes")
    );
    ensure!(
        grew("sockets_inserted") <= 4,
        "more sockets inserted than fit: {after}"
    );
    // A connecting socket that does not fit is a failure; its accepting side then has no
    // client in the map and is left out (skipped), not inserted alone. An accepting side
    // whose client did fit may find the map full too (connections established faster
    // than they are accepted, as under emulation): a failure as well.
    ensure!(
        grew("sockets_inserted") + grew("insert_failures") + grew("sockets_skipped") == 20
            && grew("insert_failures") >= 8
            && grew("sockets_skipped") <= grew("insert_failures")
            && grew("insert_failures") - grew("sockets_skipped") <= grew("sockets_inserted"),
        "every socket is inserted, counted as a failure, or (the accepting side of a \
         failure) skipped: {before} -> {after}"
    );
    // At most two of the ten connections have both ends in the map: the other eight
    // (32 MiB both ways) cross the veths.
    ensure!(wire >= 32 << 20, "only {wire} B on the normal path");
    Ok((client, server))
}

#[test]
fn full_sockhash_falls_back_counts_and_warns() -> Result<()> {
    privileged!();
    let pods = two_pods()?;
    let started = Instant::now();
    let agent = agent_with(&pods, &["--max-sockets", "4"])?;
    ten_at_once(&pods, &agent, 5501)?;
    let st = agent.status()?;
    let cause = st["insert_failures_cause"].as_str().unwrap_or("");
    ensure!(
        cause.contains("SockHash full"),
        "insert failures not told as a full map: {st}"
    );
    const WARNING: &str = "sockets could not be inserted";
    ensure_logged(&agent, WARNING, "no warning about the full map")?;
    // More failures: counted each time (`ten_at_once` asserts the counter), warned at
    // most once per interval however many fail. How many intervals the run spans is
    // the machine's speed (a slower one outlasts the first): the bound is on what was
    // seen, from the agent's start, which is before its first warning. The pause lets
    // a warning the second batch wrongly caused show (the watcher polls every POLL).
    ten_at_once(&pods, &agent, 5502)?;
    std::thread::sleep(2 * POLL);
    let warnings = agent.stderr().matches(WARNING).count() as u64;
    let intervals = started.elapsed().as_secs() / WARN_EVERY.as_secs();
    ensure!(
        (1..=1 + intervals).contains(&warnings),
        "{warnings} warnings in {:?} (at most one per {WARN_EVERY:?}): {}",
        started.elapsed(),
        agent.stderr()
    );

    // Closed connections left the maps: a new one is bypassed.
    let st = agent.status()?;
    ensure!(
        num(&st, "sockets") == 0 && num(&st, "connectors") == 0 && num(&st, "links") == 0,
        "maps not empty after every connection closed: {st}"
    );
    let args = ClientArgs::bulk(8 << 20).greeted();
    let before = agent.status()?;
    let addr = pods.b.v4_addr(5503);
    let server = PeerServer::start(&pods.b, addr, 1)?;
    let client = testbed::run_client(&pods.a, addr, &args)?;
    let server = server.wait()?;
    ensure!(client.ok && server.ok, "{client:?} {server:?}");
    let after = agent.status()?;
    ensure!(
        num(&after, "sockets_inserted") - num(&before, "sockets_inserted") == 2
            && num(&after, "redirected_bytes") - num(&before, "redirected_bytes") >= 16 << 20,
        "not bypassed once there was room again: {after}"
    );
    Ok(())
}

/// Loads an sk_msg program that returns SK_PASS, named `name` (raw `bpf(2)`: the tests
/// build no BPF objects); it stays loaded while the descriptor is open.
fn load_sk_msg(name: &str) -> Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd as _;
    // mov r0, 1 (SK_PASS); exit
    let insns: [u8; 16] = [0xb7, 0, 0, 0, 1, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0];
    let license = b"GPL\0";
    // union bpf_attr for BPF_PROG_LOAD (include/uapi/linux/bpf.h).
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&16u32.to_ne_bytes()); // BPF_PROG_TYPE_SK_MSG
    attr[4..8].copy_from_slice(&2u32.to_ne_bytes());
    attr[8..16].copy_from_slice(&(insns.as_ptr() as u64).to_ne_bytes());
    attr[16..24].copy_from_slice(&(license.as_ptr() as u64).to_ne_bytes());
    let n = name.len().min(15);
    attr[48..48 + n].copy_from_slice(&name.as_bytes()[..n]);
    // Raw bpf(2): aya loads programs only from an ELF object, and this one has no ELF.
    // SAFETY: attr is a valid BPF_PROG_LOAD attribute whose pointers outlive the call.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, 5, attr.as_ptr(), attr.len()) };
    ensure!(
        fd >= 0,
        "BPF_PROG_LOAD {name}: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(i32::try_from(fd)?) })
}

#[test]
fn another_programs_sk_msg_is_named_with_its_owner() -> Result<()> {
    privileged!();
    let pods = two_pods()?;
    let agent = agent_with(&pods, &[])?;
    let before = agent.status()?;
    ensure!(
        !before.to_string().contains("mb_msg_redir"),
        "named before it was loaded: {before}"
    );
    let merbridge = load_sk_msg("mb_msg_redir")?;
    let st = agent.status()?;
    let others: Vec<&str> = st["other_programs"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
        .unwrap_or_default();
    ensure!(
        others
            .iter()
            .any(|o| o.starts_with("sk_msg mb_msg_redir") && o.ends_with("Merbridge)")),
        "Merbridge's program not named: {st}"
    );
    ensure!(
        !others.iter().any(|o| o.contains("bypass_")),
        "the agent's own programs listed as others: {st}"
    );
    let text = agent.status_text()?;
    ensure!(text.contains("Merbridge"), "{text}");
    drop(merbridge);
    Ok(())
}

/// `net.ipv4.tcp_mem` set for a test; the node's own put back when dropped (the sysctl
/// is one for the whole node, not per network namespace).
struct TcpMem {
    saved: String,
}

impl TcpMem {
    const PATH: &str = "/proc/sys/net/ipv4/tcp_mem";

    fn set(pages: &str) -> Result<Self> {
        let saved = std::fs::read_to_string(Self::PATH)?;
        std::fs::write(Self::PATH, pages)?;
        Ok(Self { saved })
    }
}

impl Drop for TcpMem {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(Self::PATH, self.saved.trim()) {
            eprintln!(
                "could not put {} back to {}: {e}",
                Self::PATH,
                self.saved.trim()
            );
        }
    }
}

/// A sysctl's first number (`/proc/sys/...`), if it has one.
fn sysctl_first(path: &str) -> Option<u64> {
    std::fs::read_to_string(path)
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Pages of TCP memory the node holds now (`/proc/net/sockstat`, `TCP: ... mem N`).
fn tcp_pages_now() -> Result<u64> {
    let text = std::fs::read_to_string("/proc/net/sockstat")?;
    text.lines()
        .find(|l| l.starts_with("TCP:"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no TCP memory in /proc/net/sockstat: {text}"))
}

/// `tcp_mem` whose first threshold the agent turns into one `room` pages above what
/// the node holds now (as the agent does: `control::tcp_mem_tight` with the node's
/// CPUs and per-CPU reserve), with pressure just past it and refusals past a fair
/// share of a limit far above.
fn tcp_mem_with_room(room: u64) -> Result<String> {
    let cpus = nix::unistd::sysconf(nix::unistd::SysconfVar::_NPROCESSORS_CONF)?
        .and_then(|n| u64::try_from(n).ok())
        .unwrap_or(1);
    let reserve = sysctl_first("/proc/sys/net/core/mem_pcpu_rsv")
        .unwrap_or(bypass_common::control::PCPU_RESERVE_PAGES);
    let want = tcp_pages_now()? + room;
    let mut low = want;
    while u64::from(bypass_common::control::tcp_mem_tight(low, cpus, reserve)) < want {
        low += 64;
    }
    Ok(format!("{low} {} {}", low + 1, (4 * low).max(65536)))
}

#[test]
fn near_the_tcp_memory_limit_sends_wait_never_fail() -> Result<()> {
    privileged!();
    let pods = two_pods()?;
    // The agent's threshold 8 MiB above the node's TCP memory now; pressure just past
    // tcp_mem's first threshold, and refusals past a fair share of at least 256 MiB,
    // which a reader holding many MiB redirected to it exceeds. A redirect charges that
    // reader, and a refused charge fails the writer's send (ENOMEM): the datapath must
    // send by TCP before that.
    let _mem = TcpMem::set(&tcp_mem_with_room(2048)?)?;
    let agent = agent_with(&pods, &["--max-queued-bytes", "64M"])?;
    let before = agent.status()?;
    // A non-blocking writer floods a reader that reads nothing, until the agent has
    // sent by TCP for memory and a write has then met EAGAIN; the reader then drains.
    // Any write error fails the probe.
    let steps = Steps::new(&pods, "tight")?;
    let args = [
        "--case".to_owned(),
        "flood".to_owned(),
        "--go-file".to_owned(),
        steps.arg("tight"),
        "--wait-file".to_owned(),
        steps.arg("read"),
    ];
    let to = pods.b.v4_addr(5504);
    let server = ProbeServer::start(&pods.b, to, &args)?;
    let client = spawn_probe_client(&pods.a, to, &args)?;
    let tight0 = num(&before, "memory_tight");
    agent.wait_for(testbed::steps::NET, "a send by TCP for memory", |s| {
        s.counters.memory_tight > tight0
    })?;
    steps.touch("tight")?;
    let c = probe_report(client)?;
    steps.touch("read")?;
    let s = server.wait()?;
    let after = agent.status()?;
    let grew = |key: &str| num(&after, key) - num(&before, key);
    let accepted = num(&c, "accepted");
    ensure!(
        s["ok"] == true && num(&s, "received") == accepted,
        "bytes lost or reordered: client {c}, server {s}"
    );
    ensure!(
        num(&c, "eagain") > 0,
        "the writer never waited as TCP makes it: {c}"
    );
    // Redirected while there was room, then by TCP.
    ensure!(
        grew("redirected_bytes") > 0 && grew("memory_tight") > 0,
        "not redirected below the threshold and by TCP above it: {before} -> {after}"
    );
    eprintln!(
        "near tcp_mem: {accepted} B accepted, {} B redirected, {} B by TCP as sk_msg saw \
         them, {} sends by TCP for memory",
        grew("redirected_bytes"),
        grew("passed_bytes"),
        grew("memory_tight")
    );
    Ok(())
}

/// Stops a process (SIGSTOP) until dropped (SIGCONT).
struct Stopped(nix::unistd::Pid);

impl Stopped {
    fn new(pid: u32) -> Result<Self> {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(pid)?);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP)?;
        Ok(Self(pid))
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(self.0, nix::sys::signal::Signal::SIGCONT);
    }
}

/// More connections ask to leave the SockHash at once than the leave-event ring buffer
/// holds, while the agent reads none of it (stopped): every one of them still leaves
/// once its bytes are read, the lost events counted, and each is exact on plain TCP
/// after. A pod's program (Python, nobody here wrote it) opens the connections to its
/// own address and makes each a small-message stream: one-byte sends its peer does not
/// read.
#[test]
fn leave_events_the_ring_cannot_hold_lose_no_leave() -> Result<()> {
    privileged!();
    const SCRIPT: &str = r#"
import os, resource, socket, sys, time
ip, n, sends, dir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
def step(name):
    open(os.path.join(dir, name), "w").close()
def wait(name):
    while not os.path.exists(os.path.join(dir, name)):
        time.sleep(0.05)
l = socket.socket()
l.bind((ip, 0))
l.listen(4096)
held = []
for _ in range(n):
    c = socket.create_connection(l.getsockname())
    s, _ = l.accept()
    held.append((c, s))
step("connected")
wait("send")
for c, _ in held:
    for _ in range(sends):
        c.send(b"x")
step("sent")
wait("read")
for i, (c, s) in enumerate(held):
    got = b""
    while len(got) < sends:
        b = s.recv(sends)
        if not b:
            sys.exit("connection %d: EOF after %r" % (i, got))
        got += b
    if got != b"x" * sends:
        sys.exit("connection %d: read %r" % (i, got))
step("read-all")
wait("again")
for c, s in held:
    c.sendall(b"y")
    s.sendall(b"z")
for i, (c, s) in enumerate(held):
    if s.recv(1) != b"y" or c.recv(1) != b"z":
        sys.exit("connection %d: not exact after leaving" % i)
step("done")
while True:
    time.sleep(3600)
"#;
    let pods = two_pods()?;
    let agent = agent_with(&pods, &["--heartbeat-seconds", "3600"])?;
    let ring = u64::from(bypass_common::names::EVENTS_BYTES)
        / (std::mem::size_of::<bypass_common::state::LeaveEvent>() as u64 + 8);
    let n = ring + 512;
    // One past the small-stream run: the last sends find the connection leaving.
    let sends = bypass_common::state::SMALL_STREAM_RUN + 2;
    let steps = Steps::new(&pods, "ring")?;
    let ip = pods.a.ipv4();
    agent.wait_for(testbed::steps::NET, "pod a's address owned", |s| {
        s.address_owners
            .iter()
            .any(|o| o.address == std::net::IpAddr::V4(ip))
    })?;
    let before = agent.stats()?;
    let mut cmd = std::process::Command::new("python3");
    cmd.args([
        "-c",
        SCRIPT,
        &ip.to_string(),
        &n.to_string(),
        &sends.to_string(),
        &steps.arg(""),
    ]);
    let mut child = testbed::spawn::spawn_in(&pods.a, cmd)?;
    let wait = |child: testbed::spawn::PodChild, name: &str| {
        child.wait_ready(&steps.file(name), name, testbed::steps::NET)
    };
    // Thousands of connections take minutes in an emulated guest: a net against no
    // progress, not a pace.
    progress(&agent, &mut child, "sockets inserted", 2 * n, |s| {
        grew(&before, s, |s| s.counters.sockets_inserted)
    })?;
    child = wait(child, "connected")?;
    let (requested, lost) = {
        let _stopped = Stopped::new(agent.pid())?;
        steps.touch("send")?;
        child = wait(child, "sent")?;
        // Each connection asked to leave once, its events written while nothing read
        // the ring; its bytes are read before the agent runs again.
        let sent = agent.stats()?;
        steps.touch("read")?;
        child = wait(child, "read-all")?;
        (
            grew(&before, &sent, |s| s.counters.leave_requests),
            grew(&before, &sent, |s| s.counters.leave_events_lost),
        )
    };
    ensure!(
        requested > ring && lost > 0 && lost <= requested - ring + 1,
        "{requested} leave requests, {lost} events lost, for a ring of {ring} events"
    );
    progress(&agent, &mut child, "connections left", requested, |s| {
        grew(&before, s, |s| s.counters.left)
    })?;
    let after = agent.stats()?;
    ensure!(
        grew(&before, &after, |s| s.counters.left) == requested
            && after.sockets as u64 + 2 * requested
                == before.sockets as u64 + grew(&before, &after, |s| s.counters.sockets_inserted),
        "not every connection left: {requested} asked, {after:?}"
    );
    steps.touch("again")?;
    wait(child, "done")?.kill();
    let end = agent.stats()?;
    ensure!(
        end.counters.redirected_bytes == after.counters.redirected_bytes,
        "bytes redirected after the connections left: {after:?} -> {end:?}"
    );
    eprintln!("leave ring: {requested} leave requests, {lost} events lost, every connection left");
    Ok(())
}
