//! `rcvlowat`: SO_RCVLOWAT 1000 with 500 bytes, then 600 more: readiness and the first
//! read.

use std::{
    io::{ErrorKind, Read, Write},
    net::TcpStream,
};

use anyhow::{Context as _, Result};
use nix::sys::socket::setsockopt;
use serde_json::{Value, json};
use testbed::peer::pattern::{Direction, Pattern};

use super::{
    Common,
    sock::{RcvLowat, poll_in, sleep_ms, wait_closed},
};

pub fn server(mut s: TcpStream) -> Result<Value> {
    setsockopt(&s, RcvLowat, &1000).context("setsockopt")?;
    // The client sends 500 bytes 100 ms after connecting, 600 more 300 ms later.
    let ready_early = poll_in(&s, 250)?;
    // Read only once readable: a blocking read that already holds some bytes is woken
    // by lowat more bytes in the queue (net/ipv4/tcp.c, tcp_data_ready), a quirk of its
    // own.
    // Readable once the rest arrives, at the machine's speed: a net.
    let ready = poll_in(&s, super::sock::net_ms())?;
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

pub fn client(mut s: TcpStream, c: &Common) -> Result<Value> {
    let mut p = Pattern::new(0, Direction::ClientToServer);
    let mut buf = c.chunk_buf();
    sleep_ms(100);
    p.fill(&mut buf[..500]);
    s.write_all(&buf[..500])?;
    sleep_ms(300);
    p.fill(&mut buf[..600]);
    s.write_all(&buf[..600])?;
    wait_closed(&mut s)
}
