//! What a killed run of the suite leaves (its guards never ran) is removed by the next
//! run before its first pods: the dead run's processes (an agent naming its pin
//! directory, a pod's process in its cgroup), cgroups, namespaces, bridge and pin
//! directory; a live run's are left alone.

use crate::support::privileged;

use std::{
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::support::two_pods;
use anyhow::{Context as _, Result, ensure};
use testbed::names;

/// Waits for the child the reaper should have killed, failing past a generous net.
fn reaped(child: &mut Child, what: &str) -> Result<()> {
    let deadline = Instant::now() + testbed::steps::NET;
    while child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            anyhow::bail!("{what} was not killed");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn run(cmd: &str, args: &[&str]) -> Result<()> {
    let st = Command::new(cmd)
        .args(args)
        .status()
        .with_context(|| format!("run {cmd}"))?;
    ensure!(st.success(), "{cmd} {args:?}: {st}");
    Ok(())
}

#[test]
fn killed_runs_pods_agents_and_pins_are_removed_by_the_next_run() -> Result<()> {
    privileged!();
    // A live run: this process's pods.
    let live = two_pods()?;
    // A dead run's tag: the pid of a process that has exited.
    let mut gone = Command::new("true").spawn().context("run true")?;
    let dead_pid = gone.id();
    gone.wait()?;
    let tag = names::tag(dead_pid, 0);
    let prefix = names::prefix();
    let cgroup_root = testbed::cgroup::cgroup2_mount()?;
    let cgroup = cgroup_root.join(names::resource(&tag, "cg"));
    let pod_cgroup = cgroup.join("pod-a");
    let netns = names::resource(&tag, "a");
    let bridge = names::ifname("-br", &tag).map_err(anyhow::Error::msg)?;
    let host_if = names::ifname("-a", &tag).map_err(anyhow::Error::msg)?;
    let pins = Path::new("/sys/fs/bpf").join(names::resource(&tag, "pins"));

    std::fs::create_dir_all(&pod_cgroup)?;
    run("ip", &["netns", "add", &netns])?;
    run("ip", &["link", "add", &bridge, "type", "bridge"])?;
    run(
        "ip",
        &[
            "link", "add", &host_if, "type", "veth", "peer", "name", "eth0", "netns", &netns,
        ],
    )?;
    run("ip", &["link", "set", &host_if, "master", &bridge])?;
    std::fs::create_dir(&pins)?;
    // A pod's process, in the dead run's cgroup and namespace.
    let mut pod_process = Command::new("ip")
        .args(["netns", "exec", &netns, "sleep", "100000"])
        .stdin(Stdio::null())
        .spawn()
        .context("run sleep in the dead run's namespace")?;
    std::fs::write(
        pod_cgroup.join("cgroup.procs"),
        pod_process.id().to_string(),
    )?;
    // Its agent, which names its pin directory.
    // (bash waiting in its builtin `read` on a pipe never written: one process.)
    let mut agent = Command::new("bash")
        .args(["-c", "read -r _", "--pin-dir"])
        .arg(&pins)
        .stdin(Stdio::piped())
        .spawn()
        .context("run bash (as a dead run's agent)")?;
    // Started (its command line is bash's, not this process's copy before exec).
    let cmdline = format!("/proc/{}/cmdline", agent.id());
    let needle = pins.display().to_string();
    let deadline = Instant::now() + testbed::steps::NET;
    while !std::fs::read(&cmdline)?
        .split(|&b| b == 0)
        .any(|a| a == needle.as_bytes())
    {
        ensure!(
            Instant::now() < deadline,
            "the dead run's agent never started"
        );
        std::thread::sleep(Duration::from_millis(10));
    }

    let r = testbed::reap::reap(prefix)?;
    eprintln!("reaped: {r:?}");
    reaped(&mut agent, "the dead run's agent")?;
    reaped(&mut pod_process, "the dead run's pod process")?;
    ensure!(!cgroup.exists(), "{} is still there", cgroup.display());
    ensure!(
        !Path::new("/run/netns").join(&netns).exists(),
        "namespace {netns} is still there"
    );
    for link in [&bridge, &host_if] {
        ensure!(
            !Path::new("/sys/class/net").join(link).exists(),
            "link {link} is still there"
        );
    }
    ensure!(!pins.exists(), "{} is still there", pins.display());
    // The live run's pods are untouched.
    ensure!(
        live.a.netns().path().exists() && live.b.netns().path().exists(),
        "the live run's namespaces were removed"
    );
    ensure!(live.cgroup().exists(), "the live run's cgroup was removed");
    Ok(())
}
