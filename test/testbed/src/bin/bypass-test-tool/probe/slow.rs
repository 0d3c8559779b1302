//! `slow`. Client: blocking writes of --bytes, pausing --pause-ms every --pause-every
//! bytes (with --ack, until the server has read everything written). Server: reads
//! --chunk bytes at a time, --delay-us apart (with --ack, one byte back each time it
//! has read a multiple of --pause-every). With --ack and --mark-file M, the client
//! creates `M.N` once it has written block N, and the server reads nothing of block N
//! before that file exists: each block reaches the reader whole, whatever the
//! machine's speed.

use std::{
    io::{ErrorKind, Read, Write},
    net::TcpStream,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use serde_json::{Value, json};
use testbed::peer::pattern::{Direction, Pattern, Verifier};

use super::{
    Common,
    sock::{drain, sleep_ms},
    trust::{mark, wait_file},
};

pub fn server(mut s: TcpStream, c: &Common) -> Result<Value> {
    if c.ack && c.pause_every > 0 {
        return acking_server(s, c);
    }
    let r = drain(&mut s, c.chunk, c.delay_us, Direction::ClientToServer, 0)?;
    Ok(json!({"received": r.bytes, "ok": r.ok, "secs": r.secs}))
}

/// [`server`] with --ack.
fn acking_server(mut s: TcpStream, c: &Common) -> Result<Value> {
    let t = Instant::now();
    let mut v = Verifier::new(0, Direction::ClientToServer);
    let mut buf = c.chunk_buf();
    let (mut next_ack, mut acks) = (c.pause_every, 0u64);
    let marks = c.steps().mark.map(Path::to_path_buf);
    let mut block_read = false;
    loop {
        if !block_read {
            if let Some(m) = &marks {
                wait_file(&block_mark(m, acks))?;
            }
            block_read = true;
        }
        let n = match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).context("read"),
        };
        v.feed(&buf[..n]);
        while v.offset() >= next_ack {
            s.write_all(b"a").context("ack")?;
            acks += 1;
            next_ack += c.pause_every;
            block_read = false;
        }
        if c.delay_us > 0 {
            std::thread::sleep(Duration::from_micros(c.delay_us));
        }
    }
    Ok(json!({
        "received": v.offset(),
        "ok": v.first_mismatch().is_none(),
        "acks": acks,
        "secs": t.elapsed().as_secs_f64(),
    }))
}

/// The file that says block `n` is written.
fn block_mark(mark: &Path, n: u64) -> PathBuf {
    let mut name = mark.as_os_str().to_owned();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

pub fn client(mut s: TcpStream, c: &Common) -> Result<Value> {
    let mut p = Pattern::new(0, Direction::ClientToServer);
    let mut buf = c.chunk_buf();
    let t = Instant::now();
    let (mut sent, mut next_pause, mut blocks) = (0u64, c.pause_every, 0u64);
    while sent < c.bytes {
        let n = (c.bytes - sent).min(buf.len() as u64) as usize;
        p.fill(&mut buf[..n]);
        s.write_all(&buf[..n]).context("write")?;
        sent += n as u64;
        if c.pause_every > 0 && sent >= next_pause {
            if c.ack {
                if let Some(m) = c.steps().mark {
                    mark(Some(&block_mark(m, blocks)))?;
                }
                blocks += 1;
                let mut a = [0u8; 1];
                s.read_exact(&mut a).context("wait for the reader's ack")?;
            }
            sleep_ms(c.pause_ms);
            next_pause += c.pause_every;
        }
    }
    if c.ack
        && let Some(m) = c.steps().mark
    {
        // The end: the server's wait for another block ends, and it reads EOF.
        mark(Some(&block_mark(m, blocks)))?;
    }
    Ok(json!({"sent": sent, "secs": t.elapsed().as_secs_f64()}))
}
