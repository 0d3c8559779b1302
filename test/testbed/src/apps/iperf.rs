//! iperf3: Debian's `iperf3 -s` in a pod and `iperf3 -c` runs by byte count (not by
//! time), their `--json` output read for what was sent and what was received.

use std::{net::SocketAddr, process::Command, time::Duration};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use super::{
    bins::{self, Needs},
    client::{self, On},
    server::Listening,
    workdir::WorkDir,
};

/// What the iperf3 workloads run.
pub const NEEDS: Needs = Needs {
    system: &["iperf3"],
    built: &[],
};

/// Starts `iperf3 -s` on `on`, bound to `listen`.
pub fn server(on: On<'_>, listen: SocketAddr) -> Result<Listening> {
    let dir = WorkDir::new("iperf3")?;
    let mut cmd = Command::new(bins::system("iperf3")?);
    cmd.args(["-s", "-B", &listen.ip().to_string()])
        .args(["-p", &listen.port().to_string()]);
    Listening::start(on, cmd, dir, "iperf3 -s", listen)
}

/// An `iperf3 -c` run.
#[derive(Clone, Debug)]
pub struct Iperf {
    /// Bytes to send (`-n`), over all streams.
    pub bytes: u64,
    /// Parallel streams (`-P`).
    pub streams: u32,
    /// Bytes per write (`-l`); `None` for iperf3's default (128 KiB).
    pub write_size: Option<u32>,
    /// The server sends (`-R`).
    pub reverse: bool,
}

/// What the client's `--json` said about the whole test.
#[derive(Clone, Debug, PartialEq)]
pub struct IperfReport {
    /// `end.sum_sent.bytes`.
    pub sent: u64,
    /// `end.sum_received.bytes`.
    pub received: u64,
    /// `end.sum_received.bits_per_second`.
    pub bits_per_second: f64,
    /// `end.sum_received.seconds`.
    pub seconds: f64,
    /// Data streams (`end.streams`).
    pub streams: u64,
}

impl Iperf {
    /// Runs it on `on` against `server`; fails unless iperf3 exits 0 with its report.
    pub fn run(&self, on: On<'_>, server: SocketAddr, timeout: Duration) -> Result<IperfReport> {
        let mut cmd = Command::new(bins::system("iperf3")?);
        cmd.args(["-c", &server.ip().to_string()])
            .args(["-p", &server.port().to_string()])
            .args(["-n", &self.bytes.to_string()])
            .args(["-P", &self.streams.to_string()])
            .args(["--json", "--connect-timeout", "10000"]);
        if let Some(len) = self.write_size {
            cmd.args(["-l", &len.to_string()]);
        }
        if self.reverse {
            cmd.arg("-R");
        }
        let out = client::run(on, cmd, "iperf3 -c", timeout)?;
        let text = String::from_utf8_lossy(&out.stdout);
        let json: Value = serde_json::from_str(&text).with_context(|| {
            format!("iperf3 -c ({}): {}", out.status, client::output_tail(&out))
        })?;
        if let Some(err) = json.get("error").and_then(Value::as_str) {
            bail!("iperf3 -c failed: {err}");
        }
        if !out.status.success() {
            bail!(
                "iperf3 -c failed ({}): {}",
                out.status,
                client::output_tail(&out)
            );
        }
        parse_end(&json)
    }
}

/// The totals of an iperf3 `--json` report.
pub fn parse_end(json: &Value) -> Result<IperfReport> {
    let end = &json["end"];
    let u = |v: &Value| v.as_u64().context("not a count");
    let f = |v: &Value| v.as_f64().context("not a number");
    Ok(IperfReport {
        sent: u(&end["sum_sent"]["bytes"]).context("end.sum_sent.bytes")?,
        received: u(&end["sum_received"]["bytes"]).context("end.sum_received.bytes")?,
        bits_per_second: f(&end["sum_received"]["bits_per_second"])
            .context("end.sum_received.bits_per_second")?,
        seconds: f(&end["sum_received"]["seconds"]).context("end.sum_received.seconds")?,
        streams: end["streams"].as_array().map_or(0, |s| s.len() as u64),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_totals() {
        let json: Value = serde_json::from_str(
            r#"{"end":{"streams":[{},{}],"sum_sent":{"bytes":100,"seconds":1.0,"bits_per_second":800.0},"sum_received":{"bytes":100,"seconds":1.5,"bits_per_second":533.3}}}"#,
        )
        .unwrap();
        let r = parse_end(&json).unwrap();
        assert_eq!((r.sent, r.received, r.streams), (100, 100, 2));
        assert!(parse_end(&serde_json::json!({})).is_err());
    }
}
