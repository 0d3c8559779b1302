//! Running the proxy (`bypass-test-tool proxy`, the sidecar-like proxy of the mesh
//! tests) inside a pod, as a guard: started, ready once it printed its listening line,
//! killed on drop.

use std::{
    io::{BufRead as _, BufReader},
    net::SocketAddr,
    process::Stdio,
    sync::mpsc,
    time::Duration,
};

use anyhow::{Context as _, Result, bail};

use crate::{
    spawn::{Gathered, PodChild, spawn_in_on_cpus},
    topology::Pod,
};

/// How long `start` waits for the listening line.
pub const READY_TIMEOUT: Duration = crate::steps::NET;

/// How the proxy's one line on stdout starts once it listens (`LISTENING ADDR:PORT
/// upstream ADDR:PORT`).
pub const LISTENING: &str = "bypass-test-tool proxy listening on";

/// Options of the proxy.
#[derive(Clone, Debug)]
pub struct ProxyOpts {
    /// `--listen`.
    pub listen: SocketAddr,
    /// `--upstream`.
    pub upstream: SocketAddr,
    /// `--mark` (0: none).
    pub mark: u32,
    /// `--upstream-bind`.
    pub upstream_bind: Option<SocketAddr>,
    /// CPUs it may run on (empty: any).
    pub cpus: Vec<usize>,
}

impl ProxyOpts {
    /// A proxy from `listen` to `upstream`, no mark.
    pub fn new(listen: SocketAddr, upstream: SocketAddr) -> Self {
        Self {
            listen,
            upstream,
            mark: 0,
            upstream_bind: None,
            cpus: Vec::new(),
        }
    }

    /// The command line after the subcommand.
    pub fn args(&self) -> Vec<String> {
        let mut a = vec![
            "--listen".to_owned(),
            self.listen.to_string(),
            "--upstream".to_owned(),
            self.upstream.to_string(),
        ];
        if self.mark != 0 {
            a.extend(["--mark".to_owned(), format!("{:#x}", self.mark)]);
        }
        if let Some(b) = self.upstream_bind {
            a.extend(["--upstream-bind".to_owned(), b.to_string()]);
        }
        a
    }
}

/// A proxy running in a pod; killed on drop.
#[derive(Debug)]
pub struct Proxy {
    child: PodChild,
    stderr: Gathered,
}

impl Proxy {
    /// Starts the proxy in `pod` and waits until it listens.
    pub fn start(pod: &Pod, opts: &ProxyOpts) -> Result<Self> {
        let mut cmd = crate::tools::test_tool_command("proxy")?;
        cmd.args(opts.args())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = spawn_in_on_cpus(pod, cmd, &opts.cpus)?;
        let (stderr, _) = Gathered::start(child.inner().stderr.take());
        let stdout = child.inner().stdout.take().context("proxy stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let r = BufReader::new(stdout).read_line(&mut line).map(|_| line);
            let _ = tx.send(r);
        });
        let proxy = Self { child, stderr };
        match rx.recv_timeout(READY_TIMEOUT) {
            Ok(Ok(line)) if line.starts_with(LISTENING) => Ok(proxy),
            Ok(Ok(line)) => {
                // Give its stderr reader a moment to catch the reason.
                std::thread::sleep(Duration::from_millis(50));
                bail!(
                    "proxy {} in pod {} did not start (stdout {:?}): {}",
                    opts.args().join(" "),
                    pod.name(),
                    line.trim(),
                    proxy.stderr().trim()
                )
            }
            Ok(Err(e)) => Err(e).context("read the proxy's stdout"),
            Err(_) => bail!(
                "the proxy in pod {} did not listen within {READY_TIMEOUT:?}",
                pod.name()
            ),
        }
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// What it wrote to stderr so far (one line per failed connection).
    pub fn stderr(&self) -> String {
        self.stderr.text()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args() {
        let mut o = ProxyOpts::new(
            "0.0.0.0:15001".parse().unwrap(),
            "10.88.1.2:5801".parse().unwrap(),
        );
        assert_eq!(
            o.args().join(" "),
            "--listen 0.0.0.0:15001 --upstream 10.88.1.2:5801"
        );
        o.mark = 0x539;
        o.upstream_bind = Some("127.0.0.1:40123".parse().unwrap());
        assert!(
            o.args()
                .join(" ")
                .ends_with("--mark 0x539 --upstream-bind 127.0.0.1:40123")
        );
    }
}
