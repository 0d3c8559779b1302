//! Small-message streams. A redirect costs the reader one ingress-queue entry and one
//! wake-up per message, where plain TCP coalesces small writes; a direction whose sends
//! under `--small-stream-bytes` (256 by default) keep finding the peer behind on its
//! reading makes its connection leave the SockHash: once each side has read what was
//! redirected to it the agent deletes both sockets from it, and they run as plain TCP.
//! Request/response traffic (the peer has read everything before it answers) keeps the
//! redirect at every size. Either way every byte arrives once and in order.

use crate::support::privileged;

use crate::support::exchange::{Exchange, assert_bypassed, assert_byte_exact, exchange_with};
use crate::support::{
    ProbeServer, Steps, agent_with, grew, num, probe_report, spawn_probe_client, two_pods,
};
use anyhow::{Result, ensure};
use testbed::{Agent, AgentStatus, ClientArgs, ServerArgs, TwoPods};

/// One-byte writes, 256 KiB of them.
fn small_writes() -> ClientArgs {
    ClientArgs {
        send: 256 << 10,
        recv: 0,
        msg_size: 1,
        ..ClientArgs::default()
    }
    .greeted()
}

/// `client`'s writes to a server in pod b on `port` that starts reading only once
/// `ahead` holds of the agent's counters (waited for, a net, while the writer writes):
/// the writer is ahead of its reader from its first sends, however slowly the machine
/// runs it.
fn writes_ahead_of_reader(
    pods: &TwoPods,
    agent: &Agent,
    port: u16,
    client: ClientArgs,
    what: &str,
    ahead: impl Fn(&AgentStatus, &AgentStatus) -> bool + Sync,
) -> Result<(ClientArgs, Exchange)> {
    let steps = Steps::new(pods, "small")?;
    let server = ServerArgs {
        go_file: Some(steps.file("read")),
        ..ServerArgs::new(1)
    };
    let before = agent.stats()?;
    let x = std::thread::scope(|s| {
        let watcher = s.spawn(|| {
            let seen = agent.wait_for(testbed::steps::NET, what, |now| ahead(&before, now));
            // The reader goes on either way: a test that fails does not hang.
            steps.touch("read").and(seen)
        });
        let x = to_pod_b(pods, agent, port, &client, &server);
        match watcher.join() {
            Ok(seen) => seen.and(x),
            Err(_) => anyhow::bail!("the watch of the agent's counters panicked"),
        }
    })?;
    Ok((client, x))
}

/// Server in pod b on `port`, client in pod a, with `agent`'s counters around it.
fn to_pod_b(
    pods: &TwoPods,
    agent: &Agent,
    port: u16,
    args: &ClientArgs,
    server: &ServerArgs,
) -> Result<Exchange> {
    let addr = pods.b.v4_addr(port);
    exchange_with(pods, Some(agent), addr, addr, args, server)
}

/// One-byte writes to a reader that reads none yet: the rule sees a stream, the
/// connection leaves the SockHash once the reader has caught up, and what follows goes
/// by plain TCP (no program sees it; the veths carry it). The test waits for what it
/// observes: the probe marks when its first half is written, the agent's `left` counter
/// says the connection is out, then the probe writes the second half.
#[test]
fn small_message_stream_leaves_the_sockhash_in_order() -> Result<()> {
    privileged!();
    let pods = two_pods()?;
    let agent = agent_with(&pods, &[])?;
    let st = agent.status()?;
    ensure!(
        num(&st, "small_stream_bytes") == 256,
        "the small-stream rule is not on by default: {st}"
    );
    let dir = std::env::temp_dir().join(format!("{}-leave", pods.tag()));
    std::fs::create_dir_all(&dir)?;
    let file = |n: &str| dir.join(n).display().to_string();
    let half = 16 * 1024;
    let addr = pods.b.v4_addr(5405);
    let common = ["--case", "small-leave", "--bytes", "16K"];
    let with = |extra: &[&str]| -> Vec<String> {
        common
            .iter()
            .chain(extra)
            .map(|s| (*s).to_owned())
            .collect()
    };
    let before = agent.stats()?;
    let result = (|| -> Result<(serde_json::Value, serde_json::Value, AgentStatus, u64)> {
        let server = ProbeServer::start(&pods.b, addr, &with(&["--wait-file", &file("sent")]))?;
        let client = spawn_probe_client(
            &pods.a,
            addr,
            &with(&["--mark-file", &file("sent"), "--go-file", &file("go")]),
        )?;
        crate::support::wait_file(std::path::Path::new(&file("sent")))?;
        let out = agent.wait_for(testbed::steps::NET, "the connection to leave", |s| {
            s.counters.left > before.counters.left
        })?;
        let wire = pods.wire_bytes()?;
        std::fs::write(file("go"), b"")?;
        Ok((probe_report(client)?, server.wait()?, out, wire))
    })();
    let _ = std::fs::remove_dir_all(&dir);
    let (c, s, left, wire_at_leave) = result?;
    let after = agent.stats()?;
    ensure!(
        s["ok"] == true && num(&s, "received") == 2 * half && num(&c, "sent") == 2 * half,
        "bytes lost, duplicated or reordered: client {c}, server {s}"
    );
    ensure!(
        grew(&before, &after, |s| s.counters.small_streams) == 1,
        "small_streams: {after:?}"
    );
    ensure!(
        left.sockets == before.sockets,
        "the two sockets are still in the SockHash: {left:?}"
    );
    // The second half went by plain TCP: no program counted it, the veths carried it.
    let seen = |s: &AgentStatus| s.counters.passed_bytes + s.counters.redirected_bytes;
    ensure!(
        seen(&after) == seen(&left),
        "the programs still saw bytes after the connection left: {left:?} -> {after:?}"
    );
    ensure!(
        pods.wire_bytes()? >= wire_at_leave + half,
        "the veths did not carry the second half"
    );
    Ok(())
}

#[test]
fn length_prefixed_records_keep_redirect() -> Result<()> {
    privileged!();
    let pods = two_pods()?;
    // The bound is not what this tests (`queue_bound` does), and the default one (the
    // reader's largest receive buffer, 6 MiB where `tcp_rmem` is Debian's default) is
    // below what the lagging reader lets pile up: one that never applies.
    let agent = agent_with(&pods, &["--max-queued-bytes", "64M"])?;
    // A 4-byte length before each 16 KiB record, to a reader that lags: each length
    // finds the queue unread, but the records between them are not small.
    let args = ClientArgs {
        send: 8 << 20,
        recv: 0,
        msg_size: 16 << 10,
        prefix: 4,
        ..ClientArgs::default()
    }
    .greeted();
    let server = ServerArgs {
        reply_delay_ms: 200,
        ..ServerArgs::new(1)
    };
    let x = to_pod_b(&pods, &agent, 5404, &args, &server)?;
    assert_byte_exact(&x, &args)?;
    assert_bypassed(&x, &args)?;
    ensure!(
        grew(&x.before, &x.after, |s| s.counters.small_streams) == 0,
        "length-prefixed records were taken for a small-message stream: {:?}",
        x.after
    );
    Ok(())
}

/// An echo of bulk data answers a short read with a short write: each 16 KiB record
/// here is followed by twenty 100-byte writes, all to a reader that reads nothing
/// until the last is written. Each short write finds the queue unread, far more than 8
/// in a row, but what waits is mostly the long records: large messages on average, not
/// a stream that costs a queue entry per few bytes, so the connection keeps the
/// redirect.
#[test]
fn short_writes_behind_long_ones_keep_redirect() -> Result<()> {
    privileged!();
    let pods = two_pods()?;
    // The bound is not what this tests: one above everything the gated reader lets
    // pile up (records, short writes and each message's `struct sk_msg`).
    let agent = agent_with(&pods, &["--max-queued-bytes", "64M"])?;
    let client = ClientArgs {
        send: 4 << 20,
        recv: 0,
        msg_size: 16 << 10,
        prefix: 100,
        prefix_after: 20,
        ..ClientArgs::default()
    }
    .greeted();
    // The reader starts once the whole stream waits for it (a reader let go earlier
    // could read up to the middle of a run of short writes and leave only short ones
    // waiting: small on average, which the rule rightly counts), or once the
    // connection asked to leave (what the rule must not do here).
    let send = client.send;
    let (args, x) = writes_ahead_of_reader(
        &pods,
        &agent,
        5406,
        client,
        "the whole stream redirected to the gated reader, or a leave",
        |before, now| {
            now.counters.redirected_bytes >= before.counters.redirected_bytes + send
                || now.counters.leave_requests > before.counters.leave_requests
        },
    )?;
    assert_byte_exact(&x, &args)?;
    ensure!(
        grew(&x.before, &x.after, |s| s.counters.small_streams) == 0
            && grew(&x.before, &x.after, |s| s.counters.leave_requests) == 0,
        "short writes behind long records were taken for a small-message stream: {:?}",
        x.after
    );
    assert_bypassed(&x, &args)?;
    Ok(())
}

#[test]
fn small_message_ping_pong_keeps_redirect() -> Result<()> {
    privileged!();
    let pods = two_pods()?;
    let agent = agent_with(&pods, &[])?;
    // Each side answers only after reading the whole message: every send finds the
    // peer's queue read.
    let args = ClientArgs::pingpong(5000, 1).greeted();
    let x = to_pod_b(&pods, &agent, 5402, &args, &ServerArgs::new(1))?;
    ensure!(x.client.ok && x.server.ok, "{x:#?}");
    ensure!(
        x.client.rtt.as_ref().is_some_and(|r| r.count == 5000),
        "round trips: {:?}",
        x.client.rtt
    );
    ensure!(
        grew(&x.before, &x.after, |s| s.counters.small_streams) == 0,
        "a ping-pong was taken for a stream: {:?}",
        x.after
    );
    // Greeted: both sides paired and each has read what the other sent, so every
    // message of the ping-pong is redirected.
    ensure!(
        grew(&x.before, &x.after, |s| s.counters.redirected_bytes)
            >= x.client.bytes_sent + x.server.bytes_sent,
        "not every message was redirected: {:?}",
        x.after
    );
    // One-byte messages went socket to socket: the wire carried the handshake, the
    // greeting and the close, not a segment per message.
    ensure!(
        x.wire < 10_000,
        "the veths carried {} B for 10,000 one-byte messages",
        x.wire
    );
    Ok(())
}

#[test]
fn small_stream_rule_can_be_turned_off() -> Result<()> {
    privileged!();
    let pods = two_pods()?;
    let agent = agent_with(&pods, &["--small-stream-bytes", "0"])?;
    let st = agent.status()?;
    ensure!(num(&st, "small_stream_bytes") == 0, "{st}");
    let (args, x) = writes_ahead_of_reader(
        &pods,
        &agent,
        5403,
        small_writes(),
        "the bound to apply while the reader waits",
        |before, now| now.counters.queue_limited > before.counters.queue_limited,
    )?;
    assert_byte_exact(&x, &args)?;
    // The stream stays in the SockHash; 262,144 one-byte messages waiting for a reader
    // that waits first are each charged their `struct sk_msg`, so the bound (in
    // messages as well as bytes) moves the rest to TCP until the reader catches up.
    ensure!(
        grew(&x.before, &x.after, |s| s.counters.small_streams) == 0
            && grew(&x.before, &x.after, |s| s.counters.leave_requests) == 0,
        "the rule is off, yet the stream left the SockHash: {:?}",
        x.after
    );
    ensure!(
        grew(&x.before, &x.after, |s| s.counters.redirected_bytes) > 0
            && grew(&x.before, &x.after, |s| s.counters.queue_limited) >= 1,
        "want the first messages redirected, then the bound applied: {:?}",
        x.after
    );
    Ok(())
}
