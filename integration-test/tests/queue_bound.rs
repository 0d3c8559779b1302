//! Bounded kernel memory for a slow reader. A redirected message waits in the peer's
//! ingress queue, which the kernel charges to no socket buffer (net/ipv4/tcp_bpf.c,
//! bpf_tcp_ingress): without a bound a writer facing a reader that stopped queues
//! without limit. With `--max-queued-bytes`, a send that would pass the bound takes the
//! TCP path (and TCP's backpressure), and so does the rest of that direction: going
//! back to redirects is never safe against a reader blocked inside tcp_recvmsg
//! (`bypass_common::tx_mode`). Every byte still arrives once and in order.

mod support;

use support::privileged;

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use support::{
    ProbeServer, agent_with, num, probe_pair, probe_report, queue_bound_off, spawn_probe_client,
    two_pods, wait_for_log,
};

const MIB: u64 = 1 << 20;

/// A non-blocking writer for 1.5 s against a reader that reads nothing for 2.5 s, then
/// drains and verifies.
const FLOOD: [&str; 6] = ["--case", "flood", "--secs", "1.5", "--hold-ms", "2500"];

#[test]
fn stalled_reader_queue_is_bounded() -> Result<()> {
    privileged!("stalled_reader_queue_is_bounded");
    let pods = two_pods()?;
    // Plain TCP: the writer stops at the socket buffers.
    let (tcp, tcp_server) = probe_pair(&pods, 5201, &FLOOD)?;
    let tcp_accepted = num(&tcp, "accepted");
    ensure!(
        tcp_server["ok"] == true && num(&tcp_server, "received") == tcp_accepted,
        "plain TCP: {tcp} {tcp_server}"
    );

    let agent = agent_with(&pods, &["--max-queued-bytes", "4M"])?;
    if queue_bound_off(&agent)?.is_some() {
        return Ok(());
    }
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
    privileged!("restarted_agent_applies_its_own_bound");
    let pods = two_pods()?;
    let mut first = agent_with(
        &pods,
        &["--max-queued-bytes", "8M", "--detach-on-exit=false"],
    )?;
    if queue_bound_off(&first)?.is_some() {
        return Ok(());
    }
    ensure!(num(&first.status()?, "max_queued_bytes") == 8 * MIB);
    first.stop()?;
    // The adopted datapath takes the new agent's bound.
    let second = agent_with(&pods, &["--max-queued-bytes", "1M"])?;
    ensure!(
        wait_for_log(&second, "Adopted"),
        "not adopted: {}",
        second.stderr()
    );
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

#[test]
fn slow_reader_byte_exact_and_stays_on_tcp() -> Result<()> {
    privileged!("slow_reader_byte_exact_and_stays_on_tcp");
    let pods = two_pods()?;
    let agent = agent_with(&pods, &["--max-queued-bytes", "1M"])?;
    if queue_bound_off(&agent)?.is_some() {
        return Ok(());
    }
    let before = agent.status()?;
    // The writer outruns a reader of 64 KiB every 500 us, hits the bound, falls back to
    // TCP; its pauses let the reader catch up, and it still stays on TCP.
    let (c, s) = probe_pair(
        &pods,
        5204,
        &[
            "--case",
            "slow",
            "--bytes",
            "64M",
            "--chunk",
            "64K",
            "--pause-every",
            "8M",
            "--pause-ms",
            "300",
            "--delay-us",
            "500",
        ],
    )?;
    let after = agent.status()?;
    let grew = |k: &str| num(&after, k).saturating_sub(num(&before, k));
    eprintln!(
        "slow reader: {c} {s}; redirected +{} B, passed +{} B, queue_limited +{}",
        grew("redirected_bytes"),
        grew("passed_bytes"),
        grew("queue_limited"),
    );
    ensure!(num(&c, "sent") == 64 * MIB, "client: {c}");
    ensure!(
        s["ok"] == true && num(&s, "received") == 64 * MIB,
        "bytes lost, duplicated or reordered: {s}"
    );
    ensure!(
        grew("queue_limited") == 1,
        "the bound applied once, for good"
    );
    ensure!(
        grew("redirected_bytes") >= MIB && grew("passed_bytes") > 0,
        "expected both paths to carry bytes"
    );
    ensure!(
        grew("redirected_bytes") + grew("passed_bytes") == 64 * MIB,
        "every byte counted once on one path"
    );
    Ok(())
}

/// Under kernel lockdown in confidentiality mode `bpf_probe_read_kernel` is unavailable,
/// and so is measuring a peer's queue. The agent then loads with that code dead to the
/// verifier (the rest of the datapath reads nothing it would need), says so once in its
/// log, in `status` and on `/metrics`, and redirects byte-exact. (The lockdown mode is
/// read from securityfs; the test points the agent at a file that says
/// `[confidentiality]`, the one seam it has. A real lockdown boot is in the kernel
/// matrix.)
#[test]
fn lockdown_loads_without_the_bound_and_says_so() -> Result<()> {
    privileged!("lockdown_loads_without_the_bound_and_says_so");
    let pods = two_pods()?;
    let lockdown = std::env::temp_dir().join(format!("bypass-lockdown-{}", pods.tag()));
    std::fs::write(&lockdown, "none integrity [confidentiality]\n")?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let agent = testbed::Agent::start(&testbed::AgentOpts {
        env: vec![(
            "BYPASS_LOCKDOWN_FILE".to_owned(),
            lockdown.display().to_string(),
        )],
        extra_args: vec!["--metrics-addr".to_owned(), format!("127.0.0.1:{port}")],
        ..pods.agent_opts()
    });
    let _ = std::fs::remove_file(&lockdown);
    let agent = agent?;
    let st = agent.status()?;
    ensure!(
        st["features"]["queue_bound"] == false
            && st["queue_bound_off"]
                .as_str()
                .is_some_and(|s| s.contains("lockdown"))
            && num(&st, "max_queued_bytes") == 0,
        "status does not say the bound is off and why: {st}\nagent log:\n{}",
        agent.stderr()
    );
    ensure!(
        st["features"]["order_no_resume"] == true && st["features"]["ulp_guard"] == true,
        "the guarantees that do not need probe reads must stay on: {st}"
    );
    use testbed::agent::metric;
    ensure!(
        metric(port, "bypass_feature{feature=\"queue_bound\"}")? == 0.0
            && metric(port, "bypass_feature{feature=\"order_no_resume\"}")? == 1.0
            && metric(port, "bypass_feature{feature=\"ulp_guard\"}")? == 1.0,
        "/metrics does not show which guarantees are active"
    );
    ensure!(
        wait_for_log(&agent, "no bound on queued bytes"),
        "no warning: {}",
        agent.stderr()
    );
    let before = agent.status()?;
    let wire0 = pods.wire_bytes()?;
    let (c, s) = probe_pair(&pods, 5205, &["--case", "duplex", "--bytes", "16M"])?;
    let after = agent.status()?;
    ensure!(
        c["ok"] == true && s["ok"] == true,
        "not byte-exact: {c} {s}"
    );
    let redirected = num(&after, "redirected_bytes") - num(&before, "redirected_bytes");
    let wire = pods.wire_bytes()? - wire0;
    ensure!(
        redirected >= 32 * MIB && wire < MIB,
        "not bypassed without the bound: redirected {redirected} B, wire {wire} B"
    );
    // Without the override the same kernel loads with the bound, where its sockmap has
    // the queue length (not 6.1) and it is not in lockdown itself (the matrix's
    // 6.12-lockdown): then only the kernel's own reasons remain.
    drop(agent);
    let bounded = agent_with(&pods, &[])?;
    let st = bounded.status()?;
    let has_field = st["features"]["fionread"] == true;
    let locked = std::fs::read_to_string("/sys/kernel/security/lockdown")
        .is_ok_and(|m| m.contains("[confidentiality]"));
    let why = st["queue_bound_off"].as_str().unwrap_or("");
    ensure!(
        st["features"]["queue_bound"] == (has_field && !locked)
            && why.contains("msg_tot_len") != has_field
            && why.contains("lockdown") == locked,
        "lockdown {locked}, queue field {has_field}: {st}"
    );
    Ok(())
}

/// A reader blocked in recv(MSG_WAITALL) inside plain tcp_recvmsg, with every byte the
/// writer sent by TCP already copied, must never see bytes out of order. The writer
/// (bound 1 MiB) fills the reader's ingress queue with 1 MiB, then sends 256 KiB by TCP;
/// the reader reads the redirected MiB, then blocks in MSG_WAITALL for 320 KiB with the
/// 256 KiB of TCP copied. Then the writer sends 32 KiB and 2 MiB more. A datapath that
/// went back to redirects once the reader "caught up" queued the 32 KiB (and more) in
/// the ingress queue, unseen by the blocked read, and when the bound sent it to TCP
/// again those later TCP bytes completed the read ahead of them.
#[test]
fn blocked_waitall_reader_never_sees_reordered_bytes() -> Result<()> {
    privileged!("blocked_waitall_reader_never_sees_reordered_bytes");
    let pods = two_pods()?;
    let agent = agent_with(&pods, &["--max-queued-bytes", "1M"])?;
    // Without the bound this scenario cannot be built; the rule it checks (never back
    // to redirects) is the same on every kernel.
    if queue_bound_off(&agent)?.is_some() {
        return Ok(());
    }
    let dir = std::env::temp_dir().join(format!("{}-waitall", pods.tag()));
    std::fs::create_dir_all(&dir)?;
    let file = |n: &str| dir.join(n);
    let arg = |n: &str| file(n).display().to_string();
    let before = agent.status()?;
    let addr = pods.b.v4_addr(5206);
    let common = ["--case", "waitall-after-bound", "--bytes", "1M"];
    let mut server_args: Vec<String> = common.iter().map(|s| (*s).to_owned()).collect();
    server_args.extend([
        "--wait-file".to_owned(),
        arg("first-sent"),
        "--mark-file".to_owned(),
        arg("waiting"),
    ]);
    let mut client_args: Vec<String> = common.iter().map(|s| (*s).to_owned()).collect();
    client_args.extend([
        "--mark-file".to_owned(),
        arg("first-sent"),
        "--go-file".to_owned(),
        arg("go"),
    ]);
    let result = (|| -> Result<(serde_json::Value, serde_json::Value)> {
        let server = ProbeServer::start(&pods.b, addr, &server_args)?;
        let client = spawn_probe_client(&pods.a, addr, &client_args)?;
        support::wait_file(&file("waiting")).context("the reader never got to MSG_WAITALL")?;
        // Let the reader block inside tcp_recvmsg.
        std::thread::sleep(Duration::from_millis(300));
        std::fs::write(file("go"), b"")?;
        Ok((probe_report(client)?, server.wait()?))
    })();
    let _ = std::fs::remove_dir_all(&dir);
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
