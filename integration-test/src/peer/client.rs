//! `bypass-peer client`: opens connections (some at a time), sends the header and its
//! pattern right after connect, verifies what comes back and the server's verdict.

use std::{
    io::{Read, Write},
    net::{Shutdown, SocketAddr, TcpStream},
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use super::{
    io::{PatientReader, expect_eof, recv_pattern, send_pattern_sizes},
    pattern::{Direction, Pattern, Verifier},
    report::{ConnOutcome, Failure, Report},
    wire::{Header, Mode, Trailer, Verdict},
};

/// What the client does.
#[derive(Clone, Debug)]
pub struct ClientOpts {
    /// Server address.
    pub connect: SocketAddr,
    /// Pattern bytes to send on each connection.
    pub send: u64,
    /// Pattern bytes the server sends back on each connection.
    pub recv: u64,
    /// Connections open at once.
    pub streams: usize,
    /// Connections in all.
    pub connections: u64,
    /// Bytes per write.
    pub msg_size: usize,
    /// Send rate per connection and direction, bytes per second (0: unlimited).
    pub rate: u64,
    /// Bytes written before each `msg_size` write in a bulk stream (0: none).
    pub prefix: usize,
    /// Ping-pong rounds per connection instead of bulk streams.
    pub pingpong: Option<u64>,
    /// First stream id (ids are `stream_base..stream_base + connections`).
    pub stream_base: u64,
    /// A read or write that makes no progress for this long fails the connection
    /// (zero: wait forever).
    pub idle_timeout: Duration,
}

/// Runs every connection and reports.
pub fn run(opts: &ClientOpts) -> Report {
    let next = AtomicU64::new(0);
    let outcomes = Mutex::new(Vec::new());
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..opts.streams.max(1) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= opts.connections {
                        break;
                    }
                    let outcome = one(opts, opts.stream_base + i);
                    if let Ok(mut v) = outcomes.lock() {
                        v.push(outcome);
                    }
                }
            });
        }
    });
    let elapsed = start.elapsed().as_secs_f64();
    let outcomes = outcomes.into_inner().unwrap_or_default();
    Report::build("client", outcomes, elapsed)
}

/// The socket timeout for an idle limit (zero: none).
pub(super) fn timeout_of(idle: Duration) -> Option<Duration> {
    (!idle.is_zero()).then_some(idle)
}

/// One connection.
fn one(opts: &ClientOpts, stream: u64) -> ConnOutcome {
    let mut out = ConnOutcome::default();
    let io_fail = |what: &str, e: std::io::Error| {
        Failure::new(stream, None, "io", None, format!("{what}: {e}"))
    };
    let sock = match TcpStream::connect(opts.connect) {
        Ok(s) => s,
        Err(e) => {
            out.failures
                .push(io_fail(&format!("connect {}", opts.connect), e));
            return out;
        }
    };
    let timeout = timeout_of(opts.idle_timeout);
    let setup = sock
        .set_nodelay(true)
        .and_then(|()| sock.set_read_timeout(timeout))
        .and_then(|()| sock.set_write_timeout(timeout));
    if let Err(e) = setup {
        out.failures.push(io_fail("socket options", e));
        return out;
    }
    let msg_size = opts.msg_size.clamp(1, u32::MAX as usize);
    let header = Header {
        mode: if opts.pingpong.is_some() {
            Mode::PingPong
        } else {
            Mode::Stream
        },
        stream,
        c2s: opts.pingpong.map_or(opts.send, |r| r * msg_size as u64),
        s2c: if opts.pingpong.is_some() {
            0
        } else {
            opts.recv
        },
        msg_size: msg_size as u32,
        rate: opts.rate,
    };
    // The first send follows connect at once: it races the server's side of the
    // connection into the SockHash, which is what the datapath must survive.
    if let Err(e) = (&sock).write_all(&header.encode()) {
        out.failures.push(io_fail("send header", e));
        return out;
    }
    let mut reader = PatientReader::new(&sock, timeout);
    match header.mode {
        Mode::Stream => stream_mode(&sock, &mut reader, &header, opts, &mut out),
        Mode::PingPong => pingpong_mode(&sock, &mut reader, &header, &mut out),
    }
    if out.failures.is_empty() {
        read_verdict(&mut reader, stream, &mut out);
    }
    out.spurious_eagain = reader.spurious_eagain();
    out
}

/// Bulk: a writer thread sends while this thread verifies what comes back.
fn stream_mode(
    sock: &TcpStream,
    reader: &mut PatientReader<'_>,
    h: &Header,
    opts: &ClientOpts,
    out: &mut ConnOutcome,
) {
    let msg_size = h.msg_size as usize;
    let sizes = if opts.prefix > 0 {
        vec![opts.prefix, msg_size]
    } else {
        vec![msg_size]
    };
    let rate = opts.rate;
    let (sent, (received, failure)) = std::thread::scope(|s| {
        let w = s.spawn(move || {
            let mut writer = sock;
            let r = send_pattern_sizes(
                &mut writer,
                h.stream,
                Direction::ClientToServer,
                h.c2s,
                &sizes,
                rate,
            );
            // Half-close: the server's check for extra bytes ends at our FIN.
            let _ = writer.shutdown(Shutdown::Write);
            r
        });
        let got = recv_pattern(reader, h.stream, Direction::ServerToClient, h.s2c);
        (w.join(), got)
    });
    out.received = received;
    match sent {
        Ok(Ok(n)) => out.sent = n,
        Ok(Err(e)) => out.failures.push(Failure::new(
            h.stream,
            Some(Direction::ClientToServer),
            "io",
            None,
            format!("send: {e}"),
        )),
        Err(_) => out.failures.push(Failure::new(
            h.stream,
            None,
            "io",
            None,
            "writer thread panicked",
        )),
    }
    out.failures.extend(failure);
}

/// Ping-pong: one message out, wait for its echo, verify, time it.
fn pingpong_mode(
    sock: &TcpStream,
    reader: &mut PatientReader<'_>,
    h: &Header,
    out: &mut ConnOutcome,
) {
    let mut writer = sock;
    let size = h.msg_size as usize;
    let rounds = h.c2s / size as u64;
    let mut pattern = Pattern::new(h.stream, Direction::ClientToServer);
    let mut echo_check = Verifier::new(h.stream, Direction::ClientToServer);
    let mut msg = vec![0u8; size];
    let mut echo = vec![0u8; size];
    out.rtts_ns.reserve(rounds as usize);
    for _ in 0..rounds {
        pattern.fill(&mut msg);
        let t = Instant::now();
        if let Err(e) = writer
            .write_all(&msg)
            .and_then(|()| reader.read_exact(&mut echo))
        {
            out.failures.push(Failure::new(
                h.stream,
                None,
                "io",
                Some(out.received),
                format!("round trip: {e}"),
            ));
            return;
        }
        out.rtts_ns.push(t.elapsed().as_nanos() as u64);
        out.sent += size as u64;
        out.received += size as u64;
        echo_check.feed(&echo);
    }
    if let Some(m) = echo_check.first_mismatch() {
        out.failures.push(Failure::new(
            h.stream,
            Some(Direction::ServerToClient),
            "mismatch",
            Some(m.offset),
            format!(
                "echo byte {} is {:#04x}, sent {:#04x}",
                m.offset, m.got, m.expected
            ),
        ));
    }
    let _ = sock.shutdown(Shutdown::Write);
}

/// The server's verdict on our bytes, then its close.
fn read_verdict(reader: &mut PatientReader<'_>, stream: u64, out: &mut ConnOutcome) {
    let mut b = [0u8; Trailer::LEN];
    let verdict = reader
        .read_exact(&mut b)
        .map_err(|e| format!("read verdict: {e}"))
        .and_then(|()| Trailer::decode(&b));
    let c2s = Some(Direction::ClientToServer);
    match verdict {
        Ok(Verdict::Ok) => {}
        Ok(Verdict::Mismatch(o)) => out.failures.push(Failure::new(
            stream,
            c2s,
            "mismatch",
            Some(o),
            format!("server saw byte {o} differ"),
        )),
        Ok(Verdict::Short(o)) => out.failures.push(Failure::new(
            stream,
            c2s,
            "short",
            Some(o),
            format!("server got only {o} bytes"),
        )),
        Ok(Verdict::Extra(o)) => out.failures.push(Failure::new(
            stream,
            c2s,
            "extra",
            Some(o),
            format!("server got bytes past the end, at {o}"),
        )),
        Err(e) => out
            .failures
            .push(Failure::new(stream, None, "protocol", None, e)),
    }
    match expect_eof(reader) {
        Ok(0) => {}
        Ok(n) => out.failures.push(Failure::new(
            stream,
            Some(Direction::ServerToClient),
            "extra",
            None,
            format!("{n} bytes after the verdict"),
        )),
        Err(e) => out.failures.push(Failure::new(
            stream,
            None,
            "io",
            None,
            format!("wait for close: {e}"),
        )),
    }
}
