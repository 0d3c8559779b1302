//! `flood`. Client: non-blocking writes of --chunk bytes for --secs (with --go-file:
//! until that file exists and a write has met `EAGAIN` after it), counting what the
//! kernel accepts, how far free memory drops and how many 1 KiB slab objects (where a
//! waiting redirected message's `struct sk_msg` lives) and unreclaimable slab bytes it
//! took. Server: reads nothing for --hold-ms (with --wait-file: until that file
//! exists), reports FIONREAD, then drains.

use std::{
    io::{ErrorKind, Write},
    net::TcpStream,
    time::Instant,
};

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};
use testbed::peer::pattern::{Direction, Pattern};

use super::{
    Common,
    sock::{drain, fionread, sleep_ms},
};

pub fn server(mut s: TcpStream, c: &Common) -> Result<Value> {
    match &c.wait_file {
        Some(p) => super::trust::wait_file(p)?,
        None => sleep_ms(c.hold_ms),
    }
    let queued = fionread(&s)?;
    let r = drain(&mut s, c.chunk, 0, Direction::ClientToServer, 0)?;
    Ok(json!({"fionread_after_hold": queued, "received": r.bytes, "ok": r.ok}))
}

pub fn client(mut s: TcpStream, c: &Common) -> Result<Value> {
    let mut p = Pattern::new(0, Direction::ClientToServer);
    let mut buf = c.chunk_buf();
    s.set_nonblocking(true)?;
    let free0 = mem_free_kib()?;
    let slab0 = (slab_1k()?, meminfo_kib("SUnreclaim:")?);
    let t = Instant::now();
    let (mut accepted, mut eagain) = (0u64, 0u64);
    // The pattern advances only by what the kernel took: a short write keeps
    // its tail for the next call.
    let mut pending: Vec<u8> = Vec::new();
    // With --go-file: whether it has appeared, and a write met EAGAIN since.
    let (mut go, mut blocked_after_go) = (false, false);
    loop {
        match c.go_file.as_deref() {
            Some(_) if blocked_after_go => break,
            Some(f) => go = go || f.exists(),
            None if t.elapsed().as_secs_f64() >= c.secs => break,
            None => {}
        }
        if pending.is_empty() {
            p.fill(&mut buf);
            pending.extend_from_slice(&buf);
        }
        match s.write(&pending) {
            Ok(n) => {
                accepted += n as u64;
                pending.drain(..n);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                eagain += 1;
                blocked_after_go = go;
                sleep_ms(5);
            }
            Err(e) => return Err(e).context("write"),
        }
    }
    let free1 = mem_free_kib()?;
    let slab1 = (slab_1k()?, meminfo_kib("SUnreclaim:")?);
    Ok(json!({"accepted": accepted, "eagain": eagain,
        "mem_free_drop_kib": free0 as i64 - free1 as i64,
        "kmalloc_1k_growth": slab1.0 as i64 - slab0.0 as i64,
        "sunreclaim_growth_kib": slab1.1 as i64 - slab0.1 as i64}))
}

fn mem_free_kib() -> Result<u64> {
    meminfo_kib("MemFree:")
}

/// A `/proc/meminfo` value in KiB (`field` with its colon).
fn meminfo_kib(field: &str) -> Result<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").context("read /proc/meminfo")?;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix(field) {
            return rest
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .with_context(|| format!("parse {field}"));
        }
    }
    bail!("no {field} in /proc/meminfo")
}

/// Active objects of the `kmalloc-1k` slab cache (`/proc/slabinfo`, root only).
fn slab_1k() -> Result<u64> {
    let text = std::fs::read_to_string("/proc/slabinfo").context("read /proc/slabinfo")?;
    text.lines()
        .find_map(|l| l.strip_prefix("kmalloc-1k "))
        .and_then(|rest| rest.split_whitespace().next())
        .context("no kmalloc-1k in /proc/slabinfo")?
        .parse()
        .context("parse kmalloc-1k")
}
