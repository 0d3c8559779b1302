//! Pure: the apps run's tables. [`render`] is the terminal report (`table.txt`): how the
//! agent ran, per placement every workload's normal-path rate and the ratios with their
//! spread and verdict, latencies where the tools report them, failures, what each
//! workload ran. [`render_markdown`] is results/README.md's table (`table.md`,
//! `readme-snippet.md`).

use std::fmt::Write as _;

use super::{
    cells::{AppRow, PathCell, Ratio, Verdict, events_per_run, rows, targets_met},
    mode,
};
use crate::{
    model::{AppsResults, Path, ProbePhase},
    report::text::{fmt_ratio, fmt_summary, fmt_value, render_warnings},
};

/// `median [min-max]` of a path's rates, or its failures.
fn fmt_cell(c: &PathCell) -> String {
    let rates = c
        .summary
        .map_or_else(String::new, |s| fmt_summary(Some(s), fmt_value));
    match (c.failed, rates.is_empty()) {
        (0, true) => "-".into(),
        (0, false) => rates,
        (_, true) => fmt_failed(c),
        (_, false) => format!("{rates} ({})", fmt_failed(c)),
    }
}

/// `failed F/R` of the runs that ran, and how many did not run after a hang.
fn fmt_failed(c: &PathCell) -> String {
    let ran = c.runs - c.skipped;
    if c.skipped > 0 {
        format!("failed {}/{ran}, {} not run", c.failed, c.skipped)
    } else {
        format!("failed {}/{ran}", c.failed)
    }
}

/// `ratio [min-max]` (text) of a path over the normal path, or that path's failures.
fn fmt_ratio_cell(c: &PathCell, r: Option<&Ratio>) -> String {
    match (r, c.failed) {
        (None, 0) => "-".into(),
        (None, _) => fmt_failed(c),
        (Some(r), f) => {
            let spread = if r.per_rep.n > 1 {
                format!(" [{:.2}-{:.2}]", r.per_rep.min, r.per_rep.max)
            } else {
                String::new()
            };
            let note = if f > 0 {
                format!(" ({})", fmt_failed(c))
            } else {
                String::new()
            };
            format!("{}{spread}{note}", fmt_ratio(Some(r.of_medians)))
        }
    }
}

fn fmt_share(s: Option<f64>) -> String {
    s.map_or_else(|| "-".into(), |s| format!("{:.1}%", s * 100.0))
}

fn table_line<S: AsRef<str>>(c: &[S; 7]) -> String {
    let c = c.each_ref().map(AsRef::as_ref);
    format!(
        "  {:<17} {:<7} {:<26} {:<24} {:<24} {:<7} {:>6}",
        c[0], c[1], c[2], c[3], c[4], c[5], c[6]
    )
}

fn row_line(row: &AppRow) -> String {
    table_line(&[
        row.workload.clone(),
        row.unit.clone(),
        fmt_cell(&row.normal),
        fmt_ratio_cell(&row.bypass, row.bypass_ratio.as_ref()),
        fmt_ratio_cell(&row.minimal, row.minimal_ratio.as_ref()),
        row.verdict.word().to_owned(),
        fmt_share(row.redirected_share),
    ])
}

/// The lines every view starts with: the run, how the agent ran, where processes ran.
fn header(r: &AppsResults) -> Vec<String> {
    let c = &r.config;
    let paths = if c.minimal {
        "bypass, normal, minimal"
    } else {
        "bypass, normal"
    };
    let mut h = vec![
        format!(
            "bypass bench, apps scenario: kernel {}, {} CPUs, {} interleaved rep{} ({paths}, rotated per block){}, git {}",
            r.env.kernel,
            r.env.cpus,
            c.reps,
            if c.reps == 1 { "" } else { "s" },
            if c.quick { ", --quick" } else { "" },
            r.env.git_commit
        ),
        mode::describe(&r.agent_mode),
    ];
    if !r.env.loadavg_start.is_empty() {
        h.push(format!(
            "load average (1, 5, 15 min) at the start {}, at the end {}; {:.0} s",
            r.env.loadavg_start, r.env.loadavg_end, r.env.duration_secs
        ));
    }
    if !r.agent_mode.command.is_empty() {
        h.push(format!("agent command: {}", r.agent_mode.command));
    }
    if !c.agent_args.is_empty() {
        h.push(format!("agent arguments added: {}", c.agent_args.join(" ")));
    }
    h.push(
        "pinning (sched_setaffinity): every process of pod a (the clients, and a proxy's backend) on the client CPU, \
         every process of pod b (the servers and proxies) on the server CPU"
            .into(),
    );
    h
}

/// The terminal report.
pub fn render(r: &AppsResults) -> String {
    let mut o = String::new();
    for line in header(r) {
        let _ = writeln!(o, "{line}");
    }
    let _ = writeln!(
        o,
        "cells: normal = the normal path's rate (no agent), median [min-max] over reps; ratios = median / median \
         [min-max of the per-rep ratios]; verdict: the bypass against the target >= 1.0x within that spread; \
         redir = bytes the agent redirected / (redirected + passed to TCP) in the bypassed runs"
    );
    for p in &r.config.placements {
        let _ = writeln!(
            o,
            "\n== {}: pod a (clients, backends) on CPU {}, pod b (servers, proxies) on CPU {} ==",
            p.name, p.client_cpu, p.server_cpu
        );
        let _ = writeln!(
            o,
            "{}",
            table_line(&[
                "workload",
                "unit",
                "normal",
                "bypass/normal",
                "minimal/normal",
                "verdict",
                "redir"
            ])
        );
        let rows = rows(r, &p.name);
        for row in &rows {
            let _ = writeln!(o, "{}", row_line(row));
        }
        let (met, judged) = targets_met(&rows);
        let _ = writeln!(
            o,
            "  target (bypass >= 1.0x the normal path within the spread): {met} of {judged} workloads"
        );
        render_latency(&mut o, &rows);
        render_events(&mut o, r, &p.name);
    }
    render_failures(&mut o, r);
    let _ = writeln!(o, "\nworkloads (client (pod) -> servers (pod)):");
    for w in &r.workloads {
        let _ = writeln!(o, "  {:<17} {}", w.name, w.what);
    }
    let peak = r.agent.iter().map(|a| a.hwm_kib).max();
    if let Some(kib) = peak {
        let _ = writeln!(
            o,
            "\nagent: {} starts, peak RSS (VmHWM) {:.1} MB",
            r.agent
                .iter()
                .filter(|a| a.phase == ProbePhase::Started)
                .count(),
            kib as f64 * 1024.0 / 1e6
        );
    }
    render_warnings(&mut o, &r.warnings);
    o
}

/// The mean latencies the tools reported, per path.
fn render_latency(o: &mut String, rows: &[AppRow]) {
    let with: Vec<&AppRow> = rows
        .iter()
        .filter(|r| r.normal.latency_us.is_some() || r.bypass.latency_us.is_some())
        .collect();
    if with.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "  mean latency as the tool reports it, us (median over reps; lower is better):"
    );
    let lat = |v: Option<f64>| v.map_or_else(|| "-".into(), fmt_value);
    for r in with {
        let ratio = r
            .bypass
            .latency_us
            .zip(r.normal.latency_us)
            .map(|(b, n)| b / n);
        let _ = writeln!(
            o,
            "    {:<17} normal {:>8}  bypass {:>8} ({})  minimal {:>8}",
            r.workload,
            lat(r.normal.latency_us),
            lat(r.bypass.latency_us),
            fmt_ratio(ratio),
            lat(r.minimal.latency_us)
        );
    }
}

/// The datapath's events per bypassed run, per workload.
fn render_events(o: &mut String, r: &AppsResults, placement: &str) {
    let lines: Vec<String> = r
        .workloads
        .iter()
        .filter_map(|w| {
            let ev = events_per_run(r, placement, &w.name);
            (!ev.is_empty()).then(|| {
                let ev: Vec<String> = ev
                    .iter()
                    .map(|(k, v)| format!("{k} {}", fmt_value(*v)))
                    .collect();
                format!("    {:<17} {}", w.name, ev.join(", "))
            })
        })
        .collect();
    if lines.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "  datapath events per bypassed run (status --json counters that grew, mean over runs):"
    );
    for l in lines {
        let _ = writeln!(o, "{l}");
    }
}

/// Every failed run, grouped by workload, placement and path, with its first message.
fn render_failures(o: &mut String, r: &AppsResults) {
    let mut lines = Vec::new();
    for p in &r.config.placements {
        for row in rows(r, &p.name) {
            for (path, cell) in [
                (Path::Bypass, &row.bypass),
                (Path::Default, &row.normal),
                (Path::Minimal, &row.minimal),
            ] {
                if cell.failed == 0 {
                    continue;
                }
                lines.push(format!(
                    "  {} {} {}: {}: {}",
                    row.workload,
                    p.name,
                    path.name(),
                    fmt_failed(cell),
                    cell.first_failure.as_deref().unwrap_or("-")
                ));
            }
        }
    }
    if !lines.is_empty() {
        let _ = writeln!(
            o,
            "\nfailed runs, with the first failure (a run that hung until its client's timeout is not run again):"
        );
        for l in lines {
            let _ = writeln!(o, "{l}");
        }
    }
}

/// A ratio for Markdown: `1.62× (1.55–1.70)`, bold when slower in every repetition,
/// or the failures.
fn md_ratio(c: &PathCell, r: Option<&Ratio>, verdict: Option<Verdict>) -> String {
    match r {
        None if c.failed > 0 => format!("**{}**", fmt_failed(c)),
        None => "—".into(),
        Some(r) => {
            let x = format!("{:.2}×", r.of_medians);
            let x = if verdict == Some(Verdict::Slower) {
                format!("**{x}**")
            } else {
                x
            };
            let spread = if r.per_rep.n > 1 {
                format!(" ({:.2}–{:.2})", r.per_rep.min, r.per_rep.max)
            } else {
                String::new()
            };
            let failed = if c.failed > 0 {
                format!(", **{}**", fmt_failed(c))
            } else {
                String::new()
            };
            format!("{x}{spread}{failed}")
        }
    }
}

/// results/README.md's table: per workload, for each placement the normal path's median rate
/// and the two ratios with their per-repetition range.
pub fn render_markdown(r: &AppsResults) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "{}\n", mode::describe(&r.agent_mode));
    let mut head = vec!["workload".to_owned(), "unit".to_owned()];
    let mut align = vec!["---", "---"];
    for p in &r.config.placements {
        let name = p.name.replace('-', " ");
        head.push(format!("{name}: normal path"));
        head.push("bypass ÷ normal".into());
        align.extend(["---:", "---:"]);
        if r.config.minimal {
            head.push("minimal ÷ normal".into());
            align.push("---:");
        }
    }
    let _ = writeln!(o, "| {} |", head.join(" | "));
    let _ = writeln!(o, "|{}|", align.join("|"));
    let per_placement: Vec<Vec<AppRow>> = r
        .config
        .placements
        .iter()
        .map(|p| rows(r, &p.name))
        .collect();
    for (i, w) in r.workloads.iter().enumerate() {
        let mut cells = vec![format!("`{}`", w.name), w.unit.clone()];
        for rows in &per_placement {
            let Some(row) = rows.get(i) else { continue };
            cells.push(
                row.normal
                    .summary
                    .map_or_else(|| "—".into(), |s| fmt_value(s.median)),
            );
            cells.push(md_ratio(
                &row.bypass,
                row.bypass_ratio.as_ref(),
                Some(row.verdict),
            ));
            if r.config.minimal {
                cells.push(md_ratio(&row.minimal, row.minimal_ratio.as_ref(), None));
            }
        }
        let _ = writeln!(o, "| {} |", cells.join(" | "));
    }
    o
}

/// [`render_markdown`], and what each workload ran.
pub fn render_markdown_full(r: &AppsResults) -> String {
    let mut o = render_markdown(r);
    let _ = writeln!(
        o,
        "\n| workload | client (pod) → servers (pod) |\n|---|---|"
    );
    for w in &r.workloads {
        let _ = writeln!(o, "| `{}` | {} |", w.name, w.what);
    }
    o
}
