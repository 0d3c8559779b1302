//! `epoll`: readiness through epoll: EPOLLIN before and after data, EPOLLRDHUP after
//! the peer's FIN, EPOLLOUT on a fresh socket.

use std::{
    io::{Read, Write},
    net::{Shutdown, TcpStream},
    os::fd::{AsRawFd, RawFd},
};

use anyhow::{Context as _, Result};
use serde_json::{Value, json};
use testbed::peer::pattern::{Direction, Pattern};

use crate::{
    Common,
    sock::{close, sleep_ms},
};

pub fn server(mut s: TcpStream) -> Result<Value> {
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

pub fn client(mut s: TcpStream, c: &Common) -> Result<Value> {
    let mut p = Pattern::new(0, Direction::ClientToServer);
    let mut buf = c.chunk_buf();
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
