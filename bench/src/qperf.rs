//! qperf: the server and client command lines, and the parser of the client's output.
//! The client runs `tcp_lat` and `tcp_bw` for one message size in one invocation; each
//! test opens its own data connection, so a test started while the agent runs is
//! bypassed and one started while it is stopped is not.

use std::{net::IpAddr, process::Command};

use anyhow::{Result, anyhow, bail};

use crate::model::Test;

/// The server: `qperf --listen_port PORT`. It forks a child per client, which inherits
/// the server's CPU affinity.
pub fn server_command(port: u16) -> Command {
    let mut c = Command::new("qperf");
    c.args(["--listen_port", &port.to_string()]);
    c
}

/// The client: `tests` (`tcp_lat`, `tcp_bw`), `secs` seconds each, message size `size`,
/// units unified (`-uu`: ns and bytes/sec), parameters echoed (`-vu`). `data_port`:
/// the port of the data connections (`--ip_port`; the server listens there), else one
/// the server picks.
pub fn client_command(
    server: IpAddr,
    port: u16,
    data_port: Option<u16>,
    size: u32,
    secs: u32,
    tests: &[Test],
) -> Command {
    let mut c = Command::new("qperf");
    c.args(["--listen_port", &port.to_string()]);
    if let Some(d) = data_port {
        c.args(["--ip_port", &d.to_string()]);
    }
    c.args([
        "--wait_server",
        "5",
        "--time",
        &secs.to_string(),
        "--msg_size",
        &size.to_string(),
        "-uu",
        "-vu",
        &server.to_string(),
    ]);
    c.args(tests.iter().map(|t| t.name()));
    c
}

/// The results of one client run.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct QperfResult {
    /// `tcp_lat` latency, ns.
    pub latency_ns: Option<f64>,
    /// `tcp_bw` bandwidth, bytes/s.
    pub bw_bytes_per_sec: Option<f64>,
}

/// Parses client output with a section for each of `tests`.
pub fn parse(out: &str, tests: &[Test]) -> Result<QperfResult> {
    let mut section = "";
    let (mut lat, mut bw) = (None, None);
    for line in out.lines() {
        let t = line.trim();
        if let Some(name) = t.strip_suffix(':') {
            section = name;
            continue;
        }
        let Some((key, value)) = t.split_once('=') else {
            continue;
        };
        match (section, key.trim()) {
            ("tcp_lat", "latency") => lat = Some(parse_time_ns(value.trim())?),
            ("tcp_bw", "bw") => bw = Some(parse_rate(value.trim())?),
            _ => {}
        }
    }
    if (tests.contains(&Test::TcpLat) && lat.is_none())
        || (tests.contains(&Test::TcpBw) && bw.is_none())
    {
        bail!("qperf output lacks a result of {tests:?}: {out:?}");
    }
    Ok(QperfResult {
        latency_ns: lat,
        bw_bytes_per_sec: bw,
    })
}

fn number_and_unit(s: &str) -> Result<(f64, &str)> {
    let mut it = s.split_whitespace();
    let n: f64 = it
        .next()
        .ok_or_else(|| anyhow!("empty value"))?
        .parse()
        .map_err(|e| anyhow!("bad number in {s:?}: {e}"))?;
    Ok((n, it.next().unwrap_or("")))
}

/// `8649 ns`, `8.6 us`, ... → ns.
fn parse_time_ns(s: &str) -> Result<f64> {
    let (n, unit) = number_and_unit(s)?;
    let scale = match unit {
        "ns" => 1.0,
        "us" => 1e3,
        "ms" => 1e6,
        "sec" | "s" => 1e9,
        _ => bail!("unknown time unit in {s:?}"),
    };
    Ok(n * scale)
}

/// `29137216 bytes/sec`, `29.1 MB/sec`, `1.2 Gb/sec` ... → bytes/s (qperf's K/M/G are
/// powers of 1000).
fn parse_rate(s: &str) -> Result<f64> {
    let (n, unit) = number_and_unit(s)?;
    let (prefix, per_sec) = unit
        .split_once("/sec")
        .map(|(p, _)| (p, true))
        .unwrap_or((unit, false));
    if !per_sec {
        bail!("not a rate: {s:?}");
    }
    let (mult, bits) = match prefix {
        "bytes" => (1.0, false),
        "KB" => (1e3, false),
        "MB" => (1e6, false),
        "GB" => (1e9, false),
        "bits" => (1.0, true),
        "Kb" => (1e3, true),
        "Mb" => (1e6, true),
        "Gb" => (1e9, true),
        _ => bail!("unknown rate unit in {s:?}"),
    };
    Ok(if bits { n * mult / 8.0 } else { n * mult })
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUT: &str = "tcp_lat:
    latency   =        8649 ns
    msg_size  =          64 bytes
    time      =  1000000000 ns
tcp_bw:
    bw        =    29137216 bytes/sec
    msg_size  =          64 bytes
";

    const BOTH: &[Test] = &[Test::TcpLat, Test::TcpBw];

    #[test]
    fn parses_unified_units() {
        let r = parse(OUT, BOTH).unwrap();
        assert_eq!(r.latency_ns, Some(8649.0));
        assert_eq!(r.bw_bytes_per_sec, Some(29_137_216.0));
    }

    #[test]
    fn one_test_only() {
        let r = parse("tcp_bw:\n bw = 5 bytes/sec\n", &[Test::TcpBw]).unwrap();
        assert_eq!(r.latency_ns, None);
        assert_eq!(r.bw_bytes_per_sec, Some(5.0));
    }

    #[test]
    fn parses_scaled_units() {
        let r = parse(
            "tcp_lat:\n latency = 8.5 us\ntcp_bw:\n bw = 2.5 Gb/sec\n",
            BOTH,
        )
        .unwrap();
        assert_eq!(r.latency_ns, Some(8500.0));
        assert_eq!(r.bw_bytes_per_sec, Some(2.5e9 / 8.0));
        assert_eq!(parse_rate("3 MB/sec").unwrap(), 3e6);
    }

    #[test]
    fn missing_or_bad_fails() {
        assert!(parse("tcp_lat:\n latency = 1 ns\n", BOTH).is_err());
        assert!(
            parse(
                "tcp_lat:\n latency = x ns\ntcp_bw:\n bw = 1 bytes/sec\n",
                BOTH
            )
            .is_err()
        );
        assert!(parse_rate("5 bytes").is_err());
    }

    #[test]
    fn client_args() {
        let c = client_command("10.0.0.2".parse().unwrap(), 19770, None, 64, 2, BOTH);
        let a: Vec<_> = c
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            a.join(" "),
            "--listen_port 19770 --wait_server 5 --time 2 --msg_size 64 -uu -vu 10.0.0.2 tcp_lat tcp_bw"
        );
        let c = client_command("10.0.0.2".parse().unwrap(), 19770, Some(19870), 64, 2, BOTH);
        let a: Vec<_> = c
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert!(
            a.join(" ")
                .starts_with("--listen_port 19770 --ip_port 19870 --wait_server 5")
        );
    }
}
