//! Pure: from [`Results`](crate::model::Results) to the table (size, bypass, default,
//! ratio, floor), the sockperf percentiles, the agent's cost, and PASS/MISS for each
//! target. Ratios are of medians measured in the same run; targets are reported, never
//! asserted.
//!
//! [`cells`] computes what the tables show, [`targets`] the verdicts; [`text`] renders
//! the terminal report and [`markdown`] the README's tables and snippet.

pub mod cells;
pub mod markdown;
pub mod targets;
pub mod text;

pub use cells::{
    AgentCost, HopTotals, PctRow, Row, agent_cost, cell, hop_totals, pct_row, prog_cost, rows,
    size_label,
};
pub use markdown::{render_markdown, render_snippet};
pub use targets::{
    TARGET_AGENT_RSS_BYTES, TARGET_BW_LARGE_SIZE, TARGET_BW_LARGE_VS_DEFAULT, TARGET_BW_VS_DEFAULT,
    TARGET_LAT_VS_DEFAULT, TARGET_LAT_VS_FLOOR, TARGET_LAT_VS_MINIMAL, Target, targets,
};
pub use text::render;

#[cfg(test)]
pub(crate) mod tests;
