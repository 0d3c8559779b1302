//! `peek`: MSG_PEEK, then a read: the peeked bytes are read again.

use std::{
    io::{ErrorKind, Read, Write},
    net::TcpStream,
    os::fd::AsRawFd,
};

use anyhow::{Context as _, Result};
use nix::sys::socket::{MsgFlags, recv};
use serde_json::{Value, json};
use testbed::peer::pattern::{Direction, Pattern};

use crate::{
    Common,
    sock::{sleep_ms, wait_closed, wait_readable},
};

pub fn server(s: TcpStream) -> Result<Value> {
    wait_readable(&s, 2000)?;
    sleep_ms(100);
    let mut peek = [0u8; 50];
    // What recv returned: -1 on an error.
    let pn = recv(s.as_raw_fd(), &mut peek, MsgFlags::MSG_PEEK).map_or(-1, |n| n as i64);
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

pub fn client(mut s: TcpStream, c: &Common) -> Result<Value> {
    let mut p = Pattern::new(0, Direction::ClientToServer);
    let mut buf = c.chunk_buf();
    p.fill(&mut buf[..100]);
    s.write_all(&buf[..100])?;
    wait_closed(&mut s)
}
