//! `bypass-test-tool peer client`: opens connections (some at a time), sends the header
//! and its pattern right after connect, verifies what comes back and the server's
//! verdict.

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
    parse_size, parse_usize,
    pattern::{Direction, Pattern, Verifier},
    report::{ConnOutcome, Failure, Report},
    wire::{Header, Mode, Trailer, Verdict},
};

/// Options of `bypass-test-tool peer client`: parsed from its command line by the peer,
/// and rendered back into one ([`ClientArgs::args`]) by the tests that spawn it.
#[derive(Clone, Debug, PartialEq, Eq, clap::Args)]
pub struct ClientArgs {
    /// Bytes sent on each connection (K, M, G suffixes).
    #[arg(long, default_value = "0", value_parser = parse_size)]
    pub send: u64,
    /// Bytes the server sends back on each connection.
    #[arg(long, default_value = "0", value_parser = parse_size)]
    pub recv: u64,
    /// Connections open at once.
    #[arg(long, default_value_t = 1)]
    pub streams: usize,
    /// Connections in all; 0 is the same as --streams.
    #[arg(long, default_value_t = 0)]
    pub connections: u64,
    /// Bytes per write (one sendmsg, one sk_msg run), and the ping-pong message size.
    #[arg(long, default_value = "64K", value_parser = parse_usize)]
    pub msg_size: usize,
    /// Bytes per second per connection and direction; 0 is unlimited.
    #[arg(long, default_value = "0", value_parser = parse_size)]
    pub rate: u64,
    /// In a bulk stream, write this many bytes before each --msg-size write (a
    /// length prefix before each record); 0 writes none.
    #[arg(long, default_value = "0", value_parser = parse_usize)]
    pub prefix: usize,
    /// Write this many --prefix writes after each --msg-size write instead of one
    /// before it (an echo's short answers behind each long one); 0 keeps --prefix a
    /// length prefix. Needs --prefix.
    #[arg(long, default_value = "0", value_parser = parse_usize, requires = "prefix")]
    pub prefix_after: usize,
    /// Do this many round trips of --msg-size bytes instead of bulk transfer.
    #[arg(long, value_name = "ROUNDS")]
    pub pingpong: Option<u64>,
    /// Stream id of the first connection (seeds its pattern).
    #[arg(long, default_value_t = 0)]
    pub stream_base: u64,
    /// CPUs the client may run on (empty: any); where the test spawns it, not an
    /// option of the peer.
    #[arg(skip)]
    pub cpus: Vec<usize>,
    /// Fail a connection that makes no progress for this many seconds; 0 sets no
    /// socket timeout at all.
    #[arg(long = "idle-timeout", default_value_t = crate::steps::NO_PROGRESS.as_secs())]
    pub idle_timeout_secs: u64,
    /// Ask the server to answer the header with a greeting, and read it before sending
    /// anything more. Without it the client's bytes follow its connect at once, racing
    /// the server's socket into the SockHash (a client that wins that race sends by TCP
    /// until the server has read those bytes, by design); a test that asserts every
    /// byte was redirected greets instead: once the greeting is read, both sides are
    /// paired and each has read what the other sent.
    #[arg(long)]
    pub greet: bool,
}

impl Default for ClientArgs {
    fn default() -> Self {
        Self {
            send: 0,
            recv: 0,
            streams: 1,
            connections: 0,
            msg_size: 64 * 1024,
            rate: 0,
            prefix: 0,
            prefix_after: 0,
            pingpong: None,
            stream_base: 0,
            cpus: Vec::new(),
            idle_timeout_secs: crate::steps::NO_PROGRESS.as_secs(),
            greet: false,
        }
    }
}

impl ClientArgs {
    /// One connection, `bytes` each way.
    pub fn bulk(bytes: u64) -> Self {
        Self {
            send: bytes,
            recv: bytes,
            ..Self::default()
        }
    }

    /// One connection, `rounds` round trips of `size`-byte messages.
    pub fn pingpong(rounds: u64, size: usize) -> Self {
        Self {
            pingpong: Some(rounds),
            msg_size: size,
            ..Self::default()
        }
    }

    /// These, with each connection greeted ([`ClientArgs::greet`]): for a test that
    /// asserts every byte of the payload was redirected.
    #[must_use]
    pub fn greeted(self) -> Self {
        Self {
            greet: true,
            ..self
        }
    }

    /// Connections in all, as the server must expect them.
    pub fn total_connections(&self) -> u64 {
        if self.connections == 0 {
            self.streams.max(1) as u64
        } else {
            self.connections
        }
    }

    /// The command line after `client --connect ADDR`.
    pub fn args(&self) -> Vec<String> {
        let mut a = vec![
            "--send".to_owned(),
            self.send.to_string(),
            "--recv".to_owned(),
            self.recv.to_string(),
            "--streams".to_owned(),
            self.streams.to_string(),
            "--connections".to_owned(),
            self.total_connections().to_string(),
            "--msg-size".to_owned(),
            self.msg_size.to_string(),
            "--rate".to_owned(),
            self.rate.to_string(),
            "--prefix".to_owned(),
            self.prefix.to_string(),
            "--prefix-after".to_owned(),
            self.prefix_after.to_string(),
            "--stream-base".to_owned(),
            self.stream_base.to_string(),
            "--idle-timeout".to_owned(),
            self.idle_timeout_secs.to_string(),
        ];
        if self.greet {
            a.push("--greet".to_owned());
        }
        if let Some(r) = self.pingpong {
            a.extend(["--pingpong".to_owned(), r.to_string()]);
        }
        a
    }
}

/// Runs every connection to `connect` and reports.
pub fn run(connect: SocketAddr, opts: &ClientArgs) -> Report {
    let next = AtomicU64::new(0);
    let outcomes = Mutex::new(Vec::new());
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..opts.streams.max(1) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= opts.total_connections() {
                        break;
                    }
                    let outcome = one(connect, opts, opts.stream_base + i);
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
fn one(connect: SocketAddr, opts: &ClientArgs, stream: u64) -> ConnOutcome {
    let mut out = ConnOutcome::default();
    let io_fail =
        |what: &str, e: std::io::Error| Failure::conn(stream, "io", format!("{what}: {e}"));
    let sock = match TcpStream::connect(connect) {
        Ok(s) => s,
        Err(e) => {
            out.failures.push(io_fail(&format!("connect {connect}"), e));
            return out;
        }
    };
    let timeout = timeout_of(Duration::from_secs(opts.idle_timeout_secs));
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
        greet: opts.greet,
    };
    // By default the first send follows connect at once: it races the server's side of
    // the connection into the SockHash, which is what the datapath must survive.
    if let Err(e) = (&sock).write_all(&header.encode()) {
        out.failures.push(io_fail("send header", e));
        return out;
    }
    let mut reader = PatientReader::new(&sock, timeout);
    if opts.greet {
        let mut hello = [0u8; 8];
        match reader.read_exact(&mut hello) {
            Ok(()) if hello == super::wire::GREETING => {
                if let Err(e) = (&sock).write_all(&super::wire::GREETING) {
                    out.failures.push(io_fail("send greeting back", e));
                    return out;
                }
            }
            Ok(()) => {
                out.failures.push(Failure::conn(
                    stream,
                    "protocol",
                    format!("greeting {hello:?} is not {:?}", super::wire::GREETING),
                ));
                return out;
            }
            Err(e) => {
                out.failures.push(io_fail("read greeting", e));
                return out;
            }
        }
    }
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
    opts: &ClientArgs,
    out: &mut ConnOutcome,
) {
    let msg_size = h.msg_size as usize;
    let sizes = match (opts.prefix, opts.prefix_after) {
        (0, _) => vec![msg_size],
        (p, 0) => vec![p, msg_size],
        (p, n) => std::iter::once(msg_size)
            .chain(std::iter::repeat_n(p, n))
            .collect(),
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
        Err(_) => out
            .failures
            .push(Failure::conn(h.stream, "io", "writer thread panicked")),
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
        Err(e) => out.failures.push(Failure::conn(stream, "protocol", e)),
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
        Err(e) => out
            .failures
            .push(Failure::conn(stream, "io", format!("wait for close: {e}"))),
    }
}
