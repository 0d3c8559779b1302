//! `cargo xtask test`: setup and build, the unit tests of the host crates, then the
//! privileged tests of `integration-test` one at a time (they share kernel state) against
//! the built agent, with the test tool of `testbed` built beside them; ends with `N passed,
//! M failed` and fails on any failure. Privileged tests never skip: without root the
//! task fails.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    path::Path,
    process::{Command, ExitStatus, Stdio},
};

use anyhow::{Context as _, Result, bail};

use crate::{build, setup, workspace};
use kernel_matrix::Counts;
use kube_testenv::cmd;

/// Arguments of `cargo xtask test`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub build: build::Options,
    /// Run the privileged tests on this kernel instead, booted in qemu from a Debian
    /// package (see `cargo xtask kernel-table`): 6.1, 6.12, 6.12-lockdown, 5.10, 6.1-arm64.
    #[arg(long)]
    pub kernel: Option<String>,
    /// Skip the kernels `cargo xtask test` boots after the host's tests.
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
    let root = nix::unistd::geteuid().is_root();
    if is_ci() && !root {
        bail!(
            "CI is set but this is not root: the privileged tests cannot run, and under CI \
             they never skip; run .ci/run as root"
        );
    }
    let tools = setup::ensure(setup::Scope::All)?;
    let agent = build::build_agent(&tools, &args.build)?;
    if let Some(kernel) = &args.kernel {
        return kernel_matrix::run(&tools, &agent, kernel, &args.harness).1;
    }
    if args.cluster {
        let mut counts = Counts::default();
        return cluster_tests(&tools, &agent, &args.harness, &mut counts);
    }

    let mut counts = Counts::default();
    let mut failures = Vec::new();

    let mut unit = tools.cargo()?;
    unit.args(["test", "--workspace", "--no-fail-fast"])
        .args(["--exclude", workspace::INTEGRATION_TEST])
        .args(["--exclude", workspace::EBPF])
        .args(["--exclude", workspace::MINIMAL_EBPF])
        .arg("--")
        .args(&args.harness);
    let status = run_counting(&mut unit, &mut counts)?;
    if !status.success() {
        failures.push(format!("unit tests: {status}"));
    }

    if root {
        // The Kubernetes tests start a real API server; build it here, once and cached,
        // rather than inside the first test.
        kube_testenv::ensure_binaries()
            .context("build kube-apiserver and etcd for the Kubernetes tests")?;
        // The tool the tests run, where they look for it (next to the test binaries).
        build::build_test_tool(&tools, false)?;
        // The earlier agent the upgrade test switches to and from, once per commit.
        build::build_previous_agent(&tools)?;
        // The apps suite's own programs (Go, Java, Node), beside that tool.
        crate::apps::build("debug")?;
        let mut privileged = privileged_tests(tools.cargo()?, &agent, &args.harness);
        let before = counts;
        let pins_before = bpffs_entries();
        let status = run_counting(&mut privileged, &mut counts)?;
        if !status.success() {
            failures.push(format!("privileged tests: {status}"));
        } else if counts.passed == before.passed && counts.failed == before.failed {
            eprintln!("test: warning: no privileged test ran");
        }
        let left = leftover_pins(&pins_before, &bpffs_entries());
        if !left.is_empty() {
            failures.push(format!(
                "the privileged tests left pins in {BPFFS}: {} (a test or the agent's \
                 shutdown did not remove what it pinned)",
                left.join(", ")
            ));
        }
    } else {
        failures.push(
            "privileged tests not run: they need root (run `cargo xtask test` as root)".into(),
        );
    }

    // The one-node cluster's end-to-end tests, in every full run.
    if root && !args.no_cluster && args.harness.is_empty() {
        println!("test: host {counts}");
        if let Err(e) = cluster_tests(&tools, &agent, &args.harness, &mut counts) {
            failures.push(format!("cluster: {e:#}"));
        }
    }
    // The kernel matrix's share of every full run (the others on demand, `--kernel
    // NAME`); a filtered run is about the host's tests.
    if root && !args.no_kernels && args.harness.is_empty() {
        println!("test: host and cluster {counts}");
        for kernel in kernel_matrix::EVERY_RUN {
            let (c, verdict) = kernel_matrix::run(&tools, &agent, kernel, &args.harness);
            counts.passed += c.passed;
            counts.failed += c.failed;
            if let Err(e) = verdict {
                failures.push(format!("kernel {kernel}: {e:#}"));
            }
        }
    }
    // The closing line: the host's tests and the kernels' together.
    println!("test: {counts}");
    if failures.is_empty() {
        return Ok(());
    }
    bail!("{}", failures.join("; "))
}

/// `cargo xtask test --cluster`: the cluster's end-to-end tests, one at a time.
fn cluster_tests(
    tools: &setup::Tools,
    agent: &Path,
    harness: &[String],
    total: &mut Counts,
) -> Result<()> {
    use kube_testenv::cluster;
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "the cluster tests run kubelet and containerd: run `cargo xtask test --cluster` as root"
        );
    }
    setup::ensure_cluster()?;
    let layout = cluster::config::Layout::default();
    let started = std::time::Instant::now();
    let brought_up = if cluster::is_up(&layout) {
        false
    } else {
        cluster::up(&layout)?;
        true
    };
    eprintln!("test: cluster up in {:.0?}", started.elapsed());
    let result = (|| -> Result<()> {
        let test_tool = crate::image::build_test_tool(tools)?;
        let out = workspace::target_dir()?.join(kube_testenv::image::IMAGES_DIR);
        for t in kube_testenv::image::build_all(agent, &test_tool, &out)? {
            cluster::import_image(&layout, &t)?;
        }
        let bins = cluster::bins::ensure()?;
        let helm = cluster::bins::ensure_helm()?;
        let kubeconform = cluster::bins::ensure_kubeconform()?;
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
            .env(kube_testenv::KUBECONFIG_ENV, layout.admin_kubeconfig())
            .env(kube_testenv::KUBECTL_ENV, bins.get("kubectl"))
            .env("BYPASS_HELM", helm)
            .env("BYPASS_KUBECONFORM", kubeconform)
            .env("BYPASS_AGENT_BIN", agent)
            .args(["--", "--test-threads=1"])
            .args(harness);
        let mut counts = Counts::default();
        let status = run_counting(&mut cargo, &mut counts)?;
        println!("test: cluster {counts}");
        total.passed += counts.passed;
        total.failed += counts.failed;
        if !status.success() {
            bail!("cluster tests: {status}");
        }
        // Every test ends with the README's uninstall: nothing of the agent is left.
        let left: Vec<String> = std::fs::read_dir(cluster::AGENT_PIN_DIR)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        if !left.is_empty() {
            bail!(
                "the cluster tests left pins in {}: {} (the uninstall did not remove them)",
                cluster::AGENT_PIN_DIR,
                left.join(", ")
            );
        }
        Ok(())
    })();
    if brought_up {
        cluster::down(&layout)?;
    }
    result
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
