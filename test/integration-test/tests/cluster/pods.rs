//! The tests' pods: a namespace per test (deleted on drop), pods of the test image
//! serving or running the peer (`bypass-test-tool peer`, at [`TEST_TOOL_PATH`]), the
//! bytes on a pod's host veth, and peer client runs inside a pod with their reports.

use std::process::{Child, Command, Output, Stdio};

use anyhow::{Context as _, Result, ensure};
use kube_testenv::image::TEST_TOOL_PATH;

use crate::kube::{PORT, TEST_IMAGE, apply, k, kubectl, wait_for};

/// A `metadata` map (`labels`, `annotations`) as YAML under `metadata:`, or nothing
/// when empty.
fn metadata_map(key: &str, pairs: &[(&str, &str)]) -> String {
    if pairs.is_empty() {
        return String::new();
    }
    let items: String = pairs
        .iter()
        .map(|(k, v)| format!("    {k}: \"{v}\"\n"))
        .collect();
    format!("  {key}:\n{items}")
}

/// A namespace of the test's own, deleted (and waited for) on drop.
pub struct Namespace {
    /// Its name.
    pub name: String,
}

impl Namespace {
    /// Creates `name` with `labels` (`key: value` lines).
    pub fn create(name: &str, labels: &[(&str, &str)]) -> Result<Self> {
        let _ = kubectl().and_then(|k| k.delete_namespace(name));
        let labels = metadata_map("labels", labels);
        apply(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n{labels}"
        ))?;
        let ns = Self {
            name: name.to_owned(),
        };
        wait_for("the default ServiceAccount", kube_testenv::NET, || {
            k(&["-n", name, "get", "serviceaccount", "default"]).map(drop)
        })?;
        Ok(ns)
    }

    /// A pod of the test image running the peer's `server` on [`PORT`], Ready, with
    /// `annotations`; returns it.
    pub fn server_pod(&self, name: &str, annotations: &[(&str, &str)]) -> Result<Pod> {
        self.pod(
            name,
            annotations,
            &format!(
                "[\"{TEST_TOOL_PATH}\", \"peer\", \"server\", \"--listen\", \"0.0.0.0:{PORT}\", \"--idle-timeout\", \"120\"]"
            ),
        )
    }

    /// A pod of the test image that sleeps (clients are run in it with `exec`).
    pub fn client_pod(&self, name: &str) -> Result<Pod> {
        self.pod(name, &[], "[\"/bin/sleep\", \"3600\"]")
    }

    /// A Deployment `name` of one pod of the test image running the peer's `server` on
    /// [`PORT`]; returns its pod, Ready.
    pub fn server_deployment(&self, name: &str) -> Result<Pod> {
        apply(&format!(
            "apiVersion: apps/v1
kind: Deployment
metadata:
  name: {name}
  namespace: {ns}
spec:
  replicas: 1
  selector:
    matchLabels:
      app: {name}
  template:
    metadata:
      labels:
        app: {name}
    spec:
      dnsPolicy: Default
      terminationGracePeriodSeconds: 1
      automountServiceAccountToken: false
      containers:
      - name: c
        image: {TEST_IMAGE}
        imagePullPolicy: Never
        command: [\"{TEST_TOOL_PATH}\", \"peer\", \"server\", \"--listen\", \"0.0.0.0:{PORT}\", \"--idle-timeout\", \"120\"]
",
            ns = self.name
        ))?;
        let mut pod = String::new();
        wait_for("the Deployment's pod", kube_testenv::NET, || {
            pod = k(&[
                "-n",
                &self.name,
                "get",
                "pods",
                "-l",
                &format!("app={name}"),
                "-o",
                "jsonpath={.items[0].metadata.name}",
            ])?;
            ensure!(!pod.is_empty(), "no pod yet");
            Ok(())
        })?;
        let ip = kubectl()?.ready_pod_ip(&self.name, &pod, kube_testenv::NET)?;
        Ok(Pod {
            ns: self.name.clone(),
            name: pod,
            ip,
        })
    }

    fn pod(&self, name: &str, annotations: &[(&str, &str)], command: &str) -> Result<Pod> {
        let ann = metadata_map("annotations", annotations);
        apply(&format!(
            "apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {ns}
  labels:
    app: {name}
{ann}spec:
  dnsPolicy: Default
  terminationGracePeriodSeconds: 1
  automountServiceAccountToken: false
  containers:
  - name: c
    image: {TEST_IMAGE}
    imagePullPolicy: Never
    command: {command}
",
            ns = self.name
        ))?;
        let ip = kubectl()?.ready_pod_ip(&self.name, name, kube_testenv::NET)?;
        Ok(Pod {
            ns: self.name.clone(),
            name: name.to_owned(),
            ip,
        })
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        if let Err(e) = kubectl().and_then(|k| k.delete_namespace(&self.name)) {
            eprintln!("cluster test: delete namespace {}: {e:#}", self.name);
        }
    }
}

/// A pod of a test.
#[derive(Debug, Clone)]
pub struct Pod {
    /// Namespace.
    pub ns: String,
    /// Name.
    pub name: String,
    /// Its IPv4 address on the CNI bridge.
    pub ip: String,
}

impl Pod {
    /// `kubectl exec` of `args` in the pod.
    pub fn exec(&self, args: &[&str]) -> Command {
        kubectl().map_or_else(
            |_| Command::new("false"),
            |k| k.exec(&self.ns, &self.name, args),
        )
    }

    /// Bytes its host veth has carried (both directions).
    pub fn veth_bytes(&self) -> Result<u64> {
        kube_testenv::veth_bytes(&kubectl()?.host_veth(&self.ns, &self.name)?)
    }

    /// The peer's `client` to `target`, `bytes` each way, then `extra` arguments.
    fn peer_client(&self, target: &str, bytes: &str, extra: &[&str]) -> Command {
        let mut args = vec![
            TEST_TOOL_PATH,
            "peer",
            "client",
            "--connect",
            target,
            "--send",
            bytes,
            "--recv",
            bytes,
        ];
        args.extend(extra);
        self.exec(&args)
    }
}

/// The JSON report of one peer client run.
pub fn report(out: &Output) -> Result<serde_json::Value> {
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .with_context(|| {
            format!(
                "the peer printed no report (status {}): {text}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
    serde_json::from_str(line).with_context(|| format!("report: {line}"))
}

/// The report of a run that ended well and byte-exact, or an error.
fn byte_exact(out: &Output) -> Result<serde_json::Value> {
    let r = report(out)?;
    ensure!(
        out.status.success() && r["ok"] == true,
        "not byte-exact: {r}"
    );
    Ok(r)
}

/// The peer's `client` in `client` to `target`, `bytes` each way; the report of a
/// byte-exact run, or an error.
pub fn exchange(client: &Pod, target: &str, bytes: &str) -> Result<serde_json::Value> {
    byte_exact(&client.peer_client(target, bytes, &[]).output()?)
}

/// A peer client left running (rate-limited) until [`Running::finish`].
pub struct Running {
    child: Option<Child>,
}

impl Running {
    /// Starts it.
    pub fn start(client: &Pod, target: &str, bytes: &str, rate: &str) -> Result<Self> {
        let child = client
            .peer_client(target, bytes, &["--rate", rate, "--msg-size", "16K"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        Ok(Self { child: Some(child) })
    }

    /// Waits for it: the report of a byte-exact run, or an error.
    pub fn finish(mut self) -> Result<serde_json::Value> {
        let child = self.child.take().context("already finished")?;
        byte_exact(&child.wait_with_output()?)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
