//! The cluster's certificates, made with `openssl`: a CA, the API server's serving
//! certificate (node address, the `kubernetes` Service's ClusterIP and names), kubelet's
//! serving certificate, client certificates, and the service-account key pair.

use std::path::Path;

use anyhow::Result;

use super::config::{KUBERNETES_SERVICE_IP, NODE_IP, NODE_NAME};
use crate::{ca, client_cert, service_account_key, signed};

/// Makes every certificate under `dir` (which must exist).
pub fn make(dir: &Path) -> Result<()> {
    ca(dir, "bypass-cluster-ca")?;
    let api_san = format!(
        "subjectAltName=IP:{NODE_IP},IP:{KUBERNETES_SERVICE_IP},IP:127.0.0.1,DNS:localhost,\
         DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,\
         DNS:kubernetes.default.svc.cluster.local"
    );
    signed(
        dir,
        "apiserver",
        "/CN=kube-apiserver",
        &[&api_san, "extendedKeyUsage=serverAuth"],
    )?;
    let kubelet_san = format!("subjectAltName=IP:{NODE_IP},DNS:{NODE_NAME}");
    signed(
        dir,
        "kubelet",
        &format!("/CN={NODE_NAME}"),
        &[&kubelet_san, "extendedKeyUsage=serverAuth"],
    )?;
    client_cert(dir, "admin", "admin", &["system:masters"])?;
    client_cert(
        dir,
        "apiserver-kubelet-client",
        "kube-apiserver-kubelet-client",
        &["system:masters"],
    )?;
    service_account_key(dir)
}
