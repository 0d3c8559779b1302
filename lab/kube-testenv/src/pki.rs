//! Certificates and keys for the API server, made with `openssl`, and the kubeconfig
//! that presents a client certificate; for the test env and the one-node cluster.

use std::{path::Path, process::Command};

use anyhow::{Context as _, Result};
use xtask_lib::cmd;

fn openssl(dir: &Path, args: &[&str]) -> Result<()> {
    cmd::output_named(
        Command::new("openssl").args(args).current_dir(dir),
        &format!("openssl {}", args.first().copied().unwrap_or("")),
    )
    .map(drop)
    .context("openssl is needed for the test API server's certificates (apt-get install openssl)")
}

/// A self-signed CA, `ca.key` and `ca.crt`, in `dir`, named `cn`.
pub fn ca(dir: &Path, cn: &str) -> Result<()> {
    let subj = format!("/CN={cn}");
    openssl(
        dir,
        &[
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
            "-days", "3650", "-subj", &subj,
        ],
    )
}

/// The service-account signing key pair, `sa.key` and `sa.pub`, in `dir`.
pub fn service_account_key(dir: &Path) -> Result<()> {
    openssl(dir, &["genrsa", "-out", "sa.key", "2048"])?;
    openssl(dir, &["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"])
}

/// `<name>.key` and `<name>.crt` in `dir`, for subject `subj` with extensions `ext`
/// (subjectAltName, usages), signed by the `ca.crt`/`ca.key` there: X.509 v3 (with
/// extensions rustls accepts it), ten years.
pub fn signed(dir: &Path, name: &str, subj: &str, ext: &[&str]) -> Result<()> {
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

/// A client certificate `<name>.crt`/`<name>.key` in `dir` for the user `cn` in `groups`:
/// with extensions, so it is X.509 v3 (rustls refuses v1), client usage.
pub fn client_cert(dir: &Path, name: &str, cn: &str, groups: &[&str]) -> Result<()> {
    let subj = groups
        .iter()
        .fold(format!("/CN={cn}"), |subj, g| subj + "/O=" + g);
    signed(
        dir,
        name,
        &subj,
        &[
            "extendedKeyUsage=clientAuth",
            "keyUsage=critical,digitalSignature,keyEncipherment",
        ],
    )
}

/// A kubeconfig of the cluster `cluster` at `server` for the client certificate
/// `<user>.crt` in `pki`.
pub fn kubeconfig(cluster: &str, server: &str, pki: &Path, user: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: {cluster}\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\nusers:\n- name: {user}\n  user:\n    client-certificate: {crt}\n    client-key: {key}\ncontexts:\n- name: {user}@{cluster}\n  context:\n    cluster: {cluster}\n    user: {user}\ncurrent-context: {user}@{cluster}\n",
        ca = pki.join("ca.crt").display(),
        crt = pki.join(format!("{user}.crt")).display(),
        key = pki.join(format!("{user}.key")).display(),
    )
}
