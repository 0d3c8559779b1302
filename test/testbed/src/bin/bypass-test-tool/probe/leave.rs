//! `small-leave`: a small-message stream that leaves the SockHash. Client: a 1-byte
//! greeting each way (each side has then read through recv), --bytes as 1-byte writes
//! (the server reads none yet: a small-message stream), --mark-file, wait for
//! --go-file (the test waits until the agent took the connection out of the
//! SockHash), --bytes more as 1-byte writes, half-close. Server: the greeting, wait for
//! --wait-file, then read and verify everything.

use std::{
    io::{Read, Write},
    net::{Shutdown, TcpStream},
};

use anyhow::{Context as _, Result, ensure};
use serde_json::{Value, json};
use testbed::peer::pattern::{Direction, Verifier};

use super::trust::{Steps, Writer, mark, read_into, report, wait_opt};

pub fn client(mut s: TcpStream, st: &Steps<'_>) -> Result<Value> {
    s.set_nodelay(true)?;
    s.write_all(b"g").context("greet")?;
    let mut back = [0u8; 1];
    s.read_exact(&mut back).context("read greeting")?;
    ensure!(back == *b"g", "greeting {back:?}");
    let mut w = Writer::new(Direction::ClientToServer);
    w.send_singly(&mut s, st.bytes)?;
    mark(st.mark)?;
    wait_opt(st.go)?;
    w.send_singly(&mut s, st.bytes)?;
    s.shutdown(Shutdown::Write)?;
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    Ok(json!({"sent": w.sent}))
}

pub fn server(mut s: TcpStream, st: &Steps<'_>) -> Result<Value> {
    let mut hello = [0u8; 1];
    s.read_exact(&mut hello).context("read greeting")?;
    s.write_all(&hello).context("greet back")?;
    wait_opt(st.wait)?;
    let mut v = Verifier::new(0, Direction::ClientToServer);
    read_into(&mut s, &mut v, None)?;
    Ok(report(&v))
}
