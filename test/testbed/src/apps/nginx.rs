//! nginx: Debian's `nginx` in a pod, master and one worker, serving files from its
//! work directory over HTTP and HTTPS (a self-signed certificate for the pod's address,
//! made with `openssl`), with `sendfile` on as Debian's own configuration has it.

use std::{
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result};

use super::{
    READY_TIMEOUT,
    bins::{self, Needs},
    client::On,
    server::{AppServer, Listening},
    workdir::WorkDir,
};

/// What the nginx workloads run.
pub const NEEDS: Needs = Needs {
    system: &["nginx", "openssl", "curl", "ab"],
    built: &[],
};

/// A running nginx.
#[derive(Debug)]
pub struct Nginx {
    /// On its HTTP address.
    server: Listening,
    https: SocketAddr,
}

impl Nginx {
    /// Starts nginx on `on` serving `files` (name, contents) on `http` and, with TLS,
    /// on `https`; ready once both listen.
    pub fn start(
        on: On<'_>,
        http: SocketAddr,
        https: SocketAddr,
        files: &[(&str, &[u8])],
    ) -> Result<Self> {
        let dir = WorkDir::new("nginx")?;
        let www = dir.join("www");
        std::fs::create_dir(&www).with_context(|| format!("create {}", www.display()))?;
        for (name, data) in files {
            std::fs::write(www.join(name), data).with_context(|| format!("write {name}"))?;
        }
        self_signed_cert(&dir, https.ip())?;
        let conf = dir.write("nginx.conf", config(dir.path(), http, https))?;
        let mut cmd = Command::new(bins::system("nginx")?);
        cmd.arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&conf)
            .args(["-e", "stderr"]);
        let server = Listening::start_until(on, cmd, dir, "nginx", http, |s| {
            s.wait_listening(http, READY_TIMEOUT)?
                .wait_listening(https, READY_TIMEOUT)
        })?;
        Ok(Self { server, https })
    }

    /// `http://ADDR/name`.
    pub fn url(&self, name: &str) -> String {
        format!("http://{}/{name}", self.server.addr())
    }

    /// `https://ADDR/name`.
    pub fn https_url(&self, name: &str) -> String {
        format!("https://{}/{name}", self.https)
    }

    /// The certificate, for a client to verify the server with.
    pub fn cert(&self) -> PathBuf {
        self.server.dir().join("cert.pem")
    }

    /// The process.
    pub fn server(&mut self) -> &mut AppServer {
        self.server.server()
    }
}

/// The configuration: everything under `dir`, nothing from /etc or /var.
fn config(dir: &Path, http: SocketAddr, https: SocketAddr) -> String {
    let d = dir.display();
    format!(
        "daemon off;
master_process on;
worker_processes 1;
pid {d}/nginx.pid;
error_log stderr warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 1000000;
    default_type application/octet-stream;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    server {{
        listen {http};
        listen {https} ssl;
        ssl_certificate {d}/cert.pem;
        ssl_certificate_key {d}/key.pem;
        root {d}/www;
    }}
}}
"
    )
}

/// `cert.pem` and `key.pem` in `dir`: a self-signed certificate for `ip`.
pub fn self_signed_cert(dir: &WorkDir, ip: IpAddr) -> Result<()> {
    let out = Command::new(bins::system("openssl")?)
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ])
        .args(["-nodes", "-days", "2", "-subj", "/CN=bypass-apps"])
        .args(["-addext", &format!("subjectAltName=IP:{ip}")])
        .arg("-keyout")
        .arg(dir.join("key.pem"))
        .arg("-out")
        .arg(dir.join("cert.pem"))
        .output()
        .context("run openssl")?;
    anyhow::ensure!(
        out.status.success(),
        "openssl req failed: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}
