//! `waitall`: recv(MSG_WAITALL) of 2000 bytes sent as 1000 + 1000, 100 ms apart.

use std::{io::Write, net::TcpStream};

use anyhow::Result;
use serde_json::{Value, json};
use testbed::peer::pattern::{Direction, Pattern};

use super::{
    Common,
    sock::{recv_waitall, sleep_ms, wait_closed},
};

pub fn server(s: TcpStream) -> Result<Value> {
    let mut buf = vec![0u8; 2000];
    // What recv returned: -1 on an error.
    let n = recv_waitall(&s, &mut buf).map_or(-1, |n| n as i64);
    Ok(json!({"first_read_len": n}))
}

pub fn client(mut s: TcpStream, c: &Common) -> Result<Value> {
    let mut p = Pattern::new(0, Direction::ClientToServer);
    let mut buf = c.chunk_buf();
    p.fill(&mut buf[..1000]);
    s.write_all(&buf[..1000])?;
    sleep_ms(100);
    p.fill(&mut buf[..1000]);
    s.write_all(&buf[..1000])?;
    wait_closed(&mut s)
}
