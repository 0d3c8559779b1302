//! Cases of the trust tests: sequences a test drives step by step through files (a
//! side waits for a "go" file, or leaves a "mark" file when it reached a point), and
//! sockets made the way an attacker, a kTLS library, a TCP Fast Open client or an
//! MPTCP application makes them. Payload bytes are the testbed's pattern, verified in
//! order by the reader.

use std::{
    io::{ErrorKind, Read, Write},
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    os::fd::{AsFd as _, AsRawFd as _, BorrowedFd},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use nix::sys::socket::{setsockopt, sockopt::TcpUlp};
use serde_json::{Value, json};
use socket2::{Domain, Protocol, SockAddr, SockAddrStorage, SockRef, Socket, Type};
use testbed::peer::pattern::{Direction, Pattern, Verifier};

use super::sock::{errno_name, recv_waitall, wait_acked};

/// What the trust cases take from the command line.
pub struct Steps<'a> {
    /// Wait until this file exists before the step the case names.
    pub go: Option<&'a Path>,
    /// Create this file when the case reaches its point.
    pub mark: Option<&'a Path>,
    /// The server waits for this file before it reads (waitall).
    pub wait: Option<&'a Path>,
    /// Bytes per phase.
    pub bytes: u64,
}

/// Waits until `path` exists (at most [`testbed::steps::STEP_WAIT`]).
pub fn wait_file(path: &Path) -> Result<()> {
    testbed::steps::wait_file(path, testbed::steps::STEP_WAIT)
}

pub(crate) fn wait_opt(path: Option<&Path>) -> Result<()> {
    path.map_or(Ok(()), wait_file)
}

pub(crate) fn mark(path: Option<&Path>) -> Result<()> {
    if let Some(p) = path {
        std::fs::write(p, b"").with_context(|| format!("write {}", p.display()))?;
    }
    Ok(())
}

/// One direction of the pattern, written across several calls.
pub(crate) struct Writer {
    p: Pattern,
    buf: Vec<u8>,
    pub(crate) sent: u64,
}

impl Writer {
    pub(crate) fn new(dir: Direction) -> Self {
        Self {
            p: Pattern::new(0, dir),
            buf: vec![0u8; 64 * 1024],
            sent: 0,
        }
    }

    pub(crate) fn send(&mut self, s: &mut impl Write, n: u64) -> Result<()> {
        let mut left = n;
        while left > 0 {
            let k = left.min(self.buf.len() as u64) as usize;
            self.write(s, k)?;
            left -= k as u64;
        }
        Ok(())
    }

    /// `n` bytes, one write each.
    pub(crate) fn send_singly(&mut self, s: &mut impl Write, n: u64) -> Result<()> {
        for _ in 0..n {
            self.write(s, 1)?;
        }
        Ok(())
    }

    fn write(&mut self, s: &mut impl Write, k: usize) -> Result<()> {
        {
            self.p.fill(&mut self.buf[..k]);
            s.write_all(&self.buf[..k]).context("write")?;
            self.sent += k as u64;
        }
        Ok(())
    }
}

/// Reads into `v` until EOF (or `limit` bytes); retries EAGAIN from blocking reads.
pub(crate) fn read_into(s: &mut impl Read, v: &mut Verifier, limit: Option<u64>) -> Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let want = match limit {
            Some(l) if v.offset() >= l => return Ok(()),
            Some(l) => (l - v.offset()).min(buf.len() as u64) as usize,
            None => buf.len(),
        };
        match s.read(&mut buf[..want]) {
            Ok(0) => return Ok(()),
            Ok(n) => v.feed(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {}
            Err(e) => return Err(e).context("read"),
        }
    }
}

pub(crate) fn report(v: &Verifier) -> Value {
    json!({"received": v.offset(), "ok": v.first_mismatch().is_none(),
        "mismatch": v.first_mismatch().map(|m| format!("{m:?}"))})
}

/// A connected client socket, bound first to `bind` when given.
pub fn connect(connect: SocketAddr, bind: Option<SocketAddr>) -> Result<TcpStream> {
    let s = Socket::new(
        Domain::for_address(connect),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    if let Some(b) = bind {
        s.set_reuse_address(true)?;
        s.bind(&SockAddr::from(b))
            .with_context(|| format!("bind {b}"))?;
    }
    s.connect(&SockAddr::from(connect))
        .with_context(|| format!("connect {connect}"))?;
    Ok(s.into())
}

/// hold, client: wait for wait (if any), `bytes`, mark, wait for go, `bytes` more,
/// half-close, wait for EOF.
pub fn hold_client(mut s: TcpStream, st: &Steps<'_>) -> Result<Value> {
    let mut w = Writer::new(Direction::ClientToServer);
    wait_opt(st.wait)?;
    w.send(&mut s, st.bytes)?;
    mark(st.mark)?;
    wait_opt(st.go)?;
    w.send(&mut s, st.bytes)?;
    s.shutdown(Shutdown::Write)?;
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    Ok(json!({"sent": w.sent, "got_back": rest.len()}))
}

/// hold, server: wait for go (if any), then read everything and verify.
pub fn hold_server(mut s: TcpStream, st: &Steps<'_>) -> Result<Value> {
    mark(st.mark)?;
    wait_opt(st.go)?;
    let mut v = Verifier::new(0, Direction::ClientToServer);
    read_into(&mut s, &mut v, None)?;
    Ok(report(&v))
}

/// waitall, client. With the agent's queue bound at `bytes`: `bytes + bytes/4` (the
/// first `bytes` or a little less, each message charged its overhead too, fill the
/// peer's ingress queue, the rest take TCP), then, once the peer acknowledged every TCP
/// byte, mark, wait for go
/// (the reader is then blocked in MSG_WAITALL inside tcp_recvmsg), 32 KiB (a datapath
/// that resumed redirects would queue them unseen), then `2 * bytes` (crossing the
/// bound again: TCP), half-close.
pub fn waitall_client(mut s: TcpStream, st: &Steps<'_>) -> Result<Value> {
    let mut w = Writer::new(Direction::ClientToServer);
    w.send(&mut s, st.bytes + st.bytes / 4)?;
    wait_acked(&s)?;
    mark(st.mark)?;
    wait_opt(st.go)?;
    w.send(&mut s, 32 * 1024)?;
    std::thread::sleep(Duration::from_millis(100));
    w.send(&mut s, 2 * st.bytes)?;
    s.shutdown(Shutdown::Write)?;
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    Ok(json!({"sent": w.sent}))
}

/// waitall, server: wait (for the test to see the bound applied), read `bytes` (what
/// was redirected, and the first TCP bytes), mark, then one recv(MSG_WAITALL) for more than what TCP holds, then
/// the rest; everything verified in order.
pub fn waitall_server(mut s: TcpStream, st: &Steps<'_>) -> Result<Value> {
    wait_opt(st.wait)?;
    let mut v = Verifier::new(0, Direction::ClientToServer);
    read_into(&mut s, &mut v, Some(st.bytes))?;
    mark(st.mark)?;
    let want = st.bytes / 4 + st.bytes / 16;
    let mut buf = vec![0u8; usize::try_from(want).unwrap_or(0)];
    let t = Instant::now();
    let n = recv_waitall(&s, &mut buf).context("recv MSG_WAITALL")?;
    let waited_ms = t.elapsed().as_millis();
    v.feed(&buf[..n]);
    let ok_after_waitall = v.first_mismatch().is_none();
    read_into(&mut s, &mut v, None)?;
    let mut r = report(&v);
    r["waitall_len"] = json!(n);
    r["waitall_ms"] = json!(waited_ms);
    r["ok_after_waitall"] = json!(ok_after_waitall);
    Ok(r)
}

/// `setsockopt(IPPROTO_TCP, TCP_ULP, "tls")`: `"ok"` or the errno's name.
fn set_ulp_tls(s: &TcpStream) -> String {
    match setsockopt(s, TcpUlp::default(), b"tls") {
        Ok(()) => "ok".into(),
        Err(e) => errno_name(&std::io::Error::from(e)),
    }
}

/// ulp, client: asks for the TLS upper-layer protocol, then sends `bytes` and reads
/// `bytes` back, both verified.
pub fn ulp_client(mut s: TcpStream, st: &Steps<'_>) -> Result<Value> {
    let ulp = set_ulp_tls(&s);
    let mut w = Writer::new(Direction::ClientToServer);
    w.send(&mut s, st.bytes)?;
    let mut v = Verifier::new(0, Direction::ServerToClient);
    read_into(&mut s, &mut v, Some(st.bytes))?;
    let mut r = report(&v);
    r["ulp"] = json!(ulp);
    r["sent"] = json!(w.sent);
    Ok(r)
}

/// ulp-after-disconnect, client: once connected (and inserted, if bypassed), disconnect
/// with connect(AF_UNSPEC), then ask for the TLS upper-layer protocol.
pub fn ulp_after_disconnect_client(s: TcpStream) -> Result<Value> {
    std::thread::sleep(Duration::from_millis(50));
    // SAFETY: an all-zero address is AF_UNSPEC, and it is given the length of a
    // `sockaddr`, what the kernel reads for that family.
    let unspec = unsafe {
        SockAddr::new(
            SockAddrStorage::zeroed(),
            size_of::<libc::sockaddr>() as libc::socklen_t,
        )
    };
    SockRef::from(&s)
        .connect(&unspec)
        .context("connect(AF_UNSPEC)")?;
    Ok(json!({"ulp": set_ulp_tls(&s), "ok": true}))
}

/// ulp-after-disconnect, server: reads until the peer is gone (EOF or reset).
pub fn until_closed_server(mut s: TcpStream) -> Result<Value> {
    let mut buf = [0u8; 4096];
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
    }
    Ok(json!({"ok": true}))
}

/// ulp, server: the same on the accepted socket, then reads `bytes` and sends `bytes`.
pub fn ulp_server(mut s: TcpStream, st: &Steps<'_>) -> Result<Value> {
    let ulp = set_ulp_tls(&s);
    let mut v = Verifier::new(0, Direction::ClientToServer);
    read_into(&mut s, &mut v, Some(st.bytes))?;
    let mut w = Writer::new(Direction::ServerToClient);
    w.send(&mut s, st.bytes)?;
    s.shutdown(Shutdown::Write)?;
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    let mut r = report(&v);
    r["ulp"] = json!(ulp);
    Ok(r)
}

/// One setsockopt with a raw buffer: `"ok"` or the errno's name. Raw libc on purpose:
/// every option gets the bytes an application passes, so the errno is the kernel's own
/// answer to that buffer (nix's typed options would reshape or refuse some of them).
fn setsockopt_raw(fd: BorrowedFd<'_>, level: i32, name: i32, val: &[u8]) -> String {
    // SAFETY: valid buffer of the length passed.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            val.as_ptr().cast(),
            val.len() as libc::socklen_t,
        )
    };
    if r == 0 {
        "ok".into()
    } else {
        errno_name(&std::io::Error::last_os_error())
    }
}

/// The setsockopt calls applications make, on a socket: name → result.
fn common_sockopts(fd: BorrowedFd<'_>) -> serde_json::Map<String, Value> {
    let one = 1i32.to_ne_bytes();
    let big = vec![0u8; 5000];
    let cubic = b"cubic";
    let mut out = serde_json::Map::new();
    for (name, level, opt, val) in [
        (
            "TCP_NODELAY",
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            &one[..],
        ),
        (
            "SO_KEEPALIVE",
            libc::SOL_SOCKET,
            libc::SO_KEEPALIVE,
            &one[..],
        ),
        (
            "SO_RCVBUF",
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            &(256 * 1024i32).to_ne_bytes()[..],
        ),
        (
            "IP_TOS",
            libc::IPPROTO_IP,
            libc::IP_TOS,
            &0x10i32.to_ne_bytes()[..],
        ),
        (
            "TCP_CONGESTION",
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            &cubic[..],
        ),
        // Longer than a page: a sockopt hook that mishandles it turns this into EFAULT.
        (
            "SO_BINDTODEVICE_5000",
            libc::SOL_SOCKET,
            libc::SO_BINDTODEVICE,
            &big[..],
        ),
        (
            "TCP_MD5SIG_5000",
            libc::IPPROTO_TCP,
            libc::TCP_MD5SIG,
            &big[..],
        ),
    ] {
        out.insert(name.into(), json!(setsockopt_raw(fd, level, opt, val)));
    }
    out
}

/// sockopts, client: the common setsockopts on the connected (bypassed) socket and on
/// a fresh one, then `bytes` verified by the server.
pub fn sockopts_client(mut s: TcpStream, st: &Steps<'_>) -> Result<Value> {
    let connected = common_sockopts(s.as_fd());
    let fresh = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
    let unconnected = common_sockopts(fresh.as_fd());
    let mut w = Writer::new(Direction::ClientToServer);
    w.send(&mut s, st.bytes)?;
    s.shutdown(Shutdown::Write)?;
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    Ok(json!({"connected": connected, "unconnected": unconnected, "sent": w.sent}))
}

/// A plain server side: read everything, verify.
pub fn drain_server(mut s: TcpStream) -> Result<Value> {
    let mut v = Verifier::new(0, Direction::ClientToServer);
    read_into(&mut s, &mut v, None)?;
    Ok(report(&v))
}

/// A listener made with `protocol` (MPTCP) or with TCP Fast Open, as `std` cannot.
pub fn special_listener(listen: SocketAddr, mptcp: bool, fastopen: bool) -> Result<TcpListener> {
    let proto = if mptcp {
        Protocol::MPTCP
    } else {
        Protocol::TCP
    };
    let s = Socket::new(Domain::for_address(listen), Type::STREAM, Some(proto))
        .with_context(|| format!("socket (MPTCP: {mptcp})"))?;
    s.set_reuse_address(true)?;
    if fastopen {
        // Neither nix nor socket2 sets TCP_FASTOPEN (the listener's queue length).
        let qlen = 16i32.to_ne_bytes();
        let r = setsockopt_raw(s.as_fd(), libc::IPPROTO_TCP, libc::TCP_FASTOPEN, &qlen);
        if r != "ok" {
            bail!("TCP_FASTOPEN on the listener: {r}");
        }
    }
    s.bind(&SockAddr::from(listen))
        .with_context(|| format!("bind {listen}"))?;
    s.listen(128)?;
    Ok(s.into())
}

/// tfo, server: accepts `connections` connections, each carrying `bytes`, and reads
/// each only after `hold_ms`, when everything sent has landed (by TCP or redirected).
pub fn tfo_server(l: &TcpListener, connections: u64, hold_ms: u64) -> Result<Value> {
    let mut results = Vec::new();
    for _ in 0..connections {
        let (s, _) = l.accept().context("accept")?;
        std::thread::sleep(Duration::from_millis(hold_ms));
        results.push(drain_server(s)?);
    }
    Ok(json!({"connections": results}))
}

/// tfo, client: `connections` connections, each sending `bytes` with the first part in
/// the SYN (sendto MSG_FASTOPEN); the first fetches the cookie, the others use it.
pub fn tfo_client(connect: SocketAddr, connections: u64, bytes: u64) -> Result<Value> {
    let mut out = Vec::new();
    for _ in 0..connections {
        let s = Socket::new(
            Domain::for_address(connect),
            Type::STREAM,
            Some(Protocol::TCP),
        )?;
        let mut p = Pattern::new(0, Direction::ClientToServer);
        let first = bytes.min(1000) as usize;
        let mut buf = vec![0u8; first];
        p.fill(&mut buf);
        let n = s
            .send_to_with_flags(&buf, &SockAddr::from(connect), libc::MSG_FASTOPEN)
            .context("sendto MSG_FASTOPEN")?;
        let mut stream: TcpStream = s.into();
        // What the SYN did not carry, then the rest.
        stream.write_all(&buf[n..])?;
        let mut rest = vec![0u8; (bytes as usize).saturating_sub(first)];
        p.fill(&mut rest);
        stream.write_all(&rest)?;
        stream.shutdown(Shutdown::Write)?;
        let mut back = Vec::new();
        let _ = stream.read_to_end(&mut back);
        out.push(json!({"in_syn": n}));
    }
    Ok(json!({"connections": out}))
}

/// mptcp, client: an MPTCP socket sends `bytes` and reads `bytes` back, verified.
pub fn mptcp_client(connect: SocketAddr, bytes: u64) -> Result<Value> {
    let s = Socket::new(
        Domain::for_address(connect),
        Type::STREAM,
        Some(Protocol::MPTCP),
    )
    .context("MPTCP socket (net.mptcp.enabled?)")?;
    s.connect(&SockAddr::from(connect))
        .with_context(|| format!("connect {connect}"))?;
    let mut s: TcpStream = s.into();
    let mut w = Writer::new(Direction::ClientToServer);
    w.send(&mut s, bytes)?;
    s.shutdown(Shutdown::Write)?;
    let mut v = Verifier::new(0, Direction::ServerToClient);
    read_into(&mut s, &mut v, None)?;
    let mut r = report(&v);
    r["sent"] = json!(w.sent);
    Ok(r)
}

/// mptcp, server: reads everything, then sends `bytes` back.
pub fn mptcp_server(l: &TcpListener, bytes: u64) -> Result<Value> {
    let (mut s, _) = l.accept().context("accept")?;
    let mut v = Verifier::new(0, Direction::ClientToServer);
    read_into(&mut s, &mut v, None)?;
    let mut w = Writer::new(Direction::ServerToClient);
    w.send(&mut s, bytes)?;
    s.shutdown(Shutdown::Write)?;
    Ok(report(&v))
}

/// A path argument, if given.
pub fn path(p: &Option<PathBuf>) -> Option<&Path> {
    p.as_deref()
}
