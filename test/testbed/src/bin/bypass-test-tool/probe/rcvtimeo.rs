//! `rcvtimeo`: SO_RCVTIMEO 200 ms and nothing sent: the read times out with EAGAIN.

use std::{
    io::Read,
    net::TcpStream,
    time::{Duration, Instant},
};

use anyhow::Result;
use serde_json::{Value, json};

use super::sock::{errno_name, wait_closed};

pub fn server(mut s: TcpStream) -> Result<Value> {
    s.set_read_timeout(Some(Duration::from_millis(200)))?;
    let t = Instant::now();
    let mut buf = [0u8; 16];
    let result = match s.read(&mut buf) {
        Ok(n) => format!("read {n}"),
        Err(e) => errno_name(&e),
    };
    let waited = t.elapsed().as_millis();
    Ok(json!({"result": result, "waited_at_least_180ms": waited >= 180}))
}

pub fn client(mut s: TcpStream) -> Result<Value> {
    wait_closed(&mut s)
}
