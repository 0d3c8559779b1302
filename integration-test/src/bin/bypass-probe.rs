//! `bypass-probe`: one TCP behaviour at a time, observed from the application, so a test
//! can run the same case with and without the bypass and compare. A server and a client
//! agree on a case by name; each prints one JSON object of what it saw. Payload bytes
//! are the testbed's pattern (stream 0), verified in order by the reader.
//!
//! Cases: `flood` (a non-blocking writer against a reader that sleeps, then drains),
//! `slow` (a blocking writer, with pauses, against a reader that reads in small paced
//! chunks).

use std::{
    io::{ErrorKind, Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    os::fd::AsRawFd,
    path::PathBuf,
    process::ExitCode,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use clap::{Parser, Subcommand, ValueEnum};
use serde_json::{Value, json};
use testbed::peer::{
    parse_size,
    pattern::{Direction, Pattern, Verifier},
};

#[derive(Debug, Parser)]
#[command(name = "bypass-probe", about)]
struct Cli {
    #[command(subcommand)]
    role: Role,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Case {
    /// Client: non-blocking writes for --secs, counting what the kernel accepts.
    /// Server: accepts, reads nothing for --hold-ms, reports FIONREAD, then drains.
    Flood,
    /// Client: blocking writes of --bytes, pausing --pause-ms every --pause-every bytes.
    /// Server: reads --chunk bytes at a time, --delay-us apart.
    Slow,
}

#[derive(Debug, clap::Args)]
struct Common {
    /// The case.
    #[arg(long, value_enum)]
    case: Case,
    /// Bytes per read or write.
    #[arg(long, default_value = "64K", value_parser = parse_size)]
    chunk: u64,
    /// flood: seconds of writing.
    #[arg(long, default_value_t = 2.0)]
    secs: f64,
    /// slow: bytes to write.
    #[arg(long, default_value = "0", value_parser = parse_size)]
    bytes: u64,
    /// slow: pause every this many bytes written (0: never).
    #[arg(long, default_value = "0", value_parser = parse_size)]
    pause_every: u64,
    /// slow: pause length.
    #[arg(long, default_value_t = 0)]
    pause_ms: u64,
    /// flood: how long the server reads nothing.
    #[arg(long, default_value_t = 3000)]
    hold_ms: u64,
    /// slow: delay between the server's reads.
    #[arg(long, default_value_t = 0)]
    delay_us: u64,
}

#[derive(Debug, Subcommand)]
enum Role {
    /// Accept one connection and play the case's server side.
    Server {
        /// Address to listen on.
        #[arg(long)]
        listen: SocketAddr,
        /// File to create once listening.
        #[arg(long)]
        ready_file: Option<PathBuf>,
        #[command(flatten)]
        common: Common,
    },
    /// Connect and play the case's client side.
    Client {
        /// Server address.
        #[arg(long)]
        connect: SocketAddr,
        #[command(flatten)]
        common: Common,
    },
}

fn main() -> ExitCode {
    let out = match Cli::parse().role {
        Role::Server {
            listen,
            ready_file,
            common,
        } => server(listen, ready_file, &common),
        Role::Client { connect, common } => client(connect, &common),
    };
    match out {
        Ok(v) => {
            println!("{v}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("bypass-probe: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn server(listen: SocketAddr, ready: Option<PathBuf>, c: &Common) -> Result<Value> {
    let l = TcpListener::bind(listen).with_context(|| format!("listen on {listen}"))?;
    if let Some(f) = ready {
        std::fs::write(&f, listen.to_string()).with_context(|| format!("write {f:?}"))?;
    }
    let (mut s, _) = l.accept().context("accept")?;
    match c.case {
        Case::Flood => {
            std::thread::sleep(Duration::from_millis(c.hold_ms));
            let queued = fionread(&s)?;
            let (received, ok, secs) = drain(&mut s, c.chunk, 0)?;
            Ok(json!({"fionread_after_hold": queued, "received": received, "ok": ok, "secs": secs}))
        }
        Case::Slow => {
            let (received, ok, secs) = drain(&mut s, c.chunk, c.delay_us)?;
            Ok(json!({"received": received, "ok": ok, "secs": secs}))
        }
    }
}

/// Reads to EOF, verifying the pattern; `(bytes, in order, seconds)`.
fn drain(s: &mut TcpStream, chunk: u64, delay_us: u64) -> Result<(u64, bool, f64)> {
    let t = Instant::now();
    let mut v = Verifier::new(0, Direction::ClientToServer);
    let mut buf = vec![0u8; usize::try_from(chunk).unwrap_or(65536).max(1)];
    loop {
        let n = match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            // A blocking read must not see these; retrying keeps the byte check honest,
            // another test counts them.
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                continue;
            }
            Err(e) => return Err(e).context("read"),
        };
        v.feed(&buf[..n]);
        if delay_us > 0 {
            std::thread::sleep(Duration::from_micros(delay_us));
        }
    }
    Ok((
        v.offset(),
        v.first_mismatch().is_none(),
        t.elapsed().as_secs_f64(),
    ))
}

fn client(connect: SocketAddr, c: &Common) -> Result<Value> {
    let mut s = TcpStream::connect(connect).with_context(|| format!("connect {connect}"))?;
    let mut p = Pattern::new(0, Direction::ClientToServer);
    let mut buf = vec![0u8; usize::try_from(c.chunk).unwrap_or(65536).max(1)];
    match c.case {
        Case::Flood => {
            s.set_nonblocking(true)?;
            let free0 = mem_free_kib()?;
            let t = Instant::now();
            let (mut accepted, mut eagain) = (0u64, 0u64);
            // The pattern advances only by what the kernel took: a short write keeps
            // its tail for the next call.
            let mut pending: Vec<u8> = Vec::new();
            while t.elapsed().as_secs_f64() < c.secs {
                if pending.is_empty() {
                    p.fill(&mut buf);
                    pending.extend_from_slice(&buf);
                }
                match s.write(&pending) {
                    Ok(n) => {
                        accepted += n as u64;
                        pending.drain(..n);
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        eagain += 1;
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(e) => return Err(e).context("write"),
                }
            }
            let free1 = mem_free_kib()?;
            Ok(json!({"accepted": accepted, "eagain": eagain,
                "mem_free_drop_kib": free0 as i64 - free1 as i64}))
        }
        Case::Slow => {
            let t = Instant::now();
            let (mut sent, mut next_pause) = (0u64, c.pause_every);
            while sent < c.bytes {
                let n = (c.bytes - sent).min(buf.len() as u64) as usize;
                p.fill(&mut buf[..n]);
                s.write_all(&buf[..n]).context("write")?;
                sent += n as u64;
                if c.pause_every > 0 && sent >= next_pause {
                    std::thread::sleep(Duration::from_millis(c.pause_ms));
                    next_pause += c.pause_every;
                }
            }
            Ok(json!({"sent": sent, "secs": t.elapsed().as_secs_f64()}))
        }
    }
}

/// FIONREAD: bytes the next reads would return without blocking.
fn fionread(s: &TcpStream) -> Result<u64> {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int through the pointer.
    if unsafe { libc::ioctl(s.as_raw_fd(), libc::FIONREAD, &mut n) } != 0 {
        return Err(std::io::Error::last_os_error()).context("ioctl FIONREAD");
    }
    Ok(u64::try_from(n).unwrap_or(0))
}

fn mem_free_kib() -> Result<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").context("read /proc/meminfo")?;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("MemFree:") {
            return rest
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .context("parse MemFree");
        }
    }
    bail!("no MemFree in /proc/meminfo")
}
