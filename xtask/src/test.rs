//! `cargo xtask test`: setup and build; what the kernel matrix's guests run (the agent,
//! the test tool of `testbed`, the earlier agents, the apps suite's programs, the
//! privileged tests' binary); the demo's tests, which measure, on a quiet machine; then
//! the guests boot (each guest is one qemu TCG thread, [`GUEST_LANES`] at once, each
//! console line prefixed with its kernel's name), and beside them the unit tests of the
//! host crates, the privileged tests of `integration-test` one at a time (they share
//! kernel state) and the one-node cluster's. Ends with `N passed, M failed` over all of
//! it and fails on any failure. Privileged tests never skip: without root the task fails.
use std::{
    collections::VecDeque,
    io::{BufRead as _, BufReader, Write as _},
    path::Path,
    process::{Command, ExitStatus, Stdio},
    sync::Mutex,
    time::Instant,
};

use anyhow::{Context as _, Result, bail};
use kernel_matrix::Counts;
use xtask_lib::{cmd, workspace};

use crate::{build, setup};

/// Arguments of `cargo xtask test`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub build: build::Options,
    /// Run the privileged tests on this kernel instead, booted in qemu from a Debian
    /// package (see `cargo xtask kernel-table`): 6.1, 6.12, 7.3, 7.3-cloud, 6.18,
    /// 6.12-lockdown, 5.10, 6.1-arm64. Several, comma-separated, boot side by side (two
    /// at a time).
    #[arg(long)]
    pub kernel: Option<String>,
    /// Skip the kernels `cargo xtask test` boots beside the host's tests.
    #[arg(long)]
    pub no_kernels: bool,
    /// Skip the one-node cluster's end-to-end tests that `cargo xtask test` runs after
    /// the host's tests.
    #[arg(long)]
    pub no_cluster: bool,
    /// Only the end-to-end tests against the one-node cluster (`cargo xtask cluster`):
    /// brings it up if it is not (and down afterwards), loads the images, runs
    /// `test/integration-test/tests/cluster/`.
    #[arg(long)]
    pub cluster: bool,
    /// Given to both test harnesses: a name filter, `--nocapture`, `--exact`, ...
    #[arg(last = true)]
    pub harness: Vec<String>,
}

/// `cargo xtask test`.
pub fn run(args: &Args) -> Result<()> {
    // Each stage's start is printed as seconds from here (where a slower machine's time
    // goes).
    let begun = Instant::now();
    let root = nix::unistd::geteuid().is_root();
    if is_ci() && !root {
        bail!(
            "CI is set but this is not root: the privileged tests cannot run, and under CI \
             they never skip; run .ci/run as root"
        );
    }
    let tools = setup::ensure(setup::Scope::All)?;
    let agent = build::build_agent(&tools, &args.build)?;
    if let Some(kernels) = &args.kernel {
        return kernels_on_demand(&tools, &agent, kernels, &args.harness);
    }
    if args.cluster {
        let mut counts = Counts::default();
        return cluster_tests(&tools, &agent, &args.harness, &mut counts);
    }

    let mut counts = Counts::default();
    let mut failures = Vec::new();

    // The kernel matrix's share of every full run (the others on demand, `--kernel
    // NAME`); a filtered run is about the host's tests.
    let mut guests = None;
    if root {
        // What the guests run, first: the tool the tests run, where they look for it
        // (next to the test binaries); the earlier agents the upgrade tests switch to and
        // from, once per commit; the apps suite's own programs (Go, Java, Node), beside
        // that tool.
        build::build_test_tool(&tools, false)?;
        build::build_previous_agents(&tools)?;
        crate::apps::build("debug")?;
        let started = Instant::now();
        // The host's privileged tests, counted apart for their own line.
        let mut host = Counts::default();
        let pins_before = bpffs_entries();
        let mut statuses = Vec::new();
        let rest = if !args.no_kernels && args.harness.is_empty() {
            // Prepared (downloaded, built) before the host's tests, which hold cargo's
            // lock while they run; booted beside them, once the tests that measure
            // have run on a machine the guests do not yet load. The unit tests and the
            // Kubernetes tests' API server, which no guest needs, are built after.
            let mut ready = VecDeque::new();
            for share in kernel_matrix::EVERY_RUN {
                match kernel_matrix::prepare(&tools, &agent, share.kernel, &share.harness()) {
                    Ok(p) => ready.push_back(p),
                    Err(e) => {
                        counts.failed += 1;
                        failures.push(format!("kernel {}: {e:#}", share.kernel));
                    }
                }
            }
            let first = [BEFORE_GUESTS.to_owned()];
            let mut privileged = privileged_tests(tools.cargo()?, &agent, &first);
            statuses.push(run_counting(&mut privileged, &mut host)?);
            println!(
                "test: the kernels' guests boot, {} s in",
                begun.elapsed().as_secs()
            );
            guests = Some(boot_guests(ready));
            vec!["--skip".to_owned(), BEFORE_GUESTS.to_owned()]
        } else {
            args.harness.clone()
        };
        unit_tests(&tools, &args.harness, &mut counts, &mut failures)?;
        // The Kubernetes tests start a real API server; build it here, once and cached,
        // rather than inside the first test.
        kube_testenv::ensure_binaries()
            .context("build kube-apiserver and etcd for the Kubernetes tests")?;
        let mut privileged = privileged_tests(tools.cargo()?, &agent, &rest);
        statuses.push(run_counting(&mut privileged, &mut host)?);
        println!(
            "test: host's privileged tests {host} in {} s",
            started.elapsed().as_secs()
        );
        if let Some(status) = statuses.iter().find(|s| !s.success()) {
            failures.push(format!("privileged tests: {status}"));
        } else if host.passed == 0 && host.failed == 0 {
            eprintln!("test: warning: no privileged test ran");
        }
        counts += host;
        let left = leftover_pins(&pins_before, &bpffs_entries());
        if !left.is_empty() {
            failures.push(format!(
                "the privileged tests left pins in {BPFFS}: {} (a test or the agent's \
                 shutdown did not remove what it pinned)",
                left.join(", ")
            ));
        }
    } else {
        unit_tests(&tools, &args.harness, &mut counts, &mut failures)?;
        failures.push(
            "privileged tests not run: they need root (run `cargo xtask test` as root)".into(),
        );
    }

    // The one-node cluster's end-to-end tests, in every full run.
    if root && !args.no_cluster && args.harness.is_empty() {
        println!("test: host {counts}, {} s in", begun.elapsed().as_secs());
        let started = Instant::now();
        if let Err(e) = cluster_tests(&tools, &agent, &args.harness, &mut counts) {
            failures.push(format!("cluster: {e:#}"));
        }
        println!("test: cluster done in {} s", started.elapsed().as_secs());
    }
    if let Some(guests) = guests {
        println!("test: host and cluster {counts}; waiting for the kernels");
        join_guests(guests, &mut counts, &mut failures);
    }
    // The closing line: the host's tests and the kernels' together.
    println!("test: {counts} in {} s", begun.elapsed().as_secs());
    if failures.is_empty() {
        return Ok(());
    }
    bail!("{}", failures.join("; "))
}

/// The unit tests of the host crates (every crate but the privileged tests' and the
/// eBPF programs'); a failure is added to `failures`.
fn unit_tests(
    tools: &setup::Tools,
    harness: &[String],
    counts: &mut Counts,
    failures: &mut Vec<String>,
) -> Result<()> {
    let mut unit = tools.cargo()?;
    unit.args(["test", "--workspace", "--no-fail-fast"])
        .args(["--exclude", workspace::INTEGRATION_TEST])
        .args(["--exclude", workspace::EBPF])
        .args(["--exclude", workspace::MINIMAL_EBPF])
        .arg("--")
        .args(harness);
    let status = run_counting(&mut unit, counts)?;
    if !status.success() {
        failures.push(format!("unit tests: {status}"));
    }
    Ok(())
}

/// `cargo xtask test --kernel A[,B...]`: one kernel's run, or several side by side
/// (prepared one after the other, then booted in [`GUEST_LANES`] lanes, each line
/// prefixed with its kernel's name); ends with the closing line over all of them.
fn kernels_on_demand(
    tools: &setup::Tools,
    agent: &Path,
    kernels: &str,
    harness: &[String],
) -> Result<()> {
    let names: Vec<&str> = kernels.split(',').map(str::trim).collect();
    if let [one] = names[..] {
        return kernel_matrix::run(tools, agent, one, harness).1;
    }
    let mut counts = Counts::default();
    let mut failures = Vec::new();
    let mut ready = VecDeque::new();
    for name in names {
        match kernel_matrix::prepare(tools, agent, name, harness) {
            Ok(p) => ready.push_back(p),
            Err(e) => {
                counts.failed += 1;
                failures.push(format!("kernel {name}: {e:#}"));
            }
        }
    }
    join_guests(boot_guests(ready), &mut counts, &mut failures);
    println!("test: {counts}");
    if failures.is_empty() {
        return Ok(());
    }
    bail!("{}", failures.join("; "))
}

/// The host's tests that run before the guests boot: the demo measures, and its
/// streams stay in the SockHash only while their readers keep up (a reader behind its
/// bound leaves by design); with two TCG threads beside it on two cores, every stream
/// left (`demo::demo_bypasses_and_says_so`: "no bypassed stream stayed").
const BEFORE_GUESTS: &str = "demo::";

/// How many guests boot at once beside the host's tests: each is one TCG thread, and
/// this machine has two cores.
const GUEST_LANES: usize = 2;

/// What one lane's guests gave: each kernel's name, counts and verdict.
type LaneRuns = Vec<(&'static str, Counts, Result<()>)>;

/// Boots `ready` in [`GUEST_LANES`] threads, each taking the next kernel when its last
/// is done; each console line is prefixed with `[NAME] `.
fn boot_guests(ready: VecDeque<kernel_matrix::Prepared>) -> Vec<std::thread::JoinHandle<LaneRuns>> {
    let queue = std::sync::Arc::new(Mutex::new(ready));
    (0..GUEST_LANES)
        .map(|_| {
            let queue = queue.clone();
            std::thread::spawn(move || {
                let mut runs = Vec::new();
                loop {
                    // The lock is released before the boot.
                    let next = queue.lock().ok().and_then(|mut q| q.pop_front());
                    let Some(p) = next else { break };
                    let name = p.name();
                    let started = Instant::now();
                    let (c, verdict) = p.boot(&format!("[{name}] "));
                    println!(
                        "test: kernel {name}: {c} in {} s",
                        started.elapsed().as_secs()
                    );
                    runs.push((name, c, verdict));
                }
                runs
            })
        })
        .collect()
}

/// Waits for the lanes of [`boot_guests`], adding their counts and failures.
fn join_guests(
    lanes: Vec<std::thread::JoinHandle<LaneRuns>>,
    counts: &mut Counts,
    failures: &mut Vec<String>,
) {
    for lane in lanes {
        let Ok(runs) = lane.join() else {
            counts.failed += 1;
            failures.push("a kernel's run panicked".into());
            continue;
        };
        for (kernel, c, verdict) in runs {
            *counts += c;
            if let Err(e) = verdict {
                failures.push(format!("kernel {kernel}: {e:#}"));
            }
        }
    }
}

/// `cargo xtask test --cluster`: the cluster's end-to-end tests, one at a time.
fn cluster_tests(
    tools: &setup::Tools,
    agent: &Path,
    harness: &[String],
    total: &mut Counts,
) -> Result<()> {
    use kube_testenv::cluster::{AGENT_PIN_DIR, bins};
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "the cluster tests run kubelet and containerd: run `cargo xtask test --cluster` as root"
        );
    }
    // The upgrade and rollback test moves the DaemonSet between this build and an
    // earlier one of the same layout.
    let earlier = build::build_previous_agent(tools, workspace::SAME_LAYOUT_AGENT_COMMIT)?;
    let mut cargo = tools.cargo()?;
    cargo
        .args([
            "test",
            "--package",
            workspace::INTEGRATION_TEST,
            "--features",
            "cluster",
            "--test",
            "cluster",
        ])
        .env("BYPASS_AGENT_BIN", agent)
        .args(["--", "--test-threads=1"])
        .args(harness);
    crate::cluster::with_cluster(tools, agent, Some(&earlier), &mut cargo, |cargo| {
        // Built after setup::ensure_cluster, which installs the Go they are built with.
        cargo
            .env("BYPASS_HELM", bins::ensure_helm()?)
            .env("BYPASS_KUBECONFORM", bins::ensure_kubeconform()?)
            .env("BYPASS_PROMTOOL", bins::ensure_promtool()?);
        let mut counts = Counts::default();
        let status = run_counting(cargo, &mut counts)?;
        println!("test: cluster {counts}");
        *total += counts;
        if !status.success() {
            bail!("cluster tests: {status}");
        }
        // Every test ends with the README's uninstall: nothing of the agent is left.
        let left: Vec<String> = std::fs::read_dir(AGENT_PIN_DIR)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        if !left.is_empty() {
            bail!(
                "the cluster tests left pins in {}: {} (the uninstall did not remove them)",
                AGENT_PIN_DIR,
                left.join(", ")
            );
        }
        Ok(())
    })
}

/// Where the tests' agents pin (each under its own directory).
const BPFFS: &str = "/sys/fs/bpf";

/// What the kernel itself pins into every bpffs it mounts (CONFIG_BPF_PRELOAD,
/// kernel/bpf/preload): not ours, and there from the first mount on.
const KERNEL_PRELOAD_PINS: [&str; 2] = ["maps.debug", "progs.debug"];

/// The names at the top of the bpffs mount (empty when it is not mounted).
fn bpffs_entries() -> std::collections::BTreeSet<String> {
    std::fs::read_dir(BPFFS)
        .map(|dir| {
            dir.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Entries present after the tests that were not before, the kernel's own excepted.
fn leftover_pins(
    before: &std::collections::BTreeSet<String>,
    after: &std::collections::BTreeSet<String>,
) -> Vec<String> {
    after
        .difference(before)
        .filter(|n| !KERNEL_PRELOAD_PINS.contains(&n.as_str()))
        .cloned()
        .collect()
}

/// `cargo test -p integration-test -- --test-threads=1` against `agent` (the testbed's
/// test tool built first: [`build::build_test_tool`]).
fn privileged_tests(mut cargo: Command, agent: &Path, harness: &[String]) -> Command {
    cargo
        .env("BYPASS_AGENT_BIN", agent)
        .args([
            "test",
            "--package",
            workspace::INTEGRATION_TEST,
            "--no-fail-fast",
            "--",
            "--test-threads=1",
        ])
        .args(harness);
    cargo
}

/// Whether we run under CI (`CI=true`, as GitHub, GitLab and most runners set it).
fn is_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// Runs `cmd`, echoing its stdout as it comes and adding its `test result:` lines to
/// `counts`.
fn run_counting(cmd: &mut Command, counts: &mut Counts) -> Result<ExitStatus> {
    cmd::echo(cmd);
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("could not start `{}`", cmd::display(cmd)))?;
    if let Some(stdout) = child.stdout.take() {
        let mut reader = BufReader::new(stdout);
        let mut line = Vec::new();
        let mut out = std::io::stdout();
        while reader.read_until(b'\n', &mut line)? > 0 {
            out.write_all(&line)?;
            out.flush()?;
            counts.add_line(&String::from_utf8_lossy(&line));
            line.clear();
        }
    }
    child
        .wait()
        .with_context(|| format!("`{}` did not finish", cmd::display(cmd)))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn set(v: &[&str]) -> BTreeSet<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn leftovers_are_new_entries_but_the_kernels() {
        // A fresh mount during the run brings the kernel's preload entries: not ours.
        assert!(leftover_pins(&set(&[]), &set(&["maps.debug", "progs.debug"])).is_empty());
        assert_eq!(
            leftover_pins(&set(&["bypass"]), &set(&["bypass", "bt-x1-pins"])),
            vec!["bt-x1-pins".to_owned()]
        );
        assert!(leftover_pins(&set(&["old"]), &set(&[])).is_empty());
    }
}
