//! Many connections at once, each side writing right after connect/accept.

use anyhow::{Result, ensure};
use serde_json::Value;

use super::support::both;
use crate::support::{num, privileged, two_pods};

/// `connections` connections, `concurrency` at a time, each side writing `bytes` right
/// after connect/accept; both runs byte-exact.
fn burst(port: u16, connections: u64, concurrency: u64, bytes: &str) -> Result<()> {
    let pods = two_pods()?;
    let (c, k) = (connections.to_string(), concurrency.to_string());
    let (tcp, bypass) = both(
        &pods,
        port,
        &[
            "--case",
            "burst",
            "--connections",
            &c,
            "--concurrency",
            &k,
            "--bytes",
            bytes,
        ],
    )?;
    let each = testbed::peer::parse_size(bytes).map_err(anyhow::Error::msg)?;
    for (name, r) in [("normal path", &tcp), ("bypassed", &bypass)] {
        for side in [&r.client, &r.server] {
            ensure!(
                num(side, "failures") == 0 && num(side, "received") == connections * each,
                "{name}: {side}"
            );
        }
    }
    let g = Value::Object(bypass.grew.clone());
    ensure!(
        num(&g, "sockets_inserted") == 2 * connections && num(&g, "insert_failures") == 0,
        "{g}"
    );
    Ok(())
}

#[test]
fn thousand_concurrent_streams() -> Result<()> {
    privileged!();
    burst(5431, 1000, 1000, "256K")
}

#[test]
fn ten_thousand_connections_writing_at_once_both_ways() -> Result<()> {
    privileged!();
    burst(5433, 10_000, 64, "4K")
}
