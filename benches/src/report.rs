//! Pure: from [`Results`] to the table (size, bypass, default, ratio, floor), the
//! sockperf percentiles, the agent's cost, and PASS/MISS for each target. Ratios are
//! of medians measured in the same run; targets are reported, never asserted.

use std::{collections::BTreeMap, fmt::Write as _};

use crate::{
    model::{Path, PctSample, Placement, ProbePhase, Prog, Results, Scenario, Test},
    scenario::HOP_COUNTERS,
    stats::{Summary, summarize},
};

/// Latency with the bypass at most this times the minimal reference redirect's, at every
/// size.
pub const TARGET_LAT_VS_MINIMAL: f64 = 0.95;
/// Latency with the bypass at most this times the default path's, at every size.
pub const TARGET_LAT_VS_DEFAULT: f64 = 0.5;
/// Latency with the bypass at most this times the Unix-socket floor's, at every size.
pub const TARGET_LAT_VS_FLOOR: f64 = 1.3;
/// Throughput with the bypass at least this times the default path's, at every size.
pub const TARGET_BW_VS_DEFAULT: f64 = 1.0;
/// Throughput with the bypass at least this times the default path's at
/// [`TARGET_BW_LARGE_SIZE`].
pub const TARGET_BW_LARGE_VS_DEFAULT: f64 = 2.5;
/// The size the large-message throughput target is about.
pub const TARGET_BW_LARGE_SIZE: u32 = 16384;
/// The agent's peak resident memory at most this many bytes.
pub const TARGET_AGENT_RSS_BYTES: u64 = 30_000_000;

/// `1`, `4`, ..., `1K`, `16K`.
pub fn size_label(size: u32) -> String {
    if size >= 1024 && size.is_multiple_of(1024) {
        format!("{}K", size / 1024)
    } else {
        size.to_string()
    }
}

/// One line of a table: a size and the summaries of each path.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// Message size.
    pub size: u32,
    /// With the bypass.
    pub bypass: Option<Summary>,
    /// The normal path.
    pub default: Option<Summary>,
    /// The minimal reference redirect.
    pub minimal: Option<Summary>,
    /// The Unix-socket floor.
    pub floor: Option<Summary>,
}

impl Row {
    /// bypass / default, of medians.
    pub fn ratio(&self) -> Option<f64> {
        Some(self.bypass?.median / self.default?.median)
    }

    /// bypass / minimal, of medians.
    pub fn vs_minimal(&self) -> Option<f64> {
        Some(self.bypass?.median / self.minimal?.median)
    }

    /// bypass / floor, of medians.
    pub fn vs_floor(&self) -> Option<f64> {
        Some(self.bypass?.median / self.floor?.median)
    }
}

/// The summary of every sample of one cell.
pub fn cell(r: &Results, placement: &str, path: Path, test: Test, size: u32) -> Option<Summary> {
    let v: Vec<f64> = r
        .samples
        .iter()
        .filter(|s| s.placement == placement && s.path == path && s.test == test && s.size == size)
        .map(|s| s.value)
        .collect();
    summarize(&v)
}

/// The rows of one placement and test, one per configured size.
pub fn rows(r: &Results, placement: &str, test: Test) -> Vec<Row> {
    r.config
        .sizes
        .iter()
        .map(|&size| Row {
            size,
            bypass: cell(r, placement, Path::Bypass, test, size),
            default: cell(r, placement, Path::Default, test, size),
            minimal: cell(r, placement, Path::Minimal, test, size),
            floor: cell(r, placement, Path::Floor, test, size),
        })
        .collect()
}

/// Medians of sockperf-style percentiles for one placement, path and size.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PctRow {
    /// Median over runs of p50, ns.
    pub p50_ns: f64,
    /// Median over runs of p99, ns.
    pub p99_ns: f64,
    /// Median over runs of p99.9, ns.
    pub p999_ns: f64,
    /// Runs.
    pub runs: usize,
}

/// The percentile row of one placement, path and size, if measured.
pub fn pct_row(r: &Results, placement: &str, path: Path, size: u32) -> Option<PctRow> {
    let runs: Vec<&PctSample> = r
        .percentiles
        .iter()
        .filter(|p| p.placement == placement && p.path == path && p.size == size)
        .collect();
    let med = |f: fn(&PctSample) -> f64| {
        summarize(&runs.iter().map(|p| f(p)).collect::<Vec<_>>()).map(|s| s.median)
    };
    Some(PctRow {
        p50_ns: med(|p| p.p50_ns)?,
        p99_ns: med(|p| p.p99_ns)?,
        p999_ns: med(|p| p.p999_ns)?,
        runs: runs.len(),
    })
}

/// The agent's cost over the run.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AgentCost {
    /// Largest VmRSS seen, KiB.
    pub rss_kib: u64,
    /// Largest VmHWM seen, KiB.
    pub hwm_kib: u64,
    /// CPU to load and attach, ms (largest over the starts).
    pub start_cpu_ms: f64,
    /// CPU while idle, ms per second of wall time.
    pub idle_cpu_ms_per_s: Option<f64>,
    /// CPU during the bypassed blocks of the sweep, ms per second of wall time.
    pub sweep_cpu_ms_per_s: Option<f64>,
    /// Agent processes started.
    pub starts: usize,
}

/// Sums the agent probes.
pub fn agent_cost(r: &Results) -> AgentCost {
    let mut c = AgentCost::default();
    let (mut idle, mut sweep) = ((0.0, 0.0), (0.0, 0.0));
    for p in &r.agent {
        c.rss_kib = c.rss_kib.max(p.rss_kib);
        c.hwm_kib = c.hwm_kib.max(p.hwm_kib);
        match p.phase {
            ProbePhase::Started => {
                c.starts += 1;
                c.start_cpu_ms = c.start_cpu_ms.max(p.cpu_ms);
            }
            ProbePhase::Idle => idle = (idle.0 + p.cpu_ms, idle.1 + p.wall_ms),
            ProbePhase::Sweep => sweep = (sweep.0 + p.cpu_ms, sweep.1 + p.wall_ms),
        }
    }
    let rate = |(cpu, wall): (f64, f64)| (wall > 0.0).then(|| cpu / (wall / 1000.0));
    c.idle_cpu_ms_per_s = rate(idle);
    c.sweep_cpu_ms_per_s = rate(sweep);
    c
}

/// One target's verdict.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    /// What it asks.
    pub name: String,
    /// `Some(true)` PASS, `Some(false)` MISS, `None` not measured.
    pub pass: Option<bool>,
    /// The worst measured ratio or value, per placement.
    pub detail: String,
}

impl Target {
    /// `PASS`, `MISS` or `n/a`.
    pub fn verdict(&self) -> &'static str {
        match self.pass {
            Some(true) => "PASS",
            Some(false) => "MISS",
            None => "n/a",
        }
    }
}

/// Worst ratio over rows for one placement: (ratio, size), for a target that wants
/// ratios low (`want_low`) or high.
fn worst(rows: &[Row], ratio: fn(&Row) -> Option<f64>, want_low: bool) -> Option<(f64, u32)> {
    rows.iter()
        .filter_map(|row| Some((ratio(row)?, row.size)))
        .reduce(|a, b| {
            let b_worse = if want_low { b.0 > a.0 } else { b.0 < a.0 };
            if b_worse { b } else { a }
        })
}

fn ratio_target(
    r: &Results,
    name: String,
    test: Test,
    sizes: Option<&[u32]>,
    ratio: fn(&Row) -> Option<f64>,
    limit: f64,
    want_low: bool,
) -> Target {
    let mut pass = None;
    let mut detail = Vec::new();
    for p in &r.config.placements {
        let rows: Vec<Row> = rows(r, &p.name, test)
            .into_iter()
            .filter(|row| sizes.is_none_or(|s| s.contains(&row.size)))
            .collect();
        if let Some((w, size)) = worst(&rows, ratio, want_low) {
            let ok = if want_low { w <= limit } else { w >= limit };
            pass = Some(pass.unwrap_or(true) && ok);
            detail.push(format!("{}: worst {w:.2}x at {}", p.name, size_label(size)));
        }
    }
    Target {
        name,
        pass,
        detail: detail.join("; "),
    }
}

/// Every target, evaluated on this run.
pub fn targets(r: &Results) -> Vec<Target> {
    let mut t = vec![
        ratio_target(
            r,
            format!("latency: bypass <= {TARGET_LAT_VS_MINIMAL}x minimal redirect at every size"),
            Test::TcpLat,
            None,
            Row::vs_minimal,
            TARGET_LAT_VS_MINIMAL,
            true,
        ),
        ratio_target(
            r,
            format!("latency: bypass <= {TARGET_LAT_VS_DEFAULT}x default at every size"),
            Test::TcpLat,
            None,
            Row::ratio,
            TARGET_LAT_VS_DEFAULT,
            true,
        ),
        ratio_target(
            r,
            format!("latency: bypass <= {TARGET_LAT_VS_FLOOR}x Unix-socket floor at every size"),
            Test::TcpLat,
            None,
            Row::vs_floor,
            TARGET_LAT_VS_FLOOR,
            true,
        ),
        ratio_target(
            r,
            format!("throughput: bypass >= {TARGET_BW_VS_DEFAULT}x default at every size"),
            Test::TcpBw,
            None,
            Row::ratio,
            TARGET_BW_VS_DEFAULT,
            false,
        ),
        ratio_target(
            r,
            format!(
                "throughput: bypass >= {TARGET_BW_LARGE_VS_DEFAULT}x default at {}",
                size_label(TARGET_BW_LARGE_SIZE)
            ),
            Test::TcpBw,
            Some(&[TARGET_BW_LARGE_SIZE]),
            Row::ratio,
            TARGET_BW_LARGE_VS_DEFAULT,
            false,
        ),
    ];
    let cost = agent_cost(r);
    let peak = cost.hwm_kib.max(cost.rss_kib) * 1024;
    t.push(Target {
        name: format!("agent RSS <= {} MB", TARGET_AGENT_RSS_BYTES / 1_000_000),
        pass: (peak > 0).then_some(peak <= TARGET_AGENT_RSS_BYTES),
        detail: format!("peak {:.1} MB (VmHWM)", peak as f64 / 1e6),
    });
    t
}

fn fmt_lat(ns: f64) -> String {
    let us = ns / 1e3;
    if us >= 100.0 {
        format!("{us:.0}")
    } else if us >= 10.0 {
        format!("{us:.1}")
    } else {
        format!("{us:.2}")
    }
}

fn fmt_bw(bps: f64) -> String {
    let mb = bps / 1e6;
    if mb >= 100.0 {
        format!("{mb:.0}")
    } else if mb >= 10.0 {
        format!("{mb:.1}")
    } else {
        format!("{mb:.2}")
    }
}

fn fmt_summary(s: Option<Summary>, f: fn(f64) -> String) -> String {
    match s {
        Some(s) if s.n > 1 => format!("{} [{}-{}]", f(s.median), f(s.min), f(s.max)),
        Some(s) => f(s.median),
        None => "-".into(),
    }
}

fn fmt_ratio(x: Option<f64>) -> String {
    x.map_or_else(|| "-".into(), |x| format!("{x:.2}x"))
}

/// How the table says which placement it is about.
fn heading(p: &Placement) -> String {
    format!("== {} ==", p.describe())
}

/// Where a scenario's extra processes run, for a placement.
fn pinning(scenario: Scenario, p: &Placement) -> Option<String> {
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

/// The agent's counters summed over the bypassed blocks of one placement.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HopTotals {
    /// Bypassed blocks.
    pub blocks: usize,
    /// Measured connections the clients opened in them.
    pub connections: u64,
    /// Counter growth, summed, by `status --json` key.
    pub counters: BTreeMap<String, u64>,
}

impl HopTotals {
    /// A counter's sum, if the agent reported it.
    pub fn get(&self, key: &str) -> Option<u64> {
        self.counters.get(key).copied()
    }

    /// A counter per measured connection.
    pub fn per_connection(&self, key: &str) -> Option<f64> {
        let v = self.get(key)?;
        (self.connections > 0).then(|| v as f64 / self.connections as f64)
    }

    /// Bytes the datapath let take TCP, as a share of all it saw.
    pub fn passed_share(&self) -> Option<f64> {
        let (r, p) = (self.get("redirected_bytes")?, self.get("passed_bytes")?);
        (r + p > 0).then(|| p as f64 / (r + p) as f64)
    }
}

/// The hop counters of one placement, if the run recorded any.
pub fn hop_totals(r: &Results, placement: &str) -> Option<HopTotals> {
    let mut t = HopTotals::default();
    for h in r.hops.iter().filter(|h| h.placement == placement) {
        t.blocks += 1;
        t.connections += h.connections;
        for (k, v) in &h.counters {
            *t.counters.entry(k.clone()).or_default() += v;
        }
    }
    (t.blocks > 0).then_some(t)
}

/// What a scenario's bypassed connection should pair, per measured connection.
fn hop_expectation(scenario: Scenario) -> &'static str {
    match scenario {
        Scenario::Default => "",
        Scenario::Mesh => {
            "expected per measured connection: 2 translated pairs (client->sidecar A, sidecar A->sidecar B), 1 loopback pair (sidecar B->server)"
        }
        Scenario::Clusterip => {
            "expected per measured connection: at least 1 translated pair (qperf's control connections go through the VIP too)"
        }
        Scenario::Cluster => {
            "expected per measured connection: at least 1 pod-to-pod pair (qperf's control connections are pairs too)"
        }
    }
}

fn fmt_count(v: Option<u64>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

fn fmt_per_conn(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.2}"))
}

/// The hop section of the text report (scenario runs).
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
                "  {:>5}  {:<22} {:<22} {:>7}  {:<22} {:>7}  {:<22} {:>8}",
                "size",
                "bypass",
                "default",
                "ratio",
                "minimal",
                "vs min",
                "floor (unix)",
                "vs floor"
            );
            for row in rows(r, &p.name, test) {
                let _ = writeln!(
                    o,
                    "  {:>5}  {:<22} {:<22} {:>7}  {:<22} {:>7}  {:<22} {:>8}",
                    size_label(row.size),
                    fmt_summary(row.bypass, f),
                    fmt_summary(row.default, f),
                    fmt_ratio(row.ratio()),
                    fmt_summary(row.minimal, f),
                    fmt_ratio(row.vs_minimal()),
                    fmt_summary(row.floor, f),
                    fmt_ratio(row.vs_floor()),
                );
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
    if !r.warnings.is_empty() {
        let _ = writeln!(o, "\nwarnings:");
        for w in &r.warnings {
            let _ = writeln!(o, "  - {w}");
        }
    }
    o
}

/// Median over blocks of one program's nanoseconds per run, and its runs per block.
pub fn prog_cost(r: &Results, placement: &str, path: Path, prog: Prog) -> Option<(f64, f64)> {
    let blocks: Vec<_> = r
        .programs
        .iter()
        .filter(|s| s.placement == placement && s.path == path && s.prog == prog && s.runs > 0)
        .collect();
    let per_run: Vec<f64> = blocks.iter().map(|s| s.ns as f64 / s.runs as f64).collect();
    let runs: Vec<f64> = blocks.iter().map(|s| s.runs as f64).collect();
    Some((summarize(&per_run)?.median, summarize(&runs)?.median))
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

/// The tables as Markdown (size | bypass | default | ratio | floor | vs floor), for the
/// README.
pub fn render_markdown(r: &Results) -> String {
    let mut o = String::new();
    for p in &r.config.placements {
        for (test, title, f) in [
            (
                Test::TcpLat,
                "one-way latency, µs",
                fmt_lat as fn(f64) -> String,
            ),
            (Test::TcpBw, "throughput, MB/s", fmt_bw),
        ] {
            let _ = writeln!(o, "**{} — {}**\n", p.describe(), title);
            let _ = writeln!(
                o,
                "| size | bypass | default | ratio | minimal | vs min | Unix floor | vs floor |"
            );
            let _ = writeln!(o, "|---:|---:|---:|---:|---:|---:|---:|---:|");
            for row in rows(r, &p.name, test) {
                let _ = writeln!(
                    o,
                    "| {} | {} | {} | {} | {} | {} | {} | {} |",
                    size_label(row.size),
                    fmt_summary(row.bypass, f),
                    fmt_summary(row.default, f),
                    fmt_ratio(row.ratio()),
                    fmt_summary(row.minimal, f),
                    fmt_ratio(row.vs_minimal()),
                    fmt_summary(row.floor, f),
                    fmt_ratio(row.vs_floor()),
                );
            }
            let _ = writeln!(o);
        }
    }
    let _ = writeln!(o, "| target | result | measured |\n|---|---|---|");
    for t in targets(r) {
        let _ = writeln!(o, "| {} | {} | {} |", t.name, t.verdict(), t.detail);
    }
    o
}

/// A scenario's title in the README.
fn scenario_title(s: Scenario) -> &'static str {
    match s {
        Scenario::Default => "Pod to pod",
        Scenario::Mesh => {
            "Service mesh: app → sidecar → sidecar → app (iptables REDIRECT in both pods)"
        }
        Scenario::Clusterip => "ClusterIP: app → Service VIP, kube-proxy DNAT → app",
        Scenario::Cluster => {
            "Real pods on the one-node cluster: the DaemonSet of deploy/, switched by the node label"
        }
    }
}

fn ratio_cell(row: &Row, f: fn(f64) -> String, unit: &str) -> String {
    match (row.ratio(), row.bypass, row.default) {
        (Some(x), Some(b), Some(d)) => {
            format!("{x:.2}× ({} vs {} {unit})", f(b.median), f(d.median))
        }
        _ => "-".into(),
    }
}

/// `0123456789ab+dirty` from a full `git rev-parse HEAD` (plus `+dirty`).
fn short_commit(c: &str) -> String {
    match c.split_once('+') {
        Some((h, rest)) => format!("{}+{rest}", &h[..h.len().min(12)]),
        None => c[..c.len().min(12)].to_owned(),
    }
}

/// A short Markdown block for the README: per size, bypass ÷ default for latency and
/// throughput in each placement (medians of this run), and what the hop counters
/// showed.
pub fn render_snippet(r: &Results) -> String {
    let c = &r.config;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "**{}** — `cargo xtask bench --scenario {}`, {} interleaved reps, {} s per qperf test, git {}, load {} → {}; ratios are bypass ÷ normal path ({}), medians of one run, absolute values in parentheses.\n",
        scenario_title(c.scenario),
        c.scenario.name(),
        c.reps,
        c.qperf_secs,
        short_commit(&r.env.git_commit),
        r.env.loadavg_start,
        r.env.loadavg_end,
        if c.scenario == Scenario::Cluster {
            "node labelled bypass.dev/enabled=false, agent running"
        } else {
            "agent stopped"
        },
    );
    let mut head = vec!["size".to_owned()];
    let mut cols: Vec<(Test, &Placement)> = Vec::new();
    for (test, what) in [(Test::TcpLat, "latency"), (Test::TcpBw, "throughput")] {
        if !c.tests.contains(&test) {
            continue;
        }
        for p in &c.placements {
            head.push(format!("{what}, {}", p.name));
            cols.push((test, p));
        }
    }
    let _ = writeln!(o, "| {} |", head.join(" | "));
    let _ = writeln!(o, "|{}", "---:|".repeat(head.len()));
    for (i, &size) in c.sizes.iter().enumerate() {
        let mut line = vec![size_label(size)];
        for (test, p) in &cols {
            let row = &rows(r, &p.name, *test)[i];
            line.push(match test {
                Test::TcpLat => ratio_cell(row, fmt_lat, "µs"),
                Test::TcpBw => ratio_cell(row, fmt_bw, "MB/s"),
            });
        }
        let _ = writeln!(o, "| {} |", line.join(" | "));
    }
    let _ = writeln!(o);
    for p in &c.placements {
        let mut notes = Vec::new();
        if let Some(pin) = pinning(c.scenario, p) {
            notes.push(pin);
        }
        for &size in &c.sockperf_sizes {
            if let (Some(b), Some(d)) = (
                pct_row(r, &p.name, Path::Bypass, size),
                pct_row(r, &p.name, Path::Default, size),
            ) {
                notes.push(format!(
                    "sockperf {} B p50/p99/p99.9: {} / {} / {} µs vs {} / {} / {} µs",
                    size_label(size),
                    fmt_lat(b.p50_ns),
                    fmt_lat(b.p99_ns),
                    fmt_lat(b.p999_ns),
                    fmt_lat(d.p50_ns),
                    fmt_lat(d.p99_ns),
                    fmt_lat(d.p999_ns)
                ));
            }
        }
        if let Some(t) = hop_totals(r, &p.name) {
            let per = |k: &str| fmt_per_conn(t.per_connection(k));
            notes.push(format!(
                "hops paired per measured connection: {} translated, {} loopback, {} pod-to-pod (qperf's control connections); {} rejected; {} of the bytes took TCP",
                per("paired_translated"),
                per("paired_loopback"),
                per("paired_pod"),
                fmt_count(t.get("pair_rejected")),
                t.passed_share()
                    .map_or_else(|| "-".into(), |s| format!("{:.2} %", s * 100.0))
            ));
        }
        if !notes.is_empty() {
            let _ = writeln!(o, "- {}: {}", p.name, notes.join("; "));
        }
    }
    o
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::{AgentProbe, Config, Environment, ProgSample, SCHEMA, Sample};

    pub(crate) fn sample_results() -> Results {
        let mut samples = Vec::new();
        for rep in 0..3 {
            for &size in &[64u32, 16384] {
                for (path, lat, bw) in [
                    (Path::Bypass, 5000.0, 4e9),
                    (Path::Default, 12000.0, 1.5e9),
                    (Path::Minimal, 5500.0, 4.2e9),
                    (Path::Floor, 4500.0, 5e9),
                ] {
                    let jitter = f64::from(rep) * 100.0;
                    samples.push(Sample {
                        rep,
                        placement: "cross-cpu".into(),
                        path,
                        test: Test::TcpLat,
                        size,
                        value: lat + jitter,
                        wire_bytes: None,
                        redirected_bytes: None,
                        passed_bytes: None,
                    });
                    samples.push(Sample {
                        rep,
                        placement: "cross-cpu".into(),
                        path,
                        test: Test::TcpBw,
                        size,
                        value: bw + jitter,
                        wire_bytes: None,
                        redirected_bytes: None,
                        passed_bytes: None,
                    });
                }
            }
        }
        Results {
            schema: SCHEMA,
            config: Config {
                quick: false,
                reps: 3,
                sockperf_reps: 1,
                qperf_secs: 1,
                sockperf_secs: 2,
                floor_secs: 0.5,
                sizes: vec![64, 16384],
                sockperf_sizes: vec![64],
                placements: vec![Placement::cross_cpu()],
                tests: vec![Test::TcpLat, Test::TcpBw],
                idle_secs: 1.0,
                minimal: true,
                agent_args: Vec::new(),
                scenario: Default::default(),
            },
            env: Environment::default(),
            samples,
            percentiles: vec![PctSample {
                rep: 0,
                placement: "cross-cpu".into(),
                path: Path::Bypass,
                size: 64,
                avg_ns: 5000.0,
                p50_ns: 4900.0,
                p99_ns: 8000.0,
                p999_ns: 20000.0,
                observations: 1000,
            }],
            agent: vec![
                AgentProbe {
                    phase: ProbePhase::Started,
                    pid: 1,
                    rss_kib: 8000,
                    hwm_kib: 9000,
                    cpu_ms: 40.0,
                    wall_ms: 300.0,
                },
                AgentProbe {
                    phase: ProbePhase::Sweep,
                    pid: 1,
                    rss_kib: 8100,
                    hwm_kib: 9000,
                    cpu_ms: 10.0,
                    wall_ms: 10_000.0,
                },
            ],
            hops: vec![],
            programs: vec![
                ProgSample {
                    rep: 0,
                    placement: "cross-cpu".into(),
                    path: Path::Bypass,
                    prog: Prog::SkMsg,
                    runs: 1000,
                    ns: 250_000,
                },
                ProgSample {
                    rep: 0,
                    placement: "cross-cpu".into(),
                    path: Path::Minimal,
                    prog: Prog::SkMsg,
                    runs: 2000,
                    ns: 260_000,
                },
            ],
            warnings: vec![],
        }
    }

    #[test]
    fn rows_and_ratios() {
        let r = sample_results();
        let rows = rows(&r, "cross-cpu", Test::TcpLat);
        assert_eq!(rows.len(), 2);
        let b = rows[0].bypass.unwrap();
        assert_eq!((b.median, b.min, b.max, b.n), (5100.0, 5000.0, 5200.0, 3));
        assert!((rows[0].ratio().unwrap() - 5100.0 / 12100.0).abs() < 1e-9);
        assert!((rows[0].vs_floor().unwrap() - 5100.0 / 4600.0).abs() < 1e-9);
        assert!((rows[0].vs_minimal().unwrap() - 5100.0 / 5600.0).abs() < 1e-9);
    }

    #[test]
    fn program_cost_per_run() {
        let r = sample_results();
        assert_eq!(
            prog_cost(&r, "cross-cpu", Path::Bypass, Prog::SkMsg),
            Some((250.0, 1000.0))
        );
        assert_eq!(
            prog_cost(&r, "cross-cpu", Path::Minimal, Prog::SkMsg),
            Some((130.0, 2000.0))
        );
        assert_eq!(
            prog_cost(&r, "cross-cpu", Path::Bypass, Prog::SockOps),
            None
        );
        let text = render(&r);
        assert!(
            text.contains("sk_msg    bypass 250 ns x 1000")
                && text.contains("minimal 130 ns x 2000"),
            "{text}"
        );
    }

    #[test]
    fn target_verdicts() {
        let r = sample_results();
        let t = targets(&r);
        assert_eq!(t[0].verdict(), "PASS", "{t:?}"); // 0.91x minimal <= 0.95x
        assert_eq!(t[1].verdict(), "PASS", "{t:?}"); // 0.42x <= 0.5x
        assert_eq!(t[2].verdict(), "PASS", "{t:?}"); // 1.11x <= 1.3x floor
        assert_eq!(t[3].verdict(), "PASS", "{t:?}"); // 2.67x >= 1x at every size
        assert_eq!(t[4].verdict(), "PASS", "{t:?}"); // 2.67x >= 2.5x at 16K
        assert_eq!(t[5].verdict(), "PASS", "{t:?}"); // 9.2 MB
        assert!(t[4].detail.contains("16K"), "{}", t[4].detail);
        let mut r2 = r.clone();
        for s in &mut r2.samples {
            if s.path == Path::Default && s.test == Test::TcpLat {
                s.value = 6000.0;
            }
            if s.path == Path::Minimal && s.test == Test::TcpLat {
                s.value = 5000.0;
            }
            if s.path == Path::Default && s.test == Test::TcpBw && s.size == 64 {
                s.value = 5e9;
            }
        }
        let t2 = targets(&r2);
        assert_eq!(t2[0].verdict(), "MISS", "{t2:?}");
        assert_eq!(t2[1].verdict(), "MISS", "{t2:?}");
        assert_eq!(t2[3].verdict(), "MISS", "{t2:?}");
        assert_eq!(t2[4].verdict(), "PASS", "{t2:?}");
    }

    #[test]
    fn unmeasured_target_is_na() {
        let mut r = sample_results();
        r.samples.retain(|s| s.path != Path::Floor);
        assert_eq!(targets(&r)[2].verdict(), "n/a");
    }

    #[test]
    fn agent_rates() {
        let a = agent_cost(&sample_results());
        assert_eq!(a.starts, 1);
        assert_eq!(a.sweep_cpu_ms_per_s, Some(1.0));
        assert_eq!(a.idle_cpu_ms_per_s, None);
        assert_eq!(a.hwm_kib, 9000);
    }

    #[test]
    fn render_has_table_and_targets() {
        let text = render(&sample_results());
        assert!(
            text.contains("cross-cpu (client CPU 0, server CPU 1)"),
            "{text}"
        );
        assert!(text.contains("0.42x"), "{text}");
        assert!(text.contains("PASS"), "{text}");
        assert!(text.contains("16K") && text.contains("vs min"), "{text}");
        let md = render_markdown(&sample_results());
        assert!(
            md.contains("| 64 | 5.10 [5.00-5.20] | 12.1 [12.0-12.2] | 0.42x |"),
            "{md}"
        );
    }

    #[test]
    fn scenario_report_and_snippet() {
        let mut r = sample_results();
        r.config.scenario = Scenario::Mesh;
        let counters = |t: u64, l: u64| {
            [
                ("paired_translated", t),
                ("paired_loopback", l),
                ("pair_rejected", 0),
                ("redirected_bytes_translated", 2000),
                ("redirected_bytes_loopback", 1000),
                ("redirected_bytes", 3000),
                ("passed_bytes", 0),
            ]
            .map(|(k, v)| (k.to_owned(), v))
            .into_iter()
            .collect()
        };
        for rep in 0..2 {
            r.hops.push(crate::model::HopSample {
                rep,
                placement: "cross-cpu".into(),
                connections: 5,
                counters: counters(10, 5),
            });
        }
        let text = render(&r);
        assert!(text.contains("scenario mesh"), "{text}");
        assert!(text.contains("sidecar B + server on CPU 1"), "{text}");
        assert!(text.contains("2 blocks, 10 measured connections"), "{text}");
        assert!(text.contains("(2.00 per connection)"), "{text}");
        assert!(text.contains("translated / loopback bytes"), "{text}");
        let md = render_snippet(&r);
        assert!(
            md.contains("| size | latency, cross-cpu | throughput, cross-cpu |"),
            "{md}"
        );
        assert!(md.contains("| 64 | 0.42× (5.10 vs 12.1 µs) |"), "{md}");
        assert!(md.contains("2.00 translated, 1.00 loopback"), "{md}");
        assert_eq!(short_commit("0123456789abcdef+dirty"), "0123456789ab+dirty");
        assert_eq!(short_commit("0123"), "0123");
        // A default run's report has none of it.
        let plain = render(&sample_results());
        assert!(
            !plain.contains("scenario") && !plain.contains("hops:"),
            "{plain}"
        );
    }

    #[test]
    fn cluster_report_says_how_it_switched_and_pinned() {
        let mut r = sample_results();
        r.config.scenario = Scenario::Cluster;
        r.agent.clear();
        let text = render(&r);
        assert!(text.contains("agent: not probed in this run"), "{text}");
        assert!(text.contains("`taskset -c 1` qperf server"), "{text}");
        let md = render_snippet(&r);
        assert!(
            md.contains("node labelled bypass.dev/enabled=false, agent running"),
            "{md}"
        );
        assert!(md.contains("--scenario cluster"), "{md}");
    }

    #[test]
    fn labels() {
        assert_eq!(size_label(1), "1");
        assert_eq!(size_label(1024), "1K");
        assert_eq!(size_label(16384), "16K");
        assert_eq!(size_label(1000), "1000");
    }
}
