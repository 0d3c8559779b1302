//! `reset`: the client closes with SO_LINGER 0 (RST) after sending; the server reads
//! late.

use std::{
    io::{Read, Write},
    net::TcpStream,
    time::Duration,
};

use anyhow::{Context as _, Result};
use serde_json::{Value, json};
use socket2::SockRef;
use testbed::peer::pattern::{Direction, Verifier};

use super::sock::{errno_name, send_pattern, sleep_ms};

/// Reads late, after the RST: what data, then which errors.
pub fn server(mut s: TcpStream) -> Result<Value> {
    sleep_ms(500);
    let mut v = Verifier::new(0, Direction::ClientToServer);
    let mut events: Vec<String> = Vec::new();
    let mut buf = vec![0u8; 65536];
    for _ in 0..10_000 {
        match s.read(&mut buf) {
            Ok(0) => {
                events.push("eof".into());
                break;
            }
            Ok(n) => {
                v.feed(&buf[..n]);
                if events.last().map(String::as_str) != Some("data") {
                    events.push("data".into());
                }
            }
            Err(e) => {
                events.push(errno_name(&e));
                if events.len() > 8 {
                    break;
                }
            }
        }
    }
    let write = match s.write(b"late") {
        Ok(n) => format!("wrote {n}"),
        Err(e) => errno_name(&e),
    };
    Ok(
        json!({"events": events, "received": v.offset(), "prefix_ok": v.first_mismatch().is_none(),
        "write_after_reset": write}),
    )
}

pub fn client(mut s: TcpStream) -> Result<Value> {
    let sent = send_pattern(
        &mut s,
        256 * 1024,
        64 * 1024,
        0,
        Direction::ClientToServer,
        0,
    )?;
    sleep_ms(100);
    SockRef::from(&s)
        .set_linger(Some(Duration::ZERO))
        .context("SO_LINGER")?;
    drop(s);
    Ok(json!({"sent": sent}))
}
