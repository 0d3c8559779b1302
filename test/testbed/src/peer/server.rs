//! `bypass-test-tool peer server`: accepts connections, serves each as its header asks
//! (send the requested pattern while verifying the client's, or echo), and answers with
//! a verdict.

use std::{
    io::{Read, Write},
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    path::PathBuf,
    sync::Mutex,
    time::{Duration, Instant},
};

use super::{
    io::{PatientReader, expect_eof, recv_pattern, send_pattern},
    pattern::{Direction, Verifier},
    report::{ConnOutcome, Failure, Report},
    wire::{Header, Mode, Trailer, Verdict},
};

/// What the server does.
#[derive(Clone, Debug)]
pub struct ServerOpts {
    /// Address to listen on (`[::]:port` is dual-stack).
    pub listen: SocketAddr,
    /// Exit after this many connections and print one report; 0 serves forever and
    /// prints a report per connection.
    pub connections: u64,
    /// Created once the socket listens.
    pub ready_file: Option<PathBuf>,
    /// A read or write that makes no progress for this long fails the connection
    /// (zero: wait forever).
    pub idle_timeout: Duration,
    /// Pause between reading a header and answering it.
    pub reply_delay: Duration,
    /// In stream mode, read nothing after the header until this file exists (waited
    /// for at most [`crate::steps::STEP_WAIT`]).
    pub go_file: Option<PathBuf>,
}

/// Listens, serves, reports. Errors only if it cannot listen.
pub fn run(opts: &ServerOpts) -> std::io::Result<Option<Report>> {
    let listener = TcpListener::bind(opts.listen)?;
    if let Some(path) = &opts.ready_file {
        std::fs::write(path, listener.local_addr()?.to_string())?;
    }
    if opts.connections == 0 {
        for conn in listener.incoming() {
            let opts = opts.clone();
            std::thread::spawn(move || {
                let start = Instant::now();
                let outcome = match conn {
                    Ok(sock) => serve(sock, &opts),
                    Err(e) => accept_failure(e),
                };
                print_report(&Report::build(
                    "server",
                    vec![outcome],
                    start.elapsed().as_secs_f64(),
                ));
            });
        }
        return Ok(None);
    }
    let outcomes = Mutex::new(Vec::new());
    let mut start = None;
    std::thread::scope(|s| {
        for _ in 0..opts.connections {
            let conn = listener.accept();
            start.get_or_insert_with(Instant::now);
            let outcomes = &outcomes;
            s.spawn(move || {
                let outcome = match conn {
                    Ok((sock, _)) => serve(sock, opts),
                    Err(e) => accept_failure(e),
                };
                if let Ok(mut v) = outcomes.lock() {
                    v.push(outcome);
                }
            });
        }
    });
    let elapsed = start.map_or(0.0, |t| t.elapsed().as_secs_f64());
    Ok(Some(Report::build(
        "server",
        outcomes.into_inner().unwrap_or_default(),
        elapsed,
    )))
}

/// Prints a report as one JSON line.
pub fn print_report(r: &Report) {
    match serde_json::to_string(r) {
        Ok(s) => println!("{s}"),
        Err(e) => eprintln!("bypass-test-tool peer: cannot encode report: {e}"),
    }
}

fn accept_failure(e: std::io::Error) -> ConnOutcome {
    ConnOutcome {
        failures: vec![Failure::conn(0, "io", format!("accept: {e}"))],
        ..Default::default()
    }
}

/// One connection: header, then stream or echo, then the verdict.
fn serve(sock: TcpStream, opts: &ServerOpts) -> ConnOutcome {
    let mut out = ConnOutcome::default();
    let timeout = super::client::timeout_of(opts.idle_timeout);
    let setup = sock
        .set_nodelay(true)
        .and_then(|()| sock.set_read_timeout(timeout))
        .and_then(|()| sock.set_write_timeout(timeout));
    if let Err(e) = setup {
        out.failures
            .push(Failure::conn(0, "io", format!("socket options: {e}")));
        return out;
    }
    let mut reader = PatientReader::new(&sock, timeout);
    let h = match Header::read_from(&mut reader) {
        Ok(h) => h,
        Err(e) => {
            out.failures
                .push(Failure::conn(0, "protocol", format!("read header: {e}")));
            return out;
        }
    };
    if h.greet {
        let mut back = [0u8; 8];
        let greeted = (&sock)
            .write_all(&super::wire::GREETING)
            .and_then(|()| reader.read_exact(&mut back));
        if let Err(e) = greeted {
            out.failures
                .push(Failure::conn(h.stream, "io", format!("greeting: {e}")));
            return out;
        }
        if back != super::wire::GREETING {
            out.failures.push(Failure::conn(
                h.stream,
                "protocol",
                format!("greeting back {back:?}"),
            ));
            return out;
        }
    }
    let verdict = match h.mode {
        Mode::Stream => {
            std::thread::sleep(opts.reply_delay);
            if let Some(go) = &opts.go_file
                && let Err(e) = crate::steps::wait_file(go, crate::steps::STEP_WAIT)
            {
                out.failures
                    .push(Failure::conn(h.stream, "steps", format!("go file: {e:#}")));
                return out;
            }
            stream_mode(&sock, &mut reader, &h, &mut out)
        }
        Mode::PingPong => echo_mode(&sock, &mut reader, &h, &mut out),
    };
    out.spurious_eagain = reader.spurious_eagain();
    if let Some(v) = verdict {
        let sent = (&sock)
            .write_all(&Trailer::encode(v))
            .and_then(|()| sock.shutdown(Shutdown::Write));
        if let Err(e) = sent {
            out.failures
                .push(Failure::conn(h.stream, "io", format!("send verdict: {e}")));
        }
    }
    out
}

/// The verdict on the client's bytes from what was read and what followed them.
fn verdict_of(received: u64, failure: Option<&Failure>, extra: u64) -> Verdict {
    match failure {
        Some(f) if f.kind == "mismatch" => Verdict::Mismatch(f.offset.unwrap_or(0)),
        Some(_) => Verdict::Short(received),
        None if extra > 0 => Verdict::Extra(received),
        None => Verdict::Ok,
    }
}

/// Sends the requested bytes from a second thread while verifying the client's.
/// Returns the verdict to send, or `None` when the connection is beyond answering.
fn stream_mode(
    sock: &TcpStream,
    reader: &mut PatientReader<'_>,
    h: &Header,
    out: &mut ConnOutcome,
) -> Option<Verdict> {
    let mut writer = sock;
    let (sent, (received, failure, extra)) = std::thread::scope(|s| {
        let w = s.spawn(move || {
            send_pattern(
                &mut writer,
                h.stream,
                Direction::ServerToClient,
                h.s2c,
                h.msg_size as usize,
                h.rate,
            )
        });
        let (received, failure) = recv_pattern(reader, h.stream, Direction::ClientToServer, h.c2s);
        let extra = if failure.as_ref().is_some_and(|f| f.kind != "mismatch") {
            Ok(0)
        } else {
            expect_eof(reader)
        };
        (w.join(), (received, failure, extra))
    });
    out.received = received;
    let mut answerable = true;
    match sent {
        Ok(Ok(n)) => out.sent = n,
        Ok(Err(e)) => {
            answerable = false;
            out.failures.push(Failure::new(
                h.stream,
                Some(Direction::ServerToClient),
                "io",
                None,
                format!("send: {e}"),
            ));
        }
        Err(_) => {
            answerable = false;
            out.failures
                .push(Failure::conn(h.stream, "io", "writer thread panicked"));
        }
    }
    let extra = match extra {
        Ok(n) => n,
        Err(e) => {
            answerable = false;
            out.failures.push(Failure::new(
                h.stream,
                Some(Direction::ClientToServer),
                "io",
                Some(received),
                format!("wait for the client's close: {e}"),
            ));
            0
        }
    };
    let verdict = verdict_of(received, failure.as_ref(), extra);
    out.failures.extend(failure);
    if extra > 0 {
        out.failures.push(Failure::new(
            h.stream,
            Some(Direction::ClientToServer),
            "extra",
            Some(received),
            format!("{extra} bytes past the announced {}", h.c2s),
        ));
    }
    answerable.then_some(verdict)
}

/// Echoes each message back as it completes, verifying it on the way.
fn echo_mode(
    sock: &TcpStream,
    reader: &mut PatientReader<'_>,
    h: &Header,
    out: &mut ConnOutcome,
) -> Option<Verdict> {
    let mut writer = sock;
    let size = h.msg_size as usize;
    let mut verifier = Verifier::new(h.stream, Direction::ClientToServer);
    let mut msg = vec![0u8; size];
    while verifier.offset() < h.c2s {
        let n = (h.c2s - verifier.offset()).min(size as u64) as usize;
        if let Err(e) = reader
            .read_exact(&mut msg[..n])
            .and_then(|()| writer.write_all(&msg[..n]))
        {
            let off = verifier.offset();
            out.received = off;
            out.failures.push(Failure::new(
                h.stream,
                Some(Direction::ClientToServer),
                if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    "short"
                } else {
                    "io"
                },
                Some(off),
                format!("echo after {off} bytes: {e}"),
            ));
            return Some(Verdict::Short(off));
        }
        verifier.feed(&msg[..n]);
        out.sent += n as u64;
    }
    out.received = verifier.offset();
    let extra = match expect_eof(reader) {
        Ok(n) => n,
        Err(e) => {
            out.failures.push(Failure::conn(
                h.stream,
                "io",
                format!("wait for the client's close: {e}"),
            ));
            return None;
        }
    };
    let mismatch = verifier.first_mismatch().map(|m| {
        Failure::new(
            h.stream,
            Some(Direction::ClientToServer),
            "mismatch",
            Some(m.offset),
            format!(
                "byte {} is {:#04x}, pattern has {:#04x}",
                m.offset, m.got, m.expected
            ),
        )
    });
    let verdict = verdict_of(out.received, mismatch.as_ref(), extra);
    out.failures.extend(mismatch);
    Some(verdict)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts() {
        let m = Failure::new(1, None, "mismatch", Some(9), "");
        let s = Failure::new(1, None, "short", Some(3), "");
        assert_eq!(verdict_of(10, Some(&m), 0), Verdict::Mismatch(9));
        assert_eq!(verdict_of(3, Some(&s), 0), Verdict::Short(3));
        assert_eq!(verdict_of(10, None, 5), Verdict::Extra(10));
        assert_eq!(verdict_of(10, None, 0), Verdict::Ok);
    }
}
