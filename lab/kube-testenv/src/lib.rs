//! The Kubernetes lab: the one-node cluster, the API-server test env and the offline
//! images.
//!
//! A real kube-apiserver with its etcd on loopback, for `cargo xtask kube-env up|down`
//! and for the agent's Kubernetes tests. Both binaries are built once from the Go module
//! proxy and cached; certificates (a CA, the serving certificate, client certificates)
//! and the service-account key are made with `openssl`; an admin kubeconfig is written.
//! No controller-manager, scheduler or kubelet runs: tests set status themselves.
//!
//! [`cluster`]: the one-node cluster of `cargo xtask cluster` (which has them all);
//! [`image`] and [`oci`]: the agent and test images of `cargo xtask image`, assembled
//! with no registry. For that cluster: [`Kubectl`] with the admin kubeconfig, the agent
//! of `deploy/` on it ([`deploy`]), and polling until a check passes ([`wait_for`]),
//! shared by xtask, the cluster tests and the bench.
//!
//! Only `std`, `anyhow`, `serde_json`, `nix`, bypass-common's std helpers and
//! `xtask-lib` (the command runner, the workspace's paths, one HTTP GET), so xtask (which
//! installs the eBPF toolchain the other crates need) and the tests can use it cheaply.

mod binaries;
pub mod chart;
pub mod cluster;
pub mod deploy;
mod env;
pub mod image;
mod kubectl;
pub mod oci;
mod pki;
mod state;
mod wait;

pub use binaries::{
    Binaries, KUBE_VERSION, STAGING_VERSION, build_go_mod, build_stamped, cache_dir,
    ensure_binaries, go_command, go_tool, is_current, tools_go, version_ldflags,
};
pub use env::{GET_TIMEOUT, KubeEnv, READY_TIMEOUT};
pub use kubectl::{KUBECONFIG_ENV, KUBECTL_ENV, Kubectl, env_path, veth_bytes};
pub use pki::{ca, client_cert, kubeconfig, service_account_key, signed};
pub use state::{default_dir, down, up};
pub use wait::{NET, retry, wait_for};
