//! The suite's Node.js servers (`testbed/apps/node/pipe.js`, copied beside the tests by
//! `cargo xtask test`): an echo and a proxy that move bytes with `stream.pipe`.

use std::{net::SocketAddr, process::Command};

use anyhow::Result;

use super::{
    READY_TIMEOUT,
    bins::{self, Needs},
    client::On,
    server::AppServer,
    workdir::WorkDir,
};

/// What the Node.js workload runs.
pub const NEEDS: Needs = Needs {
    system: &["node"],
    built: &["node/pipe.js", "go/streamcheck"],
};

/// A running `pipe.js`.
#[derive(Debug)]
pub struct NodePipe {
    server: AppServer,
    _dir: WorkDir,
    addr: SocketAddr,
}

impl NodePipe {
    /// An echo (`socket.pipe(socket)`) on `on`, listening on `listen`.
    pub fn echo(on: On<'_>, listen: SocketAddr) -> Result<Self> {
        Self::start(on, listen, &[])
    }

    /// A proxy to `upstream` (`client.pipe(upstream)`, `upstream.pipe(client)`).
    pub fn proxy(on: On<'_>, listen: SocketAddr, upstream: SocketAddr) -> Result<Self> {
        Self::start(
            on,
            listen,
            &[upstream.ip().to_string(), upstream.port().to_string()],
        )
    }

    fn start(on: On<'_>, listen: SocketAddr, upstream: &[String]) -> Result<Self> {
        let dir = WorkDir::new("node")?;
        let ready = dir.join("ready");
        let mode = if upstream.is_empty() { "echo" } else { "proxy" };
        let mut cmd = Command::new(bins::system("node")?);
        cmd.arg(bins::built("node/pipe.js")?)
            .arg(mode)
            .arg(listen.ip().to_string())
            .arg(listen.port().to_string())
            .arg(&ready)
            .args(upstream);
        let server = AppServer::start(on, cmd, &dir.join("log"), &format!("node pipe.js {mode}"))?
            .wait_ready_file(&ready, READY_TIMEOUT)?;
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
