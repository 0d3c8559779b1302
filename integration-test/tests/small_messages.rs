//! Small-message streams. A redirect costs the reader one ingress-queue entry and one
//! wake-up per message; with `--small-stream-bytes N`, a direction whose sends under N
//! bytes keep finding the peer behind on its reading takes the TCP path for good,
//! while request/response traffic (the peer has read everything before it answers)
//! keeps the redirect at every size. Off by default (the bench shows where it wins and
//! where it loses). Either way every byte arrives once and in order.

mod support;

use support::privileged;

use anyhow::{Result, ensure};
use support::exchange::{Exchange, assert_bypassed, assert_byte_exact, exchange_with};
use support::{agent_with, num, queue_bound_off, two_pods};
use testbed::{Agent, AgentStatus, ClientArgs, ServerArgs, TwoPods};

/// One-byte writes, 256 KiB of them, to a server that starts reading only after 200 ms:
/// the writer is ahead of its reader from its first sends.
fn stream_of_small_writes() -> (ClientArgs, ServerArgs) {
    let client = ClientArgs {
        send: 256 << 10,
        recv: 0,
        msg_size: 1,
        ..ClientArgs::default()
    };
    let server = ServerArgs {
        reply_delay_ms: 200,
        ..ServerArgs::new(1)
    };
    (client, server)
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

fn grew(before: &AgentStatus, after: &AgentStatus, f: fn(&AgentStatus) -> u64) -> u64 {
    f(after).saturating_sub(f(before))
}

#[test]
fn small_message_stream_takes_tcp_in_order() -> Result<()> {
    privileged!("small_message_stream_takes_tcp_in_order");
    let pods = two_pods()?;
    let agent = agent_with(&pods, &["--small-stream-bytes", "256"])?;
    let st = agent.status()?;
    if let Some(why) = queue_bound_off(&agent)? {
        // No measurement of the peer's queue, so no rule: the stream stays redirected.
        eprintln!("queue not measurable ({why}): the small-stream rule is off");
        ensure!(num(&st, "small_stream_bytes") == 0, "{st}");
        let (args, server) = stream_of_small_writes();
        let args = args.paired_first();
        let x = to_pod_b(&pods, &agent, 5401, &args, &server)?;
        assert_byte_exact(&x, &args)?;
        return assert_bypassed(&x, &args);
    }
    ensure!(
        num(&st, "small_stream_bytes") == 256,
        "status does not show the small-stream size asked for: {st}"
    );
    let (args, server) = stream_of_small_writes();
    let x = to_pod_b(&pods, &agent, 5401, &args, &server)?;
    assert_byte_exact(&x, &args)?;
    let passed = grew(&x.before, &x.after, |s| s.counters.passed_bytes);
    ensure!(
        grew(&x.before, &x.after, |s| s.counters.small_streams) == 1,
        "small_streams grew by {}, want 1 (the client's direction): {:?}",
        grew(&x.before, &x.after, |s| s.counters.small_streams),
        x.after
    );
    // The first few writes were redirected before the rule saw a stream; the rest went
    // by TCP, on the veths.
    ensure!(
        passed >= args.send * 99 / 100,
        "only {passed} of {} B took TCP",
        args.send
    );
    ensure!(
        x.wire >= args.send,
        "the veths carried {} B: the stream did not take TCP",
        x.wire
    );
    Ok(())
}

#[test]
fn length_prefixed_records_keep_redirect() -> Result<()> {
    privileged!("length_prefixed_records_keep_redirect");
    let pods = two_pods()?;
    let agent = agent_with(&pods, &["--small-stream-bytes", "256"])?;
    // A 4-byte length before each 16 KiB record, to a reader that lags: each length
    // finds the queue unread, but the records between them are not small.
    let args = ClientArgs {
        send: 8 << 20,
        recv: 0,
        msg_size: 16 << 10,
        prefix: 4,
        ..ClientArgs::default()
    }
    .paired_first();
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

#[test]
fn small_message_ping_pong_keeps_redirect() -> Result<()> {
    privileged!("small_message_ping_pong_keeps_redirect");
    let pods = two_pods()?;
    let agent = agent_with(&pods, &["--small-stream-bytes", "256"])?;
    // Each side answers only after reading the whole message: every send finds the
    // peer's queue read.
    let args = ClientArgs::pingpong(5000, 1);
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
    // The client's first send can race its pairing (the server pairs when its own end
    // is established): then that direction keeps TCP from its first byte, as the ordering
    // rule says, and `unpaired_sends` tells. The server's answers are still redirected.
    let passed = grew(&x.before, &x.after, |s| s.counters.passed_bytes);
    let client_unpaired = grew(&x.before, &x.after, |s| s.counters.unpaired_sends) == 1;
    let client_bytes = x.client.bytes_sent + 64;
    if client_unpaired {
        eprintln!("the client's first send raced its pairing: its direction took TCP");
    }
    ensure!(
        passed == 0 || (client_unpaired && passed <= client_bytes),
        "{passed} B took TCP: {:?}",
        x.after
    );
    ensure!(
        grew(&x.before, &x.after, |s| s.counters.redirected_bytes) >= x.server.bytes_sent,
        "the server's answers were not all redirected: {:?}",
        x.after
    );
    // One-byte messages went socket to socket: the wire carried the handshake and the
    // close, not a segment per message.
    ensure!(
        client_unpaired || x.wire < 10_000,
        "the veths carried {} B for 10,000 one-byte messages",
        x.wire
    );
    Ok(())
}

#[test]
fn small_stream_rule_off_by_default() -> Result<()> {
    privileged!("small_stream_rule_off_by_default");
    let pods = two_pods()?;
    let agent = Agent::start(&pods.agent_opts())?;
    let st = agent.status()?;
    ensure!(num(&st, "small_stream_bytes") == 0, "{st}");
    let (args, server) = stream_of_small_writes();
    let args = args.paired_first();
    let x = to_pod_b(&pods, &agent, 5403, &args, &server)?;
    assert_byte_exact(&x, &args)?;
    assert_bypassed(&x, &args)?;
    ensure!(
        grew(&x.before, &x.after, |s| s.counters.small_streams) == 0,
        "{:?}",
        x.after
    );
    Ok(())
}
