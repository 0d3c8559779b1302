//! HTTP clients the way users run them: `curl` for one download (kept to check it, or
//! timed by curl itself and discarded, for a bench), `ab` (ApacheBench) for many
//! requests by count, with keep-alive or a connection per request, and `wrk` for
//! keep-alive load over a duration (for a bench: the tests count requests).

use std::{path::Path, process::Command, time::Duration};

use anyhow::{Context as _, Result, bail};

use super::{
    bins,
    client::{self, On},
};

/// `curl` GETs `url` on `on` (verifying the server against `cacert` for HTTPS) and
/// returns the body; fails on an HTTP error, when no byte came for
/// [`crate::steps::NO_PROGRESS`], or after `timeout`.
pub fn curl_get(
    on: On<'_>,
    url: &str,
    cacert: Option<&Path>,
    timeout: Duration,
) -> Result<Vec<u8>> {
    let mut cmd = Command::new(bins::system("curl")?);
    cmd.args(["--silent", "--show-error", "--fail", "--http1.1"])
        .args(["--max-time", &timeout.as_secs().to_string()])
        .args(no_progress())
        .args(["--output", "-"]);
    if let Some(ca) = cacert {
        cmd.arg("--cacert").arg(ca);
    }
    cmd.arg(url);
    let out = client::run(on, cmd, "curl", timeout + Duration::from_secs(30))?;
    if !out.status.success() {
        bail!(
            "curl {url} failed ({}) after {} bytes: {}",
            out.status,
            out.stdout.len(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out.stdout)
}

/// curl's no-progress timeout: less than a byte a second for
/// [`crate::steps::NO_PROGRESS`] (and its connect, at most as long).
fn no_progress() -> [String; 6] {
    let secs = crate::steps::NO_PROGRESS.as_secs().to_string();
    [
        "--speed-limit".into(),
        "1".into(),
        "--speed-time".into(),
        secs.clone(),
        "--connect-timeout".into(),
        secs,
    ]
}

/// What curl said about one download it timed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DownloadReport {
    /// `size_download`: body bytes received.
    pub bytes: u64,
    /// `time_total`: from the start of the connection to the last byte, seconds.
    pub secs: f64,
    /// `speed_download`: bytes per second, as curl computes it.
    pub bytes_per_sec: f64,
}

/// The `--write-out` format [`parse_write_out`] reads.
const WRITE_OUT: &str = "%{size_download} %{time_total} %{speed_download}";

/// `curl` GETs `url` on `on` and times it itself, the body discarded (so the client's
/// cost is receiving it, not keeping it); fails on an HTTP error, a short body (curl
/// checks the length the server announced) or after `timeout`.
pub fn curl_download(on: On<'_>, url: &str, timeout: Duration) -> Result<DownloadReport> {
    let mut cmd = Command::new(bins::system("curl")?);
    cmd.args(["--silent", "--show-error", "--fail", "--http1.1"])
        .args(["--max-time", &timeout.as_secs().to_string()])
        .args(["--output", "/dev/null", "--write-out", WRITE_OUT])
        .arg(url);
    let out = client::run_ok(on, cmd, "curl", timeout + Duration::from_secs(30))?;
    parse_write_out(&out).with_context(|| format!("curl's --write-out: {out}"))
}

/// The three numbers of `WRITE_OUT`.
pub fn parse_write_out(text: &str) -> Result<DownloadReport> {
    let mut f = text.split_whitespace();
    let mut next = |name: &str| f.next().with_context(|| format!("no {name}"));
    Ok(DownloadReport {
        bytes: next("size_download")?.parse()?,
        secs: next("time_total")?.parse()?,
        bytes_per_sec: next("speed_download")?.parse()?,
    })
}

/// An `ab` run: `requests` requests, `concurrency` at a time.
#[derive(Clone, Debug)]
pub struct Ab {
    /// Requests (`-n`).
    pub requests: u32,
    /// In flight at once (`-c`).
    pub concurrency: u32,
    /// Reuse connections (`-k`); without it, a connection per request.
    pub keep_alive: bool,
}

/// What `ab` printed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AbReport {
    /// "Complete requests".
    pub complete: u64,
    /// "Failed requests" (connect, receive, length and exception errors).
    pub failed: u64,
    /// "Non-2xx responses" (absent: 0).
    pub non_2xx: u64,
    /// "Keep-Alive requests" (absent: 0).
    pub keep_alive: u64,
    /// "HTML transferred": body bytes.
    pub body_bytes: u64,
    /// "Requests per second".
    pub rps: f64,
}

impl Ab {
    /// Runs it on `on` against `url`; fails unless it exits 0 within `timeout` (a
    /// net); each of its sockets gives up after [`crate::steps::NO_PROGRESS`] without
    /// a byte (`-s`).
    pub fn run(&self, on: On<'_>, url: &str, timeout: Duration) -> Result<AbReport> {
        let mut cmd = Command::new(bins::system("ab")?);
        cmd.args(["-q", "-n", &self.requests.to_string()])
            .args(["-c", &self.concurrency.to_string()])
            .args(["-s", &crate::steps::NO_PROGRESS.as_secs().to_string()]);
        if self.keep_alive {
            cmd.arg("-k");
        }
        cmd.arg(url);
        let out = client::run_ok(on, cmd, "ab", timeout)?;
        parse_ab(&out).with_context(|| format!("ab's output: {out}"))
    }
}

/// The fields of `ab`'s summary that say whether every request completed.
pub fn parse_ab(text: &str) -> Result<AbReport> {
    let field = |name: &str| -> Option<&str> {
        text.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == name).then(|| v.split_whitespace().next())?
        })
    };
    let num = |name: &str| field(name).and_then(|v| v.parse::<u64>().ok());
    Ok(AbReport {
        complete: num("Complete requests").context("no \"Complete requests\"")?,
        failed: num("Failed requests").context("no \"Failed requests\"")?,
        non_2xx: num("Non-2xx responses").unwrap_or(0),
        keep_alive: num("Keep-Alive requests").unwrap_or(0),
        body_bytes: num("HTML transferred").context("no \"HTML transferred\"")?,
        rps: field("Requests per second")
            .and_then(|v| v.parse().ok())
            .context("no \"Requests per second\"")?,
    })
}

/// A `wrk` run: keep-alive connections for a duration.
#[derive(Clone, Debug)]
pub struct Wrk {
    /// Threads (`-t`).
    pub threads: u32,
    /// Connections (`-c`).
    pub connections: u32,
    /// How long (`-d`, in whole seconds: wrk takes no fraction; at least 1).
    pub duration: Duration,
}

/// What `wrk` printed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WrkReport {
    /// Requests completed.
    pub requests: u64,
    /// Connect, read, write and timeout errors together.
    pub socket_errors: u64,
    /// "Non-2xx or 3xx responses" (absent: 0).
    pub non_2xx_3xx: u64,
    /// "Requests/sec".
    pub rps: f64,
    /// The mean of the "Latency" line, microseconds.
    pub latency_us: Option<f64>,
}

impl Wrk {
    /// Runs it on `on` against `url`; fails unless it exits 0 with its summary.
    pub fn run(&self, on: On<'_>, url: &str) -> Result<WrkReport> {
        let mut cmd = Command::new(bins::system("wrk")?);
        cmd.args(["-t", &self.threads.to_string()])
            .args(["-c", &self.connections.to_string()])
            .args(["-d", &format!("{}s", wrk_secs(self.duration))])
            .arg(url);
        let out = client::run_ok(on, cmd, "wrk", self.duration + Duration::from_secs(60))?;
        parse_wrk(&out).with_context(|| format!("wrk's output: {out}"))
    }
}

/// `-d` for `duration`: wrk reads whole seconds (its `scan_time` takes an integer and
/// a unit of s, m or h), so a duration rounds up, to at least 1 s.
fn wrk_secs(duration: Duration) -> u64 {
    duration.as_secs_f64().ceil().max(1.0) as u64
}

/// The summary of `wrk` 4: "N requests in", "Socket errors: connect a, read b, write c,
/// timeout d", "Non-2xx or 3xx responses: n", "Requests/sec: x", and the thread
/// statistics' "Latency avg stdev max +/-" line.
pub fn parse_wrk(text: &str) -> Result<WrkReport> {
    let line = |prefix: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(prefix).map(str::trim))
    };
    let requests = text
        .lines()
        .find_map(|l| l.trim().split_once(" requests in ").map(|(n, _)| n.trim()))
        .and_then(|n| n.parse().ok())
        .context("no \"N requests in\"")?;
    let socket_errors = line("Socket errors:").map_or(0, |errs| {
        errs.split(',')
            .filter_map(|e| e.split_whitespace().last()?.parse::<u64>().ok())
            .sum()
    });
    Ok(WrkReport {
        requests,
        socket_errors,
        non_2xx_3xx: line("Non-2xx or 3xx responses:")
            .and_then(|n| n.parse().ok())
            .unwrap_or(0),
        rps: line("Requests/sec:")
            .and_then(|n| n.parse().ok())
            .context("no \"Requests/sec\"")?,
        latency_us: line("Latency")
            .and_then(|l| l.split_whitespace().next())
            .and_then(duration_us),
    })
}

/// One of wrk's durations (`203.45us`, `1.23ms`, `2.00s`), in microseconds.
fn duration_us(text: &str) -> Option<f64> {
    let split = text.find(|c: char| c.is_ascii_alphabetic())?;
    let (n, unit) = text.split_at(split);
    let scale = match unit {
        "us" => 1.0,
        "ms" => 1e3,
        "s" => 1e6,
        "m" => 60e6,
        _ => return None,
    };
    Some(n.parse::<f64>().ok()? * scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_wrk_summary() {
        let text = "Running 1s test @ http://10.0.0.2:8080/small.bin\n  1 threads and 4 connections\n  Thread Stats   Avg      Stdev     Max   +/- Stdev\n    Latency   323.45us  100.10us   1.23ms   80.00%\n    Req/Sec    12.35k     1.00k   13.00k    90.00%\n  12345 requests in 1.00s, 190.00MB read\n  Socket errors: connect 0, read 2, write 0, timeout 1\n  Non-2xx or 3xx responses: 5\nRequests/sec:  12345.67\nTransfer/sec:    190.00MB\n";
        let r = parse_wrk(text).unwrap();
        assert_eq!((r.requests, r.socket_errors, r.non_2xx_3xx), (12345, 3, 5));
        assert!((r.rps - 12345.67).abs() < 1e-9);
        assert!((r.latency_us.unwrap() - 323.45).abs() < 1e-9);
        let clean = "  10 requests in 1.00s, 1MB read\nRequests/sec: 10.00\n";
        assert_eq!(parse_wrk(clean).unwrap().socket_errors, 0);
        assert_eq!(parse_wrk(clean).unwrap().latency_us, None);
        assert_eq!(duration_us("1.50ms"), Some(1500.0));
        assert_eq!(duration_us("2.00s"), Some(2e6));
        assert_eq!(duration_us("12"), None);
        assert_eq!(wrk_secs(Duration::from_millis(250)), 1);
        assert_eq!(wrk_secs(Duration::from_millis(2500)), 3);
        assert!(parse_wrk("nothing").is_err());
    }

    #[test]
    fn parses_curl_write_out() {
        let r = parse_write_out("67108864 0.052311 1282888123\n").unwrap();
        assert_eq!(r.bytes, 67_108_864);
        assert!((r.secs - 0.052311).abs() < 1e-12);
        assert!((r.bytes_per_sec - 1_282_888_123.0).abs() < 1e-3);
        assert!(parse_write_out("12 0.1").is_err());
    }

    #[test]
    fn parses_ab_summary() {
        let text = "Document Length:        4096 bytes\n\nConcurrency Level:      4\nComplete requests:      2000\nFailed requests:        0\nKeep-Alive requests:    2000\nTotal transferred:      8712000 bytes\nHTML transferred:       8192000 bytes\nRequests per second:    9876.54 [#/sec] (mean)\n";
        let r = parse_ab(text).unwrap();
        assert_eq!(r.complete, 2000);
        assert_eq!(r.failed, 0);
        assert_eq!(r.keep_alive, 2000);
        assert_eq!(r.non_2xx, 0);
        assert_eq!(r.body_bytes, 8_192_000);
        assert!((r.rps - 9876.54).abs() < 1e-9);
        assert!(parse_ab("nothing").is_err());
    }
}
