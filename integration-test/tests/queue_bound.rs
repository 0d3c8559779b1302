//! Bounded kernel memory for a slow reader. A redirected message waits in the peer's
//! ingress queue, which the kernel charges to no socket buffer (net/ipv4/tcp_bpf.c,
//! bpf_tcp_ingress): without a bound a writer facing a reader that stopped queues
//! without limit. With `--max-queued-bytes`, a send that would pass the bound takes the
//! TCP path (and TCP's backpressure), and so does the rest of that direction: going
//! back to redirects is never safe against a reader blocked inside tcp_recvmsg
//! (`bypass_common::tx_mode`). Every byte still arrives once and in order.

mod support;

use anyhow::{Result, ensure};
use support::{agent_with, num, probe_pair, two_pods, wait_for_log};
use testbed::preflight;

const MIB: u64 = 1 << 20;

/// A non-blocking writer for 1.5 s against a reader that reads nothing for 2.5 s, then
/// drains and verifies.
const FLOOD: [&str; 6] = ["--case", "flood", "--secs", "1.5", "--hold-ms", "2500"];

#[test]
fn stalled_reader_queue_is_bounded() -> Result<()> {
    if !preflight("stalled_reader_queue_is_bounded")? {
        return Ok(());
    }
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
    ensure!(
        num(&s, "fionread_after_hold") <= 4 * MIB,
        "the reader's queue holds more than the bound: {s}"
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
    if !preflight("restarted_agent_applies_its_own_bound")? {
        return Ok(());
    }
    let pods = two_pods()?;
    let mut first = agent_with(
        &pods,
        &["--max-queued-bytes", "8M", "--detach-on-exit=false"],
    )?;
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
    if !preflight("slow_reader_byte_exact_and_stays_on_tcp")? {
        return Ok(());
    }
    let pods = two_pods()?;
    let agent = agent_with(&pods, &["--max-queued-bytes", "1M"])?;
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
