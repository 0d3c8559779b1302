//! Sending and receiving pattern bytes on a socket: paced writes of a fixed size, and
//! exact-length reads checked by a [`Verifier`].

use std::{
    io::{self, Read, Write},
    net::TcpStream,
    time::{Duration, Instant},
};

use super::{
    pattern::{Direction, Pattern, Verifier},
    report::Failure,
};

/// Holds a sender to `rate` bytes per second (0: no limit).
pub struct Pacer {
    start: Instant,
    rate: u64,
}

impl Pacer {
    /// Starts the clock now.
    pub fn new(rate: u64) -> Self {
        Self {
            start: Instant::now(),
            rate,
        }
    }

    /// Sleeps until `done` bytes are due.
    pub fn wait(&self, done: u64) {
        if self.rate == 0 {
            return;
        }
        let due = Duration::from_secs_f64(done as f64 / self.rate as f64);
        let now = self.start.elapsed();
        if due > now {
            std::thread::sleep(due - now);
        }
    }
}

/// Reads a blocking socket, retrying the `EAGAIN` a blocking read must never return
/// but a socket in a SockHash can (`tcp_bpf_recvmsg` gives up after one wake-up that
/// found no data, net/ipv4/tcp_bpf.c): those are counted, so a test can assert on
/// them, and not mistaken for lost bytes. `EAGAIN` after the socket's own receive
/// timeout is a real timeout.
pub struct PatientReader<'a> {
    sock: &'a TcpStream,
    timeout: Option<Duration>,
    spurious: u64,
}

impl<'a> PatientReader<'a> {
    /// Reads `sock`, whose `SO_RCVTIMEO` is `timeout` (`None`: no timeout).
    pub fn new(sock: &'a TcpStream, timeout: Option<Duration>) -> Self {
        Self {
            sock,
            timeout,
            spurious: 0,
        }
    }

    /// `EAGAIN`s seen before the timeout.
    pub fn spurious_eagain(&self) -> u64 {
        self.spurious
    }
}

impl Read for PatientReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let start = Instant::now();
        loop {
            match (&*self.sock).read(buf) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // The kernel timer may fire a little early: 9/10 of it counts.
                    if let Some(t) = self.timeout
                        && start.elapsed() >= t.mul_f64(0.9)
                    {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!("no data for {t:?}"),
                        ));
                    }
                    self.spurious += 1;
                }
                r => return r,
            }
        }
    }
}

/// Writes `len` bytes of the pattern of `stream` in `dir`, one `write` per `msg_size`
/// bytes (so one sk_msg run per message), paced to `rate`. Returns the bytes written.
pub fn send_pattern(
    w: &mut impl Write,
    stream: u64,
    dir: Direction,
    len: u64,
    msg_size: usize,
    rate: u64,
) -> io::Result<u64> {
    send_pattern_sizes(w, stream, dir, len, &[msg_size], rate)
}

/// [`send_pattern`] with writes whose sizes cycle through `sizes` (a length prefix
/// and a record, say).
pub fn send_pattern_sizes(
    w: &mut impl Write,
    stream: u64,
    dir: Direction,
    len: u64,
    sizes: &[usize],
    rate: u64,
) -> io::Result<u64> {
    let mut pattern = Pattern::new(stream, dir);
    let mut buf = vec![0u8; sizes.iter().copied().max().unwrap_or(1).max(1)];
    let pacer = Pacer::new(rate);
    let mut sent = 0u64;
    for &size in sizes.iter().cycle() {
        if sent >= len {
            break;
        }
        let n = (len - sent).min(size.max(1) as u64) as usize;
        pattern.fill(&mut buf[..n]);
        w.write_all(&buf[..n])?;
        sent += n as u64;
        pacer.wait(sent);
    }
    Ok(sent)
}

/// Reads exactly `len` bytes (never more) and checks them against the pattern of
/// `stream` in `dir`. Returns the bytes read and the failure, if any: a mismatch (the
/// rest is still read, to stay in step), a short stream, or an I/O error.
pub fn recv_pattern(
    r: &mut impl Read,
    stream: u64,
    dir: Direction,
    len: u64,
) -> (u64, Option<Failure>) {
    let mut verifier = Verifier::new(stream, dir);
    let mut buf = vec![0u8; 256 * 1024];
    let stop = |kind, off, detail| {
        (
            off,
            Some(Failure::new(stream, Some(dir), kind, Some(off), detail)),
        )
    };
    while verifier.offset() < len {
        let want = (len - verifier.offset()).min(buf.len() as u64) as usize;
        let off = verifier.offset();
        match r.read(&mut buf[..want]) {
            Ok(0) => {
                return stop(
                    "short",
                    off,
                    format!("stream ended after {off} of {len} bytes"),
                );
            }
            Ok(n) => verifier.feed(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return stop("io", off, format!("read after {off} of {len} bytes: {e}")),
        }
    }
    let failure = verifier.first_mismatch().map(|m| {
        Failure::new(
            stream,
            Some(dir),
            "mismatch",
            Some(m.offset),
            format!(
                "byte {} is {:#04x}, pattern has {:#04x}",
                m.offset, m.got, m.expected
            ),
        )
    });
    (verifier.offset(), failure)
}

/// After a stream's last byte the peer must close: counts what arrives before EOF.
pub fn expect_eof(r: &mut impl Read) -> io::Result<u64> {
    let mut buf = [0u8; 4096];
    let mut extra = 0u64;
    loop {
        match r.read(&mut buf) {
            Ok(0) => return Ok(extra),
            Ok(n) => extra += n as u64,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn send_then_recv_round_trip() {
        let mut wire = Vec::new();
        let n = send_pattern(&mut wire, 4, Direction::ClientToServer, 100_003, 4096, 0).unwrap();
        assert_eq!(n, 100_003);
        let mut r = io::Cursor::new(wire);
        let (got, failure) = recv_pattern(&mut r, 4, Direction::ClientToServer, 100_003);
        assert_eq!((got, failure), (100_003, None));
        assert_eq!(expect_eof(&mut r).unwrap(), 0);
    }

    #[test]
    fn recv_reports_short_and_mismatch() {
        let mut wire = Vec::new();
        send_pattern(&mut wire, 4, Direction::ClientToServer, 1000, 100, 0).unwrap();
        let (got, f) = recv_pattern(
            &mut io::Cursor::new(&wire),
            4,
            Direction::ClientToServer,
            2000,
        );
        assert_eq!(got, 1000);
        assert_eq!(f.unwrap().kind, "short");
        wire[500] ^= 0xff;
        let (_, f) = recv_pattern(
            &mut io::Cursor::new(&wire),
            4,
            Direction::ClientToServer,
            1000,
        );
        let f = f.unwrap();
        assert_eq!((f.kind.as_str(), f.offset), ("mismatch", Some(500)));
    }

    #[test]
    fn pacer_holds_the_rate() {
        let mut sink = io::sink();
        let t = Instant::now();
        send_pattern(
            &mut sink,
            1,
            Direction::ServerToClient,
            100_000,
            10_000,
            1_000_000,
        )
        .unwrap();
        assert!(
            t.elapsed() >= Duration::from_millis(90),
            "{:?}",
            t.elapsed()
        );
    }
}
