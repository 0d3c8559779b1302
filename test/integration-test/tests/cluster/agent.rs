//! The agent on the cluster as the tests install it: the DaemonSet of `deploy/` or a
//! release of the Helm chart, each removed on drop (the README's uninstall); its pod,
//! `status --json`, pins and `/metrics`.

use std::{net::SocketAddr, process::Command};

use anyhow::{Context as _, Result};
use kube_testenv::{deploy::AGENT_NS, env_path};

use crate::kube::{FIX, NODE_IP, deploy_dir, k, kubectl, repo};

/// The agent's pin directory in `deploy/`.
pub const PIN_DIR: &str = "/sys/fs/bpf/bypass";

/// The DaemonSet of `deploy/` (`kubectl apply -k deploy/`), Ready; on drop the README's
/// uninstall: delete it, run `deploy/uninstall.yaml` until every node is clean, delete
/// that, and remove the node label.
pub struct Deployed;

impl Deployed {
    /// Applies `deploy/` and waits for the rollout.
    pub fn apply() -> Result<Self> {
        let me = Self;
        let kube = kubectl()?;
        // On a kernel with no read guard, the operator's step docs/limitations.md gives
        // (a refused agent is not ready: the rollout finishes only once it is taken).
        kube.apply_deploy(&deploy_dir(), !testbed::kernel_probe()?.bypass_by_default)?;
        Ok(me)
    }

    /// [`wait_rollout`].
    pub fn wait_rollout(&self) -> Result<()> {
        wait_rollout()
    }

    /// [`agent_pod`].
    pub fn pod(&self) -> Result<String> {
        agent_pod()
    }

    /// [`agent_status`].
    pub fn status(&self) -> Result<serde_json::Value> {
        agent_status()
    }

    /// [`counter`].
    pub fn counter(&self, name: &str) -> Result<u64> {
        counter(name)
    }
}

impl Drop for Deployed {
    fn drop(&mut self) {
        if let Err(e) = kubectl().and_then(|k| k.uninstall_deploy(&deploy_dir())) {
            eprintln!("cluster test: uninstall failed: {e:#}");
        }
    }
}

/// Waits until the agent DaemonSet's rollout is complete and its pod Ready.
pub fn wait_rollout() -> Result<()> {
    kubectl()?.wait_rollout()
}

/// The running agent pod's name.
pub fn agent_pod() -> Result<String> {
    let name = k(&[
        "-n",
        AGENT_NS,
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/name=bypass-agent",
        "--field-selector=status.phase=Running",
        "-o",
        "jsonpath={.items[0].metadata.name}",
    ])?;
    anyhow::ensure!(!name.trim().is_empty(), "no running agent pod");
    Ok(name.trim().to_owned())
}

/// `bypass-agent status --json` through `kubectl exec`.
pub fn agent_status() -> Result<serde_json::Value> {
    kubectl()?.agent_status()
}

/// A counter of the running agent's `status --json`.
pub fn counter(name: &str) -> Result<u64> {
    let s = agent_status()?;
    find_u64(&s, name).with_context(|| format!("no {name} in status: {s}"))
}

fn find_u64(v: &serde_json::Value, key: &str) -> Option<u64> {
    match v {
        serde_json::Value::Object(m) => m
            .get(key)
            .and_then(serde_json::Value::as_u64)
            .or_else(|| m.values().find_map(|x| find_u64(x, key))),
        _ => None,
    }
}

/// `helm` of the tests.
pub fn helm(args: &[&str]) -> Result<String> {
    xtask_lib::cmd::output_named(
        Command::new(env_path("BYPASS_HELM", FIX)?)
            .arg("--kubeconfig")
            .arg(kubectl()?.kubeconfig())
            .args(args),
        &format!("helm {}", args.join(" ")),
    )
}

/// `helm template` of the chart as `release` (in `namespace`, when given) for the
/// cluster the tests run (helm template alone assumes v1.20.0), only `show_only` when
/// given, with each of `sets` as `--set`.
pub fn helm_template(
    release: &str,
    namespace: Option<&str>,
    show_only: Option<&str>,
    sets: &[&str],
) -> Result<String> {
    let chart_dir = repo()
        .join(kube_testenv::chart::CHART)
        .display()
        .to_string();
    let mut args = vec!["template", release, chart_dir.as_str()];
    if let Some(ns) = namespace {
        args.extend(["-n", ns]);
    }
    args.extend(["--kube-version", kube_testenv::KUBE_VERSION]);
    if let Some(t) = show_only {
        args.extend(["--show-only", t]);
    }
    for s in sets {
        args.extend(["--set", s]);
    }
    helm(&args)
}

/// A release of `deploy/chart/bypass-agent` in `bypass-system`; on drop `helm
/// uninstall`, the README's node cleanup, the namespace deleted.
pub struct HelmRelease {
    /// `helm uninstall` already ran (the test's own step).
    uninstalled: bool,
}

/// The release's name.
pub const RELEASE: &str = "bypass";

/// `helm <verb> RELEASE <chart> -n bypass-system <mode> --wait` with `sets` (`key=value`),
/// then the rollout waited for.
fn helm_chart(verb: &str, mode: &str, sets: &[&str]) -> Result<()> {
    let chart = repo()
        .join("deploy/chart/bypass-agent")
        .display()
        .to_string();
    let mut args = vec![
        verb,
        RELEASE,
        &chart,
        "-n",
        AGENT_NS,
        mode,
        "--wait",
        "--timeout=900s",
    ];
    for s in sets {
        args.extend(["--set", s]);
    }
    // This kernel has no read guard: the value docs/limitations.md gives for such nodes.
    if verb == "install" && !testbed::kernel_probe()?.bypass_by_default {
        args.extend(["--set", "allowUnguarded=true"]);
    }
    helm(&args)?;
    wait_rollout()
}

impl HelmRelease {
    /// `helm install` with `sets` (`key=value`), waiting for the DaemonSet.
    pub fn install(sets: &[&str]) -> Result<Self> {
        // Helm's --create-namespace: the namespace has no Pod Security label of its own.
        let _ = kubectl()?.delete_namespace(AGENT_NS);
        let me = Self { uninstalled: false };
        helm_chart("install", "--create-namespace", sets)?;
        Ok(me)
    }

    /// `helm uninstall --wait`, and nothing else (the drop then only deletes the
    /// namespace and cleans what a failed test left).
    pub fn uninstall(&mut self) -> Result<()> {
        self.uninstalled = true;
        helm(&[
            "uninstall",
            RELEASE,
            "-n",
            AGENT_NS,
            "--wait",
            "--timeout=900s",
        ])
        .map(drop)
    }

    /// `helm upgrade --reuse-values` with `sets`, waiting for the rollout.
    pub fn upgrade(&self, sets: &[&str]) -> Result<()> {
        helm_chart("upgrade", "--reuse-values", sets)
    }

    /// `helm rollback` to `revision` (1: what `install` made), waiting for the rollout.
    pub fn rollback(&self, revision: u32) -> Result<()> {
        helm(&[
            "rollback",
            RELEASE,
            &revision.to_string(),
            "-n",
            AGENT_NS,
            "--wait",
            "--timeout=900s",
        ])?;
        wait_rollout()
    }
}

impl Drop for HelmRelease {
    fn drop(&mut self) {
        let uninstall = if self.uninstalled {
            Ok(String::new())
        } else {
            helm(&["uninstall", RELEASE, "-n", AGENT_NS, "--wait"])
        };
        let result = uninstall
            .and_then(|_| kubectl()?.clean_nodes(&deploy_dir()))
            .and_then(|()| kubectl()?.delete_namespace(AGENT_NS));
        if let Err(e) = result {
            eprintln!("cluster test: helm uninstall failed: {e:#}");
        }
    }
}

/// The agent pod's container `name` as JSON (`spec.containers` or `initContainers`).
pub fn agent_container(init: bool) -> Result<serde_json::Value> {
    let pod = agent_pod()?;
    let field = if init { "initContainers" } else { "containers" };
    let text = pod_jsonpath(&pod, &format!("{{.spec.{field}[0]}}"))?;
    Ok(serde_json::from_str(&text)?)
}

/// `kubectl get pod POD -o jsonpath=EXPR` in the agent's namespace.
pub fn pod_jsonpath(pod: &str, expr: &str) -> Result<String> {
    k(&[
        "-n",
        AGENT_NS,
        "get",
        "pod",
        pod,
        "-o",
        &format!("jsonpath={expr}"),
    ])
}

/// Bytes the agent container's memory cgroup is charged now (`memory.current` on
/// cgroup v2, `memory.usage_in_bytes` on v1), BPF maps included (kernels >= 5.11
/// charge them to the cgroup of the process that made them).
pub fn agent_memory() -> Result<u64> {
    let pod = agent_pod()?;
    let id = pod_jsonpath(&pod, "{.status.containerStatuses[0].containerID}")?;
    let id = id.trim().rsplit("://").next().unwrap_or("").to_owned();
    anyhow::ensure!(!id.is_empty(), "agent pod {pod} has no container id");
    for (root, file) in [
        ("/sys/fs/cgroup/memory", "memory.usage_in_bytes"),
        ("/sys/fs/cgroup", "memory.current"),
    ] {
        if let Some(dir) = find_dir(std::path::Path::new(root), &id, 6) {
            let v = std::fs::read_to_string(dir.join(file))
                .with_context(|| format!("read {}/{file}", dir.display()))?;
            return Ok(v.trim().parse()?);
        }
    }
    anyhow::bail!("no memory cgroup of container {id}")
}

/// The directory under `root` (at most `depth` down) whose name ends with `id`.
fn find_dir(root: &std::path::Path, id: &str, depth: usize) -> Option<std::path::PathBuf> {
    for e in std::fs::read_dir(root).ok()?.flatten() {
        if !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let p = e.path();
        if e.file_name().to_string_lossy().ends_with(id) {
            return Some(p);
        }
        if depth > 0
            && let Some(found) = find_dir(&p, id, depth - 1)
        {
            return Some(found);
        }
    }
    None
}

/// What is left under the agent's pin directory (empty when it is gone).
pub fn pins_left() -> Vec<String> {
    std::fs::read_dir(PIN_DIR)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// The agent's metrics port in `deploy/` and the chart's default.
pub const METRICS_PORT: u16 = 19_464;

/// The agent's metrics address in `deploy/`: `NODE_IP:19464`.
fn metrics_addr() -> Result<SocketAddr> {
    Ok(SocketAddr::new(NODE_IP.parse()?, METRICS_PORT))
}

/// `GET http://NODE_IP:19464/<path>`: status code and body.
pub fn http_get(path: &str) -> Result<(u16, String)> {
    testbed::agent::http_get_at(metrics_addr()?, path)
}

/// The value of `series` (name with labels) in `/metrics`.
pub fn metric(series: &str) -> Result<f64> {
    testbed::agent::metric_at(metrics_addr()?, series)
}
