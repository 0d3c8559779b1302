//! Starting a process inside a pod (or a [`crate::topology::Sandbox`]): in its cgroup
//! (so its sockets are subject to the programs attached above it) and in its network
//! namespace, from the first instruction of the new program. Children are killed on
//! drop.

use std::{
    fs::File,
    io::Read,
    os::{
        fd::{AsRawFd as _, BorrowedFd},
        unix::process::CommandExt as _,
    },
    path::Path,
    process::{Child, Command, ExitStatus, Output},
    sync::{Arc, Mutex},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use nix::{
    sched::{CloneFlags, CpuSet, sched_setaffinity, setns},
    unistd::Pid,
};

use crate::cgroup::CgroupGuard;

/// Where a process starts: a cgroup, and a network namespace (none: the host's).
pub trait Place {
    /// A label for messages.
    fn label(&self) -> &str;
    /// The cgroup.
    fn cgroup(&self) -> &CgroupGuard;
    /// The network namespace file to enter, or `None` to stay in the host's.
    fn netns_path(&self) -> Option<std::path::PathBuf>;
}

/// A process started by [`spawn_in`]; killed (SIGKILL) and reaped on drop unless it
/// was waited for.
#[derive(Debug)]
pub struct PodChild {
    child: Child,
    what: String,
    done: bool,
}

/// Starts `cmd` inside `pod`: between fork and exec the child writes itself into the
/// pod's `cgroup.procs` and `setns`es into its network namespace. Both files are
/// opened before the fork; the child only makes raw syscalls.
pub fn spawn_in(pod: &impl Place, cmd: Command) -> Result<PodChild> {
    spawn_in_on_cpus(pod, cmd, &[])
}

/// [`spawn_in`], and the process (and the threads it starts) may only run on `cpus`
/// (`sched_setaffinity`); empty means no restriction.
pub fn spawn_in_on_cpus(pod: &impl Place, mut cmd: Command, cpus: &[usize]) -> Result<PodChild> {
    let what = format!("{:?} in {}", cmd, pod.label());
    let procs = pod.cgroup().procs_file();
    let cgroup = File::options()
        .write(true)
        .open(&procs)
        .with_context(|| format!("open {}", procs.display()))?;
    let netns = match pod.netns_path() {
        Some(p) => Some(File::open(&p).with_context(|| format!("open {}", p.display()))?),
        None => None,
    };
    let cpu_set = cpu_set(cpus)?;
    let (cg_fd, ns_fd) = (cgroup.as_raw_fd(), netns.as_ref().map(|f| f.as_raw_fd()));
    // SAFETY: the closure only makes async-signal-safe syscalls on fds that stay open
    // until `spawn` returns, and touches no lock or allocator.
    unsafe {
        cmd.pre_exec(move || {
            // Both fds stay open until `spawn` returns (dropped after it).
            let (cg, ns) = (
                BorrowedFd::borrow_raw(cg_fd),
                ns_fd.map(|fd| BorrowedFd::borrow_raw(fd)),
            );
            // "0" moves the writer itself (kernel/cgroup/cgroup.c, cgroup_procs_write_start).
            if nix::unistd::write(cg, b"0")? != 1 {
                return Err(std::io::Error::other("short write to cgroup.procs"));
            }
            if let Some(ns) = ns {
                setns(ns, CloneFlags::CLONE_NEWNET)?;
            }
            if let Some(set) = &cpu_set {
                sched_setaffinity(Pid::from_raw(0), set)?;
            }
            Ok(())
        });
    }
    let child = cmd.spawn().with_context(|| format!("start {what}"))?;
    drop((cgroup, netns));
    Ok(PodChild {
        child,
        what,
        done: false,
    })
}

fn cpu_set(cpus: &[usize]) -> Result<Option<CpuSet>> {
    if cpus.is_empty() {
        return Ok(None);
    }
    let mut set = CpuSet::new();
    for &cpu in cpus {
        set.set(cpu)
            .map_err(|_| anyhow::anyhow!("cpu {cpu} is out of range"))?;
    }
    Ok(Some(set))
}

impl PodChild {
    /// Takes a process started some other way (outside any pod) into the same care:
    /// waited for with a timeout, killed on drop. `what` names it in errors.
    pub fn adopt(child: Child, what: &str) -> Self {
        Self {
            child,
            what: what.to_owned(),
            done: false,
        }
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The std handle, e.g. to take its stdout.
    pub fn inner(&mut self) -> &mut Child {
        &mut self.child
    }

    /// Whether it has exited (and its status then).
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>> {
        let st = self
            .child
            .try_wait()
            .with_context(|| format!("wait for {}", self.what))?;
        if st.is_some() {
            self.done = true;
        }
        Ok(st)
    }

    /// Waits at most `timeout`; past it, kills the process and fails.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.try_wait()? {
                return Ok(st);
            }
            if Instant::now() > deadline {
                self.kill();
                bail!("{} did not finish within {timeout:?}; killed it", self.what);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Collects stdout and stderr (when they were piped) until the process exits, at
    /// most `timeout`.
    pub fn wait_output(mut self, timeout: Duration) -> Result<Output> {
        let out = drain(self.child.stdout.take());
        let err = drain(self.child.stderr.take());
        let waited = self.wait_timeout(timeout);
        let stdout = out.map_or_else(Vec::new, |h| h.join().unwrap_or_default());
        let stderr = err.map_or_else(Vec::new, |h| h.join().unwrap_or_default());
        match waited {
            Ok(status) => Ok(Output {
                status,
                stdout,
                stderr,
            }),
            Err(e) => Err(e.context(format!(
                "stderr: {}",
                String::from_utf8_lossy(&stderr).trim()
            ))),
        }
    }

    /// Waits until the file `ready` exists (the process writes it once it listens), at
    /// most `timeout`; fails with its stderr if it exits first. `what` names it in
    /// errors.
    pub fn wait_ready(mut self, ready: &Path, what: &str, timeout: Duration) -> Result<Self> {
        let deadline = Instant::now() + timeout;
        while !ready.exists() {
            if self.try_wait()?.is_some() {
                let out = self.wait_output(Duration::from_secs(1))?;
                bail!(
                    "{what} exited early: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            if Instant::now() > deadline {
                bail!("{what} did not listen within {} s", timeout.as_secs());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(self)
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if !self.done {
            let _ = self.child.kill();
            let _ = self.child.wait();
            self.done = true;
        }
    }
}

/// Reads `r` to its end on a thread; the thread's result is everything read.
pub(crate) fn drain<R: Read + Send + 'static>(r: Option<R>) -> Option<JoinHandle<Vec<u8>>> {
    r.map(|mut r| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            buf
        })
    })
}

/// What a process writes to a pipe, read by a thread as it comes, so that it can be
/// shown while the process still runs.
#[derive(Clone, Debug, Default)]
pub(crate) struct Gathered(Arc<Mutex<Vec<u8>>>);

impl Gathered {
    /// Starts the reader thread on `pipe` (none: nothing is gathered, no thread).
    pub(crate) fn start<R: Read + Send + 'static>(
        pipe: Option<R>,
    ) -> (Self, Option<JoinHandle<()>>) {
        let gathered = Self::default();
        let reader = pipe.map(|mut pipe| {
            let sink = Arc::clone(&gathered.0);
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = pipe.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    if let Ok(mut s) = sink.lock() {
                        s.extend_from_slice(&buf[..n]);
                    }
                }
            })
        });
        (gathered, reader)
    }

    /// What was read so far, as text.
    pub(crate) fn text(&self) -> String {
        self.0
            .lock()
            .map(|s| String::from_utf8_lossy(&s).into_owned())
            .unwrap_or_default()
    }
}

impl Drop for PodChild {
    fn drop(&mut self) {
        self.kill();
    }
}
