//! A known difference between a bypassed socket and TCP, pinned down so that it stays
//! documented (docs/limitations.md) and so that this test fails, and the documentation
//! gets updated, on the day a kernel fixes it.
//!
//! On TCP a blocking `recv` never returns `EAGAIN` (only a non-blocking one, or one whose
//! `SO_RCVTIMEO` expired, may). On a socket in a sockmap it can, and no BPF program can
//! change that path. The peer (`bypass-test-tool peer`) retries such reads and counts
//! them, so the bytes are still checked end to end here and everywhere else.
//!
//! The pattern that shows it: the client sends its request, half-closes
//! (`shutdown(SHUT_WR)`) and blocks reading the reply, which the server sends 20 ms
//! later. When the ACK of the client's FIN arrives, the kernel wakes the reader
//! (`sk_state_change`, FIN_WAIT1 -> FIN_WAIT2); plain `tcp_recvmsg` goes back to sleep,
//! `tcp_bpf_recvmsg` returns -EAGAIN (net/ipv4/tcp_bpf.c: one `tcp_msg_wait_data`, then
//! `copied = -EAGAIN`).

use crate::support::privileged;

use crate::support::exchange::{assert_byte_exact, exchange_with};
use anyhow::{Result, ensure};
use testbed::{Agent, ClientArgs, ServerArgs, TwoPods};

#[test]
fn blocking_read_after_own_half_close_sees_eagain_only_when_bypassed() -> Result<()> {
    privileged!();
    let pods = TwoPods::new()?;
    // No SO_RCVTIMEO anywhere: every EAGAIN is one a blocking read must not return.
    let args = ClientArgs {
        connections: 50,
        idle_timeout_secs: 0,
        ..ClientArgs::bulk(1024)
    };
    let server = ServerArgs {
        idle_timeout_secs: 0,
        reply_delay_ms: 20,
        ..ServerArgs::new(args.total_connections())
    };
    let tcp = exchange_with(
        &pods,
        None,
        pods.b.v4_addr(5101),
        pods.b.v4_addr(5101),
        &args,
        &server,
    )?;
    assert_byte_exact(&tcp, &args)?;
    ensure!(
        tcp.client.spurious_eagain + tcp.server.spurious_eagain == 0,
        "plain TCP returned EAGAIN to a blocking read: the test itself is wrong"
    );
    let agent = Agent::start(&pods.agent_opts())?;
    let x = exchange_with(
        &pods,
        Some(&agent),
        pods.b.v4_addr(5102),
        pods.b.v4_addr(5102),
        &args,
        &server,
    )?;
    assert_byte_exact(&x, &args)?;
    ensure!(
        x.grew(|s| s.counters.sockets_inserted) == 100,
        "not bypassed: {:?}",
        x.after
    );
    let eagain = x.client.spurious_eagain + x.server.spurious_eagain;
    println!(
        "blocking recv() returned EAGAIN {eagain} times in 50 bypassed connections (plain TCP: 0); \
         every byte arrived in order"
    );
    // The documented limitation: the client's blocking read of the reply is woken by the
    // ACK of its own FIN and gets EAGAIN. If this fails with 0, the kernel no longer does
    // this: remove the limitation from docs/limitations.md and turn this into an equality
    // check.
    ensure!(
        eagain > 0 && x.client.spurious_eagain > 0,
        "no EAGAIN on bypassed blocking reads any more (client {}, server {}): update \
         docs/limitations.md and make this test assert 0",
        x.client.spurious_eagain,
        x.server.spurious_eagain
    );
    Ok(())
}
