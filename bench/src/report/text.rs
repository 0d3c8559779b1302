//! Pure: the terminal report: tables per placement, percentiles, the agent's cost, the
//! hop counters, program cost, targets and warnings.

use std::fmt::Write as _;

use crate::{
    model::{Path, Placement, Prog, Results, Scenario, Test},
    report::{
        cells::{Row, agent_cost, hop_totals, pct_row, prog_cost, rows, size_label},
        targets::targets,
    },
    scenario::HOP_COUNTERS,
    stats::Summary,
};

/// A value with three significant digits or more (`61234`, `312`, `19.4`, `4.53`).
pub fn fmt_value(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Nanoseconds as microseconds, [`fmt_value`].
pub(super) fn fmt_lat(ns: f64) -> String {
    fmt_value(ns / 1e3)
}

/// Bytes a second as MB/s, [`fmt_value`].
pub(super) fn fmt_bw(bps: f64) -> String {
    fmt_value(bps / 1e6)
}

pub(crate) fn fmt_summary(s: Option<Summary>, f: fn(f64) -> String) -> String {
    match s {
        Some(s) if s.n > 1 => format!("{} [{}-{}]", f(s.median), f(s.min), f(s.max)),
        Some(s) => f(s.median),
        None => "-".into(),
    }
}

pub fn fmt_ratio(x: Option<f64>) -> String {
    x.map_or_else(|| "-".into(), |x| format!("{x:.2}x"))
}

/// How the table says which placement it is about.
/// A size table's cells of `row`, values shown by `f`: size, bypass, default, ratio,
/// minimal, vs min, floor, vs floor.
pub(super) fn row_cells(row: &Row, f: fn(f64) -> String) -> [String; 8] {
    [
        size_label(row.size),
        fmt_summary(row.bypass, f),
        fmt_summary(row.default, f),
        fmt_ratio(row.ratio()),
        fmt_summary(row.minimal, f),
        fmt_ratio(row.vs_minimal()),
        fmt_summary(row.floor, f),
        fmt_ratio(row.vs_floor()),
    ]
}

/// A line of the terminal's size table: [`row_cells`] (or the headings) aligned.
fn table_line<S: AsRef<str>>(c: &[S; 8]) -> String {
    let c = c.each_ref().map(AsRef::as_ref);
    format!(
        "  {:>5}  {:<22} {:<22} {:>7}  {:<22} {:>7}  {:<22} {:>8}",
        c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]
    )
}

fn heading(p: &Placement) -> String {
    format!("== {} ==", p.describe())
}

/// Where a scenario's extra processes run, for a placement.
pub(super) fn pinning(scenario: Scenario, p: &Placement) -> Option<String> {
    match scenario {
        Scenario::Mesh => Some(format!(
            "pinning: client + sidecar A on CPU {}, sidecar B + server on CPU {} (same for bypass and default)",
            p.client_cpu, p.server_cpu
        )),
        Scenario::Cluster => Some(format!(
            "pinning: `taskset -c {}` qperf client in pod client (kubectl exec), `taskset -c {}` qperf server in pod server",
            p.client_cpu, p.server_cpu
        )),
        Scenario::Default | Scenario::Clusterip => None,
    }
}

/// What a scenario's bypassed connection should pair, per measured connection.
fn hop_expectation(scenario: Scenario) -> &'static str {
    match scenario {
        Scenario::Default | Scenario::Cluster => {
            "expected per measured connection: at least 1 pod-to-pod pair (qperf's control connections are pairs too)"
        }
        Scenario::Mesh => {
            "expected per measured connection: 2 translated pairs (client->sidecar A, sidecar A->sidecar B), 1 loopback pair (sidecar B->server)"
        }
        Scenario::Clusterip => {
            "expected per measured connection: at least 1 translated pair (qperf's control connections go through the VIP too)"
        }
    }
}

pub(super) fn fmt_count(v: Option<u64>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

pub(super) fn fmt_per_conn(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.2}"))
}

/// The hop section of the text report.
fn render_hops(o: &mut String, r: &Results) {
    if r.hops.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "\nhops: agent counters summed over the bypassed blocks (bypass-agent status --json)"
    );
    let _ = writeln!(o, "  {}", hop_expectation(r.config.scenario));
    for p in &r.config.placements {
        let Some(t) = hop_totals(r, &p.name) else {
            continue;
        };
        let _ = writeln!(
            o,
            "  {}: {} blocks, {} measured connections",
            p.name, t.blocks, t.connections
        );
        for key in HOP_COUNTERS {
            let per = if key.starts_with("paired_") {
                format!("  ({} per connection)", fmt_per_conn(t.per_connection(key)))
            } else {
                String::new()
            };
            let _ = writeln!(o, "    {key:<28} {:>14}{per}", fmt_count(t.get(key)));
        }
        for key in ["redirected_bytes", "passed_bytes"] {
            let _ = writeln!(o, "    {key:<28} {:>14}", fmt_count(t.get(key)));
        }
        if let (Some(tr), Some(lo)) = (
            t.get("redirected_bytes_translated"),
            t.get("redirected_bytes_loopback"),
        ) && lo > 0
        {
            let _ = writeln!(
                o,
                "    translated / loopback bytes  {:>14.2}  (2.00 when every byte crossed both translated hops and the loopback hop)",
                tr as f64 / lo as f64
            );
        }
        if let Some(share) = t.passed_share() {
            let _ = writeln!(
                o,
                "    passed / (redirected+passed) {:>13.2}%",
                share * 100.0
            );
        }
    }
}

/// The whole text report: tables per placement, percentiles, agent cost, targets.
pub fn render(r: &Results) -> String {
    let mut o = String::new();
    let c = &r.config;
    let _ = writeln!(
        o,
        "bypass bench: kernel {}, {} CPUs, qperf {} s/test x {} interleaved reps (bypass, default, ...), git {}",
        r.env.kernel, r.env.cpus, c.qperf_secs, c.reps, r.env.git_commit
    );
    if !c.agent_args.is_empty() {
        let _ = writeln!(o, "agent arguments added: {}", c.agent_args.join(" "));
    }
    if c.scenario != Scenario::Default {
        let _ = writeln!(
            o,
            "scenario {}: {}",
            c.scenario.name(),
            c.scenario.describe()
        );
    }
    let _ = writeln!(
        o,
        "cells: median [min-max] over reps; ratio = bypass/default; vs min = bypass/minimal redirect; vs floor = bypass/Unix-socket floor"
    );
    for p in &c.placements {
        let _ = writeln!(o, "\n{}", heading(p));
        if let Some(pin) = pinning(c.scenario, p) {
            let _ = writeln!(o, "{pin}");
        }
        for (test, title, f) in [
            (
                Test::TcpLat,
                "tcp_lat: one-way latency, us (lower is better)",
                fmt_lat as fn(f64) -> String,
            ),
            (
                Test::TcpBw,
                "tcp_bw: throughput, MB/s = 10^6 B/s (higher is better)",
                fmt_bw,
            ),
        ] {
            let _ = writeln!(o, "{title}");
            let _ = writeln!(
                o,
                "{}",
                table_line(&[
                    "size",
                    "bypass",
                    "default",
                    "ratio",
                    "minimal",
                    "vs min",
                    "floor (unix)",
                    "vs floor"
                ])
            );
            for row in rows(r, &p.name, test) {
                let _ = writeln!(o, "{}", table_line(&row_cells(&row, f)));
            }
        }
        if !c.sockperf_sizes.is_empty() {
            let _ = writeln!(
                o,
                "sockperf ping-pong one-way latency percentiles, us (median over runs; floor: own ping-pong)"
            );
            let _ = writeln!(
                o,
                "  {:>5}  {:<8} {:>9} {:>9} {:>9} {:>5}",
                "size", "path", "p50", "p99", "p99.9", "runs"
            );
            for &size in &c.sockperf_sizes {
                for path in [Path::Bypass, Path::Default, Path::Minimal, Path::Floor] {
                    if let Some(row) = pct_row(r, &p.name, path, size) {
                        let _ = writeln!(
                            o,
                            "  {:>5}  {:<8} {:>9} {:>9} {:>9} {:>5}",
                            size_label(size),
                            path.name(),
                            fmt_lat(row.p50_ns),
                            fmt_lat(row.p99_ns),
                            fmt_lat(row.p999_ns),
                            row.runs
                        );
                    }
                }
            }
        }
    }
    let a = agent_cost(r);
    let rate = |x: Option<f64>| x.map_or_else(|| "-".into(), |x| format!("{x:.2} ms/s"));
    if r.agent.is_empty() {
        // The cluster scenario's agent is the DaemonSet's pod, not a process of ours.
        let _ = writeln!(o, "\nagent: not probed in this run");
    } else {
        let _ = writeln!(
            o,
            "\nagent: RSS {:.1} MB, peak (VmHWM) {:.1} MB; CPU to load+attach {:.0} ms; idle {}; during the sweep {} ({} starts)",
            a.rss_kib as f64 * 1024.0 / 1e6,
            a.hwm_kib as f64 * 1024.0 / 1e6,
            a.start_cpu_ms,
            rate(a.idle_cpu_ms_per_s),
            rate(a.sweep_cpu_ms_per_s),
            a.starts
        );
    }
    render_hops(&mut o, r);
    render_programs(&mut o, r);
    let _ = writeln!(
        o,
        "\ntargets (ratios of medians measured in this run, reported not asserted):"
    );
    for t in targets(r) {
        let _ = writeln!(o, "  {:<4}  {:<62} {}", t.verdict(), t.name, t.detail);
    }
    render_warnings(&mut o, &r.warnings);
    o
}

/// The run's warnings, if any, one a line.
pub(crate) fn render_warnings(o: &mut String, warnings: &[String]) {
    if !warnings.is_empty() {
        let _ = writeln!(o, "\nwarnings:");
        for w in warnings {
            let _ = writeln!(o, "  - {w}");
        }
    }
}

fn render_programs(o: &mut String, r: &Results) {
    if r.programs.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "\nprogram cost (kernel bpf_stats, median over blocks): ns per run, runs per block"
    );
    for p in &r.config.placements {
        for prog in [Prog::SkMsg, Prog::SockOps] {
            let cell = |path| {
                prog_cost(r, &p.name, path, prog).map_or_else(
                    || "-".to_owned(),
                    |(ns, runs)| format!("{ns:.0} ns x {runs:.0}"),
                )
            };
            let _ = writeln!(
                o,
                "  {:<10} {:<9} bypass {:<22} minimal {}",
                p.name,
                prog.name(),
                cell(Path::Bypass),
                cell(Path::Minimal)
            );
        }
    }
}
