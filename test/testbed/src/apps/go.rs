//! The suite's Go programs (`test/testbed/apps/go/`, built by `cargo xtask test`): the
//! servers (`echo`, `l4proxy`, `sink`, `httpserver`, `revproxy`, `grpcserver`) and the
//! checking clients (`streamcheck`, `httpcheck`, `grpcclient`), whose JSON reports are
//! typed here.

use std::{net::SocketAddr, process::Command};

use anyhow::Result;
use serde::Deserialize;

use crate::steps::{NET, NO_PROGRESS};

use super::{
    bins::{self, Needs},
    client::{self, On},
    gate::Gate,
    server::Listening,
    workdir::WorkDir,
};

/// Every Go program, as [`Needs`] names them.
pub const ALL: Needs = Needs {
    system: &[],
    built: &[
        "go/echo",
        "go/l4proxy",
        "go/sink",
        "go/streamcheck",
        "go/httpserver",
        "go/revproxy",
        "go/httpcheck",
        "go/grpcserver",
        "go/grpcclient",
    ],
};

/// How a Go server moves bytes between connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Relay {
    /// `io.Copy(dst, src)`: `TCPConn.ReadFrom`, splice(2) underneath.
    Copy,
    /// A plain Read/Write loop.
    ReadWrite,
}

impl Relay {
    fn flag(self) -> &'static str {
        match self {
            Self::Copy => "copy",
            Self::ReadWrite => "rw",
        }
    }
}

/// Go server `program -listen ADDR -ready-file F args...` on `on`, ready once it
/// listens.
fn start(on: On<'_>, program: &str, listen: SocketAddr, args: &[String]) -> Result<Listening> {
    let dir = WorkDir::new(program)?;
    let ready = dir.join("ready");
    let mut cmd = Command::new(bins::built(&format!("go/{program}"))?);
    cmd.arg("-listen")
        .arg(listen.to_string())
        .arg("-ready-file")
        .arg(&ready)
        .args(args);
    Listening::start_ready_file(on, cmd, dir, program, listen, &ready)
}

/// The echo server.
pub fn echo(on: On<'_>, listen: SocketAddr, relay: Relay) -> Result<Listening> {
    start(on, "echo", listen, &["-mode".into(), relay.flag().into()])
}

/// The L4 proxy to `upstream`.
pub fn l4proxy(
    on: On<'_>,
    listen: SocketAddr,
    upstream: SocketAddr,
    relay: Relay,
) -> Result<Listening> {
    let args = [
        "-upstream".into(),
        upstream.to_string(),
        "-mode".into(),
        relay.flag().into(),
    ];
    start(on, "l4proxy", listen, &args)
}

/// The sink answering the SHA-256 of each connection's bytes.
pub fn sink(on: On<'_>, listen: SocketAddr) -> Result<Listening> {
    start(on, "sink", listen, &[])
}

/// The HTTP server (`/bytes`, `/sha256`).
pub fn http_server(on: On<'_>, listen: SocketAddr) -> Result<Listening> {
    start(on, "httpserver", listen, &[])
}

/// The `httputil.ReverseProxy` to the HTTP server at `upstream`.
pub fn reverse_proxy(on: On<'_>, listen: SocketAddr, upstream: SocketAddr) -> Result<Listening> {
    let args = ["-upstream".into(), format!("http://{upstream}")];
    start(on, "revproxy", listen, &args)
}

/// The gRPC streaming echo server.
pub fn grpc_server(on: On<'_>, listen: SocketAddr) -> Result<Listening> {
    start(on, "grpcserver", listen, &[])
}

/// What `streamcheck` expects back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Every byte, in order (an echo).
    Echo,
    /// The sink's SHA-256 line.
    Digest,
}

/// A `streamcheck` run.
#[derive(Clone, Debug)]
pub struct StreamCheck {
    /// The server (or proxy).
    pub connect: SocketAddr,
    /// Connections, all at once.
    pub connections: u32,
    /// Bytes sent on each.
    pub bytes: u64,
    /// Bytes per write.
    pub write_size: u32,
    /// Pattern seed.
    pub seed: u64,
    /// What comes back.
    pub expect: Expect,
}

/// `streamcheck`'s report.
#[derive(Clone, Debug, Deserialize)]
pub struct StreamReport {
    /// Connections opened.
    pub connections: u32,
    /// Connections whose answer was exact.
    pub exact: u32,
    /// Bytes sent, all connections.
    pub bytes_sent: u64,
    /// Bytes that came back in order (echo), or that the sink's digest vouched for.
    pub bytes_back: u64,
    /// Wall time from the first connect.
    pub secs: f64,
    /// One line per failed connection.
    pub failures: Vec<String>,
}

impl StreamCheck {
    /// `connections` streams of `bytes` to `connect`, echoed, 64 KiB writes.
    pub fn echo(connect: SocketAddr, connections: u32, bytes: u64) -> Self {
        Self {
            connect,
            connections,
            bytes,
            write_size: 64 << 10,
            seed: 1,
            expect: Expect::Echo,
        }
    }

    fn command(&self) -> Result<Command> {
        let mut cmd = Command::new(bins::built("go/streamcheck")?);
        cmd.arg("-connect")
            .arg(self.connect.to_string())
            .arg("-connections")
            .arg(self.connections.to_string())
            .arg("-bytes")
            .arg(self.bytes.to_string())
            .arg("-write-size")
            .arg(self.write_size.to_string())
            .arg("-seed")
            .arg(self.seed.to_string())
            .arg("-expect")
            .arg(match self.expect {
                Expect::Echo => "echo",
                Expect::Digest => "digest",
            })
            .args(idle_arg());
        Ok(cmd)
    }

    /// Runs it on `on`, sending at once.
    pub fn run(&self, on: On<'_>) -> Result<StreamReport> {
        let out = client::run(on, self.command()?, "streamcheck", NET)?;
        client::json_report(&out, "streamcheck")
    }

    /// Runs it on `on`, held at `gate` until `before_go` returns.
    pub fn run_gated(
        &self,
        on: On<'_>,
        gate: &Gate,
        before_go: impl FnOnce() -> Result<()>,
    ) -> Result<StreamReport> {
        let out = client::run_gated(on, self.command()?, "streamcheck", NET, gate, before_go)?;
        client::json_report(&out, "streamcheck")
    }
}

/// The suite's Go clients give up when no byte moves for [`NO_PROGRESS`] (`-idle`),
/// however long their whole run takes; [`NET`] ends one that hangs anyway.
pub fn idle_arg() -> [String; 2] {
    ["-idle".to_owned(), format!("{}ms", NO_PROGRESS.as_millis())]
}

/// An `httpcheck` run.
#[derive(Clone, Debug)]
pub struct HttpCheck {
    /// The server or proxy.
    pub connect: SocketAddr,
    /// GET+POST rounds.
    pub rounds: u32,
    /// Body sizes, cycled.
    pub sizes: Vec<u64>,
    /// One connection for every request.
    pub keep_alive: bool,
}

/// `httpcheck`'s report.
#[derive(Clone, Debug, Deserialize)]
pub struct HttpReport {
    /// Requests made (GETs and POSTs).
    pub requests: u32,
    /// Requests answered exactly.
    pub exact: u32,
    /// Body bytes of exact GETs.
    pub bytes_got: u64,
    /// Body bytes of exact POSTs.
    pub bytes_posted: u64,
    /// Connections opened.
    pub new_connections: u32,
    /// Wall time.
    pub secs: f64,
    /// One line per failed request.
    pub failures: Vec<String>,
}

impl HttpCheck {
    /// Runs it on `on`.
    pub fn run(&self, on: On<'_>) -> Result<HttpReport> {
        let sizes: Vec<String> = self.sizes.iter().map(u64::to_string).collect();
        let mut cmd = Command::new(bins::built("go/httpcheck")?);
        cmd.arg("-base")
            .arg(format!("http://{}", self.connect))
            .arg("-requests")
            .arg(self.rounds.to_string())
            .arg("-sizes")
            .arg(sizes.join(","))
            .arg(format!("-keep-alive={}", self.keep_alive))
            .args(idle_arg());
        let out = client::run(on, cmd, "httpcheck", NET)?;
        client::json_report(&out, "httpcheck")
    }
}

/// A `grpcclient` run: one bidirectional stream.
#[derive(Clone, Debug)]
pub struct GrpcCheck {
    /// The server.
    pub connect: SocketAddr,
    /// Messages sent (and echoed).
    pub messages: u32,
    /// Message sizes, cycled.
    pub sizes: Vec<u64>,
}

/// `grpcclient`'s report.
#[derive(Clone, Debug, Deserialize)]
pub struct GrpcReport {
    /// Messages sent.
    pub messages: u32,
    /// Echoes identical to what was sent.
    pub exact: u32,
    /// Bytes sent in messages.
    pub bytes_sent: u64,
    /// Bytes in the echoes.
    pub bytes_back: u64,
    /// SHA-256 of the stream sent.
    pub sha256_sent: String,
    /// SHA-256 of the stream back.
    pub sha256_back: String,
    /// Wall time.
    pub secs: f64,
    /// Failures.
    pub failures: Vec<String>,
}

impl GrpcCheck {
    /// Runs it on `on`.
    pub fn run(&self, on: On<'_>) -> Result<GrpcReport> {
        let sizes: Vec<String> = self.sizes.iter().map(u64::to_string).collect();
        let mut cmd = Command::new(bins::built("go/grpcclient")?);
        cmd.arg("-connect")
            .arg(self.connect.to_string())
            .arg("-messages")
            .arg(self.messages.to_string())
            .arg("-sizes")
            .arg(sizes.join(","))
            .args(idle_arg());
        let out = client::run(on, cmd, "grpcclient", NET)?;
        client::json_report(&out, "grpcclient")
    }
}
