//! `halfclose`: each side half-closes (shutdown SHUT_WR) while the other still sends
//! to it.

use std::{
    io::{Read, Write},
    net::{Shutdown, TcpStream},
};

use anyhow::Result;
use serde_json::{Value, json};
use testbed::peer::pattern::Direction;

use super::{
    Common,
    sock::{drain, errno_name, send_pattern},
};

/// The server keeps sending after the client's FIN, then half-closes in turn.
pub fn server(s: TcpStream, c: &Common) -> Result<Value> {
    let mut reader = s.try_clone()?;
    let read =
        std::thread::spawn(move || drain(&mut reader, 65536, 0, Direction::ClientToServer, 0));
    let mut w = s.try_clone()?;
    // Send in small paced pieces so some arrive after the client's shutdown.
    let sent = send_pattern(&mut w, c.bytes, 16 * 1024, 2, Direction::ServerToClient, 0)?;
    let r = read
        .join()
        .map_err(|_| anyhow::anyhow!("reader panicked"))??;
    s.shutdown(Shutdown::Write)?;
    let mut one = [0u8; 1];
    let again = match (&s).read(&mut one) {
        Ok(n) => format!("read {n}"),
        Err(e) => errno_name(&e),
    };
    Ok(
        json!({"received": r.bytes, "ok": r.ok, "sent": sent, "read_after_eof": again,
        "spurious_eagain": r.spurious}),
    )
}

pub fn client(mut s: TcpStream, c: &Common) -> Result<Value> {
    let sent = send_pattern(&mut s, c.bytes, 64 * 1024, 0, Direction::ClientToServer, 0)?;
    s.shutdown(Shutdown::Write)?;
    // At once, while the server still reads and sends: TCP refuses (EPIPE), and no
    // byte may reach the server after the FIN.
    let write_now = match s.write(b"x") {
        Ok(n) => format!("wrote {n}"),
        Err(e) => errno_name(&e),
    };
    let r = drain(&mut s, 65536, 0, Direction::ServerToClient, 0)?;
    let write = match s.write(b"x") {
        Ok(n) => format!("wrote {n}"),
        Err(e) => errno_name(&e),
    };
    Ok(json!({"sent": sent, "received": r.bytes, "ok": r.ok,
        "write_right_after_shutdown": write_now,
        "write_after_shutdown": write, "spurious_eagain": r.spurious}))
}
