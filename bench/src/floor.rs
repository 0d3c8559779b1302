//! The floor: the same ping-pong and stream as qperf's `tcp_lat` and `tcp_bw`, over a
//! Unix-domain stream socket pair between two processes. No TCP/IP at all, so no
//! socket-level bypass can beat it by much; it tells how close the bypass gets.
//!
//! `bypass-bench floor` (the client) makes the pair, starts `bypass-bench floor-peer`
//! with the other end as its stdin, pins both, runs the test and prints one JSON line.
//! Semantics follow qperf: latency is the mean of round trip / 2 (plus nearest-rank
//! percentiles of each round trip / 2); throughput is bytes the peer received divided
//! by the sender's sending time, with the peer reading at most one message per read.

use std::{
    io::{ErrorKind, Read as _, Write as _},
    net::Shutdown,
    os::{
        fd::{AsFd as _, OwnedFd},
        unix::net::UnixStream,
    },
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use nix::{sched::CpuSet, unistd::Pid};
use serde::{Deserialize, Serialize};

use crate::{
    model::{Percentiles, Test},
    stats::percentile_sorted,
};

/// Round trips before timing starts.
const WARMUP: u32 = 1000;

/// One floor measurement, as the client prints it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FloorResult {
    /// `tcp_lat`: the one-way latencies of the round trips timed.
    pub latency: Option<Percentiles>,
    /// `tcp_bw`: bytes per second received.
    pub bw_bytes_per_sec: Option<f64>,
}

/// Pins the calling process (all its threads created later) to `cpu`.
pub fn pin_self(cpu: usize) -> Result<()> {
    let mut set = CpuSet::new();
    set.set(cpu)
        .with_context(|| format!("cpu {cpu} out of range"))?;
    nix::sched::sched_setaffinity(Pid::from_raw(0), &set)
        .with_context(|| format!("pin to cpu {cpu}"))
}

/// The client side: runs `test` for `secs` seconds with `size`-byte messages.
pub fn client(
    test: Test,
    size: u32,
    secs: f64,
    client_cpu: usize,
    server_cpu: usize,
) -> Result<FloorResult> {
    if size == 0 {
        bail!("message size must be at least 1");
    }
    pin_self(client_cpu)?;
    let (mut ours, theirs) = UnixStream::pair().context("socketpair(AF_UNIX, SOCK_STREAM)")?;
    let exe = std::env::current_exe().context("find our own executable")?;
    let mut peer = Command::new(exe)
        .args([
            "floor-peer",
            "--test",
            test.name(),
            "--size",
            &size.to_string(),
            "--cpu",
            &server_cpu.to_string(),
        ])
        .stdin(Stdio::from(OwnedFd::from(theirs)))
        .stdout(Stdio::null())
        .spawn()
        .context("start floor-peer")?;
    let duration = Duration::from_secs_f64(secs);
    let result = match test {
        Test::TcpLat => ping_pong(&mut ours, size as usize, duration),
        Test::TcpBw => stream(&mut ours, size as usize, duration),
    };
    drop(ours);
    let status = peer.wait().context("wait for floor-peer")?;
    let result = result?;
    if !status.success() {
        bail!("floor-peer failed: {status}");
    }
    Ok(result)
}

fn ping_pong(s: &mut UnixStream, size: usize, duration: Duration) -> Result<FloorResult> {
    let mut buf = vec![0u8; size];
    for _ in 0..WARMUP {
        s.write_all(&buf)?;
        s.read_exact(&mut buf)?;
    }
    let mut half_rtts: Vec<f64> = Vec::with_capacity(1 << 20);
    let start = Instant::now();
    let mut last = start;
    loop {
        s.write_all(&buf)?;
        s.read_exact(&mut buf)?;
        let now = Instant::now();
        half_rtts.push((now - last).as_nanos() as f64 / 2.0);
        last = now;
        if now - start >= duration {
            break;
        }
    }
    let elapsed = (last - start).as_nanos() as f64;
    let n = half_rtts.len();
    half_rtts.sort_by(f64::total_cmp);
    let pct = |p| percentile_sorted(&half_rtts, p).context("no round trip timed");
    Ok(FloorResult {
        latency: Some(Percentiles {
            avg_ns: elapsed / (2.0 * n as f64),
            p50_ns: pct(50.0)?,
            p99_ns: pct(99.0)?,
            p999_ns: pct(99.9)?,
            observations: n as u64,
        }),
        bw_bytes_per_sec: None,
    })
}

fn stream(s: &mut UnixStream, size: usize, duration: Duration) -> Result<FloorResult> {
    let buf = vec![0u8; size];
    let start = Instant::now();
    loop {
        s.write_all(&buf)?;
        if start.elapsed() >= duration {
            break;
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    s.shutdown(Shutdown::Write)?;
    let mut count = [0u8; 8];
    s.read_exact(&mut count)
        .context("read the peer's byte count")?;
    let received = u64::from_le_bytes(count) as f64;
    Ok(FloorResult {
        latency: None,
        bw_bytes_per_sec: Some(received / elapsed),
    })
}

/// The peer side, on stdin: echoes messages (`tcp_lat`) or counts bytes and reports
/// the count when the client shuts down its side (`tcp_bw`).
pub fn peer(test: Test, size: u32, cpu: usize) -> Result<()> {
    pin_self(cpu)?;
    let fd = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .context("take stdin")?;
    let mut s = UnixStream::from(fd);
    let mut buf = vec![0u8; size as usize];
    match test {
        Test::TcpLat => loop {
            match s.read_exact(&mut buf) {
                Ok(()) => s.write_all(&buf)?,
                Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e.into()),
            }
        },
        Test::TcpBw => {
            let mut total = 0u64;
            loop {
                match s.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => total += n as u64,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => return Err(e.into()),
                }
            }
            s.write_all(&total.to_le_bytes())?;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ping_pong_against_an_echo_thread() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let echo = std::thread::spawn(move || {
            let mut buf = [0u8; 16];
            while b.read_exact(&mut buf).is_ok() {
                b.write_all(&buf).unwrap();
            }
        });
        let r = ping_pong(&mut a, 16, Duration::from_millis(20)).unwrap();
        drop(a);
        echo.join().unwrap();
        let l = r.latency.unwrap();
        assert!(l.observations > 0);
        assert!(
            l.p50_ns > 0.0 && l.p50_ns <= l.p99_ns && l.p99_ns <= l.p999_ns,
            "{r:?}"
        );
    }

    #[test]
    fn stream_against_a_counting_thread() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let counter = std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            let mut total = 0u64;
            loop {
                match b.read(&mut buf).unwrap() {
                    0 => break,
                    n => total += n as u64,
                }
            }
            b.write_all(&total.to_le_bytes()).unwrap();
        });
        let r = stream(&mut a, 64, Duration::from_millis(20)).unwrap();
        counter.join().unwrap();
        assert!(r.bw_bytes_per_sec.unwrap() > 0.0);
    }
}
