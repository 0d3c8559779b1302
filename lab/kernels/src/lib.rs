//! `cargo xtask test --kernel NAME`: the privileged tests on another kernel, booted in
//! qemu (TCG, one thread for both vCPUs; `BYPASS_VM_ACCEL=kvm` where KVM runs a guest)
//! from a Debian kernel package, with the host's filesystem shared read-only (9p) under
//! a tmpfs overlay, so the guest runs the very binaries the host built. The serial
//! console carries the results back; they are counted like the host run's and kept in
//! `results/kernels/NAME.json`, which `cargo xtask kernel-table` turns into the
//! README's table (a run given harness arguments, in `results/kernels/partial/`). A
//! kernel of another architecture (arm64) boots in that architecture's qemu and runs the
//! smoke test, built for it, instead of the privileged tests (see `smoke`).
//!
//! What a run needs built (the test tools, the cross-built agent) comes from the caller
//! through [`Build`]: xtask owns the toolchain and the cargo builds.

pub mod arch;
mod catalog;
mod fetch;
mod guest;
mod initramfs;
mod share;
mod smoke;
pub mod summary;
pub mod table;

use std::{
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};

pub use catalog::KERNELS;
pub use summary::Counts;
use xtask_lib::{cmd, workspace};

/// The privileged test binary (`test/integration-test/tests/privileged.rs`), which a VM
/// runs.
pub const PRIVILEGED: &str = "privileged";

/// Its modules a VM run always leaves out: the Kubernetes ones (a real API server under
/// emulation takes too long).
pub const HOST_ONLY: [&str; 1] = ["k8s::"];

/// Tests left out of a VM run unless a filter names tests, for emulation's timing: a
/// thousand streams at once through TCG take more than the probe's two minutes; the
/// write held in `connect` by a dropped SYN ended in a reset or `EPIPE` under TCG twice
/// (6.12, 6.1), never on the host; the demo measures for a minute, and its numbers
/// under emulation mean nothing (the datapath it shows is the other tests').
pub const SLOW_UNDER_EMULATION: [&str; 3] = [
    "thousand_concurrent_streams",
    "write_blocked_while_connecting_stays_in_order",
    "demo::",
];

/// The harness arguments of a VM run: `harness`, `--skip` for each [`HOST_ONLY`]
/// module, and for each [`SLOW_UNDER_EMULATION`] test unless `harness` names tests
/// itself.
pub fn vm_harness(harness: &[String]) -> Vec<String> {
    let mut out = harness.to_vec();
    if !names_tests(harness) {
        for t in SLOW_UNDER_EMULATION {
            out.extend(["--skip".to_owned(), t.to_owned()]);
        }
    }
    for m in HOST_ONLY {
        out.extend(["--skip".to_owned(), m.to_owned()]);
    }
    out
}

/// Whether harness arguments name tests (a filter), rather than only options and the
/// patterns `--skip` takes.
fn names_tests(harness: &[String]) -> bool {
    let mut args = harness.iter();
    while let Some(a) = args.next() {
        if a == "--skip" {
            args.next();
        } else if !a.starts_with("--") {
            return true;
        }
    }
    false
}

/// One kernel of every `cargo xtask test` and the tests it leaves to the other.
#[derive(Debug, Clone, Copy)]
pub struct EveryRun {
    /// The kernel's name in the matrix.
    pub kernel: &'static str,
    /// What its run skips (`--skip` patterns): tests the other kernel of the run runs.
    pub leaves: &'static [&'static str],
}

/// The kernels every `cargo xtask test` boots beside the host's tests, in this order:
/// the oldest supported (the one most operators run), the newest, and the refusal below
/// the minimum. The two that load share the suite: the tests of the kernel's socket
/// semantics (`tcp_semantics`, `socket_semantics`, and any module not named here) run
/// on both, every other module on one of them, so every test runs on a kernel unlike
/// the host's in every run. Two full suites under emulation (1,871 s and 1,947 s on a
/// quiet machine of our kind, twice that on a slower one) do not fit beside the host's
/// tests in CI's hour; `cargo xtask test --kernel 6.1,7.3` runs both in full, and the
/// kernel table comes from such runs.
pub const EVERY_RUN: [EveryRun; 3] = [
    EveryRun {
        kernel: "6.1",
        leaves: &[
            "datapath::",
            "isolation::",
            "limits::",
            "mesh::",
            "queue_bound::",
            "small_messages::",
            "one_gib_in_one_stream",
        ],
    },
    EveryRun {
        kernel: "7.3",
        leaves: &[
            "apps::",
            "bad_input::",
            "cleanup::",
            "detach::",
            "restart::",
            "ten_thousand_connections",
        ],
    },
    EveryRun {
        kernel: "5.10",
        leaves: &[],
    },
];

impl EveryRun {
    /// The harness arguments of its share.
    pub fn harness(&self) -> Vec<String> {
        self.leaves
            .iter()
            .flat_map(|t| ["--skip".to_owned(), (*t).to_owned()])
            .collect()
    }
}

/// The environment variable that sets a guest's vCPUs (default [`DEFAULT_CPUS`]): `1`
/// runs it slower, as a smaller machine would.
pub const CPUS_ENV: &str = "BYPASS_VM_CPUS";

/// A guest's vCPUs unless [`CPUS_ENV`] says otherwise.
const DEFAULT_CPUS: u32 = 2;

/// A guest's memory, MiB.
const MEM_MIB: u32 = 4096;

/// The vCPUs [`CPUS_ENV`] asks for (`None`: unset), or why it is not a number from 1 to 8.
fn cpus_of(value: Option<&str>) -> Result<u32> {
    let Some(v) = value else {
        return Ok(DEFAULT_CPUS);
    };
    match v.trim().parse::<u32>() {
        Ok(n @ 1..=8) => Ok(n),
        _ => bail!("{CPUS_ENV}={v}: give a number of vCPUs from 1 to 8"),
    }
}

/// What a VM run needs built, which the caller provides (xtask: the pinned toolchain,
/// with setup's tools on PATH).
pub trait Build {
    /// Builds the tools the privileged tests run and the apps suite's programs, in the
    /// debug profile, where the tests look for them.
    fn test_tools(&self) -> Result<()>;
    /// `cargo` in the workspace root, with the toolchain's tools on PATH.
    fn cargo(&self) -> Result<Command>;
    /// Installs `cross`'s toolchain if missing and builds `bins` (`(package, binary)`)
    /// for it, in the debug or release profile; returns the binaries, in order.
    fn cross(
        &self,
        cross: &arch::Cross,
        debug: bool,
        bins: &[(&str, &str)],
    ) -> Result<Vec<PathBuf>>;
}

/// How long a guest may print nothing before it is taken for hung and ended: a net,
/// far above the longest test under emulation on a slower machine (ten thousand
/// connections: 191 s on a quiet one), never a pace; a run that keeps making progress
/// runs as long as it needs.
const SILENCE: Duration = Duration::from_secs(20 * 60);

/// How long the guest's watchdog may report a CPU stuck before the run is ended: a
/// kernel that spins this long will not recover, and waiting for [`SILENCE`] only hides
/// the stacks the console printed under an hour of repeats.
const LOCKUP_LIMIT_SECS: u64 = 120;

/// The seconds of a soft-lockup report (`watchdog: BUG: soft lockup - CPU#1 stuck for
/// 26s! [comm:pid]`), or `None` for any other line.
fn lockup_secs(line: &str) -> Option<u64> {
    let rest = &line[line.find("BUG: soft lockup")?..];
    let after = &rest[rest.find("stuck for ")? + "stuck for ".len()..];
    let digits = after.find(|c: char| !c.is_ascii_digit())?;
    after[..digits].parse().ok()
}

/// A cache tag for `bytes` (`DefaultHasher` may change between Rust versions: that
/// only rebuilds what the tag names).
pub fn cache_tag(bytes: &[u8]) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut h = std::hash::DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

/// What a VM run saw.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Test counts from the console.
    pub counts: Counts,
    /// The kernel release the guest reported.
    pub release: Option<String>,
    /// `bypass-agent status --json` in the guest.
    pub status: Option<Value>,
    /// For a refusing kernel: exit code, stderr line count, last line.
    pub refusal: Option<(i32, u32, String)>,
    /// The run script's exit code.
    pub exit: Option<i32>,
    /// Names of failed tests.
    pub failed: Vec<String>,
    /// Names of passed tests.
    pub passed: Vec<String>,
    /// The smoke test's result line (`bypass-test-tool smoke`), on a foreign architecture.
    pub smoke: Option<Value>,
    /// Each test that ended, with the seconds it took (from the console's arrival).
    pub seconds: Vec<(String, u64)>,
    /// A test whose line the kernel's own console output cut before its verdict, which
    /// then comes on a later line.
    pending: Option<String>,
}

/// The verdict that starts `text` (`ok`, `FAILED`), whatever the kernel's console printed
/// after it (`ok[ 1646.37] ...`): `Some(true)` passed, `Some(false)` failed.
fn verdict(text: &str) -> Option<bool> {
    let word = text.trim_start().split('[').next().unwrap_or("").trim_end();
    match word {
        "ok" => Some(true),
        "FAILED" => Some(false),
        _ => None,
    }
}

impl Outcome {
    /// Takes one console line (markers may follow the console's escape codes).
    fn line(&mut self, line: &str) {
        self.counts.add_line(line);
        let after = |marker: &str| line.find(marker).map(|i| &line[i + marker.len()..]);
        if let Some(r) = after(guest::UP) {
            self.release = Some(r.trim().to_owned());
        } else if let Some(s) = after(guest::STATUS) {
            self.status = serde_json::from_str(s.trim()).ok();
        } else if let Some(r) = after(guest::REFUSAL) {
            let mut parts = r.trim().splitn(3, ' ');
            let code = parts.next().and_then(|c| c.parse().ok()).unwrap_or(-1);
            let lines = parts.next().and_then(|c| c.parse().ok()).unwrap_or(0);
            self.refusal = Some((code, lines, parts.next().unwrap_or("").to_owned()));
        } else if let Some(s) = after(guest::SMOKE) {
            self.smoke = serde_json::from_str(s.trim()).ok();
            if let Some(status) = self.smoke.as_ref().map(|v| &v["status"])
                && !status.is_null()
            {
                self.status = Some(status.clone());
            }
        } else if let Some(c) = after(guest::EXIT) {
            // The kernel's own console lines can land between the code and its newline
            // (the power-off right after it: "BYPASS-VM-EXIT 0[ 1345.78] sysrq: Power
            // Off"): the code is the digits that follow the marker.
            let c = c.trim_start();
            let digits = c.find(|ch: char| !ch.is_ascii_digit()).unwrap_or(c.len());
            self.exit = c[..digits].parse().ok();
        } else if let Some((name, rest)) = line
            .strip_prefix("test ")
            .and_then(|l| l.split_once(" ... "))
        {
            // The kernel's console may cut in after the dots ("test x ... [ 1646.37]
            // bypass-agent[14697] is installing a program with bpf_probe_write_user ..."):
            // the verdict then comes on a line of its own.
            self.pending = None;
            match verdict(rest) {
                Some(true) => self.passed.push(name.to_owned()),
                Some(false) => self.failed.push(name.to_owned()),
                None => self.pending = Some(name.to_owned()),
            }
        } else if self.pending.is_some()
            && let Some(passed) = verdict(line)
            && let Some(name) = self.pending.take()
        {
            if passed {
                self.passed.push(name);
            } else {
                self.failed.push(name);
            }
        }
    }
}

/// Runs the privileged tests (or the refusal check) on kernel `name`.
/// Returns the counts (the refusal and the smoke test count as one test each) and the
/// verdict; a run that could not start is a failed one.
pub fn run(
    build: &dyn Build,
    agent: &Path,
    name: &str,
    harness: &[String],
) -> (Counts, Result<()>) {
    match prepare(build, agent, name, harness) {
        Ok(p) => p.boot(""),
        Err(e) => (Counts::failed_run(), Err(e)),
    }
}

/// The guest's own tmpfs mounts (`guest::GUEST_TMPFS`) that hide the host's files at
/// `path`, if any.
fn hidden_in_guest(path: &Path) -> Option<&'static str> {
    guest::GUEST_TMPFS
        .iter()
        .copied()
        .find(|m| path.starts_with(m))
}

/// A kernel's run, ready to boot: what it needs downloaded, built and written. Making
/// one builds (cargo); booting it does not, so guests can boot beside other work.
pub struct Prepared {
    k: &'static catalog::Kernel,
    a: &'static arch::Arch,
    unpacked: fetch::Unpacked,
    initrd: PathBuf,
    script: PathBuf,
    dir: PathBuf,
    tests: Vec<(String, String)>,
    harness: Vec<String>,
    /// Whether the run was given harness arguments (a filter, `--skip`, ...): a part of
    /// the suite, whose record must not replace the full run's.
    partial: bool,
    cpus: u32,
}

/// Downloads, builds and writes what kernel `name`'s run needs.
pub fn prepare(
    build: &dyn Build,
    agent: &Path,
    name: &str,
    harness: &[String],
) -> Result<Prepared> {
    let Some(k) = catalog::find(name) else {
        let known: Vec<&str> = KERNELS.iter().map(|k| k.name).collect();
        bail!(
            "no kernel {name} in the matrix; known: {}",
            known.join(", ")
        );
    };
    let Some(a) = arch::of(k.arch) else {
        bail!(
            "kernel {name} is {}: no way to boot that architecture here",
            k.arch
        );
    };
    let cpus = cpus_of(std::env::var(CPUS_ENV).ok().as_deref())?;
    let target = workspace::target_dir()?;
    if let Some(hidden) = hidden_in_guest(&target) {
        bail!(
            "the build is under {hidden}, which the guest mounts a fresh tmpfs over, so it \
             would not see {}: run from a checkout outside {hidden}",
            target.display()
        );
    }
    let smoke = k.expect == catalog::Expect::Smoke;
    let partial = !harness.is_empty();
    let harness = vm_harness(harness);
    let cross = match (a.cross, smoke) {
        (Some(cross), true) => Some(cross),
        (None, false) => None,
        (Some(_), false) => bail!(
            "kernel {name} is {}: only the smoke test runs there (the privileged tests \
             need the host's tools)",
            k.arch
        ),
        (None, true) => bail!("kernel {name}: the smoke test is for a foreign architecture"),
    };
    let unpacked = fetch::kernel(k)?;
    let busybox = fetch::busybox(k.arch, k.suites)?;
    let init = guest::init(cross.is_some(), &unpacked.share.mount());
    let modules: Vec<&str> = unpacked
        .share
        .modules()
        .iter()
        .chain(a.modules)
        .copied()
        .collect();
    let initrd = initramfs::build(&unpacked, &busybox, &modules, &init)?;
    // One directory per run (its script, virtiofsd's socket), so that runs of one
    // kernel with other settings can boot side by side; removed once it is done.
    let dir = target
        .join("vm")
        .join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let script = dir.join("run.sh");
    let (text, tests) = if let Some(cross) = &cross {
        smoke::prepare(build, agent, cross, &unpacked.modules)?
    } else {
        let tests = if k.expect == catalog::Expect::Refuses {
            Vec::new()
        } else {
            test_binaries(build)?
        };
        let env: Vec<(String, String)> = ["CI", "RUST_BACKTRACE", "BYPASS_APPS_NO_AGENT"]
            .iter()
            .filter_map(|k| std::env::var(k).ok().map(|v| ((*k).to_owned(), v)))
            .collect();
        let text = guest::script(&guest::Run {
            modules: &unpacked.modules.display().to_string(),
            agent: &agent.display().to_string(),
            refuses: k.expect == catalog::Expect::Refuses,
            tests: &tests,
            harness: &harness,
            env: &env,
        });
        (text, tests)
    };
    std::fs::write(&script, text).with_context(|| format!("write {}", script.display()))?;
    cmd::run(Command::new("chmod").arg("755").arg(&script))?;
    Ok(Prepared {
        k,
        a,
        unpacked,
        initrd,
        script,
        dir,
        tests,
        harness,
        partial,
        cpus,
    })
}

impl Prepared {
    /// The kernel's name.
    pub fn name(&self) -> &'static str {
        self.k.name
    }

    /// Boots it and judges the run, printing the console with `prefix` before each line
    /// (guests that run beside others say whose line it is); keeps the result in
    /// `results/kernels/NAME.json`. Returns the counts and the verdict.
    pub fn boot(self, prefix: &str) -> (Counts, Result<()>) {
        match self.boot_once(prefix) {
            Ok(done) => done,
            Err(e) => (Counts::failed_run(), Err(e)),
        }
    }

    fn boot_once(self, prefix: &str) -> Result<(Counts, Result<()>)> {
        let (k, name) = (self.k, self.k.name);
        let smoke = k.expect == catalog::Expect::Smoke;
        eprintln!(
            "{prefix}kernel {name}: booting {} ({}) in qemu, {} vCPU(s)",
            self.unpacked.package, self.unpacked.release, self.cpus
        );
        let started = Instant::now();
        let mut outcome = boot(&self, prefix)?;
        let secs = started.elapsed().as_secs();
        let result = judge(k, &outcome);
        if smoke || k.expect == catalog::Expect::Refuses {
            // One check: counted like one test, so the summary line says how it went.
            if result.is_ok() {
                outcome.counts.passed += 1;
            } else {
                outcome.counts.failed += 1;
                outcome
                    .failed
                    .push(if smoke { smoke::NAME } else { "refusal" }.to_owned());
            }
        } else if result.is_err() && outcome.counts.failed == 0 {
            // The run failed without a failed test (no boot, no status, no test ran).
            outcome.counts.failed += 1;
        }
        save(&self, &outcome, secs)?;
        let _ = std::fs::remove_dir_all(&self.dir);
        println!(
            "{prefix}test: {} (kernel {name}, {}, {secs} s)",
            outcome.counts,
            outcome.release.as_deref().unwrap_or("did not boot")
        );
        Ok((outcome.counts, result))
    }
}

/// Whether the run met what the kernel expects.
fn judge(k: &catalog::Kernel, o: &Outcome) -> Result<()> {
    if o.release.is_none() {
        bail!("the guest never came up (see the console above)");
    }
    match k.expect {
        catalog::Expect::Refuses => match &o.refusal {
            Some((code, 1, line))
                if *code != 0 && line.contains(bypass_common::kernel::REFUSAL) =>
            {
                Ok(())
            }
            other => bail!(
                "the agent should refuse kernel {} in one line: {other:?}",
                k.name
            ),
        },
        catalog::Expect::Loads => {
            if o.status.is_none() {
                bail!("the agent did not load (no status)");
            }
            if o.counts.failed > 0 || o.exit != Some(0) {
                bail!(
                    "{} failed on kernel {}: {}",
                    o.counts.failed,
                    k.name,
                    o.failed.join(", ")
                );
            }
            if o.counts.passed == 0 {
                bail!("no test ran on kernel {}", k.name);
            }
            Ok(())
        }
        catalog::Expect::Smoke => smoke::judge(o.smoke.as_ref(), o.exit),
    }
}

/// Boots the kernel with the initramfs and the run script; reads the console until the
/// guest powers off (or the timeout).
fn boot(p: &Prepared, prefix: &str) -> Result<Outcome> {
    let a = p.a;
    // TCG by default: on this project's machines /dev/kvm exists but does not run a
    // guest (qemu's KVM start fails or spins). `BYPASS_VM_ACCEL=kvm` where it does
    // (never for another architecture).
    //
    // One TCG thread runs both vCPUs, in turns. With a thread each (`thread=multi`),
    // qemu 7.2 (Debian 12) left vCPUs executing an INT3 the kernel had already
    // replaced while attaching a trampoline (the read guard's, on
    // security_mmap_file): the kprobe handler, seeing no INT3 in memory, returns to
    // the same address, and the stale translation traps again, forever (kernel 6.1,
    // two of three full runs: both CPUs at security_mmap_file+0x0 in asm_exc_int3;
    // the memory holds the new CALL). A real CPU refetches the instruction. One thread
    // keeps qemu's code invalidation in step with every vCPU, about 1.45 times slower
    // (the whole 6.1 run: 1717 s and 1773 s against 1193 s). `BYPASS_VM_ACCEL=
    // tcg,thread=multi` chooses the faster one.
    let accel = match std::env::var("BYPASS_VM_ACCEL") {
        Ok(accel) if a.cross.is_none() || accel.starts_with("tcg") => accel,
        _ => "tcg,thread=single".to_owned(),
    };
    let cpu = if accel.starts_with("kvm") {
        "host"
    } else {
        a.tcg_cpu
    };
    // Ended on drop, whatever happens below.
    let virtiofsd = match p.unpacked.share {
        share::Share::VirtioFs => Some(share::Virtiofsd::start(&p.dir)?),
        share::Share::NineP => None,
    };
    let socket = virtiofsd
        .as_ref()
        .map_or_else(PathBuf::new, |v| v.socket().to_path_buf());
    let mut qemu = Command::new(a.qemu);
    qemu.args(["-machine", a.machine, "-cpu", cpu])
        .args(["-m", &MEM_MIB.to_string(), "-smp", &p.cpus.to_string()])
        .args(["-accel", &accel])
        .args(["-nographic", "-no-reboot", "-kernel"])
        .arg(&p.unpacked.vmlinuz)
        .arg("-initrd")
        .arg(&p.initrd)
        .arg("-append")
        .arg(format!(
            // loglevel=5, not quiet: a lockup's or a warning's stack is printed at the
            // default level, which quiet hides; on a lockup, every CPU's backtrace.
            "console={} loglevel=5 panic=-1 softlockup_all_cpu_backtrace=1 {} bypass_cmd={}",
            a.console,
            p.k.cmdline,
            p.script.display()
        ))
        .args(p.unpacked.share.qemu_args(&socket, MEM_MIB))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    cmd::echo(&qemu);
    let mut child = qemu
        .spawn()
        .with_context(|| format!("start {} (install {})", a.qemu, a.qemu_package))?;
    let stdout = child.stdout.take().context("qemu stdout")?;
    let mut heard = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        let mut buf = Vec::new();
        while r.read_until(b'\n', &mut buf).unwrap_or(0) > 0 {
            let line = String::from_utf8_lossy(&buf)
                .trim_end_matches(['\r', '\n'])
                .to_owned();
            if tx.send(line).is_err() {
                break;
            }
            buf.clear();
        }
    });
    let mut outcome = Outcome::default();
    // When the test now running started (libtest prints a test's line when it ends,
    // one test at a time): how long each took, to see which dominate a run.
    let mut since = Instant::now();
    loop {
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(line) => {
                heard = Instant::now();
                // The console's escape sequences and BIOS noise are of no use here.
                let clean: String = line.chars().filter(|c| !c.is_control()).collect();
                // One line at a time: guests that run together do not cut into each
                // other's lines.
                println!("{prefix}{clean}");
                let ended = outcome.passed.len() + outcome.failed.len();
                outcome.line(&clean);
                if clean.starts_with("running ") {
                    since = Instant::now();
                } else if let Some(t) = outcome.passed.get(ended).or(outcome.failed.get(ended)) {
                    outcome.seconds.push((t.clone(), since.elapsed().as_secs()));
                    since = Instant::now();
                }
                if lockup_secs(&clean).is_some_and(|s| s >= LOCKUP_LIMIT_SECS) {
                    let _ = child.kill();
                    let _ = child.wait();
                    bail!(
                        "the guest kernel locked up ({clean}); killed it: the stacks are in the \
                         console above, from the first 'soft lockup' line"
                    );
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if heard.elapsed() > SILENCE {
            let _ = child.kill();
            let _ = child.wait();
            bail!("the guest printed nothing for {SILENCE:?}; killed it as hung");
        }
    }
    let _ = reader.join();
    let _ = child.wait();
    drop(virtiofsd);
    Ok(outcome)
}

/// `(name, executable)` of the privileged test binary, built first, with the testbed's
/// tools it runs beside it (the guest sees the host's target directory).
fn test_binaries(build: &dyn Build) -> Result<Vec<(String, String)>> {
    // The apps suite's programs too: a guest runs what the host last built.
    build.test_tools()?;
    let mut cargo = build.cargo()?;
    cargo.args([
        "test",
        "--package",
        workspace::INTEGRATION_TEST,
        "--no-run",
        "--message-format=json",
    ]);
    cmd::echo(&cargo);
    let text = cmd::output(&mut cargo)?;
    let mut out = Vec::new();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if v["reason"] != "compiler-artifact" || v["target"]["kind"] != json!(["test"]) {
            continue;
        }
        let (Some(name), Some(exe)) = (v["target"]["name"].as_str(), v["executable"].as_str())
        else {
            continue;
        };
        if name == PRIVILEGED {
            out.push((name.to_owned(), exe.to_owned()));
        }
    }
    if out.len() != 1 {
        bail!("cargo built no test binary `{PRIVILEGED}` (found {out:?})");
    }
    Ok(out)
}

/// Where the results of full kernel runs are kept (the README's table reads them).
pub fn results_dir() -> PathBuf {
    workspace::root().join("results").join("kernels")
}

/// Where a run given harness arguments keeps its record: beside the full runs', never
/// over one (`.gitignore` keeps it out of commits).
pub fn partial_results_dir() -> PathBuf {
    results_dir().join("partial")
}

fn save(p: &Prepared, o: &Outcome, secs: u64) -> Result<()> {
    let (k, u) = (p.k, &p.unpacked);
    let dir = if p.partial {
        partial_results_dir()
    } else {
        results_dir()
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let v = json!({
        "kernel": k.name,
        "note": k.note,
        "package": u.package,
        "release": o.release,
        "cmdline": k.cmdline,
        "expect": format!("{:?}", k.expect),
        "status": o.status,
        "refusal": o.refusal.as_ref().map(|(c, n, l)| json!({"code": c, "lines": n, "line": l})),
        "arch": k.arch,
        "smoke": o.smoke,
        "passed": o.counts.passed,
        "failed": o.counts.failed,
        "failed_tests": o.failed,
        "passed_tests": o.passed,
        "tests": p.tests.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        "filter": p.harness,
        "cpus": p.cpus,
        "share": format!("{:?}", u.share),
        "seconds": secs,
        "test_seconds": o.seconds.iter().map(|(t, s)| json!([t, s])).collect::<Vec<_>>(),
    });
    let path = dir.join(format!("{}.json", k.name));
    std::fs::write(&path, serde_json::to_string_pretty(&v)? + "\n")
        .with_context(|| format!("write {}", path.display()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn builds_under_the_guests_tmpfs_are_refused() {
        use std::path::Path;
        assert_eq!(
            super::hidden_in_guest(Path::new("/tmp/ci/target")),
            Some("/tmp")
        );
        assert_eq!(super::hidden_in_guest(Path::new("/run/x")), Some("/run"));
        assert_eq!(super::hidden_in_guest(Path::new("/work/main/target")), None);
        assert_eq!(super::hidden_in_guest(Path::new("/tmpfoo/target")), None);
    }

    use super::*;

    #[test]
    fn a_soft_lockup_line_gives_its_seconds() {
        let l = "[ 3441.125686] watchdog: BUG: soft lockup - CPU#1 stuck for 2660s! [mesh::skip_port:9983]";
        assert_eq!(lockup_secs(l), Some(2660));
        assert_eq!(
            lockup_secs("watchdog: BUG: soft lockup - CPU#0 stuck for 22s! [a:1]"),
            Some(22)
        );
        assert_eq!(lockup_secs("test mesh::x ... ok"), None);
        assert_eq!(lockup_secs("BUG: soft lockup - CPU#0 stuck for s!"), None);
    }

    #[test]
    fn a_verdict_the_kernel_cut_off_is_still_counted() {
        let mut o = Outcome::default();
        for line in [
            "test tcp_semantics::so_rcvtimeo_times_out ... [ 1646.377825] bypass-agent[14697] is installing a program with bpf_probe_write_user helper that may corrupt user memory!",
            "[ 1646.379116] bypass-agent[14697] is installing a program with bpf_probe_write_user helper that may corrupt user memory!",
            "ok",
            "test a::b ... ok",
            "test a::c ... FAILED[ 12.5] sysrq: x",
            "test a::d ... [ 1.0] x",
            "FAILED",
            "ok",
        ] {
            o.line(line);
        }
        assert_eq!(o.passed, ["tcp_semantics::so_rcvtimeo_times_out", "a::b"]);
        assert_eq!(o.failed, ["a::c", "a::d"]);
    }

    #[test]
    fn the_smoke_line_carries_the_status() {
        let mut o = Outcome::default();
        o.line(&format!(
            "{} {{\"pass\": true, \"status\": {{\"attached\": true}}}}",
            guest::SMOKE
        ));
        assert_eq!(o.smoke.as_ref().map(|s| s["pass"] == true), Some(true));
        assert_eq!(o.status, Some(json!({"attached": true})));
        o.line(&format!("{} 0", guest::EXIT));
        assert_eq!(o.exit, Some(0));
        // As a CI run printed it, the power-off message inside the line.
        o.line(&format!("{} 0[ 1345.789638] sysrq: Power Off", guest::EXIT));
        assert_eq!(o.exit, Some(0));
        o.line(&format!("{} 101", guest::EXIT));
        assert_eq!(o.exit, Some(101));
        o.line(&format!("{} [ 1.0] x", guest::EXIT));
        assert_eq!(o.exit, None);
    }

    #[test]
    fn slow_tests_skipped_unless_tests_are_named() {
        let skip = vm_harness(&["--nocapture".to_owned()]);
        assert_eq!(skip[0], "--nocapture");
        assert!(
            skip.windows(2)
                .any(|w| w[0] == "--skip" && w[1] == SLOW_UNDER_EMULATION[0])
        );
        assert!(skip.windows(2).any(|w| w[0] == "--skip" && w[1] == "k8s::"));
        let named = vm_harness(&["thousand_concurrent".to_owned()]);
        assert_eq!(named, ["thousand_concurrent", "--skip", "k8s::"]);
        // A share of every run skips modules: that names no test.
        let share = vm_harness(&EVERY_RUN[0].harness());
        assert!(
            share
                .windows(2)
                .any(|w| w[0] == "--skip" && w[1] == SLOW_UNDER_EMULATION[0])
        );
    }

    #[test]
    fn every_test_runs_on_a_kernel_of_every_run() {
        // What one loading kernel leaves, no other leaves too: no pattern of one matches
        // (is part of) a pattern of another.
        let loads: Vec<&EveryRun> = EVERY_RUN
            .iter()
            .filter(|r| catalog::find(r.kernel).is_some_and(|k| k.expect == catalog::Expect::Loads))
            .collect();
        assert!(loads.len() >= 2, "every run boots two kernels that load");
        for (i, a) in loads.iter().enumerate() {
            for b in &loads[i + 1..] {
                for p in a.leaves {
                    for q in b.leaves {
                        assert!(
                            !p.contains(q) && !q.contains(p),
                            "{p} ({}) and {q} ({}): a test both leave runs on neither",
                            a.kernel,
                            b.kernel
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn vcpus_default_to_two_and_take_one() {
        assert_eq!(cpus_of(None).unwrap(), 2);
        assert_eq!(cpus_of(Some("1")).unwrap(), 1);
        assert!(cpus_of(Some("0")).is_err());
        assert!(cpus_of(Some("one")).is_err());
    }

    #[test]
    fn passed_and_failed_tests_are_named() {
        let mut o = Outcome::default();
        o.line("test a_b ... ok");
        o.line("test c_d ... FAILED");
        assert_eq!(
            (o.passed, o.failed),
            (vec!["a_b".to_owned()], vec!["c_d".to_owned()])
        );
    }
}
