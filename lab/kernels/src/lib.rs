//! `cargo xtask test --kernel NAME`: the privileged tests on another kernel, booted in
//! qemu (TCG, one thread for both vCPUs; `BYPASS_VM_ACCEL=kvm` where KVM runs a guest)
//! from a Debian kernel package, with the host's filesystem shared read-only (9p) under
//! a tmpfs overlay, so the guest runs the very binaries the host built. The serial
//! console carries the results back; they are counted like the host run's and kept in
//! `results/kernels/NAME.json`, which `cargo xtask kernel-table` turns into the
//! README's table. A kernel of another architecture (arm64) boots in that
//! architecture's qemu and runs the smoke test, built for it, instead of the privileged
//! tests (see `smoke`).
//!
//! What a run needs built (the test tools, the cross-built agent) comes from the caller
//! through [`Build`]: xtask owns the toolchain and the cargo builds.

pub mod arch;
mod catalog;
mod fetch;
mod guest;
mod initramfs;
mod smoke;
pub mod summary;
pub mod table;

use std::{
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};

use kube_testenv::{cmd, workspace};

pub use catalog::KERNELS;
pub use summary::Counts;

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
    if harness.iter().all(|a| a.starts_with("--")) {
        for t in SLOW_UNDER_EMULATION {
            out.extend(["--skip".to_owned(), t.to_owned()]);
        }
    }
    for m in HOST_ONLY {
        out.extend(["--skip".to_owned(), m.to_owned()]);
    }
    out
}

/// The kernels every `cargo xtask test` boots after the host's tests: the one most
/// operators run, and the refusal below the minimum.
pub const EVERY_RUN: [&str; 2] = ["6.1", "5.10"];

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

/// How long one VM may run.
const TIMEOUT: Duration = Duration::from_secs(60 * 60);

/// How long the guest's watchdog may report a CPU stuck before the run is ended: a
/// kernel that spins this long will not recover, and waiting for [`TIMEOUT`] only hides
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
        } else if let Some(t) = line
            .strip_prefix("test ")
            .and_then(|l| l.strip_suffix(" ... FAILED"))
        {
            self.failed.push(t.to_owned());
        } else if let Some(t) = line
            .strip_prefix("test ")
            .and_then(|l| l.strip_suffix(" ... ok"))
        {
            self.passed.push(t.to_owned());
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
    match run_once(build, agent, name, harness) {
        Ok(done) => done,
        Err(e) => (
            Counts {
                failed: 1,
                ..Counts::default()
            },
            Err(e),
        ),
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

fn run_once(
    build: &dyn Build,
    agent: &Path,
    name: &str,
    harness: &[String],
) -> Result<(Counts, Result<()>)> {
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
    let target = workspace::target_dir()?;
    if let Some(hidden) = hidden_in_guest(&target) {
        bail!(
            "the build is under {hidden}, which the guest mounts a fresh tmpfs over, so it \
             would not see {}: run from a checkout outside {hidden}",
            target.display()
        );
    }
    let smoke = k.expect == catalog::Expect::Smoke;
    let harness = &vm_harness(harness);
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
    let init = guest::init(cross.is_some());
    let initrd = initramfs::build(&unpacked, &busybox, a.modules, &init)?;
    let dir = target.join("vm").join(name);
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
        let env: Vec<(String, String)> = ["CI", "RUST_BACKTRACE"]
            .iter()
            .filter_map(|k| std::env::var(k).ok().map(|v| ((*k).to_owned(), v)))
            .collect();
        let text = guest::script(&guest::Run {
            modules: &unpacked.modules.display().to_string(),
            agent: &agent.display().to_string(),
            refuses: k.expect == catalog::Expect::Refuses,
            tests: &tests,
            harness,
            env: &env,
        });
        (text, tests)
    };
    std::fs::write(&script, text).with_context(|| format!("write {}", script.display()))?;
    cmd::run(Command::new("chmod").arg("755").arg(&script))?;

    eprintln!(
        "kernel {name}: booting {} ({}) in qemu",
        unpacked.package, unpacked.release
    );
    let started = Instant::now();
    let mut outcome = boot(a, &unpacked.vmlinuz, &initrd, &script, k.cmdline)?;
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
    save(k, &unpacked, &outcome, secs, harness, &tests)?;
    println!(
        "test: {} (kernel {name}, {}, {secs} s)",
        outcome.counts,
        outcome.release.as_deref().unwrap_or("did not boot")
    );
    Ok((outcome.counts, result))
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
fn boot(
    a: &arch::Arch,
    vmlinuz: &Path,
    initrd: &Path,
    script: &Path,
    cmdline: &str,
) -> Result<Outcome> {
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
    let mut qemu = Command::new(a.qemu);
    qemu.args([
        "-machine", a.machine, "-cpu", cpu, "-m", "4096", "-smp", "2",
    ])
    .args(["-accel", &accel])
    .args(["-nographic", "-no-reboot", "-kernel"])
    .arg(vmlinuz)
    .arg("-initrd")
    .arg(initrd)
    .arg("-append")
    .arg(format!(
        // loglevel=5, not quiet: a lockup's or a warning's stack is printed at the
        // default level, which quiet hides; on a lockup, every CPU's backtrace.
        "console={} loglevel=5 panic=-1 softlockup_all_cpu_backtrace=1 {cmdline} bypass_cmd={}",
        a.console,
        script.display()
    ))
    .args([
        "-virtfs",
        "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::null());
    cmd::echo(&qemu);
    let mut child = qemu
        .spawn()
        .with_context(|| format!("start {} (install {})", a.qemu, a.qemu_package))?;
    let stdout = child.stdout.take().context("qemu stdout")?;
    let deadline = Instant::now() + TIMEOUT;
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
    let mut out = std::io::stdout();
    loop {
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(line) => {
                // The console's escape sequences and BIOS noise are of no use here.
                let clean: String = line.chars().filter(|c| !c.is_control()).collect();
                writeln!(out, "{clean}")?;
                outcome.line(&clean);
                if lockup_secs(&clean).is_some_and(|s| s >= LOCKUP_LIMIT_SECS) {
                    let _ = child.kill();
                    bail!(
                        "the guest kernel locked up ({clean}); killed it: the stacks are in the \
                         console above, from the first 'soft lockup' line"
                    );
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            bail!("the guest ran longer than {TIMEOUT:?}; killed it");
        }
    }
    let _ = reader.join();
    let _ = child.wait();
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

/// Where the results of kernel runs are kept.
pub fn results_dir() -> PathBuf {
    workspace::root().join("results").join("kernels")
}

fn save(
    k: &catalog::Kernel,
    u: &fetch::Unpacked,
    o: &Outcome,
    secs: u64,
    harness: &[String],
    tests: &[(String, String)],
) -> Result<()> {
    let dir = results_dir();
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
        "tests": tests.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        "filter": harness,
        "seconds": secs,
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
