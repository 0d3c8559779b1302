//! HAProxy: Debian's `haproxy` in a pod, in TCP mode in front of one backend server,
//! with kernel splicing as configured (`option splice-auto`, or `splice-request` and
//! `splice-response` to force it): bytes move socket to pipe to socket with
//! splice(2), never through HAProxy's buffers.

use std::{net::SocketAddr, process::Command};

use anyhow::Result;

use super::{
    bins::{self, Needs},
    client::On,
    server::Listening,
    workdir::WorkDir,
};

/// What the HAProxy workloads run (the echo backend and the checking client are the
/// suite's Go programs).
pub const NEEDS: Needs = Needs {
    system: &["haproxy"],
    built: &["go/echo", "go/streamcheck"],
};

/// When HAProxy splices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Splice {
    /// `option splice-auto`: when its heuristics say a transfer is large.
    Auto,
    /// `option splice-request` and `option splice-response`: always.
    Forced,
    /// No splicing: through its buffers.
    Off,
}

impl Splice {
    fn options(self) -> &'static str {
        match self {
            Self::Auto => "    option splice-auto\n",
            Self::Forced => "    option splice-request\n    option splice-response\n",
            Self::Off => "",
        }
    }
}

/// Starts HAProxy on `on`: listens on `listen`, forwards each connection to `backend`.
pub fn start(
    on: On<'_>,
    listen: SocketAddr,
    backend: SocketAddr,
    splice: Splice,
) -> Result<Listening> {
    let dir = WorkDir::new("haproxy")?;
    let conf = dir.write("haproxy.cfg", config(listen, backend, splice))?;
    let mut cmd = Command::new(bins::system("haproxy")?);
    // -db: foreground, no daemon; -f: only our configuration.
    cmd.arg("-db").arg("-f").arg(&conf);
    Listening::start(on, cmd, dir, "haproxy", listen)
}

/// The configuration: TCP mode, one frontend, one backend server; a line per
/// connection in its log (`option tcplog`: times, bytes and how it ended), which a
/// failing test quotes. Its timeouts are inactivity timeouts (`client`, `server`: no
/// byte for that long) and the connect's net, all [`crate::steps::NO_PROGRESS`]: a
/// stall, never a pace.
fn config(listen: SocketAddr, backend: SocketAddr, splice: Splice) -> String {
    let idle = crate::steps::NO_PROGRESS.as_secs();
    format!(
        "global
    maxconn 1000
    log stderr format raw local0 info
defaults
    mode tcp
    log global
    option tcplog
    timeout connect {idle}s
    timeout client {idle}s
    timeout server {idle}s
{splice}frontend front
    bind {listen}
    default_backend back
backend back
    server echo {backend}
",
        splice = splice.options()
    )
}
