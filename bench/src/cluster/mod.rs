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
//! `pods` (the manifests, pure, and the namespace), `agent` (`deploy/` installed and
//! removed, the label followed; what `status` says, pure); the sweep is here. kubectl is
//! [`kube_testenv::Kubectl`]; the DaemonSet and the namespace are guards that undo on
//! drop (the README's uninstall, the namespace deleted).

mod agent;
mod pods;

use std::{
    collections::BTreeMap,
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result};
use bypass_common::Stat;
pub use kube_testenv::{
    KUBECONFIG_ENV, KUBECTL_ENV,
    deploy::{NODE, NODE_LABEL, label_arg},
};
use kube_testenv::{Kubectl, veth_bytes};

use agent::Deployed;
pub use agent::attached_of;
pub use pods::{Container, pinned, pod_manifest, server_containers};
use pods::{Namespace, argv_of};

use crate::{
    driver::{
        self, Observed, Options, RawLog, SLACK, Start, Steps, client_twice, progress, qperf_what,
        record_hops, record_qperf,
    },
    env,
    model::{Config, Counted, Path, Placement, Results},
    qperf, scenario,
};

/// The image with qperf and busybox's `taskset` (`cargo xtask image`).
pub const TEST_IMAGE: &str = concat!("bypass-test:", env!("CARGO_PKG_VERSION"));
/// The bench's own namespace, deleted on drop.
pub const NAMESPACE: &str = "bypass-bench";

struct Run<'a> {
    kube: &'a Kubectl,
    ns: &'a Namespace<'a>,
    server_ip: std::net::IpAddr,
    veth: String,
    results: Results,
    raw: RawLog,
    steps: Steps,
}

/// Runs the cluster scenario (called by [`driver::run`]).
pub fn run(opts: &Options) -> Result<Results> {
    let kube = Kubectl::from_env(
        "run the cluster scenario as `cargo xtask bench --scenario cluster`, which brings the cluster up and sets it",
    )?;
    let mut config = opts.config.clone();
    let narrowed = narrow(&mut config);
    let mut start = Start::new(&opts.workspace, &opts.raw_dir, &config.placements)?;
    config.placements = std::mem::take(&mut start.placements);
    start.warnings.splice(0..0, narrowed);
    progress(&format!(
        "cluster: deploying deploy/ (node {NODE} labelled {}), {} CPUs, load {}",
        label_arg(Some(false)),
        start.env.cpus,
        start.env.loadavg_start
    ));
    let deployed = Deployed::apply(&kube, &opts.workspace)?;
    let ns = Namespace::create(&kube)?;
    let server_ip = ns.pod("server", &server_containers(&config.placements))?;
    let sleeper = Container {
        name: "client".into(),
        command: vec!["/bin/sleep".into(), "infinity".into()],
    };
    let client_ip = ns.pod("client", &[sleeper])?;
    let veth = ns.host_veth("server")?;
    start.env.addresses = format!("{client_ip} -> {server_ip} (server pod's host veth {veth})");
    progress(&format!("cluster: pods {}", start.env.addresses));
    let blocks = driver::paths_of(config.minimal).len();
    let total_steps = config.reps as usize * config.placements.len() * blocks * config.sizes.len();
    let mut run = Run {
        kube: &kube,
        ns: &ns,
        server_ip: server_ip
            .parse()
            .with_context(|| format!("the server pod's IP {server_ip}"))?,
        veth,
        results: Results::new(config, start.env, start.warnings),
        raw: start.raw,
        steps: Steps::new(total_steps),
    };
    let outcome = run.sweep();
    let mut results = run.results;
    drop(ns);
    drop(deployed);
    outcome?;
    results.env.loadavg_end = env::loadavg();
    Ok(results)
}

/// What the cluster does not run, taken out of `config`, a warning each: sockperf is
/// not in the test image, the minimal datapath and the floor have no pods to attach to
/// or compare with here.
fn narrow(config: &mut Config) -> Vec<String> {
    let mut warnings = Vec::new();
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
    warnings
}

impl Run<'_> {
    fn sweep(&mut self) -> Result<()> {
        let cfg = self.results.config.clone();
        let mut order = driver::paths_of(cfg.minimal);
        for rep in 0..cfg.reps {
            for placement in &cfg.placements {
                for &path in &order {
                    agent::set_path(self.kube, path)?;
                    let before = self.counters()?;
                    for &size in &cfg.sizes {
                        self.qperf(rep, placement, path, size)?;
                    }
                    if path == Path::Bypass {
                        let after = self.counters()?;
                        let at = (rep, placement);
                        let shown = ["paired_pod", "redirected_bytes", "passed_bytes"];
                        progress(&record_hops(&mut self.results, at, &before, &after, &shown));
                    }
                }
                order.rotate_left(1);
            }
        }
        self.results.env.duration_secs = self.steps.elapsed_secs();
        Ok(())
    }

    /// The agent's counters now (it runs in both blocks).
    fn counters(&self) -> Result<BTreeMap<String, u64>> {
        Ok(scenario::counters_of(&self.kube.agent_status()?))
    }

    /// The qperf client in pod `client`, pinned to `cpu`, through `kubectl exec` under
    /// `timeout`; its stdout, or `None` (with a warning) after two failures.
    fn client(&mut self, what: &str, argv: &[String], secs: u32) -> Result<Option<String>> {
        let limit = Duration::from_secs(u64::from(secs) * 2 + 5) + SLACK;
        let ns = self.ns;
        client_twice(what, &mut self.raw, &mut self.results.warnings, || {
            let exec = ns.exec("client", argv);
            let out = Command::new("timeout")
                .arg(limit.as_secs().to_string())
                .arg(exec.get_program())
                .args(exec.get_args())
                .stdin(Stdio::null())
                .output()
                .context("run timeout kubectl exec")?;
            Ok(Ok(out))
        })
    }

    /// What the agent has counted (redirected and passed bytes, small-message streams
    /// that left), in a bypassed block.
    fn stats(&self, path: Path) -> Option<Counted> {
        if path != Path::Bypass {
            return None;
        }
        let c = self.counters().ok()?;
        let get = |stat: Stat| c.get(stat.name()).copied();
        Some(Counted {
            redirected: get(Stat::RedirectedBytes)?,
            passed: get(Stat::PassedBytes)?,
            left: get(Stat::LeaveRequests).unwrap_or(0),
        })
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
        let at = (rep, p, path, size);
        let what = qperf_what(at);
        let stats0 = self.stats(path);
        let wire0 = veth_bytes(&self.veth).ok();
        let out = self.client(&what, &argv, secs)?;
        let wire1 = veth_bytes(&self.veth).ok();
        let observed = Observed::between((wire0, stats0), (wire1, self.stats(path)));
        let line = record_qperf(&mut self.results, at, out.as_deref(), observed).map_or_else(
            || format!("{what}: FAILED"),
            |line| {
                let wire = observed.wire;
                format!(
                    "{line}, veth {}",
                    wire.map_or_else(|| "-".into(), |w| format!("{w} B"))
                )
            },
        );
        self.steps.tick(&line);
        Ok(())
    }
}
