//! Real applications through the bypass (issue 20): each workload's own server and
//! client between the two pods with the agent running, every byte checked end to end
//! (a digest, an echo compared byte for byte, or the application's own accounting),
//! and the agent's counters showing the connections paired and, where the datapath's
//! rules say the bytes go socket to socket, redirected bytes of at least the payload.
//!
//! Debian's redis, nginx, PostgreSQL, iperf3 and HAProxy (`cargo xtask setup`), and the
//! suite's own Go, Java and Node.js programs (`test/testbed/apps/`, built by `cargo xtask
//! test`), started through `testbed::apps`. `BYPASS_APPS_NO_AGENT=1` runs them without
//! the agent, to check a workload on its own.

use crate::support::privileged;

// The workloads by application, one file each under tests/apps/; the tests below name
// them, so every test keeps its name in the harness.
pub mod go;
pub mod haproxy;
pub mod iperf;
pub mod nginx;
pub mod postgres;
pub mod redis;
pub mod runtimes;
pub mod support;

use anyhow::Result;
use support::app_test;
use testbed::apps::{
    go as goapps, haproxy as haproxyapp, iperf as iperfapp, java, nginx as nginxapp, node,
    postgres as postgresapp, redis as redisapp,
};

// -------------------------------------------------------------------------------------
// Redis (tests/apps/redis.rs).

#[test]
fn redis_benchmark_completes() -> Result<()> {
    app_test!(redisapp::NEEDS);
    redis::benchmark_completes()
}

#[test]
fn redis_pipelined_set_get_exact() -> Result<()> {
    app_test!(redisapp::NEEDS);
    redis::pipelined_set_get_exact()
}

// -------------------------------------------------------------------------------------
// nginx (tests/apps/nginx.rs).

#[test]
fn nginx_download_64mib_exact() -> Result<()> {
    app_test!(nginxapp::NEEDS);
    nginx::download_64mib_exact()
}

#[test]
fn nginx_https_download_64mib_exact() -> Result<()> {
    app_test!(nginxapp::NEEDS);
    nginx::https_download_64mib_exact()
}

#[test]
fn nginx_keep_alive_requests_complete() -> Result<()> {
    app_test!(nginxapp::NEEDS);
    nginx::keep_alive_requests_complete()
}

#[test]
fn nginx_connection_per_request_complete() -> Result<()> {
    app_test!(nginxapp::NEEDS);
    nginx::connection_per_request_complete()
}

// -------------------------------------------------------------------------------------
// PostgreSQL (tests/apps/postgres.rs).

#[test]
fn pgbench_tpcb_all_transactions() -> Result<()> {
    app_test!(postgresapp::NEEDS);
    postgres::tpcb_all_transactions()
}

#[test]
fn pgbench_connection_per_transaction_all_transactions() -> Result<()> {
    app_test!(postgresapp::NEEDS);
    postgres::connection_per_transaction_all_transactions()
}

// -------------------------------------------------------------------------------------
// iperf3 (tests/apps/iperf.rs).

#[test]
fn iperf3_bulk_one_stream() -> Result<()> {
    app_test!(iperfapp::NEEDS);
    iperf::bulk_one_stream()
}

#[test]
fn iperf3_small_writes() -> Result<()> {
    app_test!(iperfapp::NEEDS);
    iperf::small_writes()
}

#[test]
fn iperf3_four_streams() -> Result<()> {
    app_test!(iperfapp::NEEDS);
    iperf::four_streams()
}

#[test]
fn iperf3_reverse() -> Result<()> {
    app_test!(iperfapp::NEEDS);
    iperf::reverse()
}

// -------------------------------------------------------------------------------------
// Go (tests/apps/go.rs).

#[test]
fn go_io_copy_echo_exact() -> Result<()> {
    app_test!(goapps::ALL);
    go::io_copy_echo_exact()
}

#[test]
fn go_read_write_echo_exact() -> Result<()> {
    app_test!(goapps::ALL);
    go::read_write_echo_exact()
}

#[test]
fn go_l4_proxy_io_copy_exact() -> Result<()> {
    app_test!(goapps::ALL);
    go::l4_proxy_io_copy_exact()
}

#[test]
fn go_l4_proxy_read_write_exact() -> Result<()> {
    app_test!(goapps::ALL);
    go::l4_proxy_read_write_exact()
}

#[test]
fn go_http_reverse_proxy_exact() -> Result<()> {
    app_test!(goapps::ALL);
    go::http_reverse_proxy_exact()
}

#[test]
fn go_grpc_bidi_stream_exact() -> Result<()> {
    app_test!(goapps::ALL);
    go::grpc_bidi_stream_exact()
}

// -------------------------------------------------------------------------------------
// HAProxy (tests/apps/haproxy.rs).

#[test]
fn haproxy_splice_auto_echo_exact() -> Result<()> {
    app_test!(haproxyapp::NEEDS);
    haproxy::splice_auto_echo_exact()
}

#[test]
fn haproxy_splice_forced_echo_exact() -> Result<()> {
    app_test!(haproxyapp::NEEDS);
    haproxy::splice_forced_echo_exact()
}

#[test]
fn haproxy_no_splice_echo_exact() -> Result<()> {
    app_test!(haproxyapp::NEEDS);
    haproxy::no_splice_echo_exact()
}

// -------------------------------------------------------------------------------------
// Java and Node.js (tests/apps/runtimes.rs).

#[test]
fn java_nio_echo_exact() -> Result<()> {
    app_test!(java::NEEDS);
    runtimes::java_nio_echo_exact()
}

#[test]
fn nodejs_pipe_proxy_echo_exact() -> Result<()> {
    app_test!(node::NEEDS);
    runtimes::nodejs_pipe_proxy_echo_exact()
}
