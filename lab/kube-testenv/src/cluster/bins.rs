//! The cluster's Kubernetes binaries: the API server and etcd of `kube-env`, plus
//! kube-controller-manager, kube-scheduler, kubelet, kube-proxy and kubectl, built from
//! the same `k8s.io/kubernetes` module (same version, same build module) and cached
//! beside them.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context as _, Result};
use xtask_lib::cmd;

/// The components built here besides `kube-env`'s two, by command package.
pub const COMPONENTS: [&str; 5] = [
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "kube-proxy",
    "kubectl",
];

/// Every binary of the cluster.
#[derive(Debug, Clone)]
pub struct Bins {
    /// The cache's `bin/` directory.
    pub dir: PathBuf,
}

impl Bins {
    /// The path of binary `name`.
    pub fn get(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// Builds what is missing (minutes the first time), then returns the binaries.
pub fn ensure() -> Result<Bins> {
    let base = crate::ensure_binaries()?;
    let dir = base
        .kube_apiserver
        .parent()
        .map(Path::to_path_buf)
        .context("kube-apiserver has no directory")?;
    let bins = Bins { dir };
    let missing: Vec<&str> = COMPONENTS
        .iter()
        .copied()
        .filter(|c| !crate::is_current(&bins.get(c)))
        .collect();
    if missing.is_empty() {
        return Ok(bins);
    }
    let go = crate::go_tool()?;
    let src = crate::cache_dir().join("src");
    let go_cmd = |args: &[&str]| crate::go_command(&go, &src, args);
    eprintln!(
        "cluster: building {} {} (minutes the first time)",
        missing.join(", "),
        crate::KUBE_VERSION
    );
    let started = Instant::now();
    std::fs::write(src.join("tools.go"), crate::tools_go(&COMPONENTS))
        .with_context(|| format!("write {}/tools.go", src.display()))?;
    cmd::run_to_stderr(&mut go_cmd(&["mod", "tidy"]))?;
    for c in missing {
        crate::build_stamped(go_cmd, &format!("k8s.io/kubernetes/cmd/{c}"), &bins.get(c))?;
    }
    eprintln!("cluster: built in {:.0?}", started.elapsed());
    Ok(bins)
}

/// The Helm release the chart tests install with (no Debian package carries Helm).
pub const HELM_VERSION: &str = "v3.22.0";
/// The kubeconform release the chart and `deploy/` are checked with.
pub const KUBECONFORM_VERSION: &str = "v0.7.0";
/// The Prometheus module whose `promtool` checks and unit-tests the chart's alerts
/// (module v0.316.0 is Prometheus 3.16.0).
pub const PROMTOOL_VERSION: &str = "v0.316.0";

/// `helm`, built from the Go module proxy into the cache unless there.
pub fn ensure_helm() -> Result<PathBuf> {
    go_install("helm", "helm.sh/helm/v3/cmd/helm", HELM_VERSION)
}

/// `kubeconform`, built from the Go module proxy into the cache unless there.
pub fn ensure_kubeconform() -> Result<PathBuf> {
    go_install(
        "kubeconform",
        "github.com/yannh/kubeconform/cmd/kubeconform",
        KUBECONFORM_VERSION,
    )
}

/// `promtool`, built from the Go module proxy into the cache unless there.
pub fn ensure_promtool() -> Result<PathBuf> {
    go_install(
        "promtool",
        "github.com/prometheus/prometheus/cmd/promtool",
        PROMTOOL_VERSION,
    )
}

/// `go install package@version` into the cache's `<name>-<version>/` unless there.
fn go_install(name: &str, package: &str, version: &str) -> Result<PathBuf> {
    let dir = crate::cache_dir().join(format!("{name}-{version}"));
    let bin = dir.join(name);
    if bin.is_file() {
        return Ok(bin);
    }
    let go = crate::go_tool()?;
    eprintln!("cluster: building {name} {version} (a few minutes the first time)");
    let started = Instant::now();
    std::fs::create_dir_all(&dir)?;
    cmd::run_to_stderr(
        Command::new(go)
            .args(["install", &format!("{package}@{version}")])
            .env("GOBIN", &dir)
            .env("GOTOOLCHAIN", "local")
            .current_dir(&dir),
    )?;
    eprintln!("cluster: {name} built in {:.0?}", started.elapsed());
    Ok(bin)
}
