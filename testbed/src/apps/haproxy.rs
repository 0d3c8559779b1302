//! HAProxy: Debian's `haproxy` in a pod, in TCP mode in front of one backend server,
//! with kernel splicing as configured (`option splice-auto`, or `splice-request` and
//! `splice-response` to force it): bytes move socket to pipe to socket with
//! splice(2), never through HAProxy's buffers.

use std::{net::SocketAddr, process::Command};

use anyhow::Result;

use super::{
    READY_TIMEOUT,
    bins::{self, Needs},
    client::On,
    server::AppServer,
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

/// A running HAProxy.
#[derive(Debug)]
pub struct Haproxy {
    server: AppServer,
    _dir: WorkDir,
    addr: SocketAddr,
}

impl Haproxy {
    /// Starts it on `on`: listens on `listen`, forwards each connection to `backend`.
    pub fn start(
        on: On<'_>,
        listen: SocketAddr,
        backend: SocketAddr,
        splice: Splice,
    ) -> Result<Self> {
        let dir = WorkDir::new("haproxy")?;
        let conf = dir.write("haproxy.cfg", config(listen, backend, splice))?;
        let mut cmd = Command::new(bins::system("haproxy")?);
        // -db: foreground, no daemon; -f: only our configuration.
        cmd.arg("-db").arg("-f").arg(&conf);
        let server = AppServer::start(on, cmd, &dir.join("log"), "haproxy")?
            .wait_listening(listen, READY_TIMEOUT)?;
        Ok(Self {
            server,
            _dir: dir,
            addr: listen,
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The process.
    pub fn server(&mut self) -> &mut AppServer {
        &mut self.server
    }
}

/// The configuration: TCP mode, one frontend, one backend server.
fn config(listen: SocketAddr, backend: SocketAddr, splice: Splice) -> String {
    format!(
        "global
    maxconn 1000
defaults
    mode tcp
    timeout connect 10s
    timeout client 60s
    timeout server 60s
{splice}frontend front
    bind {listen}
    default_backend back
backend back
    server echo {backend}
",
        splice = splice.options()
    )
}
