//! Redis: Debian's `redis-server` in a pod (no persistence, no protected mode, listening
//! on the pod's address), `redis-benchmark` against it, and the suite's pipelined
//! SET/GET checker (`go/respcheck`).

use std::{net::SocketAddr, process::Command, time::Duration};

use anyhow::{Context as _, Result, bail};
use serde::Deserialize;

use crate::steps::NET;

use super::{
    bins::{self, Needs},
    client::{self, On},
    gate::Gate,
    go,
    server::Listening,
    workdir::WorkDir,
};

/// What the redis workloads run.
pub const NEEDS: Needs = Needs {
    system: &["redis-server", "redis-benchmark", "redis-cli"],
    built: &["go/respcheck"],
};

/// Starts `redis-server` on `on`, listening on `listen` only, with nothing saved to disk.
pub fn start(on: On<'_>, listen: SocketAddr) -> Result<Listening> {
    let dir = WorkDir::new("redis")?;
    let mut cmd = Command::new(bins::system("redis-server")?);
    cmd.args(["--bind", &listen.ip().to_string()])
        .args(["--port", &listen.port().to_string()])
        .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
        .args(["--daemonize", "no", "--logfile", ""])
        .arg("--dir")
        .arg(dir.path());
    Listening::start(on, cmd, dir, "redis-server", listen)
}

/// `INFO stats` field `field` of the server at `server`, asked with `redis-cli` from
/// `on`.
pub fn info_stat(on: On<'_>, server: SocketAddr, field: &str) -> Result<u64> {
    let mut cmd = Command::new(bins::system("redis-cli")?);
    cmd.args(["-h", &server.ip().to_string()])
        .args(["-p", &server.port().to_string()])
        .args(["INFO", "stats"]);
    let text = client::run_ok(on, cmd, "redis-cli INFO", NET)?;
    info_field(&text, field).with_context(|| format!("no {field} in INFO stats: {text}"))
}

/// A numeric field of an `INFO` reply (`name:value` lines).
pub fn info_field(info: &str, field: &str) -> Option<u64> {
    info.lines().find_map(|l| {
        let (k, v) = l.trim().split_once(':')?;
        (k == field).then(|| v.trim().parse().ok())?
    })
}

/// A `redis-benchmark` run: by request count, not by time.
#[derive(Clone, Debug)]
pub struct Benchmark {
    /// Parallel connections (`-c`).
    pub clients: u32,
    /// Requests per test (`-n`).
    pub requests: u32,
    /// Commands in flight per connection (`-P`; 1 is no pipelining).
    pub pipeline: u32,
    /// Value size in bytes (`-d`).
    pub data_size: u32,
    /// Tests (`-t`), e.g. `set`, `get`.
    pub tests: Vec<String>,
}

/// One test's result line.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchmarkRow {
    /// The test, as redis-benchmark names it (`SET`, `GET`).
    pub test: String,
    /// Requests per second.
    pub rps: f64,
    /// Mean latency in milliseconds (`avg_latency_ms`, redis-benchmark ≥ 7).
    pub avg_latency_ms: Option<f64>,
}

impl Benchmark {
    /// Runs it on `on` against `server`; fails unless it exits 0 with a row per test.
    pub fn run(
        &self,
        on: On<'_>,
        server: SocketAddr,
        timeout: Duration,
    ) -> Result<Vec<BenchmarkRow>> {
        let mut cmd = Command::new(bins::system("redis-benchmark")?);
        cmd.args(["-h", &server.ip().to_string()])
            .args(["-p", &server.port().to_string()])
            .args(["-c", &self.clients.to_string()])
            .args(["-n", &self.requests.to_string()])
            .args(["-P", &self.pipeline.to_string()])
            .args(["-d", &self.data_size.to_string()])
            .args(["-t", &self.tests.join(",")])
            .arg("--csv");
        let out = client::run_ok(on, cmd, "redis-benchmark", timeout)?;
        let rows = parse_csv(&out);
        if rows.len() != self.tests.len() || rows.iter().any(|r| r.rps <= 0.0) {
            bail!(
                "redis-benchmark reported {} results for {} tests: {out}",
                rows.len(),
                self.tests.len()
            );
        }
        Ok(rows)
    }
}

/// The rows of `redis-benchmark --csv`: `"SET","94339.62","0.300",...` after a header
/// (`"test","rps","avg_latency_ms",...`).
pub fn parse_csv(text: &str) -> Vec<BenchmarkRow> {
    text.lines()
        .filter_map(|l| {
            let mut cells = l.split(',').map(|c| c.trim().trim_matches('"'));
            let test = cells.next()?.to_owned();
            let rps = cells.next()?.parse().ok()?;
            let avg_latency_ms = cells.next().and_then(|c| c.parse().ok());
            Some(BenchmarkRow {
                test,
                rps,
                avg_latency_ms,
            })
        })
        .collect()
}

/// A `respcheck` run: SET then GET of random binary values, pipelined on one
/// connection, every value checked.
#[derive(Clone, Debug)]
pub struct RespCheck {
    /// Value sizes in bytes.
    pub sizes: Vec<u64>,
    /// Values of each size.
    pub per_size: u32,
}

/// `respcheck`'s report.
#[derive(Clone, Debug, Deserialize)]
pub struct RespReport {
    /// Values set and read back.
    pub values: u32,
    /// Values read back exactly.
    pub exact: u32,
    /// Bytes in the values.
    pub value_bytes: u64,
    /// Bytes the client wrote (the whole pipeline).
    pub bytes_written: u64,
    /// Bytes of replies it read.
    pub bytes_read: u64,
    /// Wall time.
    pub secs: f64,
    /// Failures.
    pub failures: Vec<String>,
}

impl RespCheck {
    /// Runs it on `on` against `server`, held at `gate` until `before_go` returns.
    pub fn run_gated(
        &self,
        on: On<'_>,
        server: SocketAddr,
        gate: &Gate,
        before_go: impl FnOnce() -> Result<()>,
    ) -> Result<RespReport> {
        let sizes: Vec<String> = self.sizes.iter().map(u64::to_string).collect();
        let mut cmd = Command::new(bins::built("go/respcheck")?);
        cmd.arg("-connect")
            .arg(server.to_string())
            .arg("-sizes")
            .arg(sizes.join(","))
            .arg("-per-size")
            .arg(self.per_size.to_string())
            .args(go::idle_arg());
        let out = client::run_gated(on, cmd, "respcheck", NET, gate, before_go)?;
        client::json_report(&out, "respcheck")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_benchmark_csv_and_info() {
        let csv = "\"test\",\"rps\",\"avg_latency_ms\"\n\"SET\",\"94339.62\",\"0.3\"\n\"GET\",\"100000.00\",\"0.2\"\n";
        let rows = parse_csv(csv);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].test, "SET");
        assert!((rows[1].rps - 100_000.0).abs() < 1e-9);
        assert_eq!(rows[0].avg_latency_ms, Some(0.3));
        let info = "# Stats\r\ntotal_connections_received:3\r\ntotal_commands_processed:40002\r\n";
        assert_eq!(info_field(info, "total_commands_processed"), Some(40002));
        assert_eq!(info_field(info, "absent"), None);
    }
}
