//! [`KubeEnv`]: an API server and its etcd, running until dropped.

use std::{
    net::{Ipv4Addr, SocketAddr, TcpListener},
    path::{Path, PathBuf},
    process::{Child, Command},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use xtask_lib::http;

use crate::{
    Binaries, ca, client_cert,
    cluster::procs::{logged, tail},
    ensure_binaries, kubeconfig, service_account_key, signed,
};

/// How long to wait for the API server to answer `/readyz`: a net ([`crate::NET`]).
pub const READY_TIMEOUT: Duration = crate::NET;
/// How long [`KubeEnv::get`] waits for one answer (connect, handshake, whole body): a
/// net.
pub const GET_TIMEOUT: Duration = crate::NET;

/// A free TCP port on 127.0.0.1 (free when asked; the caller binds it soon after).
pub(crate) fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("find a free port on 127.0.0.1")?;
    Ok(l.local_addr()?.port())
}

/// An API server and its etcd, running until dropped (or [`KubeEnv::leave_running`]).
#[derive(Debug)]
pub struct KubeEnv {
    dir: PathBuf,
    bins: Binaries,
    etcd: Option<Child>,
    apiserver: Option<Child>,
    second: Option<Child>,
    etcd_port: u16,
    api_port: u16,
    keep_dir: bool,
}

impl KubeEnv {
    /// Builds (or finds) the binaries, makes certificates under `dir`, starts etcd and
    /// the API server and waits until it is ready.
    pub fn start(dir: &Path) -> Result<Self> {
        let bins = ensure_binaries()?;
        if dir.exists() {
            std::fs::remove_dir_all(dir).with_context(|| format!("clean {}", dir.display()))?;
        }
        std::fs::create_dir_all(dir.join("pki"))
            .with_context(|| format!("create {}", dir.display()))?;
        let mut env = Self {
            dir: dir.to_path_buf(),
            bins,
            etcd: None,
            apiserver: None,
            second: None,
            etcd_port: free_port()?,
            api_port: free_port()?,
            keep_dir: false,
        };
        env.make_pki()?;
        env.start_etcd()?;
        env.start_apiserver()?;
        env.write_kubeconfig("admin", &env.kubeconfig())?;
        Ok(env)
    }

    /// The admin kubeconfig (user `admin` in `system:masters`).
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("admin.kubeconfig")
    }

    /// `https://127.0.0.1:<port>`.
    pub fn server(&self) -> String {
        format!("https://127.0.0.1:{}", self.api_port)
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn pki(&self) -> PathBuf {
        self.dir.join("pki")
    }

    fn make_pki(&self) -> Result<()> {
        let pki = self.pki();
        ca(&pki, "bypass-test-ca")?;
        signed(
            &pki,
            "server",
            "/CN=kube-apiserver",
            &["subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc"],
        )?;
        service_account_key(&pki)?;
        client_cert(&pki, "admin", "admin", &["system:masters"])
    }

    fn write_kubeconfig(&self, user: &str, path: &Path) -> Result<()> {
        self.write_kubeconfig_for(&self.server(), user, path)
    }

    fn write_kubeconfig_for(&self, server: &str, user: &str, path: &Path) -> Result<()> {
        let text = kubeconfig("bypass-test", server, &self.pki(), user);
        std::fs::write(path, text).with_context(|| format!("write {}", path.display()))
    }

    /// A kubeconfig for a certificate user `user` in `groups` (RBAC decides what it may
    /// do), e.g. to run the agent with exactly the permissions of `deploy/`.
    pub fn user_kubeconfig(&self, user: &str, groups: &[&str]) -> Result<PathBuf> {
        client_cert(&self.pki(), user, user, groups)?;
        let path = self.dir.join(format!("{user}.kubeconfig"));
        self.write_kubeconfig(user, &path)?;
        Ok(path)
    }

    fn spawn_logged(&self, program: &Path, args: &[String], log: &str) -> Result<Child> {
        logged(program, args, &self.dir.join(log))?
            .spawn()
            .with_context(|| format!("start {}", program.display()))
    }

    fn start_etcd(&mut self) -> Result<()> {
        let args = etcd_args("bypass-test", &self.dir.join("etcd"), self.etcd_port)?;
        let etcd = self.bins.etcd.clone();
        self.etcd = Some(self.spawn_logged(&etcd, &args, "etcd.log")?);
        Ok(())
    }

    /// Starts (or restarts) the API server on its port and waits until it is ready.
    pub fn start_apiserver(&mut self) -> Result<()> {
        if self.apiserver.is_some() {
            return Ok(());
        }
        let args = self.apiserver_args(self.api_port);
        let bin = self.bins.kube_apiserver.clone();
        self.apiserver = Some(self.spawn_logged(&bin, &args, "kube-apiserver.log")?);
        let port = self.api_port;
        let result = self.wait_ready(port);
        if result.is_err() {
            self.stop_apiserver()?;
        }
        result
    }

    /// A second API server on the same etcd, on its own port, until dropped: lets a
    /// test change objects while the first one is stopped. Returns an admin kubeconfig.
    pub fn start_second_apiserver(&mut self) -> Result<PathBuf> {
        let port = free_port()?;
        let args = self.apiserver_args(port);
        let bin = self.bins.kube_apiserver.clone();
        self.second = Some(self.spawn_logged(&bin, &args, "kube-apiserver-2.log")?);
        self.wait_ready(port)?;
        let path = self.dir.join("admin-2.kubeconfig");
        self.write_kubeconfig_for(&format!("https://127.0.0.1:{port}"), "admin", &path)?;
        Ok(path)
    }

    fn apiserver_args(&self, port: u16) -> Vec<String> {
        let etcd = format!("http://127.0.0.1:{}", self.etcd_port);
        let mut args = api_server_args(&etcd, "127.0.0.1", port, &self.pki(), "server");
        args.extend([
            "--service-cluster-ip-range=10.0.0.0/24".to_owned(),
            "--endpoint-reconciler-type=none".to_owned(),
        ]);
        args
    }

    /// Stops the API server (etcd keeps the data): the "API server went away" case.
    pub fn stop_apiserver(&mut self) -> Result<()> {
        if let Some(mut child) = self.apiserver.take() {
            terminate(&mut child)?;
        }
        Ok(())
    }

    fn wait_ready(&mut self, port: u16) -> Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let child = if port == self.api_port {
                self.apiserver.as_mut()
            } else {
                self.second.as_mut()
            };
            if let Some(child) = child
                && let Some(status) = child.try_wait()?
            {
                bail!(
                    "kube-apiserver exited ({status}) before it was ready; log: {}",
                    tail(&self.dir.join("kube-apiserver.log"), 15)
                );
            }
            if let Ok((200, _)) = self.get_on(port, "/readyz") {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "kube-apiserver not ready within {READY_TIMEOUT:?}; log: {}",
                    tail(&self.dir.join("kube-apiserver.log"), 15)
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// `GET path` as admin (TLS with the admin client certificate): status code and body.
    /// Fails past [`GET_TIMEOUT`].
    pub fn get(&self, path: &str) -> Result<(u16, String)> {
        self.get_on(self.api_port, path)
    }

    fn get_on(&self, port: u16, path: &str) -> Result<(u16, String)> {
        let pki = self.pki();
        let tls = http::client_tls(
            &pki.join("ca.crt"),
            &pki.join("admin.crt"),
            &pki.join("admin.key"),
        )?;
        http::get_tls(
            SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
            path,
            GET_TIMEOUT,
            tls,
        )
    }

    /// Leaves both processes running and the directory in place (for `kube-env up`);
    /// returns their pids.
    pub fn leave_running(mut self) -> Vec<u32> {
        self.keep_dir = true;
        [self.apiserver.take(), self.second.take(), self.etcd.take()]
            .into_iter()
            .flatten()
            .map(|c| c.id())
            .collect()
    }
}

impl Drop for KubeEnv {
    fn drop(&mut self) {
        let children = [self.apiserver.take(), self.second.take(), self.etcd.take()];
        for child in children.into_iter().flatten() {
            let mut child = child;
            if let Err(e) = terminate(&mut child) {
                eprintln!("kube-env: stop {}: {e:#}", child.id());
            }
        }
        if !self.keep_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// SIGTERM, up to 10 s, then SIGKILL.
fn terminate(child: &mut Child) -> Result<()> {
    if child.try_wait()?.is_some() {
        return Ok(());
    }
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if child.try_wait()?.is_some() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill()?;
    child.wait()?;
    Ok(())
}

/// etcd's flags for a one-member cluster `name` with its data in `data_dir`, clients on
/// 127.0.0.1:`client_port` and its peer URL on a free port.
pub(crate) fn etcd_args(name: &str, data_dir: &Path, client_port: u16) -> Result<Vec<String>> {
    let client = format!("http://127.0.0.1:{client_port}");
    let peer = format!("http://127.0.0.1:{}", free_port()?);
    Ok(vec![
        format!("--name={name}"),
        format!("--data-dir={}", data_dir.display()),
        format!("--listen-client-urls={client}"),
        format!("--advertise-client-urls={client}"),
        format!("--listen-peer-urls={peer}"),
        format!("--initial-advertise-peer-urls={peer}"),
        format!("--initial-cluster={name}={peer}"),
        "--unsafe-no-fsync=true".to_owned(),
        "--log-level=warn".to_owned(),
    ])
}

/// kube-apiserver's flags that the test env and the cluster share: etcd at `etcd`,
/// serving on `address:port` with `<cert>.crt`/`<cert>.key` of `pki`, clients by its CA,
/// service accounts by its `sa` key pair, RBAC; each adds its Service range and more.
pub(crate) fn api_server_args(
    etcd: &str,
    address: &str,
    port: u16,
    pki: &Path,
    cert: &str,
) -> Vec<String> {
    let p = |f: &str| pki.join(f).display().to_string();
    vec![
        format!("--etcd-servers={etcd}"),
        format!("--bind-address={address}"),
        format!("--advertise-address={address}"),
        format!("--secure-port={port}"),
        format!("--cert-dir={}", p("")),
        format!("--tls-cert-file={}", p(&format!("{cert}.crt"))),
        format!("--tls-private-key-file={}", p(&format!("{cert}.key"))),
        format!("--client-ca-file={}", p("ca.crt")),
        format!("--service-account-key-file={}", p("sa.pub")),
        format!("--service-account-signing-key-file={}", p("sa.key")),
        "--service-account-issuer=https://kubernetes.default.svc".to_owned(),
        "--authorization-mode=RBAC".to_owned(),
        "--allow-privileged=true".to_owned(),
        "--enable-priority-and-fairness=false".to_owned(),
        "--profiling=false".to_owned(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_flags_name_the_pki_files_and_the_member() {
        let api = api_server_args("http://e:1", "10.0.0.1", 6443, Path::new("/p"), "apiserver");
        assert!(api.contains(&"--tls-cert-file=/p/apiserver.crt".to_owned()));
        assert!(api.contains(&"--tls-private-key-file=/p/apiserver.key".to_owned()));
        assert!(api.contains(&"--advertise-address=10.0.0.1".to_owned()));
        let etcd = etcd_args("m", Path::new("/d"), 2379).unwrap();
        assert!(etcd.contains(&"--advertise-client-urls=http://127.0.0.1:2379".to_owned()));
        assert!(
            etcd.iter()
                .any(|a| a.starts_with("--initial-cluster=m=http://127.0.0.1:"))
        );
    }

    #[test]
    fn kubeconfig_names_its_cluster_and_the_users_files() {
        let k = kubeconfig("c", "https://s", Path::new("/p"), "u");
        assert!(k.contains("current-context: u@c\n"), "{k}");
        assert!(k.contains("client-key: /p/u.key\n") && k.contains("server: https://s\n"));
    }
}
