//! `burst`: --connections connections, --concurrency at a time; both sides write
//! --bytes right after connect/accept, then read the other's.

use std::{
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};
use testbed::peer::pattern::Direction;

use super::{
    Common,
    sock::{drain, send_pattern},
};

pub fn server(l: &TcpListener, c: &Common) -> Result<Value> {
    let failures = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for i in 0..c.connections {
        let (s, _) = l.accept().context("accept")?;
        let (failures, bytes, n) = (failures.clone(), bytes.clone(), c.bytes);
        handles.push(std::thread::spawn(move || {
            match burst_one(s, n, Direction::ServerToClient) {
                Ok(got) => {
                    bytes.fetch_add(got, Ordering::Relaxed);
                }
                Err(e) => {
                    eprintln!("connection {i}: {e:#}");
                    failures.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
        if handles.len() as u64 >= c.concurrency * 2 {
            for h in handles.drain(..) {
                let _ = h.join();
            }
        }
    }
    for h in handles {
        let _ = h.join();
    }
    Ok(
        json!({"connections": c.connections, "failures": failures.load(Ordering::Relaxed),
        "received": bytes.load(Ordering::Relaxed)}),
    )
}

pub fn client(connect: SocketAddr, c: &Common) -> Result<Value> {
    let next = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for _ in 0..c.concurrency.max(1) {
        let (next, failures, bytes) = (next.clone(), failures.clone(), bytes.clone());
        let (total, n) = (c.connections, c.bytes);
        workers.push(std::thread::spawn(move || {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    break;
                }
                let r = TcpStream::connect(connect)
                    .context("connect")
                    .and_then(|s| burst_one(s, n, Direction::ClientToServer));
                match r {
                    Ok(got) => {
                        bytes.fetch_add(got, Ordering::Relaxed);
                    }
                    Err(e) => {
                        eprintln!("connection {i}: {e:#}");
                        failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    for w in workers {
        let _ = w.join();
    }
    Ok(
        json!({"connections": c.connections, "failures": failures.load(Ordering::Relaxed),
        "received": bytes.load(Ordering::Relaxed)}),
    )
}

/// One burst connection: write `n` bytes at once (no waiting for the peer), half-close,
/// read and verify the peer's `n`. Returns the bytes verified.
fn burst_one(mut s: TcpStream, n: u64, out: Direction) -> Result<u64> {
    let into = match out {
        Direction::ClientToServer => Direction::ServerToClient,
        Direction::ServerToClient => Direction::ClientToServer,
    };
    let mut w = s.try_clone()?;
    let writer = std::thread::spawn(move || -> Result<u64> {
        let sent = send_pattern(&mut w, n, 64 * 1024, 0, out, 0)?;
        w.shutdown(Shutdown::Write)?;
        Ok(sent)
    });
    let r = drain(&mut s, 65536, 0, into, 0)?;
    let sent = writer
        .join()
        .map_err(|_| anyhow::anyhow!("writer panicked"))??;
    if !r.ok || r.bytes != n || sent != n {
        bail!(
            "sent {sent} of {n}, verified {} (in order: {})",
            r.bytes,
            r.ok
        );
    }
    Ok(r.bytes)
}
