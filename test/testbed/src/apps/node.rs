//! The suite's Node.js servers (`test/testbed/apps/node/pipe.js`, copied beside the tests by
//! `cargo xtask test`): an echo and a proxy that move bytes with `stream.pipe`.

use std::{net::SocketAddr, process::Command};

use anyhow::Result;

use super::{
    bins::{self, Needs},
    client::On,
    server::Listening,
    workdir::WorkDir,
};

/// What the Node.js workload runs.
pub const NEEDS: Needs = Needs {
    system: &["node"],
    built: &["node/pipe.js", "go/streamcheck"],
};

/// `pipe.js` as an echo (`socket.pipe(socket)`) on `on`, listening on `listen`.
pub fn echo(on: On<'_>, listen: SocketAddr) -> Result<Listening> {
    start(on, listen, &[])
}

/// `pipe.js` as a proxy to `upstream` (`client.pipe(upstream)`, `upstream.pipe(client)`).
pub fn proxy(on: On<'_>, listen: SocketAddr, upstream: SocketAddr) -> Result<Listening> {
    start(
        on,
        listen,
        &[upstream.ip().to_string(), upstream.port().to_string()],
    )
}

fn start(on: On<'_>, listen: SocketAddr, upstream: &[String]) -> Result<Listening> {
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
    let what = format!("node pipe.js {mode}");
    Listening::start_ready_file(on, cmd, dir, &what, listen, &ready)
}
