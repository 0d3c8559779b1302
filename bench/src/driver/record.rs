//! Pure: one tool run's output into samples of the results, with a warning for what
//! looks wrong (no round trip, bytes on the wire that contradict the path); a bypassed
//! block's counters into a hop sample, with a warning for each hop not paired.

use std::collections::BTreeMap;

use crate::{
    model::{Config, Counted, HopSample, Path, Placement, Results, Sample, Test},
    qperf, scenario,
};

/// What the veths and the agent's counters showed over one qperf run.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Observed {
    /// Bytes on the pods' veths.
    pub(crate) wire: Option<u64>,
    /// What the agent counted.
    pub(crate) delta: Option<Counted>,
}

impl Observed {
    /// What grew between `before` and `after`, each (wire bytes, agent counters) where
    /// they could be read.
    pub(crate) fn between(
        before: (Option<u64>, Option<Counted>),
        after: (Option<u64>, Option<Counted>),
    ) -> Self {
        Self {
            wire: before.0.zip(after.0).map(|(a, b)| b.saturating_sub(a)),
            delta: before.1.zip(after.1).map(|(a, b)| b.since(a)),
        }
    }
}

/// What a qperf run is called in warnings, progress and the raw log (rep, placement,
/// path and size in `at`).
pub(crate) fn qperf_what(at: (u32, &Placement, Path, u32)) -> String {
    let (rep, p, path, size) = at;
    format!("qperf rep {rep} {} {} size {size}", p.name, path.name())
}

/// One qperf client run's output, `out`, into samples of `results` (rep, placement,
/// path and size in `at`; seconds and tests of its config), with a warning for what
/// looks wrong; returns the progress line, `None` when the client gave no output.
pub(crate) fn record_qperf(
    results: &mut Results,
    at: (u32, &Placement, Path, u32),
    out: Option<&str>,
    observed: Observed,
) -> Option<String> {
    let out = out?;
    let what = qperf_what(at);
    let (secs, tests) = (results.config.qperf_secs, results.config.tests.clone());
    Some(record_qperf_output(
        results, at, &what, secs, out, &tests, observed,
    ))
}

fn record_qperf_output(
    results: &mut Results,
    at: (u32, &Placement, Path, u32),
    what: &str,
    secs: u32,
    out: &str,
    tests: &[Test],
    observed: Observed,
) -> String {
    let (rep, p, path, size) = at;
    let mut r = match qperf::parse(out, tests) {
        Ok(r) => r,
        Err(e) => {
            results.warnings.push(format!("{what}: {e:#}"));
            return format!("{what}: unparsable");
        }
    };
    // qperf prints 0 ns when not one round trip completed (a stranded message).
    if r.latency_ns.is_some_and(|l| l <= 0.0) {
        results.warnings.push(format!(
            "{what}: tcp_lat completed no round trip in {secs} s; sample dropped"
        ));
        r.latency_ns = None;
    }
    let Observed { wire, delta } = observed;
    let payload = r.bw_bytes_per_sec.unwrap_or(0.0) * f64::from(secs);
    if let Some(w) = wire
        && let Some(problem) = wire_problem(path, w, payload, delta)
    {
        results.warnings.push(format!("{what}: {problem}"));
    }
    for (test, value) in [
        (Test::TcpLat, r.latency_ns),
        (Test::TcpBw, r.bw_bytes_per_sec),
    ] {
        let Some(value) = value else { continue };
        results.samples.push(Sample {
            wire_bytes: wire,
            redirected_bytes: delta.map(|d| d.redirected),
            passed_bytes: delta.map(|d| d.passed),
            left: delta.map(|d| d.left),
            ..Sample::bare(rep, &p.name, path, test, size, value)
        });
    }
    format!(
        "{what}: lat {}, bw {}",
        r.latency_ns
            .map_or_else(|| "-".into(), |v| format!("{:.2} us", v / 1e3)),
        r.bw_bytes_per_sec
            .map_or_else(|| "-".into(), |v| format!("{:.1} MB/s", v / 1e6)),
    )
}

/// The measured connections a bypassed block of repetition `rep` opens: one per qperf
/// size and test, one per sockperf size while sockperf runs.
pub(crate) fn block_connections(config: &Config, rep: u32) -> u64 {
    let qperf = config.sizes.len() * config.tests.len();
    let sockperf = if rep < config.sockperf_reps {
        config.sockperf_sizes.len()
    } else {
        0
    };
    (qperf + sockperf) as u64
}

/// At the end of a bypassed block (rep and placement in `at`): how the agent's counters
/// grew from `before` to `after`, into a hop sample of `results`, with a warning for
/// each hop of its scenario not paired by the block's measured connections; returns the
/// progress line, which shows the counters named in `shown`.
pub(crate) fn record_hops(
    results: &mut Results,
    at: (u32, &Placement),
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
    shown: &[&str],
) -> String {
    let (rep, p) = at;
    let connections = block_connections(&results.config, rep);
    let counters = scenario::delta(before, after);
    let scenario = results.config.scenario;
    for problem in scenario::hop_problems(scenario, connections, &counters) {
        results
            .warnings
            .push(format!("rep {rep} {} bypass: {problem}", p.name));
    }
    let shown: Vec<String> = shown
        .iter()
        .map(|&k| {
            format!(
                "{k} {}",
                counters
                    .get(k)
                    .map_or_else(|| "-".to_owned(), u64::to_string)
            )
        })
        .collect();
    results.hops.push(HopSample {
        rep,
        placement: p.name.clone(),
        connections,
        counters,
    });
    format!(
        "rep {rep} {} bypass block, {connections} measured connections: {}",
        p.name,
        shown.join(", ")
    )
}

/// What is wrong when a run's bytes on the wire contradict its path (pure): a bypassed
/// run puts only handshakes and ACK-less FINs on the wire, a default run puts every
/// payload byte there. `payload`: the bytes `tcp_bw` moved; `counted`: what the agent
/// counted over the run, where the bytes it chose to send by TCP and a connection that
/// left the SockHash (any reason) put bytes on the wire on purpose.
pub fn wire_problem(
    path: Path,
    wire: u64,
    payload: f64,
    counted: Option<Counted>,
) -> Option<String> {
    let w = wire as f64;
    let c = counted.unwrap_or_default();
    let passed = c.passed as f64;
    let redirected = (payload - passed).max(0.0);
    match path {
        // Once a connection left the SockHash (a small-message stream, a reader behind
        // its bound for --leave-after bytes) its bytes take TCP, as designed.
        Path::Bypass if c.left > 0 => None,
        Path::Bypass if w > 0.05 * redirected + 2.0 * passed && w > 1e6 => {
            Some(format!("{w:.0} bytes on the wire although bypassed"))
        }
        Path::Default if w < 0.5 * payload => Some(format!(
            "only {w:.0} bytes on the wire although not bypassed"
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counted(redirected: u64, passed: u64, left: u64) -> Option<Counted> {
        Some(Counted {
            redirected,
            passed,
            left,
        })
    }

    #[test]
    fn wire_problem_by_path() {
        // Bypassed: handshakes only, or bytes the datapath passed on purpose, are fine.
        assert_eq!(
            wire_problem(Path::Bypass, 4_000, 1e9, counted(1e9 as u64, 0, 0)),
            None
        );
        assert_eq!(
            wire_problem(Path::Bypass, 3_000_000, 1e9, counted(0, 2_000_000, 0)),
            None
        );
        let p = wire_problem(Path::Bypass, 900_000_000, 1e9, counted(0, 0, 0)).unwrap();
        assert!(p.contains("although bypassed"), "{p}");
        // A connection that left the SockHash takes TCP from then on.
        assert_eq!(
            wire_problem(Path::Bypass, 900_000_000, 1e9, counted(4_000, 0, 1)),
            None
        );
        // The normal path carries every payload byte.
        assert_eq!(wire_problem(Path::Default, 2_000_000_000, 1e9, None), None);
        let p = wire_problem(Path::Default, 1_000, 1e9, None).unwrap();
        assert!(p.contains("although not bypassed"), "{p}");
    }

    #[test]
    fn observed_is_what_grew() {
        let o = Observed::between(
            (Some(100), counted(10, 20, 1)),
            (Some(150), counted(15, 20, 3)),
        );
        assert_eq!(o.wire, Some(50));
        assert_eq!(o.delta, counted(5, 0, 2));
        let o = Observed::between((None, counted(10, 20, 0)), (Some(150), None));
        assert_eq!((o.wire, o.delta), (None, None));
    }

    #[test]
    fn hops_record_the_growth_and_show_the_named_counters() {
        let config = serde_json::from_value(serde_json::json!({
            "quick": true, "reps": 1, "sockperf_reps": 0, "qperf_secs": 1, "sockperf_secs": 1,
            "floor_secs": 1.0, "sizes": [64], "sockperf_sizes": [], "placements": [],
            "idle_secs": 0.0,
        }))
        .unwrap();
        let mut results = Results::new(config, Default::default(), Vec::new());
        let before = BTreeMap::from([("paired_pod".to_owned(), 3)]);
        let after = BTreeMap::from([("paired_pod".to_owned(), 5)]);
        let at = (1, &Placement::cross_cpu());
        let line = record_hops(
            &mut results,
            at,
            &before,
            &after,
            &["paired_pod", "passed_bytes"],
        );
        assert_eq!(
            line,
            "rep 1 cross-cpu bypass block, 2 measured connections: paired_pod 2, passed_bytes -"
        );
        assert_eq!(results.hops.len(), 1);
        assert_eq!(results.hops[0].counters["paired_pod"], 2);
    }
}
