//! Pure: the targets and their PASS/MISS verdicts on one run.

use crate::{
    model::{Results, Test},
    report::cells::{Row, agent_cost, rows, size_label},
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
