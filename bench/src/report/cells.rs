//! Pure: the numbers the tables show, from the raw samples: rows of summaries per size
//! and path, sockperf percentile rows, the agent's cost, the hop counters and each
//! program's cost per run.

use std::collections::BTreeMap;

use crate::{
    model::{Path, PctSample, ProbePhase, Prog, Results, Test},
    stats::{Summary, summarize},
};

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
