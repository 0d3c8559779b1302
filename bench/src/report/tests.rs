//! The report's unit tests, on one sample run (the plot's tests use it too).

use super::{markdown::short_commit, *};
use crate::model::{
    AgentProbe, Config, Environment, Path, PctSample, Percentiles, Placement, ProbePhase, Prog,
    ProgSample, Results, SCHEMA, Sample, Scenario, Test,
};

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
                for (test, value) in [(Test::TcpLat, lat), (Test::TcpBw, bw)] {
                    let s = Sample::bare(rep, "cross-cpu", path, test, size, value + jitter);
                    samples.push(s);
                }
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
        percentiles: vec![PctSample::new(
            0,
            "cross-cpu",
            Path::Bypass,
            64,
            Percentiles {
                avg_ns: 5000.0,
                p50_ns: 4900.0,
                p99_ns: 8000.0,
                p999_ns: 20000.0,
                observations: 1000,
            },
        )],
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
        text.contains("sk_msg    bypass 250 ns x 1000") && text.contains("minimal 130 ns x 2000"),
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
