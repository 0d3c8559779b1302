//! The demo (`cargo xtask demo`, `bypass-bench demo`): the bench at small scale, run as
//! the README's first command runs it, against the built agent. Its verdict must be
//! clean on a working bypass, and what it prints must be what happened: the connections
//! paired and bytes redirected by the agent's own counters, the bypassed bytes off the
//! pods' veths (but for a connection that left the SockHash, by design: a small-message
//! stream, a reader behind its bound) and the normal path's on them.

use anyhow::{Context as _, Result, ensure};
use bench::model::{Path, Test};
use bypass_common::Stat;
use testbed::names;

use crate::support::{PREFIX, privileged};

#[test]
fn demo_bypasses_and_says_so() -> Result<()> {
    privileged!();
    names::set_prefix(PREFIX).map_err(anyhow::Error::msg)?;
    let workspace = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let raw = tempdir("demo-raw")?;
    let results = bench::demo::run(&workspace, &raw.0).context("run the demo")?;

    let problems = bench::demo::problems(&results);
    ensure!(
        problems.is_empty(),
        "the demo says the bypass did not bypass:\n  {}\nwarnings: {:?}",
        problems.join("\n  "),
        results.warnings
    );
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    ensure!(
        results.config.placements.len() == cpus.min(2),
        "placements measured: {:?} on {cpus} CPUs",
        results.config.placements
    );
    let secs = f64::from(results.config.qperf_secs);
    for p in &results.config.placements {
        let of = |path: Path| {
            results
                .samples
                .iter()
                .filter(move |s| s.placement == p.name && s.path == path && s.test == Test::TcpBw)
        };
        // Every bypassed stream says whether its connection left the SockHash (by design,
        // counted: a 64-byte stream whose reader lags leaves as a small-message stream, a
        // stream whose reader stays behind its bound leaves past --leave-after).
        ensure!(
            of(Path::Bypass).all(|s| s.left.is_some()),
            "{}: a bypassed run without the agent's count of departures",
            p.name
        );
        // Every placement's bypassed runs were bypassed: the agent paired and redirected,
        // whether or not a connection then left (how fast a reader keeps up, and so
        // whether a stream leaves, is scheduling: with other work on the machine, as when
        // CI runs the kernel matrix beside the host's tests, every stream may leave).
        let redirected = bench::demo::counter(&results, &p.name, Stat::RedirectedBytesPod);
        ensure!(
            redirected > 0,
            "{}: the agent redirected nothing in the bypassed runs: {:?}",
            p.name,
            results.samples
        );
        let stayed = || of(Path::Bypass).filter(|s| s.left == Some(0));
        if stayed().next().is_none() {
            eprintln!(
                "{}: every bypassed stream left the SockHash (counted)",
                p.name
            );
            continue;
        }
        // What the agent says it redirected covers what qperf says it streamed.
        let streamed: f64 = stayed().map(|s| s.value * secs).sum();
        let redirected = bench::demo::counter(&results, &p.name, Stat::RedirectedBytesPod);
        ensure!(
            redirected as f64 >= 0.5 * streamed && streamed > 0.0,
            "{}: the agent redirected {redirected} bytes, qperf streamed {streamed:.0}",
            p.name
        );
        // The bypassed streams stayed off the veths; the same streams without the agent
        // did not.
        let bypass_wire: u64 = stayed().filter_map(|s| s.wire_bytes).sum();
        let tcp_wire: u64 = of(Path::Default).filter_map(|s| s.wire_bytes).sum();
        let tcp_streamed: f64 = of(Path::Default).map(|s| s.value * secs).sum();
        ensure!(
            (bypass_wire as f64) < 0.05 * streamed && tcp_wire as f64 >= 0.5 * tcp_streamed,
            "{}: veth bytes {bypass_wire} bypassed ({streamed:.0} streamed), {tcp_wire} on TCP ({tcp_streamed:.0} streamed)",
            p.name,
        );
    }
    // The table and the summary a user reads show both paths.
    let table = bench::report::render(&results);
    let moved = bench::demo::moved(&results);
    for (text, needle) in [
        (&table, "tcp_lat"),
        (&table, "tcp_bw"),
        (&table, "bypass"),
        (&table, "default"),
        (&moved, "connections paired"),
        (&moved, "on the veths (the agent stopped)"),
    ] {
        ensure!(text.contains(needle), "no {needle:?} in:\n{text}");
    }
    Ok(())
}

/// A directory under the temporary directory, removed on drop.
struct TempDir(std::path::PathBuf);

fn tempdir(what: &str) -> Result<TempDir> {
    let dir = std::env::temp_dir().join(names::resource(&names::unique_tag(), what));
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    Ok(TempDir(dir))
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
