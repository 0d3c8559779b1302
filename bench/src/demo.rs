//! The demo (`cargo xtask demo`, `bypass-bench demo`): the bench at small scale, as a
//! first look. The same run as `bypass-bench run` (two pods on a bridge, qperf between
//! them with the bypass attached and with the agent stopped, the agent's cost and
//! counters), narrowed to one small and one large message, one repetition, same-CPU
//! then cross-CPU, and sockperf's percentiles at 64 B; no floor, no minimal redirect.
//! After the bench's table it says what moved where, and it fails when the bypass did
//! not bypass ([`problems`], pure): a measurement missing, a bypassed run that
//! redirected nothing or put its bytes on the veths (unless its connection left the
//! SockHash, which the agent counts: by design, a stream of small messages or a reader
//! that stays behind its bound takes TCP), a normal-path run that did not, a bypassed
//! block whose connections the agent did not pair.

use std::{collections::BTreeMap, fmt::Write as _, path::Path as FsPath};

use anyhow::Result;
use bypass_common::Stat;

use crate::{
    driver::{self, wire_problem},
    model::{Config, Path, Placement, Results, Scenario, Test},
    report::hop_totals,
    scenario::hop_problems,
};

/// The demo's message sizes: a small message and a large one.
pub const SIZES: [u32; 2] = [64, 16384];

/// The demo's run: the bench's, at small scale.
pub fn config() -> Config {
    Config {
        quick: true,
        reps: 1,
        sockperf_reps: 1,
        qperf_secs: 1,
        sockperf_secs: 2,
        floor_secs: 0.5,
        sizes: SIZES.to_vec(),
        sockperf_sizes: vec![SIZES[0]],
        placements: vec![Placement::same_cpu(), Placement::cross_cpu()],
        tests: vec![Test::TcpLat, Test::TcpBw],
        idle_secs: 1.0,
        minimal: false,
        agent_args: Vec::new(),
        scenario: Scenario::Default,
    }
}

/// Runs the demo: the bench's driver on [`config`], raw tool output appended under
/// `raw_dir`, `workspace` the git work tree it records.
pub fn run(workspace: &FsPath, raw_dir: &FsPath) -> Result<Results> {
    driver::run(&driver::Options {
        config: config(),
        raw_dir: raw_dir.to_path_buf(),
        workspace: workspace.to_path_buf(),
        no_floor: true,
    })
}

/// The line the demo opens and closes with: whether the agent had to be allowed an
/// unguarded datapath to bypass on this kernel (the demo runs it with
/// `--allow-unguarded`, as the tests do), and why (pure).
pub fn guard_line(probe: &testbed::KernelProbe) -> String {
    if probe.bypass_by_default && probe.refusal.is_none() {
        return "agent run as a user runs it: this kernel has the read guard, the agent \
                bypasses without --allow-unguarded"
            .to_owned();
    }
    format!(
        "agent run WITH --allow-unguarded: started as a user starts it, the agent would not \
         bypass this node ({})",
        probe
            .refusal
            .as_deref()
            .unwrap_or("probe: bypass_by_default false")
    )
}

/// The paths the demo compares.
const PATHS: [Path; 2] = [Path::Bypass, Path::Default];

/// What shows that the bypass did not work in run `r` (pure): empty when it did.
pub fn problems(r: &Results) -> Vec<String> {
    let c = &r.config;
    let mut out = Vec::new();
    for p in &c.placements {
        for path in PATHS {
            for &test in &c.tests {
                for &size in &c.sizes {
                    let at = format!("{} {} {} {size} B", p.name, path.name(), test.name());
                    let mut found = 0;
                    for s in r.samples.iter().filter(|s| {
                        s.placement == p.name && s.path == path && s.test == test && s.size == size
                    }) {
                        found += 1;
                        let Some(wire) = s.wire_bytes else {
                            out.push(format!("{at}: the veths' byte counters were not read"));
                            continue;
                        };
                        if path == Path::Bypass && s.redirected_bytes.unwrap_or(0) == 0 {
                            out.push(format!("{at}: the agent redirected nothing"));
                        }
                        let payload = s.value * f64::from(c.qperf_secs);
                        if test == Test::TcpBw
                            && let Some(problem) = wire_problem(path, wire, payload, s.counted())
                        {
                            out.push(format!("{at}: {problem}"));
                        }
                    }
                    if found == 0 {
                        out.push(format!("{at}: not measured (see the warnings)"));
                    }
                }
            }
        }
        let mut blocks = 0;
        for h in r.hops.iter().filter(|h| h.placement == p.name) {
            blocks += 1;
            for problem in hop_problems(c.scenario, h.connections, &h.counters) {
                out.push(format!("{} bypass: {problem}", p.name));
            }
        }
        if blocks == 0 {
            out.push(format!(
                "{} bypass: the agent's counters were not recorded",
                p.name
            ));
        }
    }
    out
}

/// What moved where in run `r`, per placement (pure): the connections the agent
/// paired and the bytes it redirected with the bypass, the bytes on the pods' veths on
/// each path, summed over the qperf runs.
pub fn moved(r: &Results) -> String {
    let mut o = String::from("what moved where (the qperf runs above, summed):\n");
    // One qperf run gives a sample per test; count each run once, by its tcp_bw sample
    // (or its only one).
    let last_test = r.config.tests.last().copied();
    for p in &r.config.placements {
        let mut wire = BTreeMap::new();
        let (mut redirected, mut left) = (0, 0);
        for s in r
            .samples
            .iter()
            .filter(|s| s.placement == p.name && Some(s.test) == last_test)
        {
            *wire.entry(s.path).or_insert(0) += s.wire_bytes.unwrap_or(0);
            redirected += s.redirected_bytes.unwrap_or(0);
            left += s.left.unwrap_or(0);
        }
        let paired = counter(r, &p.name, Stat::PairedPod);
        let _ = writeln!(
            o,
            "  {:<9}  bypass:  {paired} connections paired, {} redirected, {} on the veths",
            p.name,
            bytes(redirected),
            bytes(wire.get(&Path::Bypass).copied().unwrap_or(0))
        );
        if left > 0 {
            let _ = writeln!(
                o,
                "  {:<9}           {left} of them left the bypass for TCP (by design: a stream \
                 of small messages, or a reader that stayed behind its bound; their bytes are on \
                 the veths)",
                ""
            );
        }
        let _ = writeln!(
            o,
            "  {:<9}  TCP:     {} on the veths (the agent stopped)",
            "",
            bytes(wire.get(&Path::Default).copied().unwrap_or(0))
        );
    }
    o
}

/// How much the agent's counter `stat` grew over the bypassed blocks of `placement` in
/// run `r` (pure).
pub fn counter(r: &Results, placement: &str, stat: Stat) -> u64 {
    hop_totals(r, placement).map_or(0, |t| t.get(stat.name()).unwrap_or(0))
}

/// `n` bytes in B, KiB, MiB or GiB.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Environment, HopSample, Sample};

    /// A demo run where every bypassed run redirected and every TCP run used the wire.
    fn good() -> Results {
        let mut r = Results::new(config(), Environment::default(), Vec::new());
        for p in &r.config.placements.clone() {
            for path in PATHS {
                for &size in &SIZES {
                    let payload = 1_000_000_000u64;
                    let (wire, redirected) = match path {
                        Path::Bypass => (4_000, payload),
                        _ => (payload + payload / 20, 0),
                    };
                    for (test, value) in [(Test::TcpLat, 5000.0), (Test::TcpBw, payload as f64)] {
                        r.samples.push(Sample {
                            wire_bytes: Some(wire),
                            redirected_bytes: (path == Path::Bypass).then_some(redirected),
                            passed_bytes: (path == Path::Bypass).then_some(0),
                            left: (path == Path::Bypass).then_some(0),
                            ..Sample::bare(0, &p.name, path, test, size, value)
                        });
                    }
                }
            }
            r.hops.push(HopSample {
                rep: 0,
                placement: p.name.clone(),
                connections: 4,
                counters: BTreeMap::from([(Stat::PairedPod.name().to_owned(), 8)]),
            });
        }
        r
    }

    #[test]
    fn the_demo_says_when_it_allowed_an_unguarded_datapath() {
        let mut probe = testbed::KernelProbe {
            read_guard: false,
            read_guard_runs_as: "none".to_owned(),
            read_hook: "tracepoint".to_owned(),
            bypass_by_default: false,
            kernel_checks: Vec::new(),
            fionread_compensation: String::new(),
            refusal: Some("no read guard on this kernel".to_owned()),
        };
        let line = guard_line(&probe);
        assert!(
            line.starts_with("agent run WITH --allow-unguarded"),
            "{line}"
        );
        assert!(line.contains("no read guard on this kernel"), "{line}");
        probe.read_guard = true;
        probe.bypass_by_default = true;
        probe.refusal = None;
        assert!(!guard_line(&probe).contains("WITH"));
    }

    #[test]
    fn a_run_that_bypassed_has_no_problem() {
        assert_eq!(problems(&good()), Vec::<String>::new());
        let text = moved(&good());
        assert!(
            text.contains(
                "same-cpu   bypass:  8 connections paired, 1.9 GiB redirected, 7.8 KiB on the veths"
            ),
            "{text}"
        );
        assert!(text.contains("TCP:     2.0 GiB on the veths"), "{text}");
    }

    #[test]
    fn a_bypass_that_did_not_bypass_is_named() {
        let mut r = good();
        for s in r.samples.iter_mut().filter(|s| s.path == Path::Bypass) {
            s.wire_bytes = Some(900_000_000);
            s.redirected_bytes = Some(0);
        }
        let p = problems(&r);
        assert!(p.iter().any(|p| p.contains("redirected nothing")), "{p:?}");
        assert!(p.iter().any(|p| p.contains("although bypassed")), "{p:?}");
    }

    #[test]
    fn a_missing_measurement_or_pairing_is_named() {
        let mut r = good();
        r.samples
            .retain(|s| !(s.placement == "cross-cpu" && s.path == Path::Default && s.size == 64));
        r.hops[0].counters.insert(Stat::PairedPod.name().into(), 1);
        r.hops.pop();
        let p = problems(&r);
        assert!(
            p.contains(
                &"cross-cpu default tcp_lat 64 B: not measured (see the warnings)".to_owned()
            ),
            "{p:?}"
        );
        assert!(
            p.iter()
                .any(|p| p.starts_with("same-cpu bypass: paired_pod = 1")),
            "{p:?}"
        );
        assert!(
            p.contains(&"cross-cpu bypass: the agent's counters were not recorded".to_owned()),
            "{p:?}"
        );
    }

    #[test]
    fn a_connection_that_left_is_by_design() {
        let mut r = good();
        for s in r
            .samples
            .iter_mut()
            .filter(|s| s.path == Path::Bypass && s.size == 64)
        {
            s.wire_bytes = Some(20_000_000);
            s.left = Some(1);
        }
        assert_eq!(problems(&r), Vec::<String>::new());
        let text = moved(&r);
        assert!(
            text.contains("1 of them left the bypass for TCP (by design"),
            "{text}"
        );
    }

    #[test]
    fn the_normal_path_must_use_the_wire() {
        let mut r = good();
        for s in r.samples.iter_mut().filter(|s| s.path == Path::Default) {
            s.wire_bytes = Some(10_000);
        }
        assert!(
            problems(&r)
                .iter()
                .any(|p| p.contains("although not bypassed")),
            "{:?}",
            problems(&r)
        );
    }
}
