//! `splice-send`: the client moves bytes from a pipe with splice(2). `splice-recv`: the
//! server reads with splice(2) into a pipe. `splice-after-close`: the same, once the
//! server's socket has closed with the bytes still unread (it half-closed first, then
//! the client sent and closed: FIN_WAIT2, then TIME_WAIT, TCP_CLOSE). `splice-switch`:
//! the server's splice comes while bytes wait unread, the client then sends more and
//! half-closes, and the server, once the FIN came, reads once.

use std::{
    io::{Read as _, Write as _},
    net::{Shutdown, TcpStream},
    os::fd::AsRawFd as _,
    time::Instant,
};

use anyhow::{Context as _, Result, bail};
use nix::{
    errno::Errno,
    fcntl::{SpliceFFlags, splice},
    sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout},
    unistd::{pipe, read, write},
};
use serde_json::{Value, json};
use testbed::peer::pattern::{Direction, Pattern, Verifier};

use super::{
    Common,
    sock::{drain, net_ms, poll_in, send_pattern, sleep_ms, wait_acked, wait_closed},
    trust::{mark, wait_file},
};

/// splice-send's server: reads and verifies.
pub fn send_server(mut s: TcpStream, c: &Common) -> Result<Value> {
    let r = drain(&mut s, c.chunk, 0, Direction::ClientToServer, 0)?;
    Ok(json!({"received": r.bytes, "ok": r.ok}))
}

pub fn send_client(s: &TcpStream, c: &Common) -> Result<Value> {
    let (rp, wp) = pipe().context("pipe")?;
    let mut p = Pattern::new(0, Direction::ClientToServer);
    let mut buf = vec![0u8; 65536];
    let mut sent = 0u64;
    while sent < c.bytes {
        let n = (c.bytes - sent).min(buf.len() as u64) as usize;
        p.fill(&mut buf[..n]);
        let mut put = 0;
        while put < n {
            let w = match write(&wp, &buf[put..n]) {
                Ok(0) => bail!("write the pipe: wrote nothing"),
                Ok(w) => w,
                Err(e) => bail!("write the pipe: {}", std::io::Error::from(e)),
            };
            put += w;
            let mut left = w;
            while left > 0 {
                left -= match splice(&rp, None, s, None, left, SpliceFFlags::SPLICE_F_MOVE) {
                    Ok(0) => bail!("splice to the socket: moved nothing"),
                    Ok(m) => m,
                    Err(e) => bail!("splice to the socket: {}", std::io::Error::from(e)),
                };
            }
        }
        sent += n as u64;
    }
    drop((rp, wp));
    s.shutdown(Shutdown::Write)?;
    Ok(json!({"sent": sent}))
}

pub fn recv_server(mut s: TcpStream) -> Result<Value> {
    let (rp, wp) = pipe().context("pipe")?;
    let mut v = Verifier::new(0, Direction::ClientToServer);
    let mut buf = vec![0u8; 65536];
    // Stalled: no byte for NO_PROGRESS (a splice that never sees the data), however
    // long the whole stream takes.
    let mut deadline = Instant::now() + testbed::steps::NO_PROGRESS;
    let mut stalled = false;
    let (mut refused, mut read_after) = (false, 0u64);
    loop {
        // Readiness first, so a splice that would never see the data cannot hang us.
        if !poll_in(&s, 200)? {
            if Instant::now() > deadline {
                stalled = true;
                break;
            }
            continue;
        }
        let n = match splice(&s, None, &wp, None, 65536, SpliceFFlags::SPLICE_F_NONBLOCK) {
            Ok(0) => break,
            Ok(n) => n,
            Err(Errno::EAGAIN) => {
                if Instant::now() > deadline {
                    stalled = true;
                    break;
                }
                sleep_ms(10);
                continue;
            }
            // The read guard: splicing is refused while redirected bytes wait. Do what Go's
            // io.Copy and HAProxy do: read the rest with read(2).
            Err(Errno::EINVAL) => {
                refused = true;
                let at = v.offset();
                loop {
                    let r = match std::io::Read::read(&mut s, &mut buf) {
                        Ok(0) => break,
                        Ok(r) => r,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(e).context("read after the refused splice"),
                    };
                    v.feed(&buf[..r]);
                }
                read_after = v.offset() - at;
                break;
            }
            Err(e) => return Err(e).context("splice from the socket"),
        };
        deadline = Instant::now() + testbed::steps::NO_PROGRESS;
        let mut left = n;
        while left > 0 {
            let want = left.min(buf.len());
            let r = match read(&rp, &mut buf[..want]) {
                Ok(0) => bail!("read the pipe: end of file"),
                Ok(r) => r,
                Err(e) => bail!("read the pipe: {}", std::io::Error::from(e)),
            };
            v.feed(&buf[..r]);
            left -= r;
        }
    }
    drop((rp, wp));
    Ok(json!({
        "received": v.offset(),
        "read_after_refusal": read_after,
        "refused": refused,
        "ok": v.first_mismatch().is_none(),
        "stalled": stalled,
    }))
}

/// splice-recv's client: sends --bytes, half-closes.
pub fn recv_client(mut s: TcpStream, c: &Common) -> Result<Value> {
    let sent = send_pattern(&mut s, c.bytes, 64 * 1024, 0, Direction::ClientToServer, 0)?;
    s.shutdown(Shutdown::Write)?;
    let _ = wait_closed(&mut s);
    Ok(json!({"sent": sent}))
}

/// `TCP_CLOSE` (include/net/tcp_states.h), as `tcp_info.tcpi_state` reports it.
const TCP_CLOSE: u8 = 7;
/// `TCP_CLOSE_WAIT`: the peer's FIN came.
const TCP_CLOSE_WAIT: u8 = 8;

/// How many splices splice-contended tries, and beside how many readers of /dev/zero.
const CONTENDED_SPLICES: u32 = 20_000;
const CONTENDED_READERS: usize = 3;

/// The calling thread on CPU 0 only.
fn on_cpu0() -> Result<()> {
    let mut set = nix::sched::CpuSet::new();
    set.set(0).context("CPU 0 in a CPU set")?;
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
        .context("sched_setaffinity(CPU 0)")
}

/// splice-contended's server: once every byte and the FIN are there (all redirected
/// where the bypass runs: they wait in the ingress queue), splices
/// [`CONTENDED_SPLICES`] times on CPU 0 while [`CONTENDED_READERS`] threads there read
/// /dev/zero a byte at a time, so that the read guard's check of every read(2) on the
/// CPU is often running in a task preempted inside it. Counts the splices refused
/// (`EINVAL`: what the guard answers while redirected bytes wait) and those that went
/// through empty (`EAGAIN`, or 0 at the FIN: they read the empty TCP queue); bytes a
/// splice moved (plain TCP) are read from the pipe. Then read(2) reads the rest, and
/// every byte is checked.
pub fn contended_server(mut s: TcpStream) -> Result<Value> {
    let deadline = Instant::now() + testbed::steps::NET;
    while tcp_state(&s)? != TCP_CLOSE_WAIT {
        if Instant::now() > deadline {
            bail!("the client's FIN never came");
        }
        sleep_ms(5);
    }
    let (rp, wp) = pipe().context("pipe")?;
    let mut v = Verifier::new(0, Direction::ClientToServer);
    let mut buf = vec![0u8; 65536];
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (mut refused, mut went_through, mut spliced) = (0u32, 0u32, 0u64);
    std::thread::scope(|scope| -> Result<()> {
        let mut readers = Vec::new();
        for _ in 0..CONTENDED_READERS {
            readers.push(scope.spawn(|| -> Result<()> {
                on_cpu0()?;
                let mut zero = std::fs::File::open("/dev/zero").context("open /dev/zero")?;
                let mut byte = [0u8; 1];
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    zero.read_exact(&mut byte).context("read /dev/zero")?;
                }
                Ok(())
            }));
        }
        let splices = (|| -> Result<()> {
            on_cpu0()?;
            for _ in 0..CONTENDED_SPLICES {
                match splice(&s, None, &wp, None, 65536, SpliceFFlags::SPLICE_F_NONBLOCK) {
                    Err(Errno::EINVAL) => refused += 1,
                    Ok(0) | Err(Errno::EAGAIN) => went_through += 1,
                    Ok(n) => {
                        spliced += n as u64;
                        let mut left = n;
                        while left > 0 {
                            let r = read(&rp, &mut buf[..left.min(65536)])
                                .map_err(std::io::Error::from)
                                .context("read the pipe")?;
                            if r == 0 {
                                bail!("read the pipe: end of file");
                            }
                            v.feed(&buf[..r]);
                            left -= r;
                        }
                    }
                    Err(e) => return Err(std::io::Error::from(e)).context("splice"),
                }
            }
            Ok(())
        })();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for r in readers {
            r.join()
                .map_err(|_| anyhow::anyhow!("a reader of /dev/zero panicked"))??;
        }
        splices
    })?;
    loop {
        let r = match s.read(&mut buf) {
            Ok(0) => break,
            Ok(r) => r,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).context("read after the splices"),
        };
        v.feed(&buf[..r]);
    }
    Ok(json!({
        "splices": CONTENDED_SPLICES,
        "refused": refused,
        "went_through": went_through,
        "spliced": spliced,
        "received": v.offset(),
        "ok": v.first_mismatch().is_none(),
    }))
}

/// splice-after-close's server: half-closes, waits until its socket has closed (the
/// client's FIN after its bytes), then reads as splice-recv does.
pub fn recv_after_close_server(s: TcpStream) -> Result<Value> {
    s.shutdown(Shutdown::Write)?;
    let deadline = Instant::now() + testbed::steps::NET;
    loop {
        let state = tcp_state(&s)?;
        if state == TCP_CLOSE {
            break;
        }
        if Instant::now() > deadline {
            bail!("the socket never closed (state {state}): the client's FIN did not come");
        }
        sleep_ms(5);
    }
    let mut out = recv_server(s)?;
    out["closed_before_reading"] = json!(true);
    Ok(out)
}

/// splice-after-close's client: waits for the server's half-close, sends --bytes,
/// half-closes.
pub fn recv_after_close_client(mut s: TcpStream, c: &Common) -> Result<Value> {
    wait_closed(&mut s)?;
    let sent = send_pattern(&mut s, c.bytes, 64 * 1024, 0, Direction::ClientToServer, 0)?;
    s.shutdown(Shutdown::Write)?;
    Ok(json!({"sent": sent}))
}

/// The socket's TCP state (`TCP_INFO`).
fn tcp_state(s: &TcpStream) -> Result<u8> {
    // SAFETY: `tcp_info` is plain old data; the kernel fills at most `len` bytes.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: a valid socket, a buffer of `len` bytes.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&raw mut info).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).context("getsockopt(TCP_INFO)");
    }
    Ok(info.tcpi_state)
}

/// splice-switch: what the client sends before the server's splice, and after it.
const BEFORE_SPLICE: usize = 16 << 10;
const AFTER_SPLICE: usize = 32 << 10;

fn switch_files(c: &Common) -> Result<(&std::path::Path, &std::path::Path)> {
    match (c.mark_file.as_deref(), c.go_file.as_deref()) {
        (Some(m), Some(g)) => Ok((m, g)),
        _ => bail!("splice-switch needs --mark-file and --go-file"),
    }
}

/// splice-switch's client: 16 KiB, acknowledged, --mark-file; once --go-file exists
/// (the server's splice came), 32 KiB more and a half-close.
pub fn switch_client(mut s: TcpStream, c: &Common) -> Result<Value> {
    let (mark_file, go_file) = switch_files(c)?;
    // Greeted, so both ends are paired before the first byte (the server writes first).
    let mut one = [0u8; 1];
    s.read_exact(&mut one).context("read the greeting")?;
    let mut p = Pattern::new(0, Direction::ClientToServer);
    let mut buf = vec![0u8; AFTER_SPLICE];
    p.fill(&mut buf[..BEFORE_SPLICE]);
    s.write_all(&buf[..BEFORE_SPLICE]).context("write")?;
    wait_acked(&s)?;
    mark(Some(mark_file))?;
    wait_file(go_file)?;
    p.fill(&mut buf);
    s.write_all(&buf).context("write")?;
    s.shutdown(Shutdown::Write)?;
    let _ = wait_closed(&mut s);
    Ok(json!({"sent": BEFORE_SPLICE + AFTER_SPLICE}))
}

/// splice-switch's server: once the first bytes are there, one non-blocking splice
/// (TCP moves them; the read guard refuses while they wait redirected), --go-file;
/// once the client's FIN came (EPOLLRDHUP: every byte it sent before is there), one
/// read of more than all that waits, then the rest to the end. TCP's read returns
/// everything waiting: an application may take a shorter read, once the peer's FIN
/// was reported, as the end of the stream (HAProxy does).
pub fn switch_server(mut s: TcpStream, c: &Common) -> Result<Value> {
    let (mark_file, go_file) = switch_files(c)?;
    s.write_all(b"G").context("greet")?;
    wait_file(mark_file)?;
    s.set_nonblocking(true)?;
    let mut v = Verifier::new(0, Direction::ClientToServer);
    let (rp, wp) = pipe().context("pipe")?;
    let mut buf = vec![0u8; 4 * AFTER_SPLICE];
    let (mut spliced, mut refused) = (0, false);
    match splice(
        &s,
        None,
        &wp,
        None,
        1 << 16,
        SpliceFFlags::SPLICE_F_NONBLOCK,
    ) {
        Ok(n) => {
            spliced = n;
            while v.offset() < n as u64 {
                let want = (n - v.offset() as usize).min(buf.len());
                let r = read(&rp, &mut buf[..want]).context("read the pipe")?;
                if r == 0 {
                    bail!("read the pipe: end of file");
                }
                v.feed(&buf[..r]);
            }
        }
        Err(Errno::EINVAL) => refused = true,
        // No read guard: the redirected bytes are not in the TCP queue.
        Err(Errno::EAGAIN) => {}
        Err(e) => return Err(e).context("splice from the socket"),
    }
    drop((rp, wp));
    mark(Some(go_file))?;
    let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).context("epoll_create1")?;
    ep.add(&s, EpollEvent::new(EpollFlags::EPOLLRDHUP, 0))
        .context("epoll_ctl")?;
    let mut ev = [EpollEvent::empty()];
    let net = EpollTimeout::try_from(testbed::steps::NET).unwrap_or(EpollTimeout::NONE);
    if ep.wait(&mut ev, net).context("epoll_wait")? == 0
        || !ev[0].events().contains(EpollFlags::EPOLLRDHUP)
    {
        bail!("no FIN from the client within {:?}", testbed::steps::NET);
    }
    let waiting = (BEFORE_SPLICE + AFTER_SPLICE - spliced) as u64;
    let first = match s.read(&mut buf) {
        Ok(n) => n,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => 0,
        Err(e) => return Err(e).context("read"),
    };
    v.feed(&buf[..first]);
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => v.feed(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if !poll_in(&s, net_ms())? {
                    bail!("the stream did not end within {:?}", testbed::steps::NET);
                }
            }
            Err(e) => return Err(e).context("read"),
        }
    }
    Ok(json!({
        "spliced": spliced,
        "refused": refused,
        "waiting": waiting,
        "first_read": first,
        "received": v.offset(),
        "ok": v.first_mismatch().is_none(),
    }))
}
