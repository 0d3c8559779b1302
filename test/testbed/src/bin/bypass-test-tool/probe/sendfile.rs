//! `sendfile`: the client sends a file with sendfile(2); the server reads and verifies.

use std::net::{Shutdown, TcpStream};

use anyhow::{Context as _, Result, bail};
use nix::sys::sendfile::sendfile;
use serde_json::{Value, json};
use testbed::peer::pattern::{Direction, Pattern};

use super::{Common, sock::drain};

pub fn server(mut s: TcpStream, c: &Common) -> Result<Value> {
    let r = drain(&mut s, c.chunk, 0, Direction::ClientToServer, 0)?;
    Ok(json!({"received": r.bytes, "ok": r.ok}))
}

pub fn client(s: &TcpStream, c: &Common) -> Result<Value> {
    let path = std::env::temp_dir().join(format!("bypass-test-tool-probe-{}", std::process::id()));
    let mut data = vec![0u8; usize::try_from(c.bytes)?];
    Pattern::new(0, Direction::ClientToServer).fill(&mut data);
    std::fs::write(&path, &data)?;
    let f = std::fs::File::open(&path)?;
    let _ = std::fs::remove_file(&path);
    let mut off = 0;
    let mut sent = 0u64;
    while sent < c.bytes {
        let n = sendfile(s, &f, Some(&mut off), (c.bytes - sent) as usize).context("sendfile")?;
        if n == 0 {
            bail!("sendfile: no progress after {sent} bytes");
        }
        sent += n as u64;
    }
    s.shutdown(Shutdown::Write)?;
    Ok(json!({"sent": sent}))
}
