//! `fionread`: FIONREAD once everything sent has arrived.

use std::{io::Write, net::TcpStream};

use anyhow::Result;
use serde_json::{Value, json};
use testbed::peer::pattern::{Direction, Pattern};

use super::{
    Common,
    sock::{fionread, sleep_ms, wait_closed, wait_readable},
};

pub fn server(s: TcpStream) -> Result<Value> {
    // The client sends 3000 bytes and waits; give them time to land.
    wait_readable(&s)?;
    sleep_ms(200);
    Ok(json!({"fionread": fionread(&s)?}))
}

pub fn client(mut s: TcpStream, c: &Common) -> Result<Value> {
    let mut p = Pattern::new(0, Direction::ClientToServer);
    let mut buf = c.chunk_buf();
    let n = 3000.min(buf.len());
    p.fill(&mut buf[..n]);
    s.write_all(&buf[..n])?;
    wait_closed(&mut s)
}
