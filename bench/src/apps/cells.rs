//! Pure: what the apps tables show, from the raw samples. Per workload and placement,
//! each path's rates (median and range over repetitions, failed runs counted apart),
//! the ratios of the bypass and of the minimal redirect to the normal path, and a
//! verdict against the target (no workload slower than the normal path).
//!
//! A ratio is of the medians; its spread is the range of the per-repetition ratios, each
//! of two runs from adjacent blocks of the same repetition, so slow drift of the machine
//! cancels out of it.

use std::collections::BTreeMap;

use crate::{
    model::{AppSample, AppsResults, Path},
    stats::{Summary, summarize},
};

/// One path's runs of one workload in one placement.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PathCell {
    /// The rates of the runs that succeeded.
    pub summary: Option<Summary>,
    /// Mean latency, µs, median over runs that reported one.
    pub latency_us: Option<f64>,
    /// Runs, not-run ones included.
    pub runs: usize,
    /// Runs that failed.
    pub failed: usize,
    /// Runs not run after an earlier one hung.
    pub skipped: usize,
    /// The first failure's message.
    pub first_failure: Option<String>,
}

/// A path's rate over the normal path's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ratio {
    /// Of the medians.
    pub of_medians: f64,
    /// The per-repetition ratios (median, min, max, how many).
    pub per_rep: Summary,
}

/// How the bypass compares with the normal path, against the target "no workload
/// slower than the normal path (ratio ≥ 1.0 within the run's spread)".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every repetition faster than the normal path.
    Faster,
    /// The spread of the per-repetition ratios holds 1.0.
    Within,
    /// Every repetition slower: the target is missed.
    Slower,
    /// A bypassed run failed (bytes lost or wrong, a request failed, a timeout).
    Failed,
    /// No pair of runs to compare.
    NoData,
}

impl Verdict {
    /// Its word in the tables.
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Faster => "faster",
            Verdict::Within => "~same",
            Verdict::Slower => "SLOWER",
            Verdict::Failed => "FAILED",
            Verdict::NoData => "-",
        }
    }

    /// Whether the target holds (`None`: nothing to judge).
    pub fn target_met(self) -> Option<bool> {
        match self {
            Verdict::Faster | Verdict::Within => Some(true),
            Verdict::Slower | Verdict::Failed => Some(false),
            Verdict::NoData => None,
        }
    }
}

/// One workload in one placement: every path, and the ratios.
#[derive(Clone, Debug, PartialEq)]
pub struct AppRow {
    /// Workload name.
    pub workload: String,
    /// Unit of its rate.
    pub unit: String,
    /// The normal path (no agent).
    pub normal: PathCell,
    /// The bypass (the agent running).
    pub bypass: PathCell,
    /// The minimal reference redirect.
    pub minimal: PathCell,
    /// bypass ÷ normal.
    pub bypass_ratio: Option<Ratio>,
    /// minimal ÷ normal.
    pub minimal_ratio: Option<Ratio>,
    /// The share of the bytes the bypassed runs' datapath saw that it redirected
    /// (`redirected_bytes / (redirected_bytes + passed_bytes)`, summed over the runs).
    pub redirected_share: Option<f64>,
    /// The bypass against the target.
    pub verdict: Verdict,
}

fn samples<'a>(
    r: &'a AppsResults,
    placement: &'a str,
    workload: &'a str,
    path: Path,
) -> impl Iterator<Item = &'a AppSample> + 'a {
    r.samples
        .iter()
        .filter(move |s| s.placement == placement && s.workload == workload && s.path == path)
}

/// One path's cell.
pub fn path_cell(r: &AppsResults, placement: &str, workload: &str, path: Path) -> PathCell {
    let runs: Vec<&AppSample> = samples(r, placement, workload, path).collect();
    let values: Vec<f64> = runs.iter().filter_map(|s| s.value).collect();
    let latencies: Vec<f64> = runs.iter().filter_map(|s| s.latency_us).collect();
    PathCell {
        summary: summarize(&values),
        latency_us: summarize(&latencies).map(|s| s.median),
        runs: runs.len(),
        failed: runs
            .iter()
            .filter(|s| s.value.is_none() && !s.skipped)
            .count(),
        skipped: runs.iter().filter(|s| s.skipped).count(),
        first_failure: runs
            .iter()
            .filter(|s| !s.skipped)
            .find_map(|s| s.failure.clone()),
    }
}

/// `path` ÷ the normal path for one workload and placement: of the medians, and per
/// repetition where both ran.
pub fn ratio(r: &AppsResults, placement: &str, workload: &str, path: Path) -> Option<Ratio> {
    let by_rep = |p: Path| -> BTreeMap<u32, f64> {
        samples(r, placement, workload, p)
            .filter_map(|s| Some((s.rep, s.value?)))
            .collect()
    };
    let (this, normal) = (by_rep(path), by_rep(Path::Default));
    let per_rep: Vec<f64> = this
        .iter()
        .filter_map(|(rep, v)| Some(v / normal.get(rep)?))
        .collect();
    let median = |m: &BTreeMap<u32, f64>| {
        summarize(&m.values().copied().collect::<Vec<_>>()).map(|s| s.median)
    };
    Some(Ratio {
        of_medians: median(&this)? / median(&normal)?,
        per_rep: summarize(&per_rep)?,
    })
}

/// The bypass's verdict: failed when a bypassed run failed, else by where 1.0 lies in
/// the spread of the per-repetition ratios.
pub fn verdict(bypass: &PathCell, ratio: Option<&Ratio>) -> Verdict {
    if bypass.failed > 0 {
        return Verdict::Failed;
    }
    match ratio {
        None => Verdict::NoData,
        Some(r) if r.per_rep.max < 1.0 => Verdict::Slower,
        Some(r) if r.per_rep.min > 1.0 => Verdict::Faster,
        Some(_) => Verdict::Within,
    }
}

/// The share of the bypassed runs' bytes that were redirected.
pub fn redirected_share(r: &AppsResults, placement: &str, workload: &str) -> Option<f64> {
    let (mut redirected, mut passed, mut any) = (0u64, 0u64, false);
    for s in samples(r, placement, workload, Path::Bypass) {
        if let (Some(rd), Some(ps)) = (s.counter("redirected_bytes"), s.counter("passed_bytes")) {
            redirected += rd;
            passed += ps;
            any = true;
        }
    }
    (any && redirected + passed > 0).then(|| redirected as f64 / (redirected + passed) as f64)
}

/// The rows of one placement, one per workload of the run.
pub fn rows(r: &AppsResults, placement: &str) -> Vec<AppRow> {
    r.workloads
        .iter()
        .map(|w| {
            let name = w.name.as_str();
            let bypass = path_cell(r, placement, name, Path::Bypass);
            let bypass_ratio = ratio(r, placement, name, Path::Bypass);
            AppRow {
                workload: w.name.clone(),
                unit: w.unit.clone(),
                normal: path_cell(r, placement, name, Path::Default),
                minimal: path_cell(r, placement, name, Path::Minimal),
                minimal_ratio: ratio(r, placement, name, Path::Minimal),
                redirected_share: redirected_share(r, placement, name),
                verdict: verdict(&bypass, bypass_ratio.as_ref()),
                bypass,
                bypass_ratio,
            }
        })
        .collect()
}

/// Counters of `status --json` that are not bytes, messages or sockets: the datapath's
/// events (pairings, moves to TCP and back, leaving the SockHash, ...).
fn is_event(key: &str) -> bool {
    !(key.contains("bytes") || key.contains("messages") || key.starts_with("sockets"))
}

/// The datapath's events in the bypassed runs of one workload and placement, each
/// counter that grew as its mean per run, by name.
pub fn events_per_run(r: &AppsResults, placement: &str, workload: &str) -> Vec<(String, f64)> {
    let runs: Vec<&AppSample> = samples(r, placement, workload, Path::Bypass)
        .filter(|s| !s.skipped && !s.counters.is_empty())
        .collect();
    let mut sums: BTreeMap<&str, u64> = BTreeMap::new();
    for s in &runs {
        for (k, v) in &s.counters {
            if is_event(k) && *v > 0 {
                *sums.entry(k.as_str()).or_default() += v;
            }
        }
    }
    sums.into_iter()
        .map(|(k, v)| (k.to_owned(), v as f64 / runs.len() as f64))
        .collect()
}

/// How many rows of `rows` meet the target, and how many were judged.
pub fn targets_met(rows: &[AppRow]) -> (usize, usize) {
    let judged: Vec<bool> = rows.iter().filter_map(|r| r.verdict.target_met()).collect();
    (judged.iter().filter(|&&m| m).count(), judged.len())
}
