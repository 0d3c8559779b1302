//! The held echo: one connection kept across agent versions, exchanging --bytes of
//! random bytes each step while the test switches agents between steps. The client
//! writes from one thread and reads back from another (so the exchange never waits on
//! TCP's buffers), or with --write-first reads only once it has written the whole step,
//! as a client that sends a whole request before it reads the reply does (the exchange
//! then needs the connection to hold a step in flight); it verifies every byte; the
//! server echoes.
//!
//! Step `k` (0 to --steps - 1): the client waits for `<go-file>.<k>`, sends, and once
//! everything came back writes `<mark-file>.<k>` (one JSON object); meanwhile it
//! rewrites `<mark-file>.progress` with the step and the bytes written and read back, so the test
//! can tell a stalled exchange from a slow one. The server reads step `k` only once
//! `<wait-file>.<k>` exists (no --wait-file: at once), which lets the test hold
//! redirected bytes unread across a switch.

use std::{
    io::{Read, Write},
    net::{Shutdown, TcpStream},
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use serde_json::{Value, json};
use testbed::peer::PatientReader;

use super::trust::wait_file;

/// The file of step `k` for the step-file prefix `prefix`.
fn step_file(prefix: &Path, k: u64) -> PathBuf {
    let mut name = prefix.as_os_str().to_owned();
    name.push(format!(".{k}"));
    PathBuf::from(name)
}

/// How often the client rewrites its progress file.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);

/// `n` random bytes, from the kernel.
fn random_bytes(n: u64) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; usize::try_from(n).context("--bytes does not fit in memory")?];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .context("read /dev/urandom")?;
    Ok(buf)
}

/// Client: `steps` exchanges of `bytes` each, as the module says.
pub fn client(
    s: TcpStream,
    steps: u64,
    bytes: u64,
    chunk: u64,
    write_first: bool,
    go: &Path,
    mark: &Path,
) -> Result<Value> {
    let chunk = usize::try_from(chunk).unwrap_or(65536).max(1);
    let mut reports = Vec::new();
    let mut progress_file = mark.as_os_str().to_owned();
    progress_file.push(".progress");
    let progress_file = PathBuf::from(progress_file);
    let progress_next = progress_file.with_extension("progress-next");
    for k in 0..steps {
        wait_file(&step_file(go, k))?;
        let data = Arc::new(random_bytes(bytes)?);
        let started = Instant::now();
        let (written, read) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let wrote = Arc::new(AtomicBool::new(false));
        let writer = {
            let (mut w, data) = (s.try_clone().context("clone the socket")?, data.clone());
            let (written, wrote) = (written.clone(), wrote.clone());
            std::thread::spawn(move || -> std::io::Result<()> {
                let all = data.chunks(chunk).try_for_each(|piece| {
                    w.write_all(piece)?;
                    written.fetch_add(piece.len() as u64, Ordering::Relaxed);
                    Ok(())
                });
                // Also when a write failed: the reader then reads what came back.
                wrote.store(true, Ordering::Release);
                all
            })
        };
        let got = {
            let (s, read) = (s.try_clone().context("clone the socket")?, read.clone());
            let (len, wrote) = (data.len(), wrote.clone());
            std::thread::spawn(move || -> std::io::Result<(Vec<u8>, u64)> {
                // --write-first: not a byte read before the whole step is written.
                while write_first && !wrote.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                let mut r = PatientReader::new(&s, None);
                let mut got = vec![0u8; len];
                let mut at = 0;
                while at < len {
                    let end = (at + chunk).min(len);
                    let n = r.read(&mut got[at..end])?;
                    if n == 0 {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::UnexpectedEof,
                            format!("the server closed after {at} of {len} bytes"),
                        ));
                    }
                    at += n;
                    read.store(at as u64, Ordering::Relaxed);
                }
                Ok((got, r.spurious_eagain()))
            })
        };
        while !got.is_finished() {
            let line = format!(
                "{k} {} {}\n",
                written.load(Ordering::Relaxed),
                read.load(Ordering::Relaxed)
            );
            // Replaced whole (written beside, then renamed): a reader never sees it
            // empty or half written.
            let _ = std::fs::write(&progress_next, line)
                .and_then(|()| std::fs::rename(&progress_next, &progress_file));
            std::thread::sleep(PROGRESS_EVERY);
        }
        let (back, spurious) = got
            .join()
            .map_err(|_| anyhow::anyhow!("the reader thread panicked"))?
            .with_context(|| format!("step {k}: read back"))?;
        writer
            .join()
            .map_err(|_| anyhow::anyhow!("the writer thread panicked"))?
            .with_context(|| format!("step {k}: write"))?;
        let first_difference = back.iter().zip(data.iter()).position(|(a, b)| a != b);
        let report = json!({
            "step": k,
            "bytes": bytes,
            "exact": first_difference.is_none(),
            "first_difference": first_difference,
            "secs": started.elapsed().as_secs_f64(),
            "spurious_eagain": spurious,
        });
        std::fs::write(step_file(mark, k), report.to_string())
            .with_context(|| format!("write {}", step_file(mark, k).display()))?;
        ensure!(
            first_difference.is_none(),
            "step {k}: the bytes read back differ from those sent at byte {first_difference:?}"
        );
        reports.push(report);
    }
    s.shutdown(Shutdown::Write).context("half-close")?;
    let mut rest = [0u8; 1];
    let mut r = PatientReader::new(&s, None);
    if r.read(&mut rest).context("read the server's close")? != 0 {
        bail!("the server sent more than it was sent");
    }
    Ok(json!({"ok": true, "steps": reports}))
}

/// Server: echoes `bytes` per step, step `k` once `<wait>.<k>` exists, then waits for
/// the client's close.
pub fn server(
    mut s: TcpStream,
    steps: u64,
    bytes: u64,
    chunk: u64,
    wait: Option<&Path>,
) -> Result<Value> {
    let mut buf = vec![0u8; usize::try_from(chunk).unwrap_or(65536).max(1)];
    let mut echoed = 0u64;
    let mut spurious = 0u64;
    for k in 0..steps {
        if let Some(w) = wait {
            wait_file(&step_file(w, k))?;
        }
        let mut left = bytes;
        while left > 0 {
            let want = usize::try_from(left.min(buf.len() as u64)).unwrap_or(buf.len());
            let mut r = PatientReader::new(&s, None);
            let n = r
                .read(&mut buf[..want])
                .with_context(|| format!("step {k}: read"))?;
            spurious += r.spurious_eagain();
            if n == 0 {
                bail!("step {k}: the client closed with {left} bytes of the step unsent");
            }
            s.write_all(&buf[..n])
                .with_context(|| format!("step {k}: echo"))?;
            left -= n as u64;
            echoed += n as u64;
        }
    }
    let mut r = PatientReader::new(&s, None);
    let extra = r.read(&mut buf).context("read the client's close")?;
    ensure!(extra == 0, "the client sent more than --steps x --bytes");
    Ok(json!({"ok": true, "echoed": echoed, "spurious_eagain": spurious}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_files_are_numbered() {
        assert_eq!(
            step_file(Path::new("/tmp/x/go"), 3),
            Path::new("/tmp/x/go.3")
        );
    }
}
