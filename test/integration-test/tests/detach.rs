//! Detach: SIGTERM to the agent while 20 streams are in flight loses, duplicates and
//! reorders no byte; the streams finish on the normal TCP path; nothing stays pinned or
//! attached. Also when the receivers have not read anything yet, so the redirected
//! bytes still sit in their queues when the later ones start arriving by TCP.

use crate::support::exchange::ABOVE_PAYLOAD;
use crate::support::privileged;

use std::time::{Duration, Instant};

use crate::support::{Steps, hold_pair, probe_report};
use anyhow::{Context as _, Result, bail, ensure};
use testbed::{
    Agent, ClientArgs, PeerClient, PeerServer, ServerArgs, TwoPods,
    bpf::{sockops_attached, sockopt_attached},
};

#[test]
fn sigterm_mid_stream_loses_nothing() -> Result<()> {
    privileged!();
    let pods = TwoPods::new()?;
    let mut opts = pods.agent_opts().max_queued(ABOVE_PAYLOAD);
    // Its detach line says how much was redirected once redirects were off.
    opts.extra_args.push("--log-json".to_owned());
    let mut agent = Agent::start(&opts)?;
    ensure!(
        sockops_attached(pods.cgroup())? == 1,
        "agent not attached to the test cgroup"
    );
    // A held connection makes the stop land mid-stream whatever the pace of the streams
    // (under emulation all 20 can end first): its first chunk is redirected before the
    // stop, its second is sent only after it, by TCP.
    const CHUNK: u64 = 1 << 20;
    let steps = Steps::new(&pods, "detach")?;
    let held = hold_pair(&pods, &agent, &steps, 5203, CHUNK)?;
    // 20 streams, 8 MiB each way at 1 MiB/s, stopped mid-way where the pace allows.
    let args = ClientArgs {
        streams: 20,
        msg_size: 16 * 1024,
        rate: 1 << 20,
        ..ClientArgs::bulk(8 << 20)
    };
    let payload = args.total_connections() * (args.send + args.recv) + 2 * CHUNK;
    let addr = pods.b.v4_addr(5201);
    let server = PeerServer::start(&pods.b, addr, args.total_connections())?;
    let client = PeerClient::spawn(&pods.a, addr, &args)?;

    // The streams' bytes flowing socket to socket.
    let deadline = Instant::now() + testbed::steps::NET;
    loop {
        let s = agent.stats()?;
        if s.counters.redirected_bytes > held.redirected.counters.redirected_bytes {
            break;
        }
        if Instant::now() > deadline {
            bail!("the streams' bytes were never redirected: {s:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let at_stop = agent.stats()?;
    // Only a connection whose client wrote before it was paired (a race with the end of
    // the handshake, frequent under emulation) sends by TCP before the stop, for good.
    ensure!(
        at_stop.counters.passed_bytes == 0 || at_stop.counters.unpaired_sends > 0,
        "bytes took TCP before the stop: {at_stop:?}"
    );
    let wire_at_stop = pods.wire_bytes()?;
    let exit = agent.stop_cleanly("agent")?;
    let redirected = exit.redirected_at_detach().with_context(|| {
        format!(
            "no `bypass detached` line with redirected_bytes: {}",
            exit.stderr
        )
    })?;

    // Nothing pinned, nothing attached, right after the exit.
    ensure!(
        !agent.pin_dir().exists(),
        "pins left: {}",
        agent.pin_dir().display()
    );
    ensure!(
        sockops_attached(pods.cgroup())? == 0 && sockopt_attached(pods.cgroup())? == 0,
        "sock_ops or setsockopt still attached"
    );

    steps.touch("more")?;
    let (c, s) = (probe_report(held.client)?, held.server.wait()?);
    ensure!(
        c["sent"] == 2 * CHUNK && s["ok"] == true && s["received"] == 2 * CHUNK,
        "held connection: {c} {s}"
    );
    let client = client.wait()?;
    let server = server.wait()?;
    let wire_after = pods.wire_bytes()?.saturating_sub(wire_at_stop);
    eprintln!(
        "redirected {} B when the stop was sent, {redirected} B in all, of {payload} B; \
         wire after the stop was sent {wire_after} B; EAGAIN {}+{}",
        at_stop.counters.redirected_bytes, client.spurious_eagain, server.spurious_eagain
    );
    ensure!(client.ok, "client failures: {:#?}", client.failures);
    ensure!(server.ok, "server failures: {:#?}", server.failures);
    ensure!(
        client.connections == 20 && server.connections == 20,
        "{client:?} {server:?}"
    );
    let each = 20 * args.send;
    ensure!(
        client.bytes_sent == each && server.bytes_received == each,
        "c2s totals"
    );
    ensure!(
        server.bytes_sent == each && client.bytes_received == each,
        "s2c totals"
    );
    // What was not redirected before the redirects went off, nor sent by TCP before
    // the stop was sent, went by TCP after it (the wire also carries headers). The
    // counters are read just after the switch: a message being redirected on another
    // CPU then may not be counted yet (a write is 16 KiB here; a MiB of slack).
    let rest = payload.saturating_sub(redirected + at_stop.counters.passed_bytes);
    ensure!(
        wire_after + (1 << 20) >= rest,
        "only {wire_after} B on the wire after the stop, {rest} B were left to send"
    );
    Ok(())
}

#[test]
fn sigterm_with_unread_redirected_bytes_keeps_order() -> Result<()> {
    privileged!();
    let pods = TwoPods::new()?;
    let mut agent = Agent::start(&pods.agent_opts().max_queued(ABOVE_PAYLOAD))?;
    // The server reads nothing for 2 s: what the clients send meanwhile piles up in
    // the server sockets' ingress queues.
    let args = ClientArgs {
        streams: 4,
        send: 32 << 20,
        recv: 0,
        ..ClientArgs::default()
    };
    let server_args = ServerArgs {
        reply_delay_ms: 2000,
        ..ServerArgs::new(args.total_connections())
    };
    let addr = pods.b.v4_addr(5202);
    let server = PeerServer::start_with(&pods.b, addr, &server_args)?;
    let client = PeerClient::spawn(&pods.a, addr, &args)?;
    let deadline = Instant::now() + testbed::steps::NET;
    let queued = loop {
        let s = agent.stats()?;
        if s.sockets == 8 && s.counters.redirected_bytes >= 16 << 20 {
            break s.counters.redirected_bytes;
        }
        if Instant::now() > deadline {
            bail!("no redirected bytes piled up: {s:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    agent.stop_cleanly("agent")?;
    let client = client.wait()?;
    let server = server.wait()?;
    eprintln!(
        "{queued} B redirected and unread at the stop; server verified {} B",
        server.bytes_received
    );
    ensure!(client.ok, "client failures: {:#?}", client.failures);
    ensure!(server.ok, "server failures: {:#?}", server.failures);
    ensure!(
        server.bytes_received == 4 * args.send,
        "server verified {}",
        server.bytes_received
    );
    Ok(())
}
