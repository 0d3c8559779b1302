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
        kube.apply_deploy(&deploy_dir())?;
        if !testbed::kernel_probe()?.bypass_by_default {
            // This kernel has no read guard: the operator's step the README gives.
            kube.allow_unguarded()?;
        }
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

    /// A counter of `status --json`.
    pub fn counter(&self, name: &str) -> Result<u64> {
        let s = agent_status()?;
        find_u64(&s, name).with_context(|| format!("no {name} in status: {s}"))
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
    kube_testenv::run(
        Command::new(env_path("BYPASS_HELM", FIX)?)
            .arg("--kubeconfig")
            .arg(kubectl()?.kubeconfig())
            .args(args),
        &format!("helm {}", args.join(" ")),
    )
}

/// A release of `deploy/chart/bypass-agent` in `bypass-system`; on drop `helm
/// uninstall`, the README's node cleanup, the namespace deleted.
pub struct HelmRelease;

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
        "--timeout=120s",
    ];
    for s in sets {
        args.extend(["--set", s]);
    }
    // This kernel has no read guard: the value the README gives for such nodes.
    if verb == "install" && !testbed::kernel_probe()?.bypass_by_default {
        args.extend(["--set", "allowUnguarded=true"]);
    }
    helm(&args)?;
    wait_rollout()
}

impl HelmRelease {
    /// `helm install` with `sets` (`key=value`), waiting for the DaemonSet.
    pub fn install(sets: &[&str]) -> Result<Self> {
        let me = Self;
        helm_chart("install", "--create-namespace", sets)?;
        Ok(me)
    }

    /// `helm upgrade --reuse-values` with `sets`, waiting for the rollout.
    pub fn upgrade(&self, sets: &[&str]) -> Result<()> {
        helm_chart("upgrade", "--reuse-values", sets)
    }
}

impl Drop for HelmRelease {
    fn drop(&mut self) {
        let result = helm(&["uninstall", RELEASE, "-n", AGENT_NS, "--wait"])
            .and_then(|_| kubectl()?.clean_nodes(&deploy_dir()))
            .and_then(|()| kubectl()?.delete_namespace(AGENT_NS));
        if let Err(e) = result {
            eprintln!("cluster test: helm uninstall failed: {e:#}");
        }
    }
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

/// The agent's metrics address in `deploy/`: `NODE_IP:9464`.
fn metrics_addr() -> Result<SocketAddr> {
    Ok(SocketAddr::new(NODE_IP.parse()?, 9464))
}

/// `GET http://NODE_IP:9464/<path>`: status code and body.
pub fn http_get(path: &str) -> Result<(u16, String)> {
    testbed::agent::http_get_at(metrics_addr()?, path)
}

/// The value of `series` (name with labels) in `/metrics`.
pub fn metric(series: &str) -> Result<f64> {
    testbed::agent::metric_at(metrics_addr()?, series)
}
