//! `kubectl` with the admin kubeconfig of the one-node cluster (`cargo xtask cluster`),
//! as the cluster tests and the bench's cluster scenario drive it: a command, its stdout
//! or its stderr in the error, manifests applied, pods waited for and `exec`ed into, and
//! the host end of a pod's veth with its byte counters.

use std::{
    ffi::OsStr,
    io::Write as _,
    path::PathBuf,
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result, bail, ensure};

/// The environment variable naming `kubectl` (set by `cargo xtask test --cluster` and
/// `cargo xtask bench --scenario cluster`).
pub const KUBECTL_ENV: &str = "BYPASS_KUBECTL";
/// The environment variable naming the cluster's admin kubeconfig (set likewise).
pub const KUBECONFIG_ENV: &str = "BYPASS_CLUSTER_KUBECONFIG";

/// `kubectl --kubeconfig <admin>`.
#[derive(Clone, Debug)]
pub struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
}

/// The path in environment variable `name`, or an error that ends with `fix`.
pub fn env_path(name: &str, fix: &str) -> Result<PathBuf> {
    std::env::var_os(name)
        .map(PathBuf::from)
        .with_context(|| format!("{name} is not set: {fix}"))
}

impl Kubectl {
    /// `bin` with `kubeconfig`.
    pub fn new(bin: impl Into<PathBuf>, kubeconfig: impl Into<PathBuf>) -> Self {
        Self {
            bin: bin.into(),
            kubeconfig: kubeconfig.into(),
        }
    }

    /// From [`KUBECTL_ENV`] and [`KUBECONFIG_ENV`]; when one is not set, the error ends
    /// with `fix` (how to run the caller so that they are).
    pub fn from_env(fix: &str) -> Result<Self> {
        Ok(Self::new(
            env_path(KUBECTL_ENV, fix)?,
            env_path(KUBECONFIG_ENV, fix)?,
        ))
    }

    /// The admin kubeconfig.
    pub fn kubeconfig(&self) -> &std::path::Path {
        &self.kubeconfig
    }

    /// A `kubectl` command.
    pub fn cmd(&self) -> Command {
        let mut c = Command::new(&self.bin);
        c.arg("--kubeconfig").arg(&self.kubeconfig);
        c
    }

    /// Runs `kubectl args`; its stdout, or an error with its stderr.
    pub fn run(&self, args: &[&str]) -> Result<String> {
        xtask_lib::cmd::output_named(
            self.cmd().args(args),
            &format!("kubectl {}", args.join(" ")),
        )
    }

    /// `kubectl apply -f -` of `manifest` (YAML or JSON).
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

    /// Deletes namespace `name` (if there is one) and waits until it is gone.
    pub fn delete_namespace(&self, name: &str) -> Result<()> {
        self.run(&[
            "delete",
            "namespace",
            name,
            "--ignore-not-found",
            "--wait=true",
            "--timeout=900s",
        ])
        .map(drop)
    }

    /// Waits until pod `ns/name` is Ready, up to `timeout`; returns its IP.
    pub fn ready_pod_ip(&self, ns: &str, name: &str, timeout: Duration) -> Result<String> {
        self.run(&[
            "-n",
            ns,
            "wait",
            "--for=condition=Ready",
            &format!("pod/{name}"),
            &format!("--timeout={}s", timeout.as_secs()),
        ])?;
        let ip = self.run(&[
            "-n",
            ns,
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

    /// `kubectl exec` of `argv` in the first container of pod `ns/name`.
    pub fn exec(&self, ns: &str, name: &str, argv: &[impl AsRef<OsStr>]) -> Command {
        let mut c = self.cmd();
        c.args(["-n", ns, "exec", name, "--"]).args(argv);
        c
    }

    /// The host end of pod `ns/name`'s veth: the interface whose index is the pod's eth0
    /// `iflink`.
    pub fn host_veth(&self, ns: &str, name: &str) -> Result<String> {
        let out = self
            .exec(ns, name, &["cat", "/sys/class/net/eth0/iflink"])
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

/// Bytes host interface `veth` has carried, both directions.
pub fn veth_bytes(veth: &str) -> Result<u64> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_carry_the_kubeconfig() {
        let k = Kubectl::new("/bin/kubectl", "/etc/admin.conf");
        let c = k.exec("ns", "pod", &["cat", "x"]);
        assert_eq!(c.get_program(), "/bin/kubectl");
        assert_eq!(
            c.get_args().collect::<Vec<_>>(),
            [
                "--kubeconfig",
                "/etc/admin.conf",
                "-n",
                "ns",
                "exec",
                "pod",
                "--",
                "cat",
                "x"
            ]
        );
    }

    #[test]
    fn the_loopback_carries_bytes_or_reads_zero() {
        assert!(veth_bytes("lo").is_ok());
        assert!(veth_bytes("no-such-interface0").is_err());
    }
}
