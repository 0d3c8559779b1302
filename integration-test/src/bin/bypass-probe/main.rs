//! `bypass-probe`: one TCP behaviour at a time, observed from the application, so a test
//! can run the same case with and without the bypass and compare. A server and a client
//! agree on a case by name; each prints one JSON object of what it saw. Payload bytes
//! are the testbed's pattern (stream 0, or the connection's index), verified in order
//! by the reader.

use std::{
    io::{ErrorKind, Read, Write},
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    os::fd::{AsRawFd, RawFd},
    path::PathBuf,
    process::ExitCode,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use clap::{Parser, Subcommand, ValueEnum};
use serde_json::{Value, json};
mod handshake;
mod trust;

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
    /// Server: reads nothing for --hold-ms, reports FIONREAD, then drains.
    Flood,
    /// Client: blocking writes of --bytes, pausing --pause-ms every --pause-every bytes.
    /// Server: reads --chunk bytes at a time, --delay-us apart.
    Slow,
    /// Each side half-closes (shutdown SHUT_WR) while the other still sends to it.
    Halfclose,
    /// The client closes with SO_LINGER 0 (RST) after sending; the server reads late.
    Reset,
    /// MSG_PEEK, then a read: the peeked bytes are read again.
    Peek,
    /// FIONREAD once everything sent has arrived.
    Fionread,
    /// SO_RCVLOWAT 1000 with 500 bytes, then 600 more: readiness and the first read.
    Rcvlowat,
    /// recv(MSG_WAITALL) of 2000 bytes sent as 1000 + 1000, 100 ms apart.
    Waitall,
    /// SO_RCVTIMEO 200 ms and nothing sent: the read times out with EAGAIN.
    Rcvtimeo,
    /// epoll readiness: EPOLLIN before and after data, EPOLLRDHUP after the peer's FIN,
    /// EPOLLOUT on a fresh socket.
    Epoll,
    /// A blocking reader thread and a writer thread on one socket, both sides.
    Duplex,
    /// The client sends a file with sendfile(2).
    Sendfile,
    /// The client moves bytes from a pipe with splice(2).
    SpliceSend,
    /// The server reads with splice(2) into a pipe.
    SpliceRecv,
    /// MSG_OOB: one urgent byte between normal data.
    Oob,
    /// --connections connections, --concurrency at a time; both sides write --bytes
    /// right after connect/accept, then read the other's.
    Burst,
    /// Client: --bytes, --mark-file, wait for --go-file, --bytes more, half-close.
    /// Server: --mark-file once accepted, wait for --go-file, read and verify all.
    Hold,
    /// With the agent's bound at --bytes. Client: 1.25 x --bytes, --mark-file, wait for
    /// --go-file, 32 KiB, 2 x --bytes. Server: wait for --wait-file, read --bytes,
    /// --mark-file, one recv(MSG_WAITALL) for more than TCP holds, then the rest.
    WaitallAfterBound,
    /// Both sides: setsockopt(TCP_ULP, "tls") after connect/accept, then --bytes each way.
    Ulp,
    /// Client: connect(AF_UNSPEC) once connected, then setsockopt(TCP_ULP, "tls").
    /// Server: reads until the client is gone.
    UlpAfterDisconnect,
    /// Client: common setsockopts (and two longer than a page) on the connected socket
    /// and a fresh one; then --bytes.
    Sockopts,
    /// TCP Fast Open: --connections connections with data in the SYN.
    Tfo,
    /// An MPTCP connection: --bytes each way.
    Mptcp,
    /// Client: a thread's write of --bytes blocks while connecting (the test holds the
    /// handshake), --mark-file once it waits; --bytes more once it returned, then
    /// --go-file. Server: as hold.
    ConnectWrite,
    /// Client (the victim): reads its own sequence numbers through TCP_REPAIR into
    /// --mark-file, then reads and verifies --bytes. Server: sends --bytes.
    Forge,
    /// Client only (the attacker): a TCP_REPAIR socket from --bind to --connect with
    /// the sequence numbers in --go-file, --mark-file, then reads for 3 s.
    ForgeAttacker,
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
    /// Bytes to write (slow, halfclose, duplex, sendfile, splice, burst).
    #[arg(long, default_value = "1M", value_parser = parse_size)]
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
    /// burst: connections in all.
    #[arg(long, default_value_t = 1)]
    connections: u64,
    /// burst: connections at once.
    #[arg(long, default_value_t = 1)]
    concurrency: u64,
    /// hold, waitall: wait until this file exists (see the case).
    #[arg(long)]
    go_file: Option<PathBuf>,
    /// hold, waitall: create this file at the case's point.
    #[arg(long)]
    mark_file: Option<PathBuf>,
    /// waitall: the server waits for this file before reading.
    #[arg(long)]
    wait_file: Option<PathBuf>,
    /// Client: bind to this address and port before connecting.
    #[arg(long)]
    bind: Option<SocketAddr>,
}

impl Common {
    fn steps(&self) -> trust::Steps<'_> {
        trust::Steps {
            go: trust::path(&self.go_file),
            mark: trust::path(&self.mark_file),
            wait: trust::path(&self.wait_file),
            bytes: self.bytes,
        }
    }
}

#[derive(Debug, Subcommand)]
enum Role {
    /// Accept connections and play the case's server side.
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

// ---------------------------------------------------------------------------------
// Server side

fn server(listen: SocketAddr, ready: Option<PathBuf>, c: &Common) -> Result<Value> {
    if let Case::Tfo | Case::Mptcp = c.case {
        let mptcp = matches!(c.case, Case::Mptcp);
        let l = trust::special_listener(listen, mptcp, !mptcp)?;
        if let Some(f) = ready {
            std::fs::write(&f, listen.to_string()).with_context(|| format!("write {f:?}"))?;
        }
        return if mptcp {
            trust::mptcp_server(&l, c.bytes)
        } else {
            trust::tfo_server(&l, c.connections, c.hold_ms)
        };
    }
    let l = TcpListener::bind(listen).with_context(|| format!("listen on {listen}"))?;
    // std listens with a backlog of 128; bursts of connects need more, or the kernel
    // resets the ones that overflow the accept queue. listen() again raises it.
    // SAFETY: plain syscall on our own listening socket.
    if unsafe { libc::listen(l.as_raw_fd(), 4096) } != 0 {
        return Err(std::io::Error::last_os_error()).context("listen backlog");
    }
    if let Some(f) = ready {
        std::fs::write(&f, listen.to_string()).with_context(|| format!("write {f:?}"))?;
    }
    if let Case::Burst = c.case {
        return burst_server(&l, c);
    }
    let (mut s, _) = l.accept().context("accept")?;
    match c.case {
        Case::Flood => {
            sleep_ms(c.hold_ms);
            let queued = fionread(&s)?;
            let r = drain(&mut s, c.chunk, 0, Direction::ClientToServer, 0)?;
            Ok(json!({"fionread_after_hold": queued, "received": r.bytes, "ok": r.ok}))
        }
        Case::Slow => {
            let r = drain(&mut s, c.chunk, c.delay_us, Direction::ClientToServer, 0)?;
            Ok(json!({"received": r.bytes, "ok": r.ok, "secs": r.secs}))
        }
        Case::Halfclose => halfclose_server(s, c),
        Case::Reset => reset_server(s),
        Case::Peek => peek_server(s),
        Case::Fionread => {
            // The client sends 3000 bytes and waits; give them time to land.
            wait_readable(&s, 2000)?;
            sleep_ms(200);
            Ok(json!({"fionread": fionread(&s)?}))
        }
        Case::Rcvlowat => rcvlowat_server(&mut s),
        Case::Waitall => {
            let mut buf = vec![0u8; 2000];
            // SAFETY: valid buffer of the length passed.
            let n = unsafe {
                libc::recv(
                    s.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_WAITALL,
                )
            };
            Ok(json!({"first_read_len": n}))
        }
        Case::Rcvtimeo => {
            s.set_read_timeout(Some(Duration::from_millis(200)))?;
            let t = Instant::now();
            let mut buf = [0u8; 16];
            let result = match s.read(&mut buf) {
                Ok(n) => format!("read {n}"),
                Err(e) => errno_name(&e),
            };
            let waited = t.elapsed().as_millis();
            Ok(json!({"result": result, "waited_at_least_180ms": waited >= 180}))
        }
        Case::Epoll => epoll_server(&mut s),
        Case::Duplex => duplex(s, c, Direction::ServerToClient),
        Case::Sendfile | Case::SpliceSend | Case::Oob => {
            if let Case::Oob = c.case {
                return oob_server(&mut s);
            }
            let r = drain(&mut s, c.chunk, 0, Direction::ClientToServer, 0)?;
            Ok(json!({"received": r.bytes, "ok": r.ok}))
        }
        Case::SpliceRecv => splice_recv_server(&s),
        Case::Hold | Case::ConnectWrite => trust::hold_server(s, &c.steps()),
        Case::Forge => handshake::push_server(s, &c.steps()),
        Case::WaitallAfterBound => trust::waitall_server(s, &c.steps()),
        Case::Ulp => trust::ulp_server(s, &c.steps()),
        Case::UlpAfterDisconnect => trust::until_closed_server(s),
        Case::Sockopts => trust::drain_server(s),
        Case::Burst | Case::Tfo | Case::Mptcp | Case::ForgeAttacker => unreachable_case(),
    }
}

fn unreachable_case() -> Result<Value> {
    bail!("burst is served before accept")
}

/// The server keeps sending after the client's FIN, then half-closes in turn.
fn halfclose_server(s: TcpStream, c: &Common) -> Result<Value> {
    let mut reader = s.try_clone()?;
    let read =
        std::thread::spawn(move || drain(&mut reader, 65536, 0, Direction::ClientToServer, 0));
    let mut w = s.try_clone()?;
    // Send in small paced pieces so some arrive after the client's shutdown.
    let sent = send_pattern(&mut w, c.bytes, 16 * 1024, 2, Direction::ServerToClient, 0)?;
    let r = read
        .join()
        .map_err(|_| anyhow::anyhow!("reader panicked"))??;
    s.shutdown(Shutdown::Write)?;
    let mut one = [0u8; 1];
    let again = match (&s).read(&mut one) {
        Ok(n) => format!("read {n}"),
        Err(e) => errno_name(&e),
    };
    Ok(
        json!({"received": r.bytes, "ok": r.ok, "sent": sent, "read_after_eof": again,
        "spurious_eagain": r.spurious}),
    )
}

/// Reads late, after the RST: what data, then which errors.
fn reset_server(mut s: TcpStream) -> Result<Value> {
    sleep_ms(500);
    let mut v = Verifier::new(0, Direction::ClientToServer);
    let mut events: Vec<String> = Vec::new();
    let mut buf = vec![0u8; 65536];
    for _ in 0..10_000 {
        match s.read(&mut buf) {
            Ok(0) => {
                events.push("eof".into());
                break;
            }
            Ok(n) => {
                v.feed(&buf[..n]);
                if events.last().map(String::as_str) != Some("data") {
                    events.push("data".into());
                }
            }
            Err(e) => {
                events.push(errno_name(&e));
                if events.len() > 8 {
                    break;
                }
            }
        }
    }
    let write = match s.write(b"late") {
        Ok(n) => format!("wrote {n}"),
        Err(e) => errno_name(&e),
    };
    Ok(
        json!({"events": events, "received": v.offset(), "prefix_ok": v.first_mismatch().is_none(),
        "write_after_reset": write}),
    )
}

fn peek_server(s: TcpStream) -> Result<Value> {
    wait_readable(&s, 2000)?;
    sleep_ms(100);
    let mut peek = [0u8; 50];
    // SAFETY: valid buffer of the length passed.
    let pn = unsafe {
        libc::recv(
            s.as_raw_fd(),
            peek.as_mut_ptr().cast(),
            peek.len(),
            libc::MSG_PEEK,
        )
    };
    let mut buf = [0u8; 100];
    let mut got = 0;
    while got < 100 {
        match (&s).read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => return Err(e).context("read"),
        }
    }
    let mut expect = [0u8; 100];
    Pattern::new(0, Direction::ClientToServer).fill(&mut expect);
    let peek_len = usize::try_from(pn).unwrap_or(0);
    Ok(
        json!({"peek_len": pn, "peek_matches": peek[..peek_len] == expect[..peek_len],
        "read_len": got, "read_matches": buf[..got] == expect[..got]}),
    )
}

fn rcvlowat_server(s: &mut TcpStream) -> Result<Value> {
    setsockopt_int(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVLOWAT, 1000)?;
    // The client sends 500 bytes 100 ms after connecting, 600 more 300 ms later.
    let ready_early = poll_in(s.as_raw_fd(), 250)?;
    // Read only once readable: a blocking read that already holds some bytes is woken
    // by lowat more bytes in the queue (net/ipv4/tcp.c, tcp_data_ready), a quirk of its
    // own.
    let ready = poll_in(s.as_raw_fd(), 2000)?;
    s.set_nonblocking(true)?;
    let mut buf = vec![0u8; 4096];
    let n = loop {
        match s.read(&mut buf) {
            Ok(n) => break n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => return Err(e).context("read"),
        }
    };
    Ok(
        json!({"readable_with_500_of_1000": ready_early, "readable_later": ready,
        "first_read_len": n}),
    )
}

fn epoll_server(s: &mut TcpStream) -> Result<Value> {
    let ep = Epoll::new()?;
    ep.add(s.as_raw_fd(), (libc::EPOLLIN | libc::EPOLLRDHUP) as u32)?;
    // The client sends 100 bytes 200 ms after connecting, then half-closes 200 ms later.
    let before = ep.wait(100)?;
    let with_data = ep.wait(1000)?;
    let mut buf = [0u8; 200];
    let n = s.read(&mut buf)?;
    let after_fin = ep.wait(1000)?;
    let rdhup = libc::EPOLLRDHUP as u32;
    let pin = libc::EPOLLIN as u32;
    Ok(json!({
        "in_before_data": before & pin != 0,
        "in_with_data": with_data & pin != 0,
        "read": n,
        "rdhup_after_fin": after_fin & rdhup != 0,
    }))
}

fn oob_server(s: &mut TcpStream) -> Result<Value> {
    // The client sends "ab", then "c" with MSG_OOB, then "de".
    sleep_ms(300);
    let mut oob = [0u8; 1];
    // SAFETY: valid one-byte buffer.
    let on = unsafe { libc::recv(s.as_raw_fd(), oob.as_mut_ptr().cast(), 1, libc::MSG_OOB) };
    let oob_result = if on == 1 {
        String::from_utf8_lossy(&oob).into_owned()
    } else {
        errno_name(&std::io::Error::last_os_error())
    };
    let mut inline = Vec::new();
    s.read_to_end(&mut inline)?;
    Ok(json!({"oob": oob_result, "inline": String::from_utf8_lossy(&inline)}))
}

fn splice_recv_server(s: &TcpStream) -> Result<Value> {
    let (rp, wp) = pipe()?;
    let mut v = Verifier::new(0, Direction::ClientToServer);
    let mut buf = vec![0u8; 65536];
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut stalled = false;
    loop {
        // Readiness first, so a splice that would never see the data cannot hang us.
        if !poll_in(s.as_raw_fd(), 200)? {
            if Instant::now() > deadline {
                stalled = true;
                break;
            }
            continue;
        }
        // SAFETY: valid fds; null offsets for a socket and a pipe.
        let n = unsafe {
            libc::splice(
                s.as_raw_fd(),
                std::ptr::null_mut(),
                wp,
                std::ptr::null_mut(),
                65536,
                libc::SPLICE_F_NONBLOCK,
            )
        };
        if n == 0 {
            break;
        }
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == ErrorKind::WouldBlock {
                if Instant::now() > deadline {
                    stalled = true;
                    break;
                }
                sleep_ms(10);
                continue;
            }
            return Err(e).context("splice from the socket");
        }
        let mut left = n as usize;
        while left > 0 {
            // SAFETY: valid buffer of the length passed.
            let r = unsafe { libc::read(rp, buf.as_mut_ptr().cast(), left.min(buf.len())) };
            if r <= 0 {
                bail!("read the pipe: {}", std::io::Error::last_os_error());
            }
            v.feed(&buf[..r as usize]);
            left -= r as usize;
        }
    }
    close(rp);
    close(wp);
    Ok(json!({"received": v.offset(), "ok": v.first_mismatch().is_none(), "stalled": stalled}))
}

fn burst_server(l: &TcpListener, c: &Common) -> Result<Value> {
    let failures = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for i in 0..c.connections {
        let (s, _) = l.accept().context("accept")?;
        let (failures, bytes, n) = (failures.clone(), bytes.clone(), c.bytes);
        handles.push(std::thread::spawn(move || {
            match burst_one(s, n, Direction::ServerToClient) {
                Ok(got) => {
                    bytes.fetch_add(got, Ordering::Relaxed);
                }
                Err(e) => {
                    eprintln!("connection {i}: {e:#}");
                    failures.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
        if handles.len() as u64 >= c.concurrency * 2 {
            for h in handles.drain(..) {
                let _ = h.join();
            }
        }
    }
    for h in handles {
        let _ = h.join();
    }
    Ok(
        json!({"connections": c.connections, "failures": failures.load(Ordering::Relaxed),
        "received": bytes.load(Ordering::Relaxed)}),
    )
}

// ---------------------------------------------------------------------------------
// Client side

fn client(connect: SocketAddr, c: &Common) -> Result<Value> {
    match c.case {
        Case::Burst => return burst_client(connect, c),
        Case::Tfo => return trust::tfo_client(connect, c.connections, c.bytes),
        Case::Mptcp => return trust::mptcp_client(connect, c.bytes),
        Case::ConnectWrite => return handshake::connect_write_client(connect, &c.steps()),
        Case::ForgeAttacker => {
            let bind = c.bind.context("forge-attacker needs --bind")?;
            return handshake::forge_attacker(connect, bind, &c.steps());
        }
        _ => {}
    }
    let mut s = trust::connect(connect, c.bind)?;
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
                        sleep_ms(5);
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
                    sleep_ms(c.pause_ms);
                    next_pause += c.pause_every;
                }
            }
            Ok(json!({"sent": sent, "secs": t.elapsed().as_secs_f64()}))
        }
        Case::Halfclose => {
            let sent = send_pattern(&mut s, c.bytes, 64 * 1024, 0, Direction::ClientToServer, 0)?;
            s.shutdown(Shutdown::Write)?;
            let r = drain(&mut s, 65536, 0, Direction::ServerToClient, 0)?;
            let write = match s.write(b"x") {
                Ok(n) => format!("wrote {n}"),
                Err(e) => errno_name(&e),
            };
            Ok(json!({"sent": sent, "received": r.bytes, "ok": r.ok,
                "write_after_shutdown": write, "spurious_eagain": r.spurious}))
        }
        Case::Reset => {
            let sent = send_pattern(
                &mut s,
                256 * 1024,
                64 * 1024,
                0,
                Direction::ClientToServer,
                0,
            )?;
            sleep_ms(100);
            let linger = libc::linger {
                l_onoff: 1,
                l_linger: 0,
            };
            // SAFETY: valid option struct of the size passed.
            let r = unsafe {
                libc::setsockopt(
                    s.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_LINGER,
                    (&raw const linger).cast(),
                    size_of::<libc::linger>() as u32,
                )
            };
            if r != 0 {
                return Err(std::io::Error::last_os_error()).context("SO_LINGER");
            }
            drop(s);
            Ok(json!({"sent": sent}))
        }
        Case::Peek => {
            p.fill(&mut buf[..100]);
            s.write_all(&buf[..100])?;
            wait_closed(&mut s)
        }
        Case::Fionread => {
            let n = 3000.min(buf.len());
            p.fill(&mut buf[..n]);
            s.write_all(&buf[..n])?;
            wait_closed(&mut s)
        }
        Case::Rcvlowat => {
            sleep_ms(100);
            p.fill(&mut buf[..500]);
            s.write_all(&buf[..500])?;
            sleep_ms(300);
            p.fill(&mut buf[..600]);
            s.write_all(&buf[..600])?;
            wait_closed(&mut s)
        }
        Case::Waitall => {
            p.fill(&mut buf[..1000]);
            s.write_all(&buf[..1000])?;
            sleep_ms(100);
            p.fill(&mut buf[..1000]);
            s.write_all(&buf[..1000])?;
            wait_closed(&mut s)
        }
        Case::Rcvtimeo => wait_closed(&mut s),
        Case::Epoll => {
            let ep = Epoll::new()?;
            ep.add(s.as_raw_fd(), libc::EPOLLOUT as u32)?;
            let out = ep.wait(100)? & libc::EPOLLOUT as u32 != 0;
            sleep_ms(200);
            p.fill(&mut buf[..100]);
            s.write_all(&buf[..100])?;
            sleep_ms(200);
            s.shutdown(Shutdown::Write)?;
            let mut rest = Vec::new();
            let _ = s.read_to_end(&mut rest);
            Ok(json!({"out_ready": out}))
        }
        Case::Duplex => duplex(s, c, Direction::ClientToServer),
        Case::Sendfile => sendfile_client(&s, c),
        Case::SpliceSend => splice_send_client(&s, c),
        Case::SpliceRecv => {
            let sent = send_pattern(&mut s, c.bytes, 64 * 1024, 0, Direction::ClientToServer, 0)?;
            s.shutdown(Shutdown::Write)?;
            let _ = wait_closed(&mut s);
            Ok(json!({"sent": sent}))
        }
        Case::Oob => {
            s.write_all(b"ab")?;
            sleep_ms(50);
            // SAFETY: valid one-byte buffer.
            let r = unsafe { libc::send(s.as_raw_fd(), b"c".as_ptr().cast(), 1, libc::MSG_OOB) };
            if r != 1 {
                return Err(std::io::Error::last_os_error()).context("send MSG_OOB");
            }
            sleep_ms(50);
            s.write_all(b"de")?;
            s.shutdown(Shutdown::Write)?;
            wait_closed(&mut s)
        }
        Case::Hold => trust::hold_client(s, &c.steps()),
        Case::Forge => handshake::forge_victim(s, &c.steps()),
        Case::WaitallAfterBound => trust::waitall_client(s, &c.steps()),
        Case::Ulp => trust::ulp_client(s, &c.steps()),
        Case::UlpAfterDisconnect => trust::ulp_after_disconnect_client(s),
        Case::Sockopts => trust::sockopts_client(s, &c.steps()),
        Case::Burst | Case::Tfo | Case::Mptcp | Case::ConnectWrite | Case::ForgeAttacker => {
            unreachable_case()
        }
    }
}

/// Waits for the server to close, so this side's socket outlives what the server does.
fn wait_closed(s: &mut TcpStream) -> Result<Value> {
    let mut rest = [0u8; 4096];
    loop {
        match s.read(&mut rest) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {}
            Err(_) => break,
        }
    }
    Ok(json!({}))
}

fn sendfile_client(s: &TcpStream, c: &Common) -> Result<Value> {
    let path = std::env::temp_dir().join(format!("bypass-probe-{}", std::process::id()));
    let mut data = vec![0u8; usize::try_from(c.bytes)?];
    Pattern::new(0, Direction::ClientToServer).fill(&mut data);
    std::fs::write(&path, &data)?;
    let f = std::fs::File::open(&path)?;
    let _ = std::fs::remove_file(&path);
    let mut off: libc::off_t = 0;
    let mut sent = 0u64;
    while sent < c.bytes {
        // SAFETY: valid fds and offset pointer.
        let n = unsafe {
            libc::sendfile(
                s.as_raw_fd(),
                f.as_raw_fd(),
                &mut off,
                (c.bytes - sent) as usize,
            )
        };
        if n <= 0 {
            return Err(std::io::Error::last_os_error()).context("sendfile");
        }
        sent += n as u64;
    }
    s.shutdown(Shutdown::Write)?;
    Ok(json!({"sent": sent}))
}

fn splice_send_client(s: &TcpStream, c: &Common) -> Result<Value> {
    let (rp, wp) = pipe()?;
    let mut p = Pattern::new(0, Direction::ClientToServer);
    let mut buf = vec![0u8; 65536];
    let mut sent = 0u64;
    while sent < c.bytes {
        let n = (c.bytes - sent).min(buf.len() as u64) as usize;
        p.fill(&mut buf[..n]);
        let mut put = 0;
        while put < n {
            // SAFETY: valid buffer of the length passed.
            let w = unsafe { libc::write(wp, buf[put..n].as_ptr().cast(), n - put) };
            if w <= 0 {
                bail!("write the pipe: {}", std::io::Error::last_os_error());
            }
            put += w as usize;
            let mut left = w as usize;
            while left > 0 {
                // SAFETY: valid fds; null offsets for a pipe and a socket.
                let m = unsafe {
                    libc::splice(
                        rp,
                        std::ptr::null_mut(),
                        s.as_raw_fd(),
                        std::ptr::null_mut(),
                        left,
                        libc::SPLICE_F_MOVE,
                    )
                };
                if m <= 0 {
                    bail!("splice to the socket: {}", std::io::Error::last_os_error());
                }
                left -= m as usize;
            }
        }
        sent += n as u64;
    }
    close(rp);
    close(wp);
    s.shutdown(Shutdown::Write)?;
    Ok(json!({"sent": sent}))
}

fn burst_client(connect: SocketAddr, c: &Common) -> Result<Value> {
    let next = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for _ in 0..c.concurrency.max(1) {
        let (next, failures, bytes) = (next.clone(), failures.clone(), bytes.clone());
        let (total, n) = (c.connections, c.bytes);
        workers.push(std::thread::spawn(move || {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    break;
                }
                let r = TcpStream::connect(connect)
                    .context("connect")
                    .and_then(|s| burst_one(s, n, Direction::ClientToServer));
                match r {
                    Ok(got) => {
                        bytes.fetch_add(got, Ordering::Relaxed);
                    }
                    Err(e) => {
                        eprintln!("connection {i}: {e:#}");
                        failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    for w in workers {
        let _ = w.join();
    }
    Ok(
        json!({"connections": c.connections, "failures": failures.load(Ordering::Relaxed),
        "received": bytes.load(Ordering::Relaxed)}),
    )
}

/// One burst connection: write `n` bytes at once (no waiting for the peer), half-close,
/// read and verify the peer's `n`. Returns the bytes verified.
fn burst_one(mut s: TcpStream, n: u64, out: Direction) -> Result<u64> {
    let into = match out {
        Direction::ClientToServer => Direction::ServerToClient,
        Direction::ServerToClient => Direction::ClientToServer,
    };
    let mut w = s.try_clone()?;
    let writer = std::thread::spawn(move || -> Result<u64> {
        let sent = send_pattern(&mut w, n, 64 * 1024, 0, out, 0)?;
        w.shutdown(Shutdown::Write)?;
        Ok(sent)
    });
    let r = drain(&mut s, 65536, 0, into, 0)?;
    let sent = writer
        .join()
        .map_err(|_| anyhow::anyhow!("writer panicked"))??;
    if !r.ok || r.bytes != n || sent != n {
        bail!(
            "sent {sent} of {n}, verified {} (in order: {})",
            r.bytes,
            r.ok
        );
    }
    Ok(r.bytes)
}

// ---------------------------------------------------------------------------------
// Both sides

/// A reader thread and this thread writing, on one socket. Each side reads exactly what
/// the other sends and closes only then: no half-close wakes the reader (the `halfclose`
/// case covers that).
fn duplex(s: TcpStream, c: &Common, out: Direction) -> Result<Value> {
    let into = match out {
        Direction::ClientToServer => Direction::ServerToClient,
        Direction::ServerToClient => Direction::ClientToServer,
    };
    let mut reader = s.try_clone()?;
    let n = c.bytes;
    let read = std::thread::spawn(move || drain_exact(&mut reader, n, into));
    let mut w = s.try_clone()?;
    let sent = send_pattern(&mut w, c.bytes, 16 * 1024, 0, out, 0)?;
    let r = read
        .join()
        .map_err(|_| anyhow::anyhow!("reader panicked"))??;
    Ok(json!({"sent": sent, "received": r.bytes, "ok": r.ok, "spurious_eagain": r.spurious}))
}

struct Drained {
    bytes: u64,
    ok: bool,
    spurious: u64,
    secs: f64,
}

/// Reads to EOF, verifying the pattern of `stream` in direction `dir`. A blocking read
/// that returns EAGAIN is retried and counted (it must not happen; other tests count).
fn drain(
    s: &mut TcpStream,
    chunk: u64,
    delay_us: u64,
    dir: Direction,
    stream: u64,
) -> Result<Drained> {
    let t = Instant::now();
    let mut v = Verifier::new(stream, dir);
    let mut buf = vec![0u8; usize::try_from(chunk).unwrap_or(65536).max(1)];
    let mut spurious = 0;
    loop {
        let n = match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                spurious += 1;
                continue;
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).context("read"),
        };
        v.feed(&buf[..n]);
        if delay_us > 0 {
            std::thread::sleep(Duration::from_micros(delay_us));
        }
    }
    Ok(Drained {
        bytes: v.offset(),
        ok: v.first_mismatch().is_none(),
        spurious,
        secs: t.elapsed().as_secs_f64(),
    })
}

/// Reads exactly `n` bytes, verifying; like [`drain`] otherwise.
fn drain_exact(s: &mut TcpStream, n: u64, dir: Direction) -> Result<Drained> {
    let t = Instant::now();
    let mut v = Verifier::new(0, dir);
    let mut buf = vec![0u8; 16 * 1024];
    let mut spurious = 0;
    while v.offset() < n {
        let want = (n - v.offset()).min(buf.len() as u64) as usize;
        match s.read(&mut buf[..want]) {
            Ok(0) => break,
            Ok(k) => v.feed(&buf[..k]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => spurious += 1,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e).context("read"),
        }
    }
    Ok(Drained {
        bytes: v.offset(),
        ok: v.first_mismatch().is_none(),
        spurious,
        secs: t.elapsed().as_secs_f64(),
    })
}

/// Writes `n` bytes of the pattern in `chunk`-byte writes, `pause_ms` apart.
fn send_pattern(
    s: &mut TcpStream,
    n: u64,
    chunk: usize,
    pause_ms: u64,
    dir: Direction,
    stream: u64,
) -> Result<u64> {
    let mut p = Pattern::new(stream, dir);
    let mut buf = vec![0u8; chunk];
    let mut sent = 0;
    while sent < n {
        let k = (n - sent).min(chunk as u64) as usize;
        p.fill(&mut buf[..k]);
        s.write_all(&buf[..k]).context("write")?;
        sent += k as u64;
        if pause_ms > 0 {
            sleep_ms(pause_ms);
        }
    }
    Ok(sent)
}

fn sleep_ms(ms: u64) {
    std::thread::sleep(Duration::from_millis(ms));
}

/// The errno's name, for reports that compare errors across runs.
fn errno_name(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EPIPE) => "EPIPE".into(),
        Some(libc::ECONNRESET) => "ECONNRESET".into(),
        Some(libc::EAGAIN) => "EAGAIN".into(),
        Some(libc::ENOTCONN) => "ENOTCONN".into(),
        Some(libc::EINVAL) => "EINVAL".into(),
        Some(libc::ETIMEDOUT) => "ETIMEDOUT".into(),
        Some(n) => format!("errno {n}"),
        None => e.to_string(),
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

fn setsockopt_int(fd: RawFd, level: i32, opt: i32, v: i32) -> Result<()> {
    // SAFETY: valid int option of the size passed.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            (&raw const v).cast(),
            size_of::<i32>() as u32,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error()).context("setsockopt");
    }
    Ok(())
}

/// poll(POLLIN) with a timeout; whether the socket became readable.
fn poll_in(fd: RawFd, timeout_ms: i32) -> Result<bool> {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let r = unsafe { libc::poll(&mut p, 1, timeout_ms) };
    if r < 0 {
        return Err(std::io::Error::last_os_error()).context("poll");
    }
    Ok(p.revents & libc::POLLIN != 0)
}

fn wait_readable(s: &TcpStream, timeout_ms: i32) -> Result<()> {
    if !poll_in(s.as_raw_fd(), timeout_ms)? {
        bail!("nothing to read within {timeout_ms} ms");
    }
    Ok(())
}

fn pipe() -> Result<(RawFd, RawFd)> {
    let mut fds = [0; 2];
    // SAFETY: two-int array.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error()).context("pipe");
    }
    Ok((fds[0], fds[1]))
}

fn close(fd: RawFd) {
    // SAFETY: an fd this process opened and no longer uses.
    unsafe { libc::close(fd) };
}

struct Epoll(RawFd);

impl Epoll {
    fn new() -> Result<Self> {
        // SAFETY: plain syscall.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()).context("epoll_create1");
        }
        Ok(Self(fd))
    }

    fn add(&self, fd: RawFd, events: u32) -> Result<()> {
        let mut ev = libc::epoll_event {
            events,
            u64: fd as u64,
        };
        // SAFETY: valid epoll and target fds, one event.
        if unsafe { libc::epoll_ctl(self.0, libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
            return Err(std::io::Error::last_os_error()).context("epoll_ctl");
        }
        Ok(())
    }

    /// The events of the first ready fd within `timeout_ms` (0 if none).
    fn wait(&self, timeout_ms: i32) -> Result<u32> {
        let mut ev = libc::epoll_event { events: 0, u64: 0 };
        // SAFETY: room for one event.
        let n = unsafe { libc::epoll_wait(self.0, &mut ev, 1, timeout_ms) };
        if n < 0 {
            return Err(std::io::Error::last_os_error()).context("epoll_wait");
        }
        Ok(if n == 1 { ev.events } else { 0 })
    }
}

impl Drop for Epoll {
    fn drop(&mut self) {
        close(self.0);
    }
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
