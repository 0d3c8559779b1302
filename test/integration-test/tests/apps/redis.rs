//! Redis: redis-benchmark runs to its end, and a pipeline of SETs and GETs of random
//! binary values (up to 1 MiB, across the 64 KiB boundary) reads every value back byte
//! for byte.

use anyhow::{Result, ensure};
use testbed::apps::{
    Gate,
    redis::{self, Benchmark, RespCheck},
};

use super::support::{Bed, app_test};

const PORT: u16 = 6379;
/// redis-benchmark: connections, and requests per test (SET, GET).
const BENCH_CLIENTS: u32 = 8;
const BENCH_REQUESTS: u32 = 20_000;
/// The pipelined check: value sizes (bytes), and values of each.
const VALUE_SIZES: [u64; 10] = [
    0,
    1,
    100,
    1000,
    16_384,
    65_535,
    65_536,
    65_537,
    300_000,
    1 << 20,
];
const VALUES_PER_SIZE: u32 = 3;
/// The net for each client run (see `testbed::steps::NET`): a hang, never a pace.
const CLIENT_TIMEOUT: std::time::Duration = testbed::steps::NET;

#[test]
fn benchmark_completes() -> Result<()> {
    app_test!(redis::NEEDS);
    let bed = Bed::new()?;
    let mut redis = redis::start(bed.b(), bed.pods.b.v4_addr(PORT))?;
    let commands_before = redis::info_stat(bed.a(), redis.addr(), "total_commands_processed")?;
    let bench = Benchmark {
        clients: BENCH_CLIENTS,
        requests: BENCH_REQUESTS,
        pipeline: 1,
        data_size: 3,
        tests: vec!["set".into(), "get".into()],
    };
    let mark = bed.mark()?;
    let rows = bench.run(bed.a(), redis.addr(), CLIENT_TIMEOUT)?;
    let delta = bed.since(&mark)?;
    redis.server().ensure_running()?;
    eprintln!("redis-benchmark: {rows:?}");
    let commands =
        redis::info_stat(bed.a(), redis.addr(), "total_commands_processed")? - commands_before;
    // Every request of both tests reached the server (the INFO call itself is one more).
    ensure!(
        commands > 2 * u64::from(BENCH_REQUESTS),
        "the server processed {commands} commands, want more than {}",
        2 * BENCH_REQUESTS
    );
    // The replies go socket to socket: "+OK\r\n" (5 B) for each SET, "$3\r\nxxx\r\n"
    // (9 B) for each GET. The requests' direction is not asserted: redis-benchmark
    // sends as soon as it is connected, and a client that beats its server's pairing
    // keeps that direction on TCP by design.
    delta.expect_bypassed(
        "redis-benchmark",
        u64::from(BENCH_CLIENTS),
        14 * u64::from(BENCH_REQUESTS),
    )
}

#[test]
fn pipelined_set_get_exact() -> Result<()> {
    app_test!(redis::NEEDS);
    let bed = Bed::new()?;
    let mut redis = redis::start(bed.b(), bed.pods.b.v4_addr(PORT))?;
    let check = RespCheck {
        sizes: VALUE_SIZES.to_vec(),
        per_size: VALUES_PER_SIZE,
    };
    let gate = Gate::new()?;
    let mark = bed.mark()?;
    let report = check.run_gated(bed.a(), redis.addr(), &gate, || bed.wait_paired(&mark, 1))?;
    let delta = bed.since(&mark)?;
    redis.server().ensure_running()?;
    ensure!(
        report.failures.is_empty() && report.exact == report.values,
        "{} of {} values came back exact: {:#?}",
        report.exact,
        report.values,
        report.failures
    );
    eprintln!(
        "respcheck: {} values ({} B) exact, {} B written, {} B read, {:.2} s",
        report.values, report.value_bytes, report.bytes_written, report.bytes_read, report.secs
    );
    // Paired before its first byte: both directions go socket to socket.
    delta.expect_bypassed("respcheck", 1, report.bytes_written + report.bytes_read)
}
