//! The bench's two pods: their manifests and pinned command lines (pure), and the
//! namespace they run in, deleted (and waited for) on drop.

use std::{process::Command, time::Duration};

use anyhow::{Context as _, Result};
use kube_testenv::{Kubectl, deploy::NODE};

use super::{NAMESPACE, TEST_IMAGE};
use crate::{driver, driver::progress, model::Placement, qperf};

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
pub(super) fn argv_of(cmd: &Command) -> Vec<String> {
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

/// [`NAMESPACE`], deleted (and waited for) on drop.
pub(super) struct Namespace<'a> {
    kube: &'a Kubectl,
}

impl<'a> Namespace<'a> {
    pub(super) fn create(kube: &'a Kubectl) -> Result<Self> {
        kube.delete_namespace(NAMESPACE)?;
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
    pub(super) fn pod(&self, name: &str, containers: &[Container]) -> Result<String> {
        self.kube.apply(&pod_manifest(name, containers))?;
        self.kube
            .ready_pod_ip(NAMESPACE, name, Duration::from_secs(120))
            .with_context(|| {
                format!("pod {name} not Ready: is {TEST_IMAGE} loaded (`cargo xtask image`)?")
            })
    }

    /// `kubectl exec` of `argv` in the first container of pod `name`.
    pub(super) fn exec(&self, name: &str, argv: &[String]) -> Command {
        self.kube.exec(NAMESPACE, name, argv)
    }

    /// The host end of pod `name`'s veth.
    pub(super) fn host_veth(&self, name: &str) -> Result<String> {
        self.kube.host_veth(NAMESPACE, name)
    }
}

impl Drop for Namespace<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.kube.delete_namespace(NAMESPACE) {
            progress(&format!("cluster: delete namespace {NAMESPACE}: {e:#}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Test;

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
