//! `kubectl` of the cluster tests: the cluster of `cargo xtask cluster`, through
//! [`kube_testenv::Kubectl`] with the admin kubeconfig `cargo xtask test --cluster` hands
//! over; the node label, and waiting for a check to pass.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::Result;
use kube_testenv::Kubectl;

/// The node's address (metrics listen there).
pub const NODE_IP: &str = "10.123.0.1";
/// The test image (the test tool, whose `peer` the tests run).
pub const TEST_IMAGE: &str = concat!("bypass-test:", env!("CARGO_PKG_VERSION"));
/// The server port of the test pods.
pub const PORT: u16 = 8080;
/// How to run the tests so that the environment names the cluster.
pub const FIX: &str = "run the cluster tests with `cargo xtask test --cluster`";

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `deploy/` of the repository.
pub fn deploy_dir() -> PathBuf {
    repo().join("deploy")
}

/// `kubectl --kubeconfig <admin>`.
pub fn kubectl() -> Result<Kubectl> {
    Kubectl::from_env(FIX)
}

/// Runs `kubectl args`; its stdout, or an error with its stderr.
pub fn k(args: &[&str]) -> Result<String> {
    kubectl()?.run(args)
}

/// `kubectl apply -f -` of `yaml`.
pub fn apply(yaml: &str) -> Result<()> {
    kubectl()?.apply(yaml)
}

/// Waits until `check` succeeds.
pub fn wait_for(what: &str, timeout: Duration, check: impl FnMut() -> Result<()>) -> Result<()> {
    kube_testenv::wait_for(what, timeout, Duration::from_millis(300), check)
}

/// Sets the node label `bypass.dev/enabled` (`None` removes it).
pub fn label_node(value: Option<bool>) -> Result<()> {
    kubectl()?.label_node(value)
}
