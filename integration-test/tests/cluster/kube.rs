//! What the cluster tests drive: `kubectl` on the cluster of `cargo xtask cluster`, a
//! namespace per test and the DaemonSet of `deploy/`, each removed on drop (the
//! DaemonSet through the README's uninstall), the host veth of a pod and its byte
//! counters, and `bypass-peer` runs inside pods.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};

/// The node of the cluster.
pub const NODE: &str = "bypass-node";
/// The node's address (metrics listen there).
pub const NODE_IP: &str = "10.123.0.1";
/// The test image (peer tools).
pub const TEST_IMAGE: &str = "bypass-test:0.1.0";
/// The agent's pin directory in `deploy/`.
pub const PIN_DIR: &str = "/sys/fs/bpf/bypass";
/// The server port of the test pods.
pub const PORT: u16 = 8080;

fn env_path(name: &str, fix: &str) -> Result<PathBuf> {
    std::env::var_os(name)
        .map(PathBuf::from)
        .with_context(|| format!("{name} is not set: {fix}"))
}

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// `kubectl --kubeconfig <admin>`.
pub fn kubectl() -> Result<Command> {
    let fix = "run the cluster tests with `cargo xtask test --cluster`";
    let bin = env_path("BYPASS_KUBECTL", fix)?;
    let kc = env_path("BYPASS_CLUSTER_KUBECONFIG", fix)?;
    let mut c = Command::new(bin);
    c.arg("--kubeconfig").arg(kc);
    Ok(c)
}

/// Runs `kubectl args`; its stdout, or an error with its stderr.
pub fn k(args: &[&str]) -> Result<String> {
    let out = kubectl()?.args(args).output().context("run kubectl")?;
    if !out.status.success() {
        bail!(
            "kubectl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `kubectl apply -f -` of `yaml`.
pub fn apply(yaml: &str) -> Result<()> {
    let mut child = kubectl()?
        .args(["apply", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    std::io::Write::write_all(child.stdin.as_mut().context("stdin")?, yaml.as_bytes())?;
    drop(child.stdin.take());
    let out = child.wait_with_output()?;
    ensure!(
        out.status.success(),
        "kubectl apply failed: {}\n{yaml}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

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

/// Waits until `check` succeeds.
pub fn wait_for(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Result<()>,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        match check() {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() > deadline => bail!("{what} not within {timeout:?}: {e:#}"),
            Err(_) => std::thread::sleep(Duration::from_millis(300)),
        }
    }
}

/// Sets the node label `bypass.dev/enabled` (`None` removes it).
pub fn label_node(value: Option<&str>) -> Result<()> {
    let arg = value.map_or_else(
        || "bypass.dev/enabled-".to_owned(),
        |v| format!("bypass.dev/enabled={v}"),
    );
    k(&["label", "node", NODE, &arg, "--overwrite"]).map(drop)
}

/// The DaemonSet of `deploy/` (`kubectl apply -k deploy/`), Ready; on drop the README's
/// uninstall: delete it, run `deploy/uninstall.yaml` until every node is clean, delete
/// that, and remove the node label.
pub struct Deployed;

impl Deployed {
    /// Applies `deploy/` and waits for the rollout.
    pub fn apply() -> Result<Self> {
        let me = Self;
        k(&["apply", "-k", &repo().join("deploy").display().to_string()])?;
        me.wait_rollout()?;
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

/// Waits until the agent DaemonSet's rollout is complete and its pod Ready.
pub fn wait_rollout() -> Result<()> {
    k(&[
        "-n",
        "bypass-system",
        "rollout",
        "status",
        "ds/bypass-agent",
        "--timeout=120s",
    ])
    .map(drop)
}

/// The running agent pod's name.
pub fn agent_pod() -> Result<String> {
    let name = k(&[
        "-n",
        "bypass-system",
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/name=bypass-agent",
        "--field-selector=status.phase=Running",
        "-o",
        "jsonpath={.items[0].metadata.name}",
    ])?;
    ensure!(!name.trim().is_empty(), "no running agent pod");
    Ok(name.trim().to_owned())
}

/// `bypass-agent status --json` through `kubectl exec`.
pub fn agent_status() -> Result<serde_json::Value> {
    let text = k(&[
        "-n",
        "bypass-system",
        "exec",
        "ds/bypass-agent",
        "--",
        "bypass-agent",
        "status",
        "--json",
    ])?;
    serde_json::from_str(&text).with_context(|| format!("status --json: {text}"))
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

impl Drop for Deployed {
    fn drop(&mut self) {
        if let Err(e) = uninstall() {
            eprintln!("cluster test: uninstall failed: {e:#}");
        }
    }
}

/// The README's uninstall, and the node label removed.
pub fn uninstall() -> Result<()> {
    let deploy = repo().join("deploy");
    k(&[
        "delete",
        "-k",
        &deploy.display().to_string(),
        "--ignore-not-found",
        "--wait=true",
        "--timeout=120s",
    ])?;
    clean_nodes()
}

/// `deploy/uninstall.yaml` until every node is clean, then deleted; the label removed.
pub fn clean_nodes() -> Result<()> {
    let deploy = repo().join("deploy");
    let manifest = deploy.join("uninstall.yaml").display().to_string();
    k(&["apply", "-f", &manifest])?;
    let result = k(&[
        "-n",
        "bypass-uninstall",
        "rollout",
        "status",
        "ds/bypass-uninstall",
        "--timeout=120s",
    ]);
    k(&["delete", "-f", &manifest, "--wait=true", "--timeout=120s"])?;
    label_node(None)?;
    result.map(drop)
}

/// `helm` of the tests.
pub fn helm(args: &[&str]) -> Result<String> {
    let fix = "run the cluster tests with `cargo xtask test --cluster`";
    let bin = env_path("BYPASS_HELM", fix)?;
    let kc = env_path("BYPASS_CLUSTER_KUBECONFIG", fix)?;
    let out = Command::new(bin)
        .arg("--kubeconfig")
        .arg(kc)
        .args(args)
        .output()
        .context("run helm")?;
    if !out.status.success() {
        bail!(
            "helm {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A release of `deploy/chart/bypass-agent` in `bypass-system`; on drop `helm
/// uninstall`, the README's node cleanup, the namespace deleted.
pub struct HelmRelease;

/// The release's name.
pub const RELEASE: &str = "bypass";

impl HelmRelease {
    /// `helm install` with `sets` (`key=value`), waiting for the DaemonSet.
    pub fn install(sets: &[&str]) -> Result<Self> {
        let chart = repo()
            .join("deploy/chart/bypass-agent")
            .display()
            .to_string();
        let mut args = vec![
            "install",
            RELEASE,
            &chart,
            "-n",
            "bypass-system",
            "--create-namespace",
            "--wait",
            "--timeout=120s",
        ];
        for s in sets {
            args.extend(["--set", s]);
        }
        let me = Self;
        helm(&args)?;
        wait_rollout()?;
        Ok(me)
    }

    /// `helm upgrade --reuse-values` with `sets`, waiting for the rollout.
    pub fn upgrade(&self, sets: &[&str]) -> Result<()> {
        let chart = repo()
            .join("deploy/chart/bypass-agent")
            .display()
            .to_string();
        let mut args = vec![
            "upgrade",
            RELEASE,
            &chart,
            "-n",
            "bypass-system",
            "--reuse-values",
            "--wait",
            "--timeout=120s",
        ];
        for s in sets {
            args.extend(["--set", s]);
        }
        helm(&args)?;
        wait_rollout()
    }
}

impl Drop for HelmRelease {
    fn drop(&mut self) {
        let result = helm(&["uninstall", RELEASE, "-n", "bypass-system", "--wait"])
            .and_then(|_| clean_nodes())
            .and_then(|()| {
                k(&[
                    "delete",
                    "namespace",
                    "bypass-system",
                    "--ignore-not-found",
                    "--wait=true",
                ])
                .map(drop)
            });
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

/// A namespace of the test's own, deleted (and waited for) on drop.
pub struct Namespace {
    /// Its name.
    pub name: String,
}

impl Namespace {
    /// Creates `name` with `labels` (`key: value` lines).
    pub fn create(name: &str, labels: &[(&str, &str)]) -> Result<Self> {
        let _ = k(&[
            "delete",
            "namespace",
            name,
            "--ignore-not-found",
            "--wait=true",
        ]);
        let labels = metadata_map("labels", labels);
        apply(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n{labels}"
        ))?;
        let ns = Self {
            name: name.to_owned(),
        };
        wait_for(
            "the default ServiceAccount",
            Duration::from_secs(30),
            || k(&["-n", name, "get", "serviceaccount", "default"]).map(drop),
        )?;
        Ok(ns)
    }

    /// A pod of the test image running `bypass-peer server` on [`PORT`], Ready, with
    /// `annotations`; returns it.
    pub fn server_pod(&self, name: &str, annotations: &[(&str, &str)]) -> Result<Pod> {
        self.pod(
            name,
            annotations,
            &format!(
                "[\"/usr/local/bin/bypass-peer\", \"server\", \"--listen\", \"0.0.0.0:{PORT}\", \"--idle-timeout\", \"120\"]"
            ),
        )
    }

    /// A pod of the test image that sleeps (clients are run in it with `exec`).
    pub fn client_pod(&self, name: &str) -> Result<Pod> {
        self.pod(name, &[], "[\"/bin/sleep\", \"3600\"]")
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
        k(&[
            "-n",
            &self.name,
            "wait",
            "--for=condition=Ready",
            &format!("pod/{name}"),
            "--timeout=60s",
        ])?;
        let ip = k(&[
            "-n",
            &self.name,
            "get",
            "pod",
            name,
            "-o",
            "jsonpath={.status.podIP}",
        ])?;
        let pod = Pod {
            ns: self.name.clone(),
            name: name.to_owned(),
            ip: ip.trim().to_owned(),
        };
        ensure!(!pod.ip.is_empty(), "pod {name} has no IP");
        Ok(pod)
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        if let Err(e) = k(&[
            "delete",
            "namespace",
            &self.name,
            "--wait=true",
            "--timeout=120s",
        ]) {
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
        let mut c = kubectl().unwrap_or_else(|_| Command::new("false"));
        c.args(["-n", &self.ns, "exec", &self.name, "--"])
            .args(args);
        c
    }

    /// The host end of its veth: the interface whose index is the pod's eth0 `iflink`.
    pub fn host_veth(&self) -> Result<String> {
        let out = self.exec(&["cat", "/sys/class/net/eth0/iflink"]).output()?;
        ensure!(out.status.success(), "read iflink in {}", self.name);
        let index = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        for entry in std::fs::read_dir("/sys/class/net")?.flatten() {
            let idx = std::fs::read_to_string(entry.path().join("ifindex")).unwrap_or_default();
            if idx.trim() == index {
                return Ok(entry.file_name().to_string_lossy().into_owned());
            }
        }
        bail!("no host interface has index {index} (pod {})", self.name)
    }

    /// Bytes its host veth has carried (both directions).
    pub fn veth_bytes(&self) -> Result<u64> {
        let veth = self.host_veth()?;
        let mut sum = 0;
        for f in ["rx_bytes", "tx_bytes"] {
            let p = format!("/sys/class/net/{veth}/statistics/{f}");
            sum += std::fs::read_to_string(&p)
                .with_context(|| format!("read {p}"))?
                .trim()
                .parse::<u64>()?;
        }
        Ok(sum)
    }
}

/// The JSON report of one `bypass-peer client` run.
pub fn report(out: &Output) -> Result<serde_json::Value> {
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .with_context(|| {
            format!(
                "bypass-peer printed no report (status {}): {text}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
    serde_json::from_str(line).with_context(|| format!("report: {line}"))
}

/// `bypass-peer client` in `client` to `target`, `bytes` each way; the report of a
/// byte-exact run, or an error.
pub fn exchange(client: &Pod, target: &str, bytes: &str) -> Result<serde_json::Value> {
    let out = client
        .exec(&[
            "/usr/local/bin/bypass-peer",
            "client",
            "--connect",
            target,
            "--send",
            bytes,
            "--recv",
            bytes,
        ])
        .output()?;
    let r = report(&out)?;
    ensure!(
        out.status.success() && r["ok"] == true,
        "not byte-exact: {r}"
    );
    Ok(r)
}

/// A `bypass-peer client` left running (rate-limited) until [`Running::finish`].
pub struct Running {
    child: Option<Child>,
}

impl Running {
    /// Starts it.
    pub fn start(client: &Pod, target: &str, bytes: &str, rate: &str) -> Result<Self> {
        let child = client
            .exec(&[
                "/usr/local/bin/bypass-peer",
                "client",
                "--connect",
                target,
                "--send",
                bytes,
                "--recv",
                bytes,
                "--rate",
                rate,
                "--msg-size",
                "16K",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        Ok(Self { child: Some(child) })
    }

    /// Waits for it: the report of a byte-exact run, or an error.
    pub fn finish(mut self) -> Result<serde_json::Value> {
        let child = self.child.take().context("already finished")?;
        let out = child.wait_with_output()?;
        let r = report(&out)?;
        ensure!(
            out.status.success() && r["ok"] == true,
            "not byte-exact: {r}"
        );
        Ok(r)
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

/// `GET http://NODE_IP:9464/<path>` (the agent's metrics address in `deploy/`).
pub fn http_get(path: &str) -> Result<String> {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect((NODE_IP, 9464))
        .with_context(|| format!("connect {NODE_IP}:9464"))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {NODE_IP}\r\nConnection: close\r\n\r\n"
    )?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    Ok(body)
}

/// The value of `series` (name with labels) in `/metrics`.
pub fn metric(series: &str) -> Result<f64> {
    let body = http_get("/metrics")?;
    body.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|r| r.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("no {series} in /metrics:\n{body}"))
}
