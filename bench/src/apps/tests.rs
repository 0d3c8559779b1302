//! Unit tests of the apps scenario's pure parts: ratios and their spread, verdicts,
//! the redirected share, and the tables, on a made-up run.

use std::collections::BTreeMap;

use super::{
    cells::{
        Verdict, events_per_run, path_cell, ratio, redirected_share, rows, targets_met, verdict,
    },
    mode,
    table::{render, render_markdown, render_markdown_full},
};
use crate::{
    model::{
        AppSample, AppsConfig, AppsResults, GuardStatus, Path, Placement, Saved, WorkloadInfo,
    },
    report::text::fmt_value,
};

fn sample(rep: u32, placement: &str, path: Path, workload: &str, value: Option<f64>) -> AppSample {
    AppSample {
        rep,
        placement: placement.into(),
        path,
        workload: workload.into(),
        value,
        latency_us: None,
        secs: 1.0,
        failure: value
            .is_none()
            .then(|| "streamcheck: 0 of 1 connections exact".into()),
        skipped: false,
        wire_bytes: Some(1000),
        counters: BTreeMap::new(),
    }
}

/// Two workloads, three reps, cross-CPU only: `fast` gains 1.5-2x; `slow` loses every
/// rep; `lossy` fails bypassed and through the minimal redirect.
fn run() -> AppsResults {
    let config = AppsConfig {
        quick: false,
        reps: 3,
        placements: vec![Placement::cross_cpu()],
        minimal: true,
        agent_args: Vec::new(),
        workloads: vec!["fast".into(), "slow".into(), "lossy".into()],
    };
    let infos = ["fast", "slow", "lossy"]
        .map(|n| WorkloadInfo {
            name: n.into(),
            what: format!("{n}-client (a) -> {n}-server (b)"),
            unit: "req/s".into(),
        })
        .to_vec();
    let mut r = AppsResults::new(config, Default::default(), infos);
    r.agent_mode = mode::decide(GuardStatus {
        attached: false,
        read_guard: false,
        refused: Some("no read guard".into()),
    });
    let p = "cross-cpu";
    for (rep, normal, bypass, minimal) in [
        (0, 100.0, 150.0, 160.0),
        (1, 110.0, 220.0, 170.0),
        (2, 90.0, 170.0, 150.0),
    ] {
        r.samples
            .push(sample(rep, p, Path::Default, "fast", Some(normal)));
        let mut b = sample(rep, p, Path::Bypass, "fast", Some(bypass));
        b.counters = BTreeMap::from([
            ("redirected_bytes".to_owned(), 900),
            ("passed_bytes".to_owned(), 100),
            ("paired_pod".to_owned(), 4),
            ("resumed".to_owned(), u64::from(rep)),
            ("sockets_inserted".to_owned(), 8),
        ]);
        b.latency_us = Some(50.0);
        r.samples.push(b);
        r.samples
            .push(sample(rep, p, Path::Minimal, "fast", Some(minimal)));
        r.samples
            .push(sample(rep, p, Path::Default, "slow", Some(normal)));
        r.samples
            .push(sample(rep, p, Path::Bypass, "slow", Some(normal * 0.6)));
        r.samples
            .push(sample(rep, p, Path::Default, "lossy", Some(normal)));
        r.samples.push(sample(rep, p, Path::Bypass, "lossy", None));
        let mut m = sample(rep, p, Path::Minimal, "lossy", None);
        if rep > 0 {
            m.skipped = true;
            m.failure = Some("not run: hung in an earlier repetition".into());
        }
        r.samples.push(m);
    }
    r
}

#[test]
fn ratio_of_medians_and_spread_of_per_rep_ratios() {
    let r = run();
    let x = ratio(&r, "cross-cpu", "fast", Path::Bypass).unwrap();
    // Medians 170 / 100; per rep 1.5, 2.0, 1.889.
    assert!((x.of_medians - 1.7).abs() < 1e-9);
    assert!((x.per_rep.min - 1.5).abs() < 1e-9 && (x.per_rep.max - 2.0).abs() < 1e-9);
    assert_eq!(x.per_rep.n, 3);
    assert!(ratio(&r, "same-cpu", "fast", Path::Bypass).is_none());
    assert!(ratio(&r, "cross-cpu", "lossy", Path::Bypass).is_none());
}

#[test]
fn verdicts_against_the_target() {
    let r = run();
    let rows = rows(&r, "cross-cpu");
    let v: Vec<Verdict> = rows.iter().map(|r| r.verdict).collect();
    assert_eq!(v, [Verdict::Faster, Verdict::Slower, Verdict::Failed]);
    assert_eq!(targets_met(&rows), (1, 3));
    // A spread that holds 1.0 is within.
    let mut x = ratio(&r, "cross-cpu", "fast", Path::Bypass).unwrap();
    x.per_rep.min = 0.97;
    let cell = path_cell(&r, "cross-cpu", "fast", Path::Bypass);
    assert_eq!(verdict(&cell, Some(&x)), Verdict::Within);
    assert_eq!(verdict(&cell, None), Verdict::NoData);
    assert_eq!(Verdict::Within.target_met(), Some(true));
    assert_eq!(Verdict::NoData.target_met(), None);
}

#[test]
fn cells_count_failures_and_latency() {
    let r = run();
    let lossy = path_cell(&r, "cross-cpu", "lossy", Path::Bypass);
    assert_eq!((lossy.runs, lossy.failed), (3, 3));
    assert!(lossy.summary.is_none());
    assert!(lossy.first_failure.unwrap().contains("0 of 1"));
    let hung = path_cell(&r, "cross-cpu", "lossy", Path::Minimal);
    assert_eq!((hung.runs, hung.failed, hung.skipped), (3, 1, 2));
    assert_eq!(
        events_per_run(&r, "cross-cpu", "fast"),
        [("paired_pod".to_owned(), 4.0), ("resumed".to_owned(), 1.0)]
    );
    assert!(events_per_run(&r, "cross-cpu", "slow").is_empty());
    let fast = path_cell(&r, "cross-cpu", "fast", Path::Bypass);
    assert_eq!(fast.latency_us, Some(50.0));
    assert_eq!(fast.summary.unwrap().median, 170.0);
    let share = redirected_share(&r, "cross-cpu", "fast").unwrap();
    assert!((share - 0.9).abs() < 1e-9);
    assert_eq!(redirected_share(&r, "cross-cpu", "slow"), None);
}

#[test]
fn text_table_says_the_mode_the_ratios_and_the_failures() {
    let t = render(&run());
    assert!(t.contains("agent run WITH --allow-unguarded"), "{t}");
    assert!(
        t.contains(
            "== cross-cpu: pod a (clients, backends) on CPU 0, pod b (servers, proxies) on CPU 1 =="
        ),
        "{t}"
    );
    let fast = t
        .lines()
        .find(|l| l.trim_start().starts_with("fast"))
        .unwrap();
    assert!(fast.contains("100 [90.0-110]"), "{fast}");
    assert!(fast.contains("1.70x [1.50-2.00]"), "{fast}");
    assert!(fast.contains("faster") && fast.contains("90.0%"), "{fast}");
    let slow = t
        .lines()
        .find(|l| l.trim_start().starts_with("slow"))
        .unwrap();
    assert!(slow.contains("0.60x") && slow.contains("SLOWER"), "{slow}");
    let lossy = t
        .lines()
        .find(|l| l.trim_start().starts_with("lossy"))
        .unwrap();
    assert!(
        lossy.contains("failed 3/3") && lossy.contains("failed 1/1, 2 not run"),
        "{lossy}"
    );
    assert!(lossy.contains("FAILED"), "{lossy}");
    assert!(t.contains("target (bypass >= 1.0x the normal path within the spread): 1 of 3"));
    assert!(
        t.contains("lossy cross-cpu bypass: failed 3/3: streamcheck"),
        "{t}"
    );
    assert!(
        t.contains("lossy cross-cpu minimal: failed 1/1, 2 not run: streamcheck"),
        "{t}"
    );
    assert!(
        t.contains("    fast              paired_pod 4.00, resumed 1.00"),
        "{t}"
    );
    assert!(t.contains("fast-client (a) -> fast-server (b)"), "{t}");
    assert!(t.contains("normal        -  bypass     50.0 (-)"), "{t}");
}

#[test]
fn markdown_table_for_the_readme() {
    let md = render_markdown(&run());
    let mut lines = md.lines().filter(|l| l.starts_with('|'));
    assert_eq!(
        lines.next().unwrap(),
        "| workload | unit | cross cpu: normal path | bypass ÷ normal | minimal ÷ normal |"
    );
    assert_eq!(lines.next().unwrap(), "|---|---|---:|---:|---:|");
    assert_eq!(
        lines.next().unwrap(),
        "| `fast` | req/s | 100 | 1.70× (1.50–2.00) | 1.60× (1.55–1.67) |"
    );
    assert_eq!(
        lines.next().unwrap(),
        "| `slow` | req/s | 100 | **0.60×** (0.60–0.60) | — |"
    );
    assert_eq!(
        lines.next().unwrap(),
        "| `lossy` | req/s | 100 | **failed 3/3** | **failed 1/1, 2 not run** |"
    );
    assert!(md.starts_with("agent run WITH --allow-unguarded"));
    assert!(
        render_markdown_full(&run()).contains("| `slow` | slow-client (a) -> slow-server (b) |")
    );
}

#[test]
fn values_keep_three_digits() {
    for (v, s) in [
        (61234.4, "61234"),
        (312.2, "312"),
        (19.44, "19.4"),
        (4.531, "4.53"),
    ] {
        assert_eq!(fmt_value(v), s);
    }
}

#[test]
fn json_round_trips_and_is_told_apart() {
    let r = run();
    let text = serde_json::to_string(&r).unwrap();
    assert_eq!(Saved::parse(&text).unwrap(), Saved::Apps(r));
    assert!(!matches!(
        Saved::parse(r#"{"schema": 1}"#),
        Ok(Saved::Apps(_))
    ));
}

#[test]
fn a_busy_machine_is_warned_about() {
    assert_eq!(super::busy("0.40 0.30 0.20"), None);
    let w = super::busy("2.50 1.00 0.50").unwrap();
    assert!(
        w.starts_with("load average 2.50 1.00 0.50 at the start (above 1.5)"),
        "{w}"
    );
}
