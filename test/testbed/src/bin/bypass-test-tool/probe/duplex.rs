//! `duplex`: a blocking reader thread and a writer thread on one socket, both sides.

use std::net::TcpStream;

use anyhow::Result;
use serde_json::{Value, json};
use testbed::peer::pattern::Direction;

use super::{
    Common,
    sock::{drain_exact, send_pattern},
};

/// A reader thread and this thread writing, on one socket. Each side reads exactly what
/// the other sends and closes only then: no half-close wakes the reader (the `halfclose`
/// case covers that).
pub fn run(s: TcpStream, c: &Common, out: Direction) -> Result<Value> {
    let into = match out {
        Direction::ClientToServer => Direction::ServerToClient,
        Direction::ServerToClient => Direction::ClientToServer,
    };
    let mut reader = s.try_clone()?;
    let n = c.bytes;
    let read = std::thread::spawn(move || drain_exact(&mut reader, n, into));
    let mut w = s.try_clone()?;
    let sent = send_pattern(&mut w, c.bytes, 16 * 1024, 0, out, 0)?;
    let r = read
        .join()
        .map_err(|_| anyhow::anyhow!("reader panicked"))??;
    Ok(json!({"sent": sent, "received": r.bytes, "ok": r.ok, "spurious_eagain": r.spurious}))
}
