//! `cargo xtask kube-env up|down`, and the guard the agent's Kubernetes tests use: a
//! real kube-apiserver with its etcd on loopback. Both are built once from the Go module
//! proxy and cached; certificates (a CA, the serving certificate, client certificates)
//! and the service-account key are made with `openssl`; an admin kubeconfig is written.
//! No controller-manager, scheduler or kubelet runs: tests set status themselves.
//!
//! Only `std` and `anyhow`, so the integration tests include this file as a module.

use std::{
    fmt::Write as _,
    io::Write as _,
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

/// The Kubernetes release the API server is built from.
pub const KUBE_VERSION: &str = "v1.35.4";
/// The staging modules (`k8s.io/api`, `k8s.io/client-go`, ...) of that release.
pub const STAGING_VERSION: &str = "v0.35.4";
/// How long to wait for the API server to answer `/readyz`.
pub const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// The two binaries.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// etcd.
    pub etcd: PathBuf,
    /// kube-apiserver.
    pub kube_apiserver: PathBuf,
}

/// Where builds are cached: `$BYPASS_KUBE_CACHE`, else `~/.cache/bypass/kube/<version>`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("BYPASS_KUBE_CACHE") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(".cache/bypass/kube").join(KUBE_VERSION)
}

/// The `go` tool: on `PATH`, else `/usr/local/go/bin/go`.
pub fn go_tool() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let go = dir.join("go");
            if go.is_file() {
                return Ok(go);
            }
        }
    }
    let fallback = PathBuf::from("/usr/local/go/bin/go");
    if fallback.is_file() {
        return Ok(fallback);
    }
    bail!(
        "no `go` tool found (PATH or /usr/local/go/bin/go): install Go >= 1.25 to build kube-apiserver and etcd"
    )
}

fn run(cmd: &mut Command, what: &str) -> Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("{what}: could not start {:?}", cmd.get_program()))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The `go.mod` of the throwaway build module: k8s.io/kubernetes with every staging
/// module it replaces locally (`=> ./staging/src/...`) replaced by its published
/// version instead (pure, so it is tested).
pub fn build_go_mod(kubernetes_go_mod: &str) -> String {
    let mut out = format!(
        "module bypass.local/kubebuild\n\ngo 1.25.0\n\nrequire k8s.io/kubernetes {KUBE_VERSION}\n\nreplace (\n"
    );
    for line in kubernetes_go_mod.lines() {
        let line = line.trim();
        if let Some((module, target)) = line.split_once("=>")
            && target.trim().starts_with("./staging/")
        {
            let module = module.trim();
            let _ = writeln!(out, "\t{module} => {module} {STAGING_VERSION}");
        }
    }
    out.push_str(")\n");
    out
}

/// Builds etcd and kube-apiserver unless cached. Takes minutes the first time.
pub fn ensure_binaries() -> Result<Binaries> {
    let root = cache_dir();
    let bins = Binaries {
        etcd: root.join("bin/etcd"),
        kube_apiserver: root.join("bin/kube-apiserver"),
    };
    if bins.etcd.is_file() && bins.kube_apiserver.is_file() {
        return Ok(bins);
    }
    let go = go_tool()?;
    let src = root.join("src");
    std::fs::create_dir_all(&src).with_context(|| format!("create {}", src.display()))?;
    std::fs::create_dir_all(root.join("bin"))?;
    let go_cmd = |args: &[&str]| go_command(&go, &src, args);
    eprintln!(
        "kube-env: building kube-apiserver {KUBE_VERSION} and etcd (several minutes the first time)"
    );
    let started = Instant::now();
    std::fs::write(
        src.join("go.mod"),
        "module bypass.local/kubebuild\n\ngo 1.25.0\n",
    )?;
    let info = run(
        &mut go_cmd(&[
            "mod",
            "download",
            "-json",
            &format!("k8s.io/kubernetes@{KUBE_VERSION}"),
        ]),
        "go mod download k8s.io/kubernetes",
    )?;
    let mod_path = info
        .lines()
        .find_map(|l| {
            let l = l.trim();
            l.strip_prefix("\"GoMod\": \"")
                .and_then(|r| r.strip_suffix("\","))
        })
        .context("`go mod download -json` printed no GoMod path")?;
    let upstream = std::fs::read_to_string(mod_path).with_context(|| format!("read {mod_path}"))?;
    std::fs::write(src.join("go.mod"), build_go_mod(&upstream))?;
    std::fs::write(
        src.join("tools.go"),
        "//go:build tools\n\npackage kubebuild\n\nimport (\n\t_ \"go.etcd.io/etcd/server/v3\"\n\t_ \"k8s.io/kubernetes/cmd/kube-apiserver\"\n)\n",
    )?;
    run(&mut go_cmd(&["mod", "tidy"]), "go mod tidy")?;
    for (pkg, dest) in [
        ("go.etcd.io/etcd/server/v3", &bins.etcd),
        ("k8s.io/kubernetes/cmd/kube-apiserver", &bins.kube_apiserver),
    ] {
        // Build beside, then rename: a concurrent user never sees half a binary.
        let tmp = dest.with_extension(format!("tmp{}", std::process::id()));
        let tmp_s = tmp.to_string_lossy().into_owned();
        run(
            &mut go_cmd(&["build", "-o", &tmp_s, pkg]),
            &format!("go build {pkg}"),
        )?;
        std::fs::rename(&tmp, dest).with_context(|| format!("install {}", dest.display()))?;
    }
    eprintln!("kube-env: built in {:.0?}", started.elapsed());
    Ok(bins)
}

/// A free TCP port on 127.0.0.1 (free when asked; the caller binds it soon after).
fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("find a free port on 127.0.0.1")?;
    Ok(l.local_addr()?.port())
}

fn openssl(dir: &Path, args: &[&str]) -> Result<()> {
    run(
        Command::new("openssl").args(args).current_dir(dir),
        &format!("openssl {}", args.first().copied().unwrap_or("")),
    )
    .map(drop)
    .context("openssl is needed for the test API server's certificates (apt-get install openssl)")
}

/// `go <args>` in the module directory `src`, modules resolved from the proxy and the
/// installed toolchain only (no toolchain download).
pub fn go_command(go: &Path, src: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(go);
    c.args(args)
        .current_dir(src)
        .env("GOFLAGS", "-mod=mod")
        .env("GOTOOLCHAIN", "local");
    c
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
        self.client_cert("admin", &["system:masters"])
    }

    /// A client certificate `<user>.crt`/`<user>.key` for `user` in `groups`.
    fn client_cert(&self, user: &str, groups: &[&str]) -> Result<()> {
        let mut subj = format!("/CN={user}");
        for g in groups {
            let _ = write!(subj, "/O={g}");
        }
        // With extensions, so the certificate is X.509 v3 (rustls refuses v1).
        signed(
            &self.pki(),
            user,
            &subj,
            &[
                "extendedKeyUsage=clientAuth",
                "keyUsage=critical,digitalSignature,keyEncipherment",
            ],
        )
    }

    fn write_kubeconfig(&self, user: &str, path: &Path) -> Result<()> {
        self.write_kubeconfig_for(&self.server(), user, path)
    }

    fn write_kubeconfig_for(&self, server: &str, user: &str, path: &Path) -> Result<()> {
        let pki = self.pki();
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: bypass-test\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\nusers:\n- name: {user}\n  user:\n    client-certificate: {crt}\n    client-key: {key}\ncontexts:\n- name: {user}@bypass-test\n  context:\n    cluster: bypass-test\n    user: {user}\ncurrent-context: {user}@bypass-test\n",
            ca = pki.join("ca.crt").display(),
            crt = pki.join(format!("{user}.crt")).display(),
            key = pki.join(format!("{user}.key")).display(),
        );
        std::fs::write(path, text).with_context(|| format!("write {}", path.display()))
    }

    /// A kubeconfig for a certificate user `user` in `groups` (RBAC decides what it may
    /// do), e.g. to run the agent with exactly the permissions of `deploy/`.
    pub fn user_kubeconfig(&self, user: &str, groups: &[&str]) -> Result<PathBuf> {
        self.client_cert(user, groups)?;
        let path = self.dir.join(format!("{user}.kubeconfig"));
        self.write_kubeconfig(user, &path)?;
        Ok(path)
    }

    fn spawn_logged(&self, program: &Path, args: &[String], log: &str) -> Result<Child> {
        let log_path = self.dir.join(log);
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("open {}", log_path.display()))?;
        let err = out.try_clone()?;
        Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("start {}", program.display()))
    }

    fn start_etcd(&mut self) -> Result<()> {
        let peer = free_port()?;
        let client = format!("http://127.0.0.1:{}", self.etcd_port);
        let peer = format!("http://127.0.0.1:{peer}");
        let args = [
            "--name=bypass-test".to_owned(),
            format!("--data-dir={}", self.dir.join("etcd").display()),
            format!("--listen-client-urls={client}"),
            format!("--advertise-client-urls={client}"),
            format!("--listen-peer-urls={peer}"),
            format!("--initial-advertise-peer-urls={peer}"),
            format!("--initial-cluster=bypass-test={peer}"),
            "--unsafe-no-fsync=true".to_owned(),
            "--log-level=warn".to_owned(),
        ];
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
        let pki = self.pki();
        let p = |f: &str| pki.join(f).display().to_string();
        let args = [
            format!("--etcd-servers=http://127.0.0.1:{}", self.etcd_port),
            "--bind-address=127.0.0.1".to_owned(),
            "--advertise-address=127.0.0.1".to_owned(),
            format!("--secure-port={port}"),
            format!("--cert-dir={}", p("")),
            format!("--tls-cert-file={}", p("server.crt")),
            format!("--tls-private-key-file={}", p("server.key")),
            format!("--client-ca-file={}", p("ca.crt")),
            format!("--service-account-key-file={}", p("sa.pub")),
            format!("--service-account-signing-key-file={}", p("sa.key")),
            "--service-account-issuer=https://kubernetes.default.svc".to_owned(),
            "--service-cluster-ip-range=10.0.0.0/24".to_owned(),
            "--authorization-mode=RBAC".to_owned(),
            "--allow-privileged=true".to_owned(),
            "--endpoint-reconciler-type=none".to_owned(),
            "--enable-priority-and-fairness=false".to_owned(),
            "--profiling=false".to_owned(),
        ];
        args.to_vec()
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
                    tail(&self.dir.join("kube-apiserver.log"))
                );
            }
            if let Ok((200, _)) = self.get_on(port, "/readyz") {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "kube-apiserver not ready within {READY_TIMEOUT:?}; log: {}",
                    tail(&self.dir.join("kube-apiserver.log"))
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// `GET path` as admin (through `openssl s_client`): status code and body.
    pub fn get(&self, path: &str) -> Result<(u16, String)> {
        self.get_on(self.api_port, path)
    }

    fn get_on(&self, port: u16, path: &str) -> Result<(u16, String)> {
        let pki = self.pki();
        let mut child = Command::new("openssl")
            .args(["s_client", "-quiet", "-connect"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("-CAfile")
            .arg(pki.join("ca.crt"))
            .arg("-cert")
            .arg(pki.join("admin.crt"))
            .arg("-key")
            .arg(pki.join("admin.key"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("start openssl s_client")?;
        if let Some(mut stdin) = child.stdin.take() {
            write!(
                stdin,
                "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
            )?;
        }
        let out = child.wait_with_output()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let code = text
            .lines()
            .next()
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|c| c.parse().ok())
            .with_context(|| format!("no HTTP answer from the API server: {text:?}"))?;
        let body = text
            .split_once("\r\n\r\n")
            .map_or("", |(_, b)| b)
            .to_owned();
        Ok((code, body))
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

/// The last lines of a log, for error messages.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// State directory of `kube-env up`.
pub fn default_dir(workspace: &Path) -> PathBuf {
    workspace.join("target/kube-env")
}

/// `kube-env up`: starts the API server and etcd in `dir` and leaves them running;
/// returns the admin kubeconfig path.
pub fn up(dir: &Path) -> Result<PathBuf> {
    if dir.join("pids").exists() {
        down(dir)?;
    }
    let env = KubeEnv::start(dir)?;
    let kubeconfig = env.kubeconfig();
    let pids = env.leave_running();
    let text: String = pids.iter().map(|p| format!("{p}\n")).collect();
    std::fs::write(dir.join("pids"), text)
        .with_context(|| format!("write {}/pids", dir.display()))?;
    Ok(kubeconfig)
}

/// `kube-env down`: stops what `up` started in `dir` and removes `dir`.
pub fn down(dir: &Path) -> Result<()> {
    let pids = std::fs::read_to_string(dir.join("pids")).unwrap_or_default();
    for pid in pids.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
        // Only our own processes: the pid must still run one of the two binaries.
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
        let name = exe.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name != "kube-apiserver" && name != "etcd" {
            continue;
        }
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        if Path::new(&format!("/proc/{pid}")).exists() {
            let _ = Command::new("kill")
                .arg("-KILL")
                .arg(pid.to_string())
                .status();
        }
    }
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("remove {}", dir.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_mod_replaces_every_staging_module_by_its_release() {
        let upstream = "module k8s.io/kubernetes\n\nreplace (\n\tk8s.io/api => ./staging/src/k8s.io/api\n\tk8s.io/client-go => ./staging/src/k8s.io/client-go\n\tgithub.com/x/y => github.com/x/y v1.0.0\n)\n";
        let m = build_go_mod(upstream);
        assert!(
            m.contains(&format!("require k8s.io/kubernetes {KUBE_VERSION}")),
            "{m}"
        );
        assert!(
            m.contains(&format!("\tk8s.io/api => k8s.io/api {STAGING_VERSION}\n")),
            "{m}"
        );
        assert!(
            m.contains(&format!(
                "\tk8s.io/client-go => k8s.io/client-go {STAGING_VERSION}\n"
            )),
            "{m}"
        );
        assert!(!m.contains("github.com/x/y"), "{m}");
    }
}
