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

pub mod go;
pub mod haproxy;
pub mod iperf;
pub mod nginx;
pub mod postgres;
pub mod redis;
pub mod runtimes;
pub mod support;
