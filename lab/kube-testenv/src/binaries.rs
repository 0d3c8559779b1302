//! The etcd and kube-apiserver binaries: built from the Go module proxy once, cached.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context as _, Result, bail};
use xtask_lib::cmd;

/// The Kubernetes release the API server is built from.
pub const KUBE_VERSION: &str = "v1.35.4";
/// The staging modules (`k8s.io/api`, `k8s.io/client-go`, ...) of that release.
pub const STAGING_VERSION: &str = "v0.35.4";

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

/// The build module's `tools.go`: etcd, kube-apiserver and each of `commands` (under
/// `k8s.io/kubernetes/cmd/`) imported, so `go mod tidy` keeps what all of them need.
pub fn tools_go(commands: &[&str]) -> String {
    let mut s = String::from(
        "//go:build tools\n\npackage kubebuild\n\nimport (\n\t_ \"go.etcd.io/etcd/server/v3\"\n\t_ \"k8s.io/kubernetes/cmd/kube-apiserver\"\n",
    );
    for c in commands {
        let _ = writeln!(s, "\t_ \"k8s.io/kubernetes/cmd/{c}\"");
    }
    s.push_str(")\n");
    s
}

/// Builds etcd and kube-apiserver unless cached. Takes minutes the first time.
pub fn ensure_binaries() -> Result<Binaries> {
    let root = cache_dir();
    let bins = Binaries {
        etcd: root.join("bin/etcd"),
        kube_apiserver: root.join("bin/kube-apiserver"),
    };
    if is_current(&bins.etcd) && is_current(&bins.kube_apiserver) {
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
    let info = cmd::output_named(
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
    std::fs::write(src.join("tools.go"), tools_go(&[]))?;
    cmd::output_named(&mut go_cmd(&["mod", "tidy"]), "go mod tidy")?;
    for (pkg, dest) in [
        ("go.etcd.io/etcd/server/v3", &bins.etcd),
        ("k8s.io/kubernetes/cmd/kube-apiserver", &bins.kube_apiserver),
    ] {
        build_stamped(go_cmd, pkg, dest)?;
    }
    eprintln!("kube-env: built in {:.0?}", started.elapsed());
    Ok(bins)
}

/// The `-ldflags` that stamp the release into a Kubernetes binary, as the release build
/// does (hack/lib/version.sh): without them `/version` answers `v0.0.0-master`, which a
/// chart's `kubeVersion` refuses.
pub fn version_ldflags() -> String {
    let minor = KUBE_VERSION
        .trim_start_matches('v')
        .split('.')
        .nth(1)
        .unwrap_or("0");
    let mut flags = String::from("-ldflags=");
    for pkg in [
        "k8s.io/component-base/version",
        "k8s.io/client-go/pkg/version",
    ] {
        let _ = write!(
            flags,
            "-X {pkg}.gitVersion={KUBE_VERSION} -X {pkg}.gitMajor=1 -X {pkg}.gitMinor={minor} \
             -X {pkg}.gitTreeState=clean "
        );
    }
    flags.trim_end().to_owned()
}

/// Whether `bin` was built here with the release stamped in (its `.version` stamp beside
/// it names [`KUBE_VERSION`]): a cache from before the stamp is rebuilt.
pub fn is_current(bin: &Path) -> bool {
    bin.is_file() && std::fs::read_to_string(stamp(bin)).is_ok_and(|v| v.trim() == KUBE_VERSION)
}

/// `go build -ldflags=<release> -o dest pkg`, installed by rename (a concurrent user
/// never sees half a binary), then stamped.
pub fn build_stamped(go: impl Fn(&[&str]) -> Command, pkg: &str, dest: &Path) -> Result<()> {
    let tmp = dest.with_extension(format!("tmp{}", std::process::id()));
    let tmp_s = tmp.to_string_lossy().into_owned();
    let ldflags = version_ldflags();
    cmd::output_named(
        &mut go(&["build", &ldflags, "-o", &tmp_s, pkg]),
        &format!("go build {pkg}"),
    )?;
    std::fs::rename(&tmp, dest).with_context(|| format!("install {}", dest.display()))?;
    std::fs::write(stamp(dest), KUBE_VERSION)
        .with_context(|| format!("write {}", stamp(dest).display()))
}

fn stamp(bin: &Path) -> PathBuf {
    bin.with_extension("version")
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tools_go_imports_every_command() {
        assert!(tools_go(&[]).ends_with("\t_ \"k8s.io/kubernetes/cmd/kube-apiserver\"\n)\n"));
        let t = tools_go(&["kubelet", "kubectl"]);
        for c in ["kube-apiserver", "kubelet", "kubectl"] {
            assert!(t.contains(&format!("\"k8s.io/kubernetes/cmd/{c}\"")), "{t}");
        }
    }

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
