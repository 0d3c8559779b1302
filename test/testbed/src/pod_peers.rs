//! Running the peer (`bypass-test-tool peer`) inside pods: a server that signals when it
//! listens, clients that run to completion or in the background, and their JSON reports
//! parsed.

use std::{
    net::SocketAddr,
    path::PathBuf,
    process::{Command, Output, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result, bail};

pub use crate::peer::client::ClientArgs;
use crate::{
    names,
    peer::Report,
    spawn::{PodChild, spawn_in_on_cpus},
    topology::Pod,
};

/// Default limit for a peer run: a net (see [`crate::steps::NET`]).
pub const PEER_TIMEOUT: Duration = crate::steps::NET;

/// A `Command` that runs the peer (the test tool's `peer`), before its
/// `server`/`client` argument.
pub fn peer_command() -> Result<Command> {
    crate::tools::test_tool_command("peer")
}

/// Options of the peer's `server`.
#[derive(Clone, Debug)]
pub struct ServerArgs {
    /// Exit after this many connections (0: never, and no final report).
    pub connections: u64,
    /// CPUs the server may run on (empty: any).
    pub cpus: Vec<usize>,
    /// As [`ClientArgs::idle_timeout_secs`].
    pub idle_timeout_secs: u64,
    /// Pause after each client header before answering, milliseconds.
    pub reply_delay_ms: u64,
    /// In stream mode, read nothing after a client's header until this file exists.
    pub go_file: Option<PathBuf>,
}

impl ServerArgs {
    /// A server for `connections` connections.
    pub fn new(connections: u64) -> Self {
        Self {
            connections,
            cpus: Vec::new(),
            idle_timeout_secs: crate::steps::NO_PROGRESS.as_secs(),
            reply_delay_ms: 0,
            go_file: None,
        }
    }
}

/// A peer server running in a pod.
#[derive(Debug)]
pub struct PeerServer {
    child: PodChild,
    _ready: crate::steps::ReadyFile,
}

impl PeerServer {
    /// Starts a server in `pod` on `listen` that exits after `connections`
    /// connections, and waits until it listens.
    pub fn start(pod: &Pod, listen: SocketAddr, connections: u64) -> Result<Self> {
        Self::start_with(pod, listen, &ServerArgs::new(connections))
    }

    /// [`PeerServer::start`] with every option.
    pub fn start_with(pod: &Pod, listen: SocketAddr, args: &ServerArgs) -> Result<Self> {
        let ready = std::env::temp_dir().join(format!(
            "{}-ready-{}",
            names::resource(&names::unique_tag(), pod.name()),
            listen.port()
        ));
        let _ = std::fs::remove_file(&ready);
        let mut cmd = peer_command()?;
        cmd.arg("server")
            .arg("--listen")
            .arg(listen.to_string())
            .arg("--connections")
            .arg(args.connections.to_string())
            .arg("--idle-timeout")
            .arg(args.idle_timeout_secs.to_string())
            .arg("--reply-delay-ms")
            .arg(args.reply_delay_ms.to_string())
            .arg("--ready-file")
            .arg(&ready)
            .args(
                args.go_file
                    .iter()
                    .flat_map(|f| [std::ffi::OsStr::new("--go-file"), f.as_os_str()]),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let ready = crate::steps::ReadyFile(ready);
        let child = spawn_in_on_cpus(pod, cmd, &args.cpus)?.wait_ready(
            &ready.0,
            &format!("peer server on {listen}"),
            crate::steps::NET,
        )?;
        Ok(Self {
            child,
            _ready: ready,
        })
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// Waits for it to serve its connections and returns its report.
    pub fn wait(self) -> Result<Report> {
        self.wait_timeout(PEER_TIMEOUT)
    }

    /// [`PeerServer::wait`] with a limit.
    pub fn wait_timeout(self, timeout: Duration) -> Result<Report> {
        parse_report("server", self.child.wait_output(timeout)?)
    }
}

/// A peer client running in a pod in the background.
#[derive(Debug)]
pub struct PeerClient {
    child: PodChild,
}

impl PeerClient {
    /// Starts a client in `pod` towards `connect`.
    pub fn spawn(pod: &Pod, connect: SocketAddr, args: &ClientArgs) -> Result<Self> {
        let mut cmd = peer_command()?;
        cmd.arg("client")
            .arg("--connect")
            .arg(connect.to_string())
            .args(args.args())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        Ok(Self {
            child: spawn_in_on_cpus(pod, cmd, &args.cpus)?,
        })
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// Waits for it and returns its report.
    pub fn wait(self) -> Result<Report> {
        self.wait_timeout(PEER_TIMEOUT)
    }

    /// [`PeerClient::wait`] with a limit.
    pub fn wait_timeout(self, timeout: Duration) -> Result<Report> {
        parse_report("client", self.child.wait_output(timeout)?)
    }
}

/// Runs a client in `pod` towards `connect` to completion.
pub fn run_client(pod: &Pod, connect: SocketAddr, args: &ClientArgs) -> Result<Report> {
    PeerClient::spawn(pod, connect, args)?.wait()
}

/// The last JSON line of a peer's stdout. A failed check still yields the report (the
/// caller asserts on it); no report at all is an error carrying stderr.
fn parse_report(role: &str, out: Output) -> Result<Report> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Shown with the test's output (cargo test keeps it unless the test fails).
    for l in stderr.lines().filter(|l| !l.trim().is_empty()) {
        eprintln!("[peer {role}] {l}");
    }
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'));
    match line {
        Some(l) => serde_json::from_str(l)
            .with_context(|| format!("peer {role} printed a bad report: {l}")),
        None => bail!(
            "peer {role} exited ({}) without a report: {}",
            out.status,
            stderr.trim()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_args() {
        let a = ClientArgs {
            streams: 20,
            ..ClientArgs::bulk(1024)
        };
        assert_eq!(a.total_connections(), 20);
        let line = a.args().join(" ");
        assert!(
            line.contains("--send 1024 --recv 1024 --streams 20 --connections 20"),
            "{line}"
        );
        assert!(
            ClientArgs::pingpong(10, 64)
                .args()
                .join(" ")
                .ends_with("--pingpong 10")
        );
    }
}
