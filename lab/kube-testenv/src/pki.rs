//! Certificates and keys for the API server, made with `openssl`.

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
