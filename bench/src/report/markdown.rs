//! Pure: the README's Markdown: the full tables with the targets, and a short snippet
//! of ratios per size with what the hop counters showed.

use std::fmt::Write as _;

use crate::{
    model::{Path, Placement, Results, Scenario, Test},
    report::{
        cells::{Row, hop_totals, pct_row, rows, size_label},
        targets::targets,
        text::{fmt_bw, fmt_count, fmt_lat, fmt_per_conn, pinning, row_cells},
    },
};

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
                let _ = writeln!(o, "| {} |", row_cells(&row, f).join(" | "));
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
pub(super) fn short_commit(c: &str) -> String {
    match c.split_once('+') {
        Some((h, rest)) => format!("{}+{rest}", &h[..h.len().min(12)]),
        None => c[..c.len().min(12)].to_owned(),
    }
}

/// A short Markdown block for results/README.md: per size, bypass ÷ default for latency and
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
