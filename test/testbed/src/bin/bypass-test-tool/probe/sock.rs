//! What the cases share: pattern writes and verified reads, waits, errno names, and
//! the calls std does not offer (FIONREAD, poll, recv flags), through nix.

use std::{
    io::{ErrorKind, Read, Write},
    net::TcpStream,
    os::fd::{AsFd, AsRawFd},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use nix::{
    errno::Errno,
    getsockopt_impl, ioctl_read_bad,
    poll::{PollFd, PollFlags, PollTimeout, poll},
    setsockopt_impl, sockopt_impl,
    sys::socket::{MsgFlags, recv},
};
use serde_json::{Value, json};
use testbed::peer::pattern::{Direction, Pattern, Verifier};

/// Waits for the server to close, so this side's socket outlives what the server does.
pub fn wait_closed(s: &mut TcpStream) -> Result<Value> {
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

/// What a reader saw: the bytes verified, whether they were in order, the spurious
/// EAGAINs of blocking reads, and how long it took.
pub struct Drained {
    pub bytes: u64,
    pub ok: bool,
    pub spurious: u64,
    pub secs: f64,
}

/// Reads to EOF, verifying the pattern of `stream` in direction `dir`. A blocking read
/// that returns EAGAIN is retried and counted (it must not happen; other tests count).
pub fn drain(
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
pub fn drain_exact(s: &mut TcpStream, n: u64, dir: Direction) -> Result<Drained> {
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
pub fn send_pattern(
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

pub fn sleep_ms(ms: u64) {
    std::thread::sleep(Duration::from_millis(ms));
}

/// The errno's symbolic name (`"EPERM"`), for reports that compare errors across runs;
/// `"errno N"` for a number nix does not know, the error's text when it has no errno.
pub fn errno_name(e: &std::io::Error) -> String {
    match e.raw_os_error().map(|n| (n, Errno::from_raw(n))) {
        Some((n, Errno::UnknownErrno)) => format!("errno {n}"),
        Some((_, errno)) => format!("{errno:?}"),
        None => e.to_string(),
    }
}

// nix has no FIONREAD call of its own: its ioctl macro declares one.
ioctl_read_bad!(fionread_ioctl, libc::FIONREAD, libc::c_int);

/// FIONREAD: bytes the next reads would return without blocking.
pub fn fionread(s: &TcpStream) -> Result<u64> {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int through the pointer.
    unsafe { fionread_ioctl(s.as_raw_fd(), &mut n) }.context("ioctl FIONREAD")?;
    Ok(u64::try_from(n).unwrap_or(0))
}

// SIOCOUTQ (TIOCOUTQ): bytes in the send queue not yet acknowledged by the peer.
ioctl_read_bad!(outq_ioctl, libc::TIOCOUTQ, libc::c_int);

/// Waits (at most [`testbed::steps::NET`], a net) until every byte this socket sent by
/// TCP was acknowledged: it is then in the peer's receive queue or read. Redirected
/// bytes never enter the queue.
pub fn wait_acked(s: &TcpStream) -> Result<()> {
    let deadline = Instant::now() + testbed::steps::NET;
    loop {
        let mut n: libc::c_int = 0;
        // SAFETY: SIOCOUTQ writes one int through the pointer.
        unsafe { outq_ioctl(s.as_raw_fd(), &mut n) }.context("ioctl SIOCOUTQ")?;
        if n == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "{n} bytes sent by TCP still unacknowledged after {:?}",
                testbed::steps::NET
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

// SO_RCVLOWAT, which nix does not define, declared with nix's own macro (the typed
// `setsockopt` of every other option).
sockopt_impl!(
    /// `SO_RCVLOWAT`: bytes a read waits for, and readiness reports.
    RcvLowat,
    Both,
    libc::SOL_SOCKET,
    libc::SO_RCVLOWAT,
    libc::c_int
);

/// recv(2) with MSG_WAITALL into `buf`: what the one call returned.
pub fn recv_waitall(s: &TcpStream, buf: &mut [u8]) -> nix::Result<usize> {
    recv(s.as_raw_fd(), buf, MsgFlags::MSG_WAITALL)
}

/// poll(POLLIN) with a timeout; whether the socket became readable.
pub fn poll_in(fd: &impl AsFd, timeout_ms: i32) -> Result<bool> {
    let mut p = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    poll(&mut p, PollTimeout::try_from(timeout_ms)?).context("poll")?;
    Ok(p[0]
        .revents()
        .is_some_and(|r| r.contains(PollFlags::POLLIN)))
}

/// Waits until `s` is readable: bytes the peer sent arrive at the machine's speed, so
/// the wait is a net ([`testbed::steps::NET`]), never a pace.
pub fn wait_readable(s: &TcpStream) -> Result<()> {
    if !poll_in(s, net_ms())? {
        bail!("nothing to read within {:?}", testbed::steps::NET);
    }
    Ok(())
}

/// [`testbed::steps::NET`] in milliseconds, for poll(2) and epoll_wait(2).
pub fn net_ms() -> i32 {
    i32::try_from(testbed::steps::NET.as_millis()).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_names() {
        let os = std::io::Error::from_raw_os_error;
        assert_eq!(errno_name(&os(libc::EPERM)), "EPERM");
        assert_eq!(errno_name(&os(libc::EWOULDBLOCK)), "EAGAIN");
        assert_eq!(errno_name(&os(libc::ENOTSUP)), "EOPNOTSUPP");
        assert_eq!(errno_name(&os(libc::ECONNRESET)), "ECONNRESET");
        assert_eq!(errno_name(&os(4000)), "errno 4000");
        let plain = std::io::Error::other("no errno");
        assert_eq!(errno_name(&plain), "no errno");
    }
}
