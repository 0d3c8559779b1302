//! The cluster's certificates, made with `openssl`: a CA, the API server's serving
//! certificate (node address, the `kubernetes` Service's ClusterIP and names), kubelet's
//! serving certificate, client certificates, and the service-account key pair.

use std::{path::Path, process::Command};

use anyhow::{Context as _, Result};

use super::config::{KUBERNETES_SERVICE_IP, NODE_IP, NODE_NAME};
use crate::cmd;

fn openssl(dir: &Path, args: &[&str]) -> Result<()> {
    cmd::output(Command::new("openssl").args(args).current_dir(dir))
        .map(drop)
        .context("openssl makes the cluster's certificates (apt-get install openssl)")
}

/// A key and a certificate signed by `ca.crt`, with `ext` (subjectAltName, usages).
fn signed(dir: &Path, name: &str, subj: &str, ext: &[&str]) -> Result<()> {
    let (key, csr, crt) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.crt"),
    );
    let mut args = vec![
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj", subj,
    ];
    for e in ext {
        args.extend(["-addext", e]);
    }
    openssl(dir, &args)?;
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            "3650",
            "-copy_extensions",
            "copy",
        ],
    )
}

/// Makes every certificate under `dir` (which must exist).
pub fn make(dir: &Path) -> Result<()> {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "3650",
            "-subj",
            "/CN=bypass-cluster-ca",
        ],
    )?;
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
    // Client certificates: X.509 v3 (rustls refuses v1), client usage.
    let client = [
        "extendedKeyUsage=clientAuth",
        "keyUsage=critical,digitalSignature,keyEncipherment",
    ];
    signed(dir, "admin", "/CN=admin/O=system:masters", &client)?;
    signed(
        dir,
        "apiserver-kubelet-client",
        "/CN=kube-apiserver-kubelet-client/O=system:masters",
        &client,
    )?;
    openssl(dir, &["genrsa", "-out", "sa.key", "2048"])?;
    openssl(dir, &["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"])
}
