//! A server of the apps suite running in a pod: its own process group (a master and its
//! workers, a postmaster and its backends, all killed together on drop), its output in
//! a log file that failures quote, and ready only once observed ready. [`Listening`] is
//! what each workload's constructor returns: such a server with its work directory and
//! the address it serves on.

use std::{
    fs::File,
    net::SocketAddr,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use nix::{
    sys::signal::{Signal, killpg},
    unistd::Pid,
};

use super::{READY_TIMEOUT, client::On, listening, workdir::WorkDir};
use crate::spawn::PodChild;

/// A running server; see the module doc.
#[derive(Debug)]
pub struct AppServer {
    child: PodChild,
    log: PathBuf,
    what: String,
}

impl AppServer {
    /// Starts `cmd` on `on`, in a process group of its own, stdout and stderr to `log`.
    /// `what` names it in errors.
    pub fn start(on: On<'_>, mut cmd: Command, log: &Path, what: &str) -> Result<Self> {
        let out = File::create(log).with_context(|| format!("create {}", log.display()))?;
        let err = out.try_clone().context("dup the log file")?;
        cmd.stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        let child = on.spawn(cmd)?;
        Ok(Self {
            child,
            log: log.to_path_buf(),
            what: format!("{what} in pod {}", on.pod.name()),
        })
    }

    /// Its pid (and process group id).
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// What it logged so far (the last few KiB).
    pub fn log(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let start = text.len().saturating_sub(4000);
        text.get(start..).unwrap_or(&text).trim().to_owned()
    }

    /// What it is, where, and what it logged so far: for a failure to quote.
    pub fn described(&self) -> String {
        format!("{} logged:\n{}", self.what, self.log())
    }

    /// Fails, with its log, if it has exited.
    pub fn ensure_running(&mut self) -> Result<()> {
        if let Some(st) = self.child.try_wait()? {
            bail!("{} exited ({st}): {}", self.what, self.log());
        }
        Ok(())
    }

    /// Waits until `ready()` says so, at most `timeout`; fails with its log if it exits
    /// first or the time runs out. `condition` names what is awaited.
    pub fn wait_until(
        mut self,
        condition: &str,
        timeout: Duration,
        mut ready: impl FnMut() -> Result<bool>,
    ) -> Result<Self> {
        let deadline = Instant::now() + timeout;
        loop {
            self.ensure_running()?;
            if ready()? {
                return Ok(self);
            }
            if Instant::now() > deadline {
                bail!(
                    "{} was not {condition} within {timeout:?}: {}",
                    self.what,
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits until a socket listens on `addr` in its network namespace.
    pub fn wait_listening(self, addr: SocketAddr, timeout: Duration) -> Result<Self> {
        let pid = self.pid();
        self.wait_until(&format!("listening on {addr}"), timeout, move || {
            listening::is_listening(pid, addr)
        })
    }

    /// Waits until the file `ready` exists (the suite's own servers create it once they
    /// listen).
    pub fn wait_ready_file(self, ready: &Path, timeout: Duration) -> Result<Self> {
        let condition = format!("ready ({} absent)", ready.display());
        self.wait_until(&condition, timeout, || Ok(ready.exists()))
    }
}

impl Drop for AppServer {
    fn drop(&mut self) {
        // The whole group: workers and backends outlive a killed master otherwise
        // (until the pod's cgroup goes). The group is ours: `process_group(0)` above.
        let Ok(pgid) = i32::try_from(self.child.pid()).map(Pid::from_raw) else {
            return;
        };
        let _ = killpg(pgid, Signal::SIGKILL);
        // Reap the leader, then wait for the rest of the group to be gone (a net), so
        // that the work directory is removed after the last writer.
        self.child.kill();
        let deadline = Instant::now() + crate::steps::NET;
        while killpg(pgid, None).is_ok() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// A server of the suite, ready, with its work directory (its configuration, data and
/// log) and the address it serves on.
#[derive(Debug)]
pub struct Listening {
    // Drop order: the process, then its directory.
    server: AppServer,
    dir: WorkDir,
    addr: SocketAddr,
}

impl Listening {
    /// Starts `cmd` on `on`, its output in `log` in `dir` (`what` names it in errors);
    /// ready once a socket listens on `addr`.
    pub fn start(
        on: On<'_>,
        cmd: Command,
        dir: WorkDir,
        what: &str,
        addr: SocketAddr,
    ) -> Result<Self> {
        Self::start_until(on, cmd, dir, what, addr, |s| {
            s.wait_listening(addr, READY_TIMEOUT)
        })
    }

    /// [`Listening::start`], ready once the file `ready` exists (the suite's own servers
    /// create it once they listen).
    pub fn start_ready_file(
        on: On<'_>,
        cmd: Command,
        dir: WorkDir,
        what: &str,
        addr: SocketAddr,
        ready: &Path,
    ) -> Result<Self> {
        Self::start_until(on, cmd, dir, what, addr, |s| {
            s.wait_ready_file(ready, READY_TIMEOUT)
        })
    }

    /// [`Listening::start`], ready once `ready` has waited for what says so (each wait
    /// [`READY_TIMEOUT`] at most).
    pub fn start_until(
        on: On<'_>,
        cmd: Command,
        dir: WorkDir,
        what: &str,
        addr: SocketAddr,
        ready: impl FnOnce(AppServer) -> Result<AppServer>,
    ) -> Result<Self> {
        let server = ready(AppServer::start(on, cmd, &dir.join("log"), what)?)?;
        Ok(Self { server, dir, addr })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The process.
    pub fn server(&mut self) -> &mut AppServer {
        &mut self.server
    }

    /// Its work directory.
    pub fn dir(&self) -> &WorkDir {
        &self.dir
    }
}
