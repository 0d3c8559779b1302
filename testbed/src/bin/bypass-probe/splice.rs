//! `splice-send`: the client moves bytes from a pipe with splice(2). `splice-recv`: the
//! server reads with splice(2) into a pipe.

use std::{
    io::ErrorKind,
    net::{Shutdown, TcpStream},
    os::fd::AsRawFd,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};
use testbed::peer::pattern::{Direction, Pattern, Verifier};

use crate::{
    Common,
    sock::{close, drain, pipe, poll_in, send_pattern, sleep_ms, wait_closed},
};

/// splice-send's server: reads and verifies.
pub fn send_server(mut s: TcpStream, c: &Common) -> Result<Value> {
    let r = drain(&mut s, c.chunk, 0, Direction::ClientToServer, 0)?;
    Ok(json!({"received": r.bytes, "ok": r.ok}))
}

pub fn send_client(s: &TcpStream, c: &Common) -> Result<Value> {
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

pub fn recv_server(s: TcpStream) -> Result<Value> {
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

/// splice-recv's client: sends --bytes, half-closes.
pub fn recv_client(mut s: TcpStream, c: &Common) -> Result<Value> {
    let sent = send_pattern(&mut s, c.bytes, 64 * 1024, 0, Direction::ClientToServer, 0)?;
    s.shutdown(Shutdown::Write)?;
    let _ = wait_closed(&mut s);
    Ok(json!({"sent": sent}))
}
