//! `epoll`: readiness through epoll: EPOLLIN before and after data, EPOLLRDHUP after
//! the peer's FIN, EPOLLOUT on a fresh socket.

use std::{
    io::{Read, Write},
    net::{Shutdown, TcpStream},
};

use anyhow::{Context as _, Result};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use serde_json::{Value, json};
use testbed::peer::pattern::{Direction, Pattern};

use super::{Common, sock::sleep_ms};

pub fn server(mut s: TcpStream) -> Result<Value> {
    let ep = new_epoll()?;
    ep.add(
        &s,
        EpollEvent::new(EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP, 0),
    )
    .context("epoll_ctl")?;
    // The client sends 100 bytes 200 ms after connecting, then half-closes 200 ms later.
    let before = wait(&ep, 100)?;
    // The data and the FIN arrive at the machine's speed: waited for with a net, each
    // returning as soon as it is ready.
    let with_data = wait(&ep, super::sock::net_ms())?;
    let mut buf = [0u8; 200];
    let n = s.read(&mut buf)?;
    let after_fin = wait_for(&ep, EpollFlags::EPOLLRDHUP)?;
    Ok(json!({
        "in_before_data": before.contains(EpollFlags::EPOLLIN),
        "in_with_data": with_data.contains(EpollFlags::EPOLLIN),
        "read": n,
        "rdhup_after_fin": after_fin.contains(EpollFlags::EPOLLRDHUP),
    }))
}

pub fn client(mut s: TcpStream, c: &Common) -> Result<Value> {
    let mut p = Pattern::new(0, Direction::ClientToServer);
    let mut buf = c.chunk_buf();
    let ep = new_epoll()?;
    ep.add(&s, EpollEvent::new(EpollFlags::EPOLLOUT, 0))
        .context("epoll_ctl")?;
    let out = wait(&ep, 100)?.contains(EpollFlags::EPOLLOUT);
    sleep_ms(200);
    p.fill(&mut buf[..100]);
    s.write_all(&buf[..100])?;
    sleep_ms(200);
    s.shutdown(Shutdown::Write)?;
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    Ok(json!({"out_ready": out}))
}

/// The events once `want` is among them (level-triggered: the data read before stays
/// reported until then), at most [`testbed::steps::NET`]; what was last reported if it
/// never is.
fn wait_for(ep: &Epoll, want: EpollFlags) -> Result<EpollFlags> {
    let deadline = std::time::Instant::now() + testbed::steps::NET;
    loop {
        let got = wait(ep, 1000)?;
        if got.contains(want) || std::time::Instant::now() > deadline {
            return Ok(got);
        }
    }
}

fn new_epoll() -> Result<Epoll> {
    Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).context("epoll_create1")
}

/// The events of the first ready fd within `timeout_ms` (none if none).
fn wait(ep: &Epoll, timeout_ms: i32) -> Result<EpollFlags> {
    let mut ev = [EpollEvent::empty()];
    let timeout = nix::sys::epoll::EpollTimeout::try_from(timeout_ms)
        .map_err(|e| anyhow::anyhow!("epoll timeout {timeout_ms} ms: {e}"))?;
    let n = ep.wait(&mut ev, timeout).context("epoll_wait")?;
    Ok(if n == 1 {
        ev[0].events()
    } else {
        EpollFlags::empty()
    })
}
