//! HTTP clients the way users run them: `curl` for one download, `ab` (ApacheBench)
//! for many requests by count, with keep-alive or a connection per request.

use std::{path::Path, process::Command, time::Duration};

use anyhow::{Context as _, Result, bail};

use super::{
    bins,
    client::{self, On},
};

/// `curl` GETs `url` on `on` (verifying the server against `cacert` for HTTPS) and
/// returns the body; fails on an HTTP error or after `timeout`.
pub fn curl_get(
    on: On<'_>,
    url: &str,
    cacert: Option<&Path>,
    timeout: Duration,
) -> Result<Vec<u8>> {
    let mut cmd = Command::new(bins::system("curl")?);
    cmd.args(["--silent", "--show-error", "--fail", "--http1.1"])
        .args(["--max-time", &timeout.as_secs().to_string()])
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
    /// Runs it on `on` against `url`; fails unless it exits 0.
    pub fn run(&self, on: On<'_>, url: &str, timeout: Duration) -> Result<AbReport> {
        let mut cmd = Command::new(bins::system("ab")?);
        cmd.args(["-q", "-n", &self.requests.to_string()])
            .args(["-c", &self.concurrency.to_string()])
            .args(["-s", &timeout.as_secs().to_string()]);
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

#[cfg(test)]
mod tests {
    use super::*;

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
