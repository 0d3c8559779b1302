//! The `cluster` scenario: the qperf sweep between two real pods of the one-node
//! cluster of `cargo xtask cluster` (kubelet, containerd, the CNI bridge), the agent
//! deployed as `deploy/`'s DaemonSet. The bypass is switched by the node label
//! `bypass.dev/enabled` (true: bypass, false: the normal path), not by stopping the
//! agent; each block waits until the agent's `status` says the datapath is attached or
//! detached. qperf runs in the test image of `cargo xtask image`, pinned with `taskset`
//! (the server in its own container per server CPU, the client through `kubectl exec`).
//! Each run's bytes on the server pod's host veth, and the agent's counters through
//! `kubectl exec ds/bypass-agent -- bypass-agent status --json`, prove which path it
//! took. `cargo xtask bench --scenario cluster` brings the cluster up and loads the
//! images; it hands us `kubectl` and the kubeconfig in the environment.
//!
//! Pure: the manifests, the label argument, what `status` says. I/O: [`Kube`] (kubectl),
//! and guards that undo on drop: the DaemonSet (the README's uninstall), the namespace.

use std::{
    collections::BTreeMap,
    io::Write as _,
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};

use crate::{
    driver::{
        self, Observed, Options, SLACK, fit_placements, fmt_secs, open_raw_log, progress,
        record_qperf,
    },
    env,
    model::{Config, HopSample, Path, Placement, Results, SCHEMA, Scenario},
    qperf, scenario,
};

/// The environment variable naming `kubectl` (set by `cargo xtask bench`).
pub const KUBECTL_ENV: &str = "BYPASS_KUBECTL";
/// The environment variable naming the admin kubeconfig (set by `cargo xtask bench`).
pub const KUBECONFIG_ENV: &str = "BYPASS_CLUSTER_KUBECONFIG";
/// The cluster's one node (`cargo xtask cluster`).
pub const NODE: &str = "bypass-node";
/// The node label the agent of `deploy/` obeys.
pub const NODE_LABEL: &str = "bypass.dev/enabled";
/// The image with qperf and busybox's `taskset` (`cargo xtask image`).
pub const TEST_IMAGE: &str = "bypass-test:0.1.0";
/// The bench's own namespace, deleted on drop.
pub const NAMESPACE: &str = "bypass-bench";
/// The agent's namespace and DaemonSet in `deploy/`.
const AGENT_NS: &str = "bypass-system";
const AGENT_DS: &str = "ds/bypass-agent";
/// How long the agent may take to follow the node label.
const LABEL_TIMEOUT: Duration = Duration::from_secs(60);

/// `kubectl --kubeconfig <admin>` of the cluster.
#[derive(Clone, Debug)]
pub struct Kube {
    kubectl: PathBuf,
    kubeconfig: PathBuf,
}

impl Kube {
    /// From [`KUBECTL_ENV`] and [`KUBECONFIG_ENV`].
    pub fn from_env() -> Result<Self> {
        let get = |name: &str| {
            std::env::var_os(name).map(PathBuf::from).with_context(|| {
                format!(
                    "{name} is not set: run the cluster scenario as `cargo xtask bench --scenario cluster`, which brings the cluster up and sets it"
                )
            })
        };
        Ok(Self {
            kubectl: get(KUBECTL_ENV)?,
            kubeconfig: get(KUBECONFIG_ENV)?,
        })
    }

    /// A `kubectl` command.
    pub fn cmd(&self) -> Command {
        let mut c = Command::new(&self.kubectl);
        c.arg("--kubeconfig").arg(&self.kubeconfig);
        c
    }

    /// Runs `kubectl args`; its stdout, or an error with its stderr.
    pub fn k(&self, args: &[&str]) -> Result<String> {
        let out = self.cmd().args(args).output().context("run kubectl")?;
        if !out.status.success() {
            bail!(
                "kubectl {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `kubectl apply -f -` of `manifest`.
    pub fn apply(&self, manifest: &str) -> Result<()> {
        let mut child = self
            .cmd()
            .args(["apply", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("run kubectl apply")?;
        child
            .stdin
            .take()
            .context("kubectl's stdin")?
            .write_all(manifest.as_bytes())
            .context("write the manifest to kubectl")?;
        let out = child.wait_with_output()?;
        ensure!(
            out.status.success(),
            "kubectl apply failed: {}\n{manifest}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(())
    }

    /// `bypass-agent status --json` of the DaemonSet's pod.
    pub fn agent_status(&self) -> Result<serde_json::Value> {
        let text = self.k(&[
            "-n",
            AGENT_NS,
            "exec",
            AGENT_DS,
            "--",
            "bypass-agent",
            "status",
            "--json",
        ])?;
        serde_json::from_str(&text).with_context(|| format!("parse status --json: {text}"))
    }

    /// Sets the node label (`None` removes it).
    pub fn label_node(&self, value: Option<bool>) -> Result<()> {
        self.k(&["label", "node", NODE, &label_arg(value), "--overwrite"])
            .map(drop)
    }
}

/// `bypass.dev/enabled=true|false`, or `bypass.dev/enabled-` to remove it (pure).
pub fn label_arg(value: Option<bool>) -> String {
    match value {
        Some(v) => format!("{NODE_LABEL}={v}"),
        None => format!("{NODE_LABEL}-"),
    }
}

/// Whether `status --json` says the datapath is attached (pure).
pub fn attached_of(status: &serde_json::Value) -> Option<bool> {
    status.get("attached").and_then(serde_json::Value::as_bool)
}

/// A container of the bench's pods: `name` running `command` (pure).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Container {
    /// Its name in the pod.
    pub name: String,
    /// Its command line.
    pub command: Vec<String>,
}

/// A pod of [`TEST_IMAGE`] with `containers`, in [`NAMESPACE`] (pure). JSON is YAML:
/// the commands are quoted by serde.
pub fn pod_manifest(name: &str, containers: &[Container]) -> String {
    let containers: Vec<serde_json::Value> = containers
        .iter()
        .map(|c| {
            serde_json::json!({
                "name": c.name,
                "image": TEST_IMAGE,
                "imagePullPolicy": "Never",
                "command": c.command,
            })
        })
        .collect();
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": NAMESPACE, "labels": { "app": name } },
        "spec": {
            "nodeName": NODE,
            "dnsPolicy": "Default",
            "terminationGracePeriodSeconds": 1,
            "automountServiceAccountToken": false,
            "containers": containers,
        },
    })
    .to_string()
}

/// `taskset -c CPU` before `argv` (pure).
pub fn pinned(cpu: usize, argv: impl IntoIterator<Item = String>) -> Vec<String> {
    ["taskset".to_owned(), "-c".to_owned(), cpu.to_string()]
        .into_iter()
        .chain(argv)
        .collect()
}

/// A command's program and arguments, as `kubectl exec` takes them.
fn argv_of(cmd: &Command) -> Vec<String> {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

/// The server pod's containers: one `qperf --listen_port` per server CPU, pinned there.
pub fn server_containers(placements: &[Placement]) -> Vec<Container> {
    let mut cpus: Vec<usize> = placements.iter().map(|p| p.server_cpu).collect();
    cpus.sort_unstable();
    cpus.dedup();
    cpus.into_iter()
        .map(|cpu| Container {
            name: format!("qperf-cpu{cpu}"),
            command: pinned(
                cpu,
                argv_of(&qperf::server_command(driver::qperf_port(cpu))),
            ),
        })
        .collect()
}

/// `deploy/` applied and rolled out; on drop the README's uninstall (delete it, run
/// `deploy/uninstall.yaml` until the node is clean, delete that) and the label removed.
struct Deployed<'a> {
    kube: &'a Kube,
    deploy: PathBuf,
}

impl<'a> Deployed<'a> {
    fn apply(kube: &'a Kube, workspace: &std::path::Path) -> Result<Self> {
        let me = Self {
            kube,
            deploy: workspace.join("deploy"),
        };
        kube.label_node(Some(false))?;
        kube.k(&["apply", "-k", &me.deploy.display().to_string()])?;
        kube.k(&[
            "-n",
            AGENT_NS,
            "rollout",
            "status",
            AGENT_DS,
            "--timeout=120s",
        ])?;
        Ok(me)
    }

    fn uninstall(&self) -> Result<()> {
        let k = self.kube;
        k.k(&[
            "delete",
            "-k",
            &self.deploy.display().to_string(),
            "--ignore-not-found",
            "--wait=true",
            "--timeout=120s",
        ])?;
        let manifest = self.deploy.join("uninstall.yaml").display().to_string();
        k.k(&["apply", "-f", &manifest])?;
        let cleaned = k.k(&[
            "-n",
            "bypass-uninstall",
            "rollout",
            "status",
            "ds/bypass-uninstall",
            "--timeout=120s",
        ]);
        k.k(&["delete", "-f", &manifest, "--wait=true", "--timeout=120s"])?;
        k.label_node(None)?;
        cleaned.map(drop)
    }
}

impl Drop for Deployed<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.uninstall() {
            progress(&format!("cluster: uninstall of deploy/ failed: {e:#}"));
        }
    }
}

/// [`NAMESPACE`], deleted (and waited for) on drop.
struct Namespace<'a> {
    kube: &'a Kube,
}

impl<'a> Namespace<'a> {
    fn create(kube: &'a Kube) -> Result<Self> {
        kube.k(&[
            "delete",
            "namespace",
            NAMESPACE,
            "--ignore-not-found",
            "--wait=true",
            "--timeout=120s",
        ])?;
        kube.apply(
            &serde_json::json!({
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": { "name": NAMESPACE },
            })
            .to_string(),
        )?;
        Ok(Self { kube })
    }

    /// Creates pod `name`, waits until it is Ready; returns its IP.
    fn pod(&self, name: &str, containers: &[Container]) -> Result<String> {
        let k = self.kube;
        k.apply(&pod_manifest(name, containers))?;
        k.k(&[
            "-n",
            NAMESPACE,
            "wait",
            "--for=condition=Ready",
            &format!("pod/{name}"),
            "--timeout=120s",
        ])
        .with_context(|| {
            format!("pod {name} not Ready: is {TEST_IMAGE} loaded (`cargo xtask image`)?")
        })?;
        let ip = k.k(&[
            "-n",
            NAMESPACE,
            "get",
            "pod",
            name,
            "-o",
            "jsonpath={.status.podIP}",
        ])?;
        let ip = ip.trim().to_owned();
        ensure!(!ip.is_empty(), "pod {name} has no IP");
        Ok(ip)
    }

    /// `kubectl exec` of `argv` in the first container of pod `name`.
    fn exec(&self, name: &str, argv: &[String]) -> Command {
        let mut c = self.kube.cmd();
        c.args(["-n", NAMESPACE, "exec", name, "--"]).args(argv);
        c
    }

    /// The host end of pod `name`'s veth: the interface whose index is its eth0's
    /// `iflink`.
    fn host_veth(&self, name: &str) -> Result<String> {
        let out = self
            .exec(name, &["cat".into(), "/sys/class/net/eth0/iflink".into()])
            .output()
            .context("run kubectl exec")?;
        ensure!(
            out.status.success(),
            "read eth0's iflink in pod {name}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        let index = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        for entry in std::fs::read_dir("/sys/class/net")?.flatten() {
            let idx = std::fs::read_to_string(entry.path().join("ifindex")).unwrap_or_default();
            if idx.trim() == index {
                return Ok(entry.file_name().to_string_lossy().into_owned());
            }
        }
        bail!("no host interface has index {index} (pod {name})")
    }
}

impl Drop for Namespace<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.kube.k(&[
            "delete",
            "namespace",
            NAMESPACE,
            "--wait=true",
            "--timeout=120s",
        ]) {
            progress(&format!("cluster: delete namespace {NAMESPACE}: {e:#}"));
        }
    }
}

/// Bytes a host interface has carried, both directions.
fn veth_bytes(veth: &str) -> Result<u64> {
    let mut sum = 0;
    for f in ["rx_bytes", "tx_bytes"] {
        let p = format!("/sys/class/net/{veth}/statistics/{f}");
        sum += std::fs::read_to_string(&p)
            .with_context(|| format!("read {p}"))?
            .trim()
            .parse::<u64>()
            .with_context(|| format!("parse {p}"))?;
    }
    Ok(sum)
}

struct Run<'a> {
    kube: &'a Kube,
    ns: &'a Namespace<'a>,
    server_ip: std::net::IpAddr,
    veth: String,
    results: Results,
    raw: Option<std::fs::File>,
    step: usize,
    total_steps: usize,
    started: Instant,
}

/// Runs the cluster scenario (called by [`driver::run`]).
pub fn run(opts: &Options) -> Result<Results> {
    let kube = Kube::from_env()?;
    let mut config = opts.config.clone();
    let mut warnings = Vec::new();
    // Not in the cluster: sockperf is not in the test image, the minimal datapath and
    // the floor have no pods to attach to or compare with here.
    if !config.sockperf_sizes.is_empty() {
        warnings.push("sockperf skipped: not in the test image".to_owned());
        config.sockperf_sizes.clear();
    }
    if config.minimal {
        warnings.push(
            "minimal datapath skipped: the cluster scenario measures the DaemonSet only".to_owned(),
        );
        config.minimal = false;
    }
    let agent_bin = testbed::agent::agent_bin();
    let mut env = env::collect(&opts.workspace, &agent_bin);
    let cpus = env.cpus;
    fit_placements(&mut config, cpus, &mut warnings)?;
    let raw = open_raw_log(&opts.raw_dir)?;
    progress(&format!(
        "cluster: deploying deploy/ (node {NODE} labelled {}), {cpus} CPUs, load {}",
        label_arg(Some(false)),
        env.loadavg_start
    ));
    let deployed = Deployed::apply(&kube, &opts.workspace)?;
    let ns = Namespace::create(&kube)?;
    let server_ip = ns.pod("server", &server_containers(&config.placements))?;
    let client_ip = ns.pod(
        "client",
        &[Container {
            name: "client".into(),
            command: vec!["/bin/sleep".into(), "infinity".into()],
        }],
    )?;
    let veth = ns.host_veth("server")?;
    env.addresses = format!("{client_ip} -> {server_ip} (server pod's host veth {veth})");
    progress(&format!("cluster: pods {}", env.addresses));
    let blocks = driver::paths_of(&config, true).len();
    let total_steps = config.reps as usize * config.placements.len() * blocks * config.sizes.len();
    let mut run = Run {
        kube: &kube,
        ns: &ns,
        server_ip: server_ip
            .parse()
            .with_context(|| format!("the server pod's IP {server_ip}"))?,
        veth,
        results: Results {
            schema: SCHEMA,
            config,
            env,
            samples: Vec::new(),
            percentiles: Vec::new(),
            agent: Vec::new(),
            hops: Vec::new(),
            programs: Vec::new(),
            warnings,
        },
        raw,
        step: 0,
        total_steps,
        started: Instant::now(),
    };
    let outcome = run.sweep();
    let mut results = run.results;
    drop(ns);
    drop(deployed);
    outcome?;
    results.env.loadavg_end = env::loadavg();
    Ok(results)
}

impl Run<'_> {
    fn sweep(&mut self) -> Result<()> {
        let cfg = self.results.config.clone();
        let mut order = driver::paths_of(&cfg, true);
        for rep in 0..cfg.reps {
            for placement in &cfg.placements {
                for &path in &order {
                    self.set_path(path)?;
                    let before = self.counters()?;
                    for &size in &cfg.sizes {
                        self.qperf(rep, placement, path, size)?;
                    }
                    if path == Path::Bypass {
                        let after = self.counters()?;
                        self.hops(rep, placement, &cfg, &before, &after);
                    }
                }
                order.rotate_left(1);
            }
        }
        self.results.env.duration_secs = self.started.elapsed().as_secs_f64();
        Ok(())
    }

    /// Labels the node for `path` and waits until the agent's `status` follows.
    fn set_path(&mut self, path: Path) -> Result<()> {
        let want = match path {
            Path::Bypass => true,
            Path::Default => false,
            Path::Minimal | Path::Floor => {
                bail!("the cluster scenario has no {} path", path.name())
            }
        };
        self.kube.label_node(Some(want))?;
        let deadline = Instant::now() + LABEL_TIMEOUT;
        loop {
            let status = self.kube.agent_status();
            match status.as_ref().ok().and_then(attached_of) {
                Some(a) if a == want => return Ok(()),
                _ if Instant::now() > deadline => bail!(
                    "the agent did not follow {} within {LABEL_TIMEOUT:?}: status {}",
                    label_arg(Some(want)),
                    match status {
                        Ok(s) => s.to_string(),
                        Err(e) => format!("{e:#}"),
                    }
                ),
                _ => std::thread::sleep(Duration::from_millis(300)),
            }
        }
    }

    /// The agent's counters now (it runs in both blocks).
    fn counters(&self) -> Result<BTreeMap<String, u64>> {
        Ok(scenario::counters_of(&self.kube.agent_status()?))
    }

    /// At the end of a bypassed block: how the counters grew, a warning when a
    /// measured connection was not paired.
    fn hops(
        &mut self,
        rep: u32,
        p: &Placement,
        cfg: &Config,
        before: &BTreeMap<String, u64>,
        after: &BTreeMap<String, u64>,
    ) {
        let counters = scenario::delta(before, after);
        let connections = (cfg.sizes.len() * cfg.tests.len()) as u64;
        for problem in scenario::hop_problems(Scenario::Cluster, connections, &counters) {
            self.results
                .warnings
                .push(format!("rep {rep} {} bypass: {problem}", p.name));
        }
        let shown: Vec<String> = ["paired_pod", "redirected_bytes", "passed_bytes"]
            .iter()
            .map(|&k| {
                format!(
                    "{k} {}",
                    counters
                        .get(k)
                        .map_or_else(|| "-".to_owned(), u64::to_string)
                )
            })
            .collect();
        progress(&format!(
            "rep {rep} {} bypass block, {connections} measured connections: {}",
            p.name,
            shown.join(", ")
        ));
        self.results.hops.push(HopSample {
            rep,
            placement: p.name.clone(),
            connections,
            counters,
        });
    }

    fn tick(&mut self, msg: &str) {
        self.step += 1;
        let el = self.started.elapsed().as_secs_f64();
        let eta = el / self.step as f64 * self.total_steps.saturating_sub(self.step) as f64;
        progress(&format!(
            "[{:>3}/{}] {msg} (elapsed {}, eta {})",
            self.step,
            self.total_steps,
            fmt_secs(el),
            fmt_secs(eta)
        ));
    }

    /// The qperf client in pod `client`, pinned to `cpu`, through `kubectl exec` under
    /// `timeout`; its stdout, or `None` (with a warning) after two failures.
    fn client(&mut self, what: &str, argv: &[String], secs: u32) -> Result<Option<String>> {
        let limit = Duration::from_secs(u64::from(secs) * 2 + 5) + SLACK;
        for attempt in 0..2 {
            let exec = self.ns.exec("client", argv);
            let out = Command::new("timeout")
                .arg(limit.as_secs().to_string())
                .arg(exec.get_program())
                .args(exec.get_args())
                .stdin(Stdio::null())
                .output()
                .context("run timeout kubectl exec")?;
            if out.status.success() {
                let text = String::from_utf8_lossy(&out.stdout).into_owned();
                if let Some(f) = &mut self.raw {
                    let _ = writeln!(f, "=== {what}\n{text}");
                }
                return Ok(Some(text));
            }
            self.results.warnings.push(format!(
                "{what} (attempt {}): {}: {}",
                attempt + 1,
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(None)
    }

    /// `(redirected_bytes, passed_bytes)` of the agent, in a bypassed block.
    fn stats(&self, path: Path) -> Option<(u64, u64)> {
        if path != Path::Bypass {
            return None;
        }
        let c = self.counters().ok()?;
        Some((*c.get("redirected_bytes")?, *c.get("passed_bytes")?))
    }

    fn qperf(&mut self, rep: u32, p: &Placement, path: Path, size: u32) -> Result<()> {
        let cfg = &self.results.config;
        let (secs, tests) = (cfg.qperf_secs, cfg.tests.clone());
        let argv = pinned(
            p.client_cpu,
            argv_of(&qperf::client_command(
                self.server_ip,
                driver::qperf_port(p.server_cpu),
                None,
                size,
                secs,
                &tests,
            )),
        );
        let what = format!("qperf rep {rep} {} {} size {size}", p.name, path.name());
        let stats0 = self.stats(path);
        let wire0 = veth_bytes(&self.veth).ok();
        let out = self.client(&what, &argv, secs)?;
        let wire1 = veth_bytes(&self.veth).ok();
        let stats1 = self.stats(path);
        let Some(out) = out else {
            self.tick(&format!("{what}: FAILED"));
            return Ok(());
        };
        let delta = stats0
            .zip(stats1)
            .map(|(a, b)| (b.0.saturating_sub(a.0), b.1.saturating_sub(a.1)));
        let wire = wire0.zip(wire1).map(|(a, b)| b.saturating_sub(a));
        let line = record_qperf(
            &mut self.results,
            (rep, p, path, size),
            &what,
            secs,
            &out,
            &tests,
            Observed { wire, delta },
        );
        self.tick(&format!(
            "{line}, veth {}",
            wire.map_or_else(|| "-".into(), |w| format!("{w} B"))
        ));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Test;

    #[test]
    fn label_arguments() {
        assert_eq!(label_arg(Some(true)), "bypass.dev/enabled=true");
        assert_eq!(label_arg(Some(false)), "bypass.dev/enabled=false");
        assert_eq!(label_arg(None), "bypass.dev/enabled-");
    }

    #[test]
    fn attached_from_status() {
        assert_eq!(
            attached_of(&serde_json::json!({"attached": true, "sockets": 3})),
            Some(true)
        );
        assert_eq!(
            attached_of(&serde_json::json!({"attached": false})),
            Some(false)
        );
        assert_eq!(attached_of(&serde_json::json!({"sockets": 3})), None);
    }

    #[test]
    fn server_pod_pins_one_qperf_per_server_cpu() {
        let cs = server_containers(&[
            Placement::cross_cpu(),
            Placement::same_cpu(),
            Placement::cross_cpu(),
        ]);
        assert_eq!(
            cs.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
            ["qperf-cpu0", "qperf-cpu1"]
        );
        assert_eq!(
            cs[1].command,
            ["taskset", "-c", "1", "qperf", "--listen_port", "19766"]
        );
        let pod: serde_json::Value = serde_json::from_str(&pod_manifest("server", &cs)).unwrap();
        assert_eq!(pod["metadata"]["namespace"], NAMESPACE);
        assert_eq!(pod["spec"]["nodeName"], NODE);
        let c = &pod["spec"]["containers"][1];
        assert_eq!(c["image"], TEST_IMAGE);
        assert_eq!(c["imagePullPolicy"], "Never");
        assert_eq!(c["command"][4], "--listen_port");
    }

    #[test]
    fn client_command_is_pinned_qperf() {
        let argv = pinned(
            0,
            argv_of(&qperf::client_command(
                "10.244.0.5".parse().unwrap(),
                19765,
                None,
                64,
                1,
                &[Test::TcpLat],
            )),
        );
        assert_eq!(argv[..4], ["taskset", "-c", "0", "qperf"]);
        assert!(argv.ends_with(&["10.244.0.5".to_owned(), "tcp_lat".to_owned()]));
    }
}
