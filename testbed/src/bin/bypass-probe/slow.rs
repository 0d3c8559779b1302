//! `slow`. Client: blocking writes of --bytes, pausing --pause-ms every --pause-every
//! bytes. Server: reads --chunk bytes at a time, --delay-us apart.

use std::{io::Write, net::TcpStream, time::Instant};

use anyhow::{Context as _, Result};
use serde_json::{Value, json};
use testbed::peer::pattern::{Direction, Pattern};

use crate::{
    Common,
    sock::{drain, sleep_ms},
};

pub fn server(mut s: TcpStream, c: &Common) -> Result<Value> {
    let r = drain(&mut s, c.chunk, c.delay_us, Direction::ClientToServer, 0)?;
    Ok(json!({"received": r.bytes, "ok": r.ok, "secs": r.secs}))
}

pub fn client(mut s: TcpStream, c: &Common) -> Result<Value> {
    let mut p = Pattern::new(0, Direction::ClientToServer);
    let mut buf = c.chunk_buf();
    let t = Instant::now();
    let (mut sent, mut next_pause) = (0u64, c.pause_every);
    while sent < c.bytes {
        let n = (c.bytes - sent).min(buf.len() as u64) as usize;
        p.fill(&mut buf[..n]);
        s.write_all(&buf[..n]).context("write")?;
        sent += n as u64;
        if c.pause_every > 0 && sent >= next_pause {
            sleep_ms(c.pause_ms);
            next_pause += c.pause_every;
        }
    }
    Ok(json!({"sent": sent, "secs": t.elapsed().as_secs_f64()}))
}
