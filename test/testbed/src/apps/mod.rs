//! Real applications between the pods: each workload's server started in a pod and its
//! client run in another, with what the client saw parsed into a report. The privileged
//! `apps` tests assert on these reports and the agent's counters; a bench can run the
//! same workloads for time.
//!
//! Servers are [`AppServer`] guards (their whole process group killed on drop, their
//! output in a log file shown on failure), ready only once observed ready (listening, a
//! ready file, a status file); each workload's constructor returns one as a
//! [`Listening`], with its work directory and address. Clients run to their end or are
//! killed at a timeout.
//! Debian's programs come from `cargo xtask setup`, the suite's own (Go, Java, Node.js,
//! `test/testbed/apps/`) from `cargo xtask test`; [`bins`] finds both and says what is
//! missing.

pub mod bins;
pub mod client;
pub mod gate;
pub mod go;
pub mod haproxy;
pub mod http;
pub mod iperf;
pub mod java;
pub mod listening;
pub mod nginx;
pub mod node;
pub mod payload;
pub mod postgres;
pub mod redis;
pub mod server;
pub mod workdir;

use std::time::Duration;

pub use bins::Needs;
pub use client::On;
pub use gate::Gate;
pub use server::{AppServer, Listening};
pub use workdir::WorkDir;

/// How long a server may take to be ready (a JVM starting, initdb and PostgreSQL's
/// recovery under load from the other engineer's build): a net.
pub const READY_TIMEOUT: Duration = crate::steps::NET;
