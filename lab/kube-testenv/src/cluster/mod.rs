//! The one-node cluster of `cargo xtask cluster up|down`: a one-node Kubernetes on this machine from the parts
//! operators run. etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet
//! and kube-proxy (iptables mode) built from one `k8s.io/kubernetes` module and cached;
//! containerd 1.6, runc and the CNI bridge/host-local/portmap plugins from Debian, with
//! a containerd of its own (config, root, state and socket under [`config::Layout`]);
//! a sandbox (pause) image built here. `down` stops everything and takes back every
//! change it made to the host (see [`host`]).

pub mod bins;
pub mod cgroups;
pub mod config;
pub mod host;
pub mod pki;
pub mod procs;

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use xtask_lib::cmd;

use crate::{
    env::{api_server_args, etcd_args, free_port},
    wait_for,
};
use cgroups::CgroupLayout;
use config::{Layout, NODE_IP, NODE_NAME};

/// The pin directory of `deploy/`'s DaemonSet: `down` removes what an agent left there.
pub const AGENT_PIN_DIR: &str = "/sys/fs/bpf/bypass";

/// `kubectl` of the cluster's version with the admin kubeconfig.
pub fn kubectl(layout: &Layout) -> Result<Command> {
    let bins = bins::ensure()?;
    Ok(crate::Kubectl::new(bins.get("kubectl"), layout.admin_kubeconfig()).cmd())
}

/// `ctr` on the cluster's containerd, Kubernetes namespace.
pub fn ctr(layout: &Layout) -> Command {
    let mut c = Command::new("ctr");
    c.arg("--address")
        .arg(layout.containerd_socket())
        .args(["--namespace", "k8s.io"]);
    c
}

/// Imports a docker-archive tarball into the cluster's containerd.
pub fn import_image(layout: &Layout, tarball: &Path) -> Result<()> {
    cmd::output(ctr(layout).args(["images", "import"]).arg(tarball))
        .map(drop)
        .with_context(|| format!("import {}", tarball.display()))
}

/// Starts the cluster; returns the admin kubeconfig.
pub fn up(layout: &Layout) -> Result<PathBuf> {
    if !nix::unistd::geteuid().is_root() {
        bail!("`cargo xtask cluster up` runs kubelet and containerd: run it as root");
    }
    let bins = bins::ensure()?;
    if layout.pids().exists() || layout.var.exists() {
        eprintln!("cluster: a previous cluster's state is here; taking it down first");
        down(layout)?;
    }
    let cg = CgroupLayout::detect()?;
    eprintln!(
        "cluster: cgroup layout {cg:?} (kubelet: cgroup {}, driver {})",
        if cg.is_unified() { "v2" } else { "v1" },
        cg.driver()
    );
    make_dirs(layout)?;
    change_host(layout)?;
    let admin = write_credentials(layout)?;
    let etcd = start_etcd(layout, &bins)?;
    start_api_server(layout, &bins, &etcd)?;
    start_containerd(layout, cg)?;
    start_controllers(layout, &bins, &admin)?;
    start_kube_proxy(layout, &bins, &admin)?;
    start_kubelet(layout, &bins, cg, &admin)?;
    wait_node_ready(layout)?;
    Ok(admin)
}

/// Step of [`up`]: the directories of the cluster's state.
fn make_dirs(layout: &Layout) -> Result<()> {
    for d in [
        layout.pki(),
        layout.logs(),
        layout.cni_conf_dir(),
        layout.kubelet_root(),
        layout.run.join("containerd"),
    ] {
        std::fs::create_dir_all(&d).with_context(|| format!("create {}", d.display()))?;
    }
    Ok(())
}

/// Step of [`up`]: the host changes the node needs (forwarding, a shared bpffs, the
/// node's link), after writing down what [`down`] restores.
fn change_host(layout: &Layout) -> Result<()> {
    // What down restores: ip_forward, and the cni-* namespaces that were not ours.
    let before_netns = host::cni_netns();
    let made_run_containerd = if Path::new("/run/containerd").exists() {
        ""
    } else {
        "made /run/containerd\n"
    };
    let forward = host::enable_forwarding()?;
    let shared_bpffs = if host::share_bpffs()? {
        "shared /sys/fs/bpf\n"
    } else {
        ""
    };
    std::fs::write(
        layout.restore(),
        format!(
            "ip_forward {forward}\n{made_run_containerd}{shared_bpffs}{}",
            before_netns
                .iter()
                .map(|n| format!("netns {n}\n"))
                .collect::<String>()
        ),
    )?;
    host::add_node_link()
}

/// Step of [`up`]: the PKI, the admission configuration and the admin kubeconfig;
/// returns the kubeconfig's path.
fn write_credentials(layout: &Layout) -> Result<PathBuf> {
    pki::make(&layout.pki())?;
    std::fs::write(layout.admission_config(), config::admission_config())?;
    let admin = layout.admin_kubeconfig();
    std::fs::write(
        &admin,
        crate::kubeconfig(
            "bypass-cluster",
            &config::api_server_url(),
            &layout.pki(),
            "admin",
        ),
    )?;
    Ok(admin)
}

/// The path of the PKI file `f`, as a daemon's argument.
fn pki_file(layout: &Layout, f: &str) -> String {
    layout.pki().join(f).display().to_string()
}

/// Step of [`up`]: etcd on two free ports; returns its client URL.
fn start_etcd(layout: &Layout, bins: &bins::Bins) -> Result<String> {
    let port = free_port()?;
    let args = etcd_args("bypass-cluster", &layout.var.join("etcd"), port)?;
    procs::spawn(
        "etcd",
        &bins.get("etcd"),
        &args,
        &layout.logs(),
        &layout.pids(),
    )?;
    Ok(format!("http://127.0.0.1:{port}"))
}

/// Step of [`up`]: kube-apiserver on the node address, on etcd at `etcd`; returns once
/// it is ready.
fn start_api_server(layout: &Layout, bins: &bins::Bins, etcd: &str) -> Result<()> {
    let p = |f: &str| pki_file(layout, f);
    let logs = layout.logs();
    let mut args = api_server_args(etcd, NODE_IP, config::API_PORT, &layout.pki(), "apiserver");
    args.extend([
        format!("--service-cluster-ip-range={}", config::SERVICE_CIDR),
        format!(
            "--kubelet-client-certificate={}",
            p("apiserver-kubelet-client.crt")
        ),
        format!("--kubelet-client-key={}", p("apiserver-kubelet-client.key")),
        format!(
            "--admission-control-config-file={}",
            layout.admission_config().display()
        ),
        "--kubelet-preferred-address-types=InternalIP".into(),
    ]);
    let api_server = bins.get("kube-apiserver");
    procs::spawn("kube-apiserver", &api_server, &args, &logs, &layout.pids())?;
    wait_for(
        "kube-apiserver /readyz",
        crate::wait::NET,
        procs::POLL,
        || cmd::output(kubectl(layout)?.args(["get", "--raw", "/readyz"])).map(drop),
    )
    .with_context(|| procs::tail(&logs.join("kube-apiserver.log"), 15))
}

/// Step of [`up`]: containerd with its configuration and the CNI's, then the sandbox
/// image imported.
fn start_containerd(layout: &Layout, cg: CgroupLayout) -> Result<()> {
    let logs = layout.logs();
    let status = std::fs::read_to_string("/proc/self/status")?;
    let restrict_oom = !config::has_capability(&status, config::CAP_SYS_RESOURCE);
    if restrict_oom {
        eprintln!("cluster: no CAP_SYS_RESOURCE here: containers keep containerd's oom_score_adj");
    }
    std::fs::write(
        layout.containerd_config(),
        config::containerd_toml(layout, cg, restrict_oom),
    )?;
    std::fs::write(
        layout.cni_conf_dir().join("10-bypass.conflist"),
        config::cni_conflist(layout),
    )?;
    procs::spawn(
        "containerd",
        Path::new("/usr/bin/containerd"),
        &[
            "--config".into(),
            layout.containerd_config().display().to_string(),
        ],
        &logs,
        &layout.pids(),
    )?;
    wait_for("containerd", crate::wait::NET, procs::POLL, || {
        cmd::output(ctr(layout).args(["version"])).map(drop)
    })
    .with_context(|| procs::tail(&logs.join("containerd.log"), 15))?;
    let pause_tar = build_pause(&layout.var.join("pause"))?;
    import_image(layout, &pause_tar)
}

/// Step of [`up`]: kube-controller-manager and kube-scheduler.
fn start_controllers(layout: &Layout, bins: &bins::Bins, admin: &Path) -> Result<()> {
    let (logs, pids) = (layout.logs(), layout.pids());
    procs::spawn(
        "kube-controller-manager",
        &bins.get("kube-controller-manager"),
        &[
            format!("--kubeconfig={}", admin.display()),
            "--leader-elect=false".into(),
            "--secure-port=0".into(),
            "--use-service-account-credentials=false".into(),
            format!("--root-ca-file={}", pki_file(layout, "ca.crt")),
            format!(
                "--service-account-private-key-file={}",
                pki_file(layout, "sa.key")
            ),
            format!("--service-cluster-ip-range={}", config::SERVICE_CIDR),
            "--controllers=*,-nodeipam,-csrsigning,-csrapproving,-csrcleaner".into(),
        ],
        &logs,
        &pids,
    )?;
    procs::spawn(
        "kube-scheduler",
        &bins.get("kube-scheduler"),
        &[
            format!("--kubeconfig={}", admin.display()),
            "--leader-elect=false".into(),
            "--secure-port=0".into(),
        ],
        &logs,
        &pids,
    )?;
    Ok(())
}

/// Step of [`up`]: kube-proxy with its configuration.
fn start_kube_proxy(layout: &Layout, bins: &bins::Bins, admin: &Path) -> Result<()> {
    let proxy_config = layout.var.join("kube-proxy.yaml");
    std::fs::write(
        &proxy_config,
        config::kube_proxy_config(admin, free_port()?, free_port()?),
    )?;
    procs::spawn(
        "kube-proxy",
        &bins.get("kube-proxy"),
        &[format!("--config={}", proxy_config.display())],
        &layout.logs(),
        &layout.pids(),
    )?;
    Ok(())
}

/// Step of [`up`]: kubelet with its configuration.
fn start_kubelet(layout: &Layout, bins: &bins::Bins, cg: CgroupLayout, admin: &Path) -> Result<()> {
    let kubelet_config = layout.var.join("kubelet.yaml");
    std::fs::write(
        &kubelet_config,
        config::kubelet_config(layout, cg, free_port()?),
    )?;
    procs::spawn(
        "kubelet",
        &bins.get("kubelet"),
        &[
            format!("--config={}", kubelet_config.display()),
            format!("--kubeconfig={}", admin.display()),
            format!("--root-dir={}", layout.kubelet_root().display()),
            format!("--hostname-override={NODE_NAME}"),
            format!("--node-ip={}", config::node_ips()),
            "--v=1".into(),
        ],
        &layout.logs(),
        &layout.pids(),
    )?;
    Ok(())
}

/// Step of [`up`]: waits for the node to be Ready and for the default ServiceAccount.
fn wait_node_ready(layout: &Layout) -> Result<()> {
    wait_for(
        &format!("node {NODE_NAME} Ready"),
        crate::wait::NET,
        procs::POLL,
        || {
            let out = cmd::output(kubectl(layout)?.args([
                "get",
                "node",
                NODE_NAME,
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
            ]))?;
            if out.trim() == "True" {
                Ok(())
            } else {
                bail!("Ready is {out:?}")
            }
        },
    )
    .with_context(|| procs::tail(&layout.logs().join("kubelet.log"), 20))?;
    // Pods need their namespace's default ServiceAccount (the controller-manager's).
    wait_for(
        "the default ServiceAccount",
        crate::wait::NET,
        procs::POLL,
        || cmd::output(kubectl(layout)?.args(["get", "serviceaccount", "default"])).map(drop),
    )
}

/// Stops the cluster and takes back every change; safe to run when nothing is up.
pub fn down(layout: &Layout) -> Result<()> {
    let pid_text = std::fs::read_to_string(layout.pids()).unwrap_or_default();
    let daemons = procs::parse_pids(&pid_text);
    let pid_of = |name: &str| {
        daemons
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, p)| *p)
            .filter(|p| procs::runs(*p, name))
    };
    let mut problems = Vec::new();
    // No controller recreates what is deleted from here on.
    for name in ["kube-controller-manager", "kube-scheduler"] {
        if let Some(pid) = pid_of(name) {
            procs::stop(pid, name, Duration::from_secs(10))?;
        }
    }
    // kubelet stops every pod's containers and sandbox (CNI DEL, netns removed).
    if pid_of("kube-apiserver").is_some() && pid_of("kubelet").is_some() {
        if let Ok(mut k) = kubectl(layout) {
            let _ = cmd::output(k.args([
                "delete",
                "pods",
                "--all",
                "--all-namespaces",
                "--grace-period=0",
                "--force",
                "--wait=false",
            ]));
        }
        let waited = wait_for(
            "every pod sandbox stopped",
            crate::wait::NET,
            procs::POLL,
            || {
                let tasks = cmd::output(ctr(layout).args(["tasks", "ls", "-q"]))?;
                if tasks.trim().is_empty() {
                    Ok(())
                } else {
                    bail!("running: {}", tasks.split_whitespace().count())
                }
            },
        );
        if let Err(e) = waited {
            eprintln!("cluster: {e:#}; killing what is left");
        }
    }
    for name in ["kubelet", "kube-proxy"] {
        if let Some(pid) = pid_of(name) {
            procs::stop(pid, name, Duration::from_secs(15))?;
        }
    }
    // Whatever kubelet did not stop: kill the tasks so their shims exit.
    if pid_of("containerd").is_some() {
        kill_tasks(layout);
    }
    for name in ["containerd", "kube-apiserver", "etcd"] {
        if let Some(pid) = pid_of(name) {
            procs::stop(pid, name, Duration::from_secs(15))?;
        }
    }
    kill_shims(layout)?;
    // A containerd of ours that the pid file does not know (e.g. restarted by hand).
    kill_by_cmdline(
        "containerd",
        &layout.containerd_config().display().to_string(),
    )?;
    // kube-proxy's own cleanup of its iptables and nftables rules, then what is left
    // of kube-proxy's, kubelet's and CNI's chains.
    if let Ok(bins) = bins::ensure() {
        let _ = cmd::output(Command::new(bins.get("kube-proxy")).arg("--cleanup"));
    }
    match host::remove_chains() {
        Ok(c) if !c.is_empty() => eprintln!("cluster: removed iptables chains {}", c.len()),
        Ok(_) => {}
        Err(e) => problems.push(format!("iptables chains: {e:#}")),
    }
    // The agent's pinned datapath (deploy/ leaves it pinned on purpose).
    if Path::new(AGENT_PIN_DIR).exists() {
        match uninstall_agent_pins() {
            Ok(()) => eprintln!("cluster: removed the agent's pins in {AGENT_PIN_DIR}"),
            Err(e) => problems.push(format!("agent pins: {e:#}")),
        }
    }
    let restore = std::fs::read_to_string(layout.restore()).unwrap_or_default();
    let kept: Vec<&str> = restore
        .lines()
        .filter_map(|l| l.strip_prefix("netns "))
        .collect();
    let ours: Vec<String> = host::cni_netns()
        .into_iter()
        .filter(|n| !kept.contains(&n.as_str()))
        .collect();
    if !ours.is_empty() {
        eprintln!(
            "cluster: removing pod network namespaces {}",
            ours.join(" ")
        );
        if let Err(e) = host::remove_netns(&ours) {
            problems.push(format!("netns: {e:#}"));
        }
    }
    match host::unmount_below(&[&layout.var, &layout.run]) {
        Ok(m) if !m.is_empty() => eprintln!("cluster: unmounted {}", m.len()),
        Ok(_) => {}
        Err(e) => problems.push(format!("mounts: {e:#}")),
    }
    if let Err(e) = host::remove_links() {
        problems.push(format!("links: {e:#}"));
    }
    if let Err(e) = host::remove_kubelet_cgroups() {
        problems.push(format!("cgroups: {e:#}"));
    }
    if restore.lines().any(|l| l == "shared /sys/fs/bpf")
        && let Err(e) = host::unshare_bpffs()
    {
        problems.push(format!("bpffs propagation: {e:#}"));
    }
    if let Some(v) = restore.lines().find_map(|l| l.strip_prefix("ip_forward ")) {
        host::restore_forwarding(v)?;
    }
    // containerd 1.6 puts shim sockets under /run/containerd/s whatever its config
    // says: remove that directory if we made it and it is empty.
    if restore.lines().any(|l| l == "made /run/containerd") {
        for d in ["/run/containerd/s", "/run/containerd"] {
            let _ = std::fs::remove_dir(d);
        }
    }
    for dir in [&layout.run, &layout.var] {
        if dir.exists() {
            std::fs::remove_dir_all(dir).with_context(|| format!("remove {}", dir.display()))?;
        }
    }
    if !problems.is_empty() {
        bail!("cluster down left: {}", problems.join("; "));
    }
    eprintln!("cluster: down, nothing left");
    Ok(())
}

/// `ctr tasks kill -s SIGKILL` on every task of the Kubernetes namespace.
fn kill_tasks(layout: &Layout) {
    let Ok(tasks) = cmd::output(ctr(layout).args(["tasks", "ls", "-q"])) else {
        return;
    };
    for id in tasks.split_whitespace() {
        let _ = cmd::output(ctr(layout).args(["tasks", "kill", "-s", "SIGKILL", id]));
    }
    std::thread::sleep(Duration::from_secs(1));
    for id in tasks.split_whitespace() {
        let _ = cmd::output(ctr(layout).args(["tasks", "delete", id]));
    }
}

/// Kills the runc shims of our containerd (found by its socket on their command line)
/// that outlived it.
fn kill_shims(layout: &Layout) -> Result<()> {
    kill_by_cmdline(
        "containerd-shim-runc-v2",
        &layout.containerd_socket().display().to_string(),
    )
}

/// Stops every process running binary `name` with `arg` on its command line.
fn kill_by_cmdline(name: &str, arg: &str) -> Result<()> {
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        if procs::runs(pid, name) && args.contains(&arg.as_bytes()) {
            procs::stop(pid, name, Duration::from_secs(10))?;
        }
    }
    Ok(())
}

/// `bypass-agent uninstall` on the DaemonSet's pin directory, with the release binary.
fn uninstall_agent_pins() -> Result<()> {
    let agent = xtask_lib::workspace::target_dir()?.join("release/bypass-agent");
    if !agent.is_file() {
        bail!(
            "{AGENT_PIN_DIR} holds pins and {} is missing: build it (`cargo xtask build`) and run `bypass-agent uninstall --pin-dir {AGENT_PIN_DIR}`",
            agent.display()
        );
    }
    cmd::output(Command::new(agent).args(["uninstall", "--pin-dir", AGENT_PIN_DIR])).map(drop)
}

/// Builds the sandbox image: a static `pause` (sleeps in `pause()`, reaps children, exits
/// on SIGINT/SIGTERM) from C, in a docker-archive tarball; returns its path.
fn build_pause(dir: &Path) -> Result<PathBuf> {
    let rootfs = dir.join("rootfs");
    std::fs::create_dir_all(&rootfs)?;
    let src = dir.join("pause.c");
    std::fs::write(&src, PAUSE_C)?;
    cmd::output(
        Command::new("gcc")
            .args(["-static", "-Os", "-s", "-o"])
            .arg(rootfs.join("pause"))
            .arg(&src),
    )
    .context("build the pause binary (gcc and libc6-dev: `cargo xtask setup`)")?;
    let tar = dir.join("pause.tar");
    crate::image::docker_archive(
        &rootfs,
        &crate::image::ImageSpec {
            name: config::PAUSE_IMAGE.into(),
            entrypoint: vec!["/pause".into()],
            ..Default::default()
        },
        &tar,
    )?;
    Ok(tar)
}

/// The sandbox process: holds the pod's namespaces and does nothing else.
const PAUSE_C: &str = r#"#include <signal.h>
#include <stddef.h>
#include <sys/wait.h>
#include <unistd.h>

static void quit(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, NULL, WNOHANG) > 0) {} }

int main(void) {
    struct sigaction q = {0}, r = {0};
    q.sa_handler = quit;
    sigaction(SIGINT, &q, NULL);
    sigaction(SIGTERM, &q, NULL);
    r.sa_handler = reap;
    r.sa_flags = SA_NOCLDSTOP;
    sigaction(SIGCHLD, &r, NULL);
    for (;;) pause();
}
"#;

/// Whether the cluster's API server answers (for the tests' task).
pub fn is_up(layout: &Layout) -> bool {
    layout.admin_kubeconfig().is_file()
        && kubectl(layout)
            .and_then(|mut k| cmd::output(k.args(["get", "--raw", "/readyz"])))
            .is_ok()
}
