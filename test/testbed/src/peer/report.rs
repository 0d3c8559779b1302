//! The JSON report the peer prints on stdout when it is done, and the per
//! connection outcome it is built from.

use serde::{Deserialize, Serialize};

use super::pattern::Direction;

/// At most this many failures are listed (all are counted).
const MAX_LISTED_FAILURES: usize = 16;

/// One thing that went wrong on one connection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// The connection's stream id.
    pub stream: u64,
    /// `c2s` or `s2c` (`-` when it is not about one direction).
    pub direction: String,
    /// `mismatch`, `short`, `extra`, `io` or `protocol`.
    pub kind: String,
    /// Offset in the stream where it went wrong, when known.
    pub offset: Option<u64>,
    /// Human detail.
    pub detail: String,
}

impl Failure {
    /// A failure on `stream` in `dir`.
    pub fn new(
        stream: u64,
        dir: Option<Direction>,
        kind: &str,
        offset: Option<u64>,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            stream,
            direction: dir.map_or("-", Direction::name).to_owned(),
            kind: kind.to_owned(),
            offset,
            detail: detail.into(),
        }
    }

    /// A failure of the connection `stream` as a whole: no direction, no offset.
    pub fn conn(stream: u64, kind: &str, detail: impl Into<String>) -> Self {
        Self::new(stream, None, kind, None, detail)
    }
}

/// Round-trip times of a ping-pong run, in microseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Rtt {
    /// Round trips measured.
    pub count: u64,
    /// Mean.
    pub mean_us: f64,
    /// Fastest.
    pub min_us: f64,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
}

impl Rtt {
    /// Summary of `samples` (nanoseconds); sorts them.
    pub fn from_nanos(samples: &mut [u64]) -> Option<Self> {
        if samples.is_empty() {
            return None;
        }
        samples.sort_unstable();
        let n = samples.len();
        let us = |ns: u64| ns as f64 / 1000.0;
        let pct = |p: usize| samples[((n - 1) * p) / 100];
        Some(Self {
            count: n as u64,
            mean_us: us(samples.iter().sum::<u64>()) / n as f64,
            min_us: us(samples[0]),
            p50_us: us(pct(50)),
            p99_us: us(pct(99)),
        })
    }
}

/// What one connection did.
#[derive(Clone, Debug, Default)]
pub struct ConnOutcome {
    /// Pattern bytes written.
    pub sent: u64,
    /// Pattern bytes read and checked.
    pub received: u64,
    /// Failures seen on this connection.
    pub failures: Vec<Failure>,
    /// Ping-pong round trips, nanoseconds.
    pub rtts_ns: Vec<u64>,
    /// `EAGAIN`s a blocking read returned before its timeout (see
    /// `PatientReader`).
    pub spurious_eagain: u64,
}

/// The report, one JSON object on stdout.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// `client` or `server`.
    pub role: String,
    /// Connections completed (successfully or not).
    pub connections: u64,
    /// Connections with at least one failure.
    pub failed_connections: u64,
    /// Pattern bytes written.
    pub bytes_sent: u64,
    /// Pattern bytes read and verified in order.
    pub bytes_received: u64,
    /// No failure anywhere (for a client: including the server's verdicts).
    pub ok: bool,
    /// Offset of the first mismatching byte, over all connections (the lowest stream
    /// id's first).
    pub first_mismatch_offset: Option<u64>,
    /// The first failures (all are counted in `failed_connections`).
    pub failures: Vec<Failure>,
    /// Wall time from the first connect (or accept) to the last close, seconds.
    pub elapsed_secs: f64,
    /// (sent + received) * 8 / elapsed, Gbit/s.
    pub gbit_per_sec: f64,
    /// Ping-pong round trips, when any.
    pub rtt: Option<Rtt>,
    /// `EAGAIN`s that blocking reads returned before their timeout, retried. Plain TCP
    /// never returns them; a socket in a SockHash can.
    #[serde(default)]
    pub spurious_eagain: u64,
}

impl Report {
    /// Folds connection outcomes into a report.
    pub fn build(role: &str, outcomes: Vec<ConnOutcome>, elapsed_secs: f64) -> Self {
        let mut r = Report {
            role: role.to_owned(),
            elapsed_secs,
            ..Default::default()
        };
        let mut rtts = Vec::new();
        let mut failures: Vec<Failure> = Vec::new();
        for o in outcomes {
            r.connections += 1;
            r.bytes_sent += o.sent;
            r.bytes_received += o.received;
            r.spurious_eagain += o.spurious_eagain;
            if !o.failures.is_empty() {
                r.failed_connections += 1;
            }
            failures.extend(o.failures);
            rtts.extend(o.rtts_ns);
        }
        failures.sort_by_key(|f| f.stream);
        r.first_mismatch_offset = failures
            .iter()
            .find(|f| f.kind == "mismatch")
            .and_then(|f| f.offset);
        failures.truncate(MAX_LISTED_FAILURES);
        r.ok = failures.is_empty();
        r.failures = failures;
        if elapsed_secs > 0.0 {
            r.gbit_per_sec = (r.bytes_sent + r.bytes_received) as f64 * 8.0 / elapsed_secs / 1e9;
        }
        r.rtt = Rtt::from_nanos(&mut rtts);
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_sums_and_flags() {
        let good = ConnOutcome {
            sent: 10,
            received: 20,
            ..Default::default()
        };
        let bad = ConnOutcome {
            sent: 1,
            received: 2,
            failures: vec![Failure::new(
                5,
                Some(Direction::ServerToClient),
                "mismatch",
                Some(42),
                "x",
            )],
            rtts_ns: vec![3000, 1000, 2000],
            spurious_eagain: 0,
        };
        let r = Report::build("client", vec![good.clone(), bad], 1.0);
        assert_eq!((r.connections, r.failed_connections), (2, 1));
        assert_eq!((r.bytes_sent, r.bytes_received), (11, 22));
        assert!(!r.ok);
        assert_eq!(r.first_mismatch_offset, Some(42));
        assert_eq!(r.failures[0].direction, "s2c");
        let rtt = r.rtt.clone().unwrap();
        assert_eq!((rtt.count, rtt.min_us, rtt.p50_us), (3, 1.0, 2.0));
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<Report>(&json).unwrap(), r);
        assert!(Report::build("server", vec![good], 1.0).ok);
    }
}
