//! Bounded kernel memory for a slow reader. A redirected message waits in the peer's
//! ingress queue, which the kernel charges to no socket buffer (net/ipv4/tcp_bpf.c,
//! bpf_tcp_ingress): without a bound a writer facing a reader that stopped queues
//! without limit. With `--max-queued-bytes` (by default what TCP lets a receive buffer
//! grow to), a send that would pass the bound takes the TCP path (and TCP's
//! backpressure) until the reader has read every byte sent by TCP with no read of it
//! still blocked, then redirects again. Each waiting message also counts for the kernel
//! memory it holds, so a stream of 1-byte messages is bounded as TCP bounds it. Every
//! byte still arrives once and in order.

use crate::support::privileged;

use std::time::Duration;

use crate::support::{
    ProbeServer, Steps, agent_with, ensure_logged, num, probe_pair, probe_report,
    spawn_probe_client, two_pods,
};
use anyhow::{Context as _, Result, ensure};
use bypass_common::Stat;

const MIB: u64 = 1 << 20;

/// A non-blocking writer for 1.5 s against a reader that reads nothing for 2.5 s, then
/// drains and verifies.
const FLOOD: [&str; 6] = ["--case", "flood", "--secs", "1.5", "--hold-ms", "2500"];

#[test]
fn stalled_reader_queue_is_bounded() -> Result<()> {
    privileged!();
    let pods = two_pods()?;
    // Plain TCP: the writer stops at the socket buffers.
    let (tcp, tcp_server) = probe_pair(&pods, 5201, &FLOOD)?;
    let tcp_accepted = num(&tcp, "accepted");
    ensure!(
        tcp_server["ok"] == true && num(&tcp_server, "received") == tcp_accepted,
        "plain TCP: {tcp} {tcp_server}"
    );

    let agent = agent_with(&pods, &["--max-queued-bytes", "4M"])?;
    let before = agent.status()?;
    let (c, s) = probe_pair(&pods, 5202, &FLOOD)?;
    let after = agent.status()?;
    let accepted = num(&c, "accepted");
    eprintln!(
        "stalled reader: plain TCP accepted {tcp_accepted} B; bypass bounded at 4 MiB accepted \
         {accepted} B (queued at the reader {} B, MemFree drop {} KiB)",
        num(&s, "fionread_after_hold"),
        c["mem_free_drop_kib"]
    );
    ensure!(
        s["ok"] == true && num(&s, "received") == accepted,
        "bytes lost or reordered: client {c}, server {s}"
    );
    // The bound, plus what TCP itself holds once the writer falls back to it.
    ensure!(
        accepted <= 4 * MIB + 2 * tcp_accepted + MIB,
        "accepted {accepted} B with a 4 MiB bound (plain TCP: {tcp_accepted} B)"
    );
    ensure!(
        accepted >= 3 * MIB,
        "only {accepted} B accepted: the bypass did not carry up to its bound"
    );
    ensure!(
        num(&c, "eagain") > 0,
        "the non-blocking writer never saw EAGAIN: {c}"
    );
    // FIONREAD counts the ingress queue and the TCP receive queue: the bound, plus what
    // came by TCP once the writer fell back to it (no more than plain TCP holds).
    ensure!(
        num(&s, "fionread_after_hold") <= 4 * MIB + tcp_accepted,
        "the reader's queue holds more than the bound: {s} (plain TCP: {tcp_accepted} B)"
    );
    ensure!(
        num(&after, "queue_limited") > num(&before, "queue_limited"),
        "queue_limited did not grow: {after}"
    );
    ensure!(
        num(&after, "max_queued_bytes") == 4 * MIB,
        "status does not show the bound: {after}"
    );
    Ok(())
}

#[test]
fn restarted_agent_applies_its_own_bound() -> Result<()> {
    privileged!();
    let pods = two_pods()?;
    let mut first = agent_with(
        &pods,
        &["--max-queued-bytes", "8M", "--detach-on-exit=false"],
    )?;
    ensure!(num(&first.status()?, "max_queued_bytes") == 8 * MIB);
    first.stop()?;
    // The adopted datapath takes the new agent's bound.
    let second = agent_with(&pods, &["--max-queued-bytes", "1M"])?;
    ensure_logged(&second, "Adopted", "not adopted")?;
    let (c, s) = probe_pair(&pods, 5203, &FLOOD)?;
    let accepted = num(&c, "accepted");
    ensure!(
        s["ok"] == true && num(&s, "received") == accepted,
        "{c} {s}"
    );
    ensure!(
        num(&s, "fionread_after_hold") <= MIB,
        "the reader's queue holds more than the new 1 MiB bound: {s}"
    );
    Ok(())
}

/// A reader that lets a block of 832 KiB pile up before it reads it (the writer writes
/// the block, says so through a file, and waits for the reader's one-byte ack): each
/// block passes the 1 MiB bound (16 KiB messages, each charged its bytes, a slab object
/// and a page), so its last messages take TCP; the reader then reads the whole block,
/// TCP bytes included, and the next block comes back to redirects. Nothing here depends
/// on the machine's speed.
#[test]
fn slow_reader_byte_exact_and_comes_back() -> Result<()> {
    privileged!();
    const BLOCK: u64 = 832 << 10;
    const BLOCKS: u64 = 8;
    let pods = two_pods()?;
    let steps = Steps::new(&pods, "slow-reader")?;
    let agent = agent_with(&pods, &["--max-queued-bytes", "1M"])?;
    let before = agent.status()?;
    let (c, s) = probe_pair(
        &pods,
        5204,
        &[
            "--case",
            "slow",
            "--bytes",
            &(BLOCK * BLOCKS).to_string(),
            "--chunk",
            "16K",
            "--pause-every",
            &BLOCK.to_string(),
            "--ack",
            "--mark-file",
            &steps.arg("written"),
        ],
    )?;
    let after = agent.status()?;
    let grew = |k: &str| num(&after, k).saturating_sub(num(&before, k));
    eprintln!(
        "slow reader: {c} {s}; redirected +{} B, passed +{} B, queue_limited +{}, resumed +{}",
        grew("redirected_bytes"),
        grew("passed_bytes"),
        grew("queue_limited"),
        grew("resumed"),
    );
    ensure!(num(&c, "sent") == BLOCK * BLOCKS, "client: {c}");
    ensure!(
        s["ok"] == true && num(&s, "received") == BLOCK * BLOCKS,
        "bytes lost, duplicated or reordered: {s}"
    );
    ensure!(
        grew("queue_limited") >= BLOCKS,
        "the bound did not apply to every block"
    );
    ensure!(
        grew("resumed") >= BLOCKS - 1,
        "the direction did not come back to redirects after each block was read"
    );
    ensure!(
        grew("redirected_bytes") > grew("passed_bytes") && grew("passed_bytes") > 0,
        "expected both paths to carry bytes, most of them redirected"
    );
    ensure!(
        grew("redirected_bytes") + grew("passed_bytes") == BLOCK * BLOCKS + num(&s, "acks"),
        "every byte (and each of the reader's one-byte acks) counted once on one path"
    );
    Ok(())
}

/// A writer of 1-byte messages facing a reader that reads nothing for 3 s: each waiting
/// message holds a `struct sk_msg` (a 1 KiB slab object) whatever its size, so a bound
/// on bytes alone lets it pin hundreds of MiB of kernel memory (before the bound counted
/// messages: 300,000 sends pinned 293 MiB). With the agent's defaults such a stream is a
/// small-message stream and its connection leaves the SockHash for plain TCP; with that
/// rule off (`--small-stream-bytes 0`) the bound, which charges each message for its
/// memory, holds it. Either way what the writer pins is about what TCP lets it pin.
#[test]
fn one_byte_flood_pins_no_more_than_tcp_would() -> Result<()> {
    privileged!();
    let pods = two_pods()?;
    let flood = [
        "--case",
        "flood",
        "--chunk",
        "1",
        "--secs",
        "2",
        "--hold-ms",
        "3000",
    ];
    let (tcp, tcp_server) = probe_pair(&pods, 5207, &flood)?;
    ensure!(
        tcp_server["ok"] == true && num(&tcp_server, "received") == num(&tcp, "accepted"),
        "plain TCP: {tcp} {tcp_server}"
    );
    for (port, args, rule) in [
        (5208, &[][..], "defaults"),
        (
            5209,
            &["--small-stream-bytes", "0"][..],
            "small-stream rule off",
        ),
    ] {
        let agent = agent_with(&pods, args)?;
        let before = agent.status()?;
        let bound = num(&before, "max_queued_bytes");
        let (c, s) = probe_pair(&pods, port, &flood)?;
        let st = agent.status()?;
        let grew = |k: &str| num(&st, k) - num(&before, k);
        eprintln!(
            "1-byte flood, reader stalled 3 s: plain TCP {tcp}; bypass ({rule}, bound {bound} \
             B) {c}; queue_limited +{}, small_streams +{}, left +{}",
            grew("queue_limited"),
            grew("small_streams"),
            grew("left")
        );
        ensure!(
            s["ok"] == true && num(&s, "received") == num(&c, "accepted"),
            "{rule}: bytes lost, duplicated or reordered: {c} {s}"
        );
        ensure_pins_as_tcp(&tcp, &c, bound, rule)?;
        if args.is_empty() {
            ensure!(
                grew("small_streams") >= 1 && grew("leave_requests") >= 1,
                "{rule}: the flood was not taken for a small-message stream: {st}"
            );
        } else {
            ensure!(
                grew("small_streams") == 0 && grew("queue_limited") >= 1,
                "{rule}: the bound never applied: {st}"
            );
        }
    }
    Ok(())
}

/// What the flood `c` pinned is within what its `bound` allows plus what plain TCP
/// pinned (`tcp`), with room for the rest of the machine's allocations meanwhile.
fn ensure_pins_as_tcp(
    tcp: &serde_json::Value,
    c: &serde_json::Value,
    bound: u64,
    rule: &str,
) -> Result<()> {
    let signed = |v: &serde_json::Value, k: &str| v.get(k).and_then(|x| x.as_i64()).unwrap_or(0);
    // A message is charged at least its 1 KiB object plus its byte.
    let slack_objects = 8192;
    let allowed = bound as i64 / 1024 + signed(tcp, "kmalloc_1k_growth").max(0) + slack_objects;
    ensure!(
        signed(c, "kmalloc_1k_growth") <= allowed,
        "{rule}: the writer pinned {} 1 KiB objects (plain TCP: {}), over the {allowed} its \
         {bound} B bound allows",
        signed(c, "kmalloc_1k_growth"),
        signed(tcp, "kmalloc_1k_growth")
    );
    let allowed_kib =
        bound as i64 * 2 / 1024 + signed(tcp, "sunreclaim_growth_kib").max(0) + 32 * 1024;
    ensure!(
        signed(c, "sunreclaim_growth_kib") <= allowed_kib,
        "{rule}: unreclaimable slab grew {} KiB (plain TCP: {} KiB), over {allowed_kib} KiB",
        signed(c, "sunreclaim_growth_kib"),
        signed(tcp, "sunreclaim_growth_kib")
    );
    Ok(())
}

/// The bound holds on every kernel the agent loads on (it reads no other socket's
/// memory: each reader publishes what it read); only `--max-queued-bytes 0` turns it
/// off, which `status` and `/metrics` say, with the guarantees that stay.
#[test]
fn bound_off_only_when_asked_and_says_so() -> Result<()> {
    privileged!();
    let pods = two_pods()?;
    let port = crate::support::free_port()?;
    let agent = agent_with(
        &pods,
        &[
            "--max-queued-bytes",
            "0",
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
        ],
    )?;
    let st = agent.status()?;
    ensure!(
        st["features"]["queue_bound"] == false
            && st["queue_bound_off"]
                .as_str()
                .is_some_and(|s| s.contains("--max-queued-bytes 0"))
            && num(&st, "max_queued_bytes") == 0,
        "status does not say the bound is off and why: {st}\nagent log:\n{}",
        agent.stderr()
    );
    ensure!(
        st["features"]["order"] == true && st["features"]["ulp_guard"] == true,
        "the other guarantees stay on: {st}"
    );
    use testbed::agent::metric;
    ensure!(
        metric(port, "bypass_feature{feature=\"queue_bound\"}")? == 0.0
            && metric(port, "bypass_feature{feature=\"order\"}")? == 1.0
            && metric(port, "bypass_feature{feature=\"ulp_guard\"}")? == 1.0,
        "/metrics does not show which guarantees are active"
    );
    ensure_logged(&agent, "no bound on what waits for a reader", "no warning")?;
    drop(agent);
    // By default the bound is what TCP lets a receive buffer grow to.
    let bounded = agent_with(&pods, &[])?;
    let st = bounded.status()?;
    let rmem_max: u64 = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_rmem")?
        .split_whitespace()
        .nth(2)
        .context("tcp_rmem")?
        .parse()?;
    ensure!(
        st["features"]["queue_bound"] == true
            && num(&st, "max_queued_bytes") == rmem_max
            && st["queue_bound_off"].is_null(),
        "default bound not tcp_rmem's {rmem_max} B: {st}"
    );
    Ok(())
}

/// A reader blocked in recv(MSG_WAITALL) inside plain tcp_recvmsg, with every byte the
/// writer sent by TCP already copied, must never see bytes out of order. The writer
/// (bound 1 MiB) fills the reader's ingress queue, then sends the rest of 1.25 MiB by
/// TCP; once the test sees the bound applied, the reader reads 1 MiB, then blocks in
/// MSG_WAITALL for 320 KiB with the 256 KiB left copied. Then the writer sends 32 KiB and
/// 2 MiB more. A datapath that went back to redirects as soon as the reader's
/// `copied_seq` caught up queued the 32 KiB (and more) in the ingress queue, unseen by
/// the blocked read, and when the bound sent it to TCP again those later TCP bytes
/// completed the read ahead of them. A reader's progress is published only when its
/// read returns, so the writer stays on TCP while the read is blocked.
#[test]
fn blocked_waitall_reader_never_sees_reordered_bytes() -> Result<()> {
    privileged!();
    let pods = two_pods()?;
    let agent = agent_with(&pods, &["--max-queued-bytes", "1M"])?;
    let steps = Steps::new(&pods, "waitall")?;
    let before = agent.status()?;
    let limited_before = agent.stats()?.counters.get(Stat::QueueLimited);
    let addr = pods.b.v4_addr(5206);
    let common = ["--case", "waitall-after-bound", "--bytes", "1M"];
    let mut server_args: Vec<String> = crate::support::to_strings(&common);
    server_args.extend([
        "--wait-file".to_owned(),
        steps.arg("limited"),
        "--mark-file".to_owned(),
        steps.arg("waiting"),
    ]);
    let mut client_args: Vec<String> = crate::support::to_strings(&common);
    client_args.extend([
        "--mark-file".to_owned(),
        steps.arg("all-acked"),
        "--go-file".to_owned(),
        steps.arg("go"),
    ]);
    let server = ProbeServer::start(&pods.b, addr, &server_args)?;
    let client = spawn_probe_client(&pods.a, addr, &client_args)?;
    // The reader starts reading only once the writer's queue reached the bound (the
    // writer may block on TCP's buffers before it has sent everything: that is TCP).
    agent.wait_for(testbed::steps::NET, "the queue bound to apply", |st| {
        st.counters.get(Stat::QueueLimited) > limited_before
    })?;
    steps.touch("limited")?;
    steps.wait("all-acked")?;
    steps
        .wait("waiting")
        .context("the reader never got to MSG_WAITALL")?;
    // Every TCP byte reached the reader's socket before the reader is next seen asleep
    // in recvfrom: it then copied them all and waits for more.
    wait_asleep_in_recv(server.pid())?;
    steps.touch("go")?;
    let result = probe_report(client).and_then(|c| Ok((c, server.wait()?)));
    let (c, s) = result?;
    let after = agent.status()?;
    let grew = |k: &str| num(&after, k).saturating_sub(num(&before, k));
    eprintln!(
        "blocked MSG_WAITALL reader: client {c}, server {s}; redirected +{} B, passed +{} B, \
         queue_limited +{}",
        grew("redirected_bytes"),
        grew("passed_bytes"),
        grew("queue_limited")
    );
    ensure!(
        grew("queue_limited") >= 1,
        "the bound never applied, so this did not test anything"
    );
    ensure!(
        s["ok_after_waitall"] == true && s["ok"] == true,
        "the blocked reader saw bytes out of order: {s}"
    );
    ensure!(
        num(&s, "received") == num(&c, "sent"),
        "bytes lost: {c} {s}"
    );
    Ok(())
}

/// Waits (at most 60 s) until a thread of `pid` sleeps inside recvfrom(2)
/// (`/proc/PID/task/TID/stat` state `S`, `/proc/PID/task/TID/syscall` its number).
fn wait_asleep_in_recv(pid: u32) -> Result<()> {
    let asleep = || -> Result<bool> {
        for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
            let dir = task?.path();
            let syscall = std::fs::read_to_string(dir.join("syscall")).unwrap_or_default();
            let stat = std::fs::read_to_string(dir.join("stat")).unwrap_or_default();
            // The state follows the command's closing parenthesis.
            let state = stat.rsplit_once(") ").map(|(_, r)| r.chars().next());
            let nr = syscall
                .split_whitespace()
                .next()
                .and_then(|n| n.parse::<i64>().ok());
            if nr == Some(libc::SYS_recvfrom) && state == Some(Some('S')) {
                return Ok(true);
            }
        }
        Ok(false)
    };
    let deadline = std::time::Instant::now() + testbed::steps::NET;
    while !asleep()? {
        ensure!(
            std::time::Instant::now() < deadline,
            "the reader (pid {pid}) never slept inside recvfrom"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}
