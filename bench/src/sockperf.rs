//! sockperf ping-pong over TCP: server and client command lines, and the parser of the
//! client's latency summary (sockperf reports one-way latency, round trip / 2, in µs).

use std::{net::IpAddr, process::Command};

use anyhow::{Result, bail};

use crate::model::Percentiles;

/// The server: `sockperf sr --tcp -i ADDR -p PORT` (one process, no fork).
pub fn server_command(addr: IpAddr, port: u16) -> Command {
    let mut c = Command::new("sockperf");
    c.args([
        "server",
        "--tcp",
        "-i",
        &addr.to_string(),
        "-p",
        &port.to_string(),
    ]);
    c
}

/// The client: ping-pong, `secs` seconds (the first 0.4 s warm up), message size `size`.
pub fn client_command(server: IpAddr, port: u16, size: u32, secs: u32) -> Command {
    let mut c = Command::new("sockperf");
    c.args([
        "ping-pong",
        "--tcp",
        "-i",
        &server.to_string(),
        "-p",
        &port.to_string(),
        "-m",
        &size.to_string(),
        "-t",
        &secs.to_string(),
    ]);
    c
}

/// Removes ANSI colour escapes (`ESC [ ... m`), which sockperf prints around some lines.
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Parses `avg-latency=`, `Total N observations` and `---> percentile P = V` lines.
pub fn parse(out: &str) -> Result<Percentiles> {
    let text = strip_ansi(out);
    let (mut avg, mut obs, mut p50, mut p99, mut p999) = (None, None, None, None, None);
    for line in text.lines() {
        if let Some(rest) = line.split("avg-latency=").nth(1) {
            avg = rest
                .split(|c: char| c.is_whitespace() || c == '(')
                .next()
                .and_then(|v| v.parse::<f64>().ok());
        }
        if let Some(rest) = line.split("Total ").nth(1)
            && rest.contains("observations")
        {
            obs = rest
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok());
        }
        if let Some(rest) = line.split("---> percentile").nth(1)
            && let Some((p, v)) = rest.split_once('=')
        {
            let v = v.trim().parse::<f64>().ok();
            match p.trim() {
                "50.000" => p50 = v,
                "99.000" => p99 = v,
                "99.900" => p999 = v,
                _ => {}
            }
        }
    }
    match (avg, obs, p50, p99, p999) {
        (Some(a), Some(o), Some(p50), Some(p99), Some(p999)) => Ok(Percentiles {
            avg_ns: a * 1e3,
            p50_ns: p50 * 1e3,
            p99_ns: p99 * 1e3,
            p999_ns: p999 * 1e3,
            observations: o,
        }),
        _ => bail!("sockperf output lacks the latency summary: {text:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUT: &str = "sockperf: [Total Run] RunTime=1.000 sec; Warm up time=400 msec; SentMessages=9254; ReceivedMessages=9253
sockperf: ========= Printing statistics for Server No: 0
sockperf: \u{1b}[2;35m====> avg-latency=52.469 (std-dev=287.738)\u{1b}[0m
sockperf: Summary: Latency is 52.469 usec
sockperf: \u{1b}[2;35mTotal 5114 observations\u{1b}[0m; each percentile contains 51.14 observations
sockperf: ---> <MAX> observation = 6219.809
sockperf: ---> percentile 99.999 = 6219.809
sockperf: ---> percentile 99.900 = 3979.277
sockperf: ---> percentile 99.000 = 1596.299
sockperf: ---> percentile 90.000 =   19.599
sockperf: ---> percentile 50.000 =   15.778
sockperf: ---> <MIN> observation =   13.074
";

    #[test]
    fn parses_summary() {
        let r = parse(OUT).unwrap();
        assert_eq!(r.observations, 5114);
        assert!((r.avg_ns - 52_469.0).abs() < 1e-6);
        assert!((r.p50_ns - 15_778.0).abs() < 1e-6);
        assert!((r.p99_ns - 1_596_299.0).abs() < 1e-6);
        assert!((r.p999_ns - 3_979_277.0).abs() < 1e-6);
    }

    #[test]
    fn incomplete_fails() {
        assert!(parse("sockperf: Summary: Latency is 52.469 usec\n").is_err());
    }

    #[test]
    fn strips_colour() {
        assert_eq!(strip_ansi("a\u{1b}[2;35mb\u{1b}[0mc"), "abc");
    }
}
