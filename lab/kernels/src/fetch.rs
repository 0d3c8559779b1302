//! Downloads a matrix kernel from Debian's archive (the package index, then the `.deb`
//! checked against the index's SHA-256), unpacks it and indexes its modules, and for a
//! foreign architecture its static busybox the same way; cached under
//! `~/.cache/bypass/kernels`, so the second run downloads nothing.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use super::catalog::{self, Kernel, Mirrors};
use kube_testenv::cmd;

/// An unpacked kernel package.
#[derive(Debug, Clone)]
pub struct Unpacked {
    /// The package and version, e.g. `linux-image-6.1.0-50-amd64 6.1.176-1`.
    pub package: String,
    /// `uname -r` of the kernel inside.
    pub release: String,
    /// The kernel image.
    pub vmlinuz: PathBuf,
    /// `lib/modules/<release>`, with `modules.dep`.
    pub modules: PathBuf,
    /// The directory the package was unpacked into.
    pub root: PathBuf,
}

/// The cache directory.
pub fn cache_dir() -> Result<PathBuf> {
    let home = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .context("neither XDG_CACHE_HOME nor HOME is set")?;
    Ok(home.join("bypass").join("kernels"))
}

fn curl(url: &str, to: &Path) -> Result<()> {
    let tmp = to.with_extension("part");
    cmd::run(
        Command::new("curl")
            .args(["--proto", "=https,http", "-fsSL", "--retry", "3", "-o"])
            .arg(&tmp)
            .arg(url),
    )
    .with_context(|| format!("download {url}"))?;
    std::fs::rename(&tmp, to).with_context(|| format!("move {}", to.display()))
}

/// The index of one suite, downloaded once per day.
fn index(dir: &Path, base: &str, suite: &str, arch: &str) -> Result<String> {
    let file = dir.join(format!("{suite}-{arch}.Packages.xz"));
    let fresh = std::fs::metadata(&file)
        .and_then(|m| m.modified())
        .is_ok_and(|t| t.elapsed().is_ok_and(|e| e.as_secs() < 86_400));
    if !fresh {
        curl(
            &format!("{base}/dists/{suite}/main/binary-{arch}/Packages.xz"),
            &file,
        )?;
    }
    cmd::output(Command::new("xz").arg("-dc").arg(&file))
}

/// The Debian mirrors this machine's apt sources name.
fn mirrors() -> Result<Mirrors> {
    let mut m = Mirrors::default();
    let mut files = vec![PathBuf::from("/etc/apt/sources.list")];
    if let Ok(dir) = std::fs::read_dir("/etc/apt/sources.list.d") {
        let mut more: Vec<PathBuf> = dir
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "sources" || e == "list"))
            .collect();
        more.sort();
        files.extend(more);
    }
    for f in files {
        if let Ok(text) = std::fs::read_to_string(&f) {
            m.add_sources(&text);
        }
    }
    if m.main.is_none() {
        bail!(
            "no Debian archive (a URI ending in /debian) in /etc/apt/sources.list or \
             /etc/apt/sources.list.d: the kernel matrix downloads Debian kernel packages from it"
        );
    }
    Ok(m)
}

/// The newest package named `pattern` for `arch` in `suites`, downloaded (checked
/// against the index's SHA-256) and unpacked once into the cache; `then` runs on a fresh
/// unpack. Returns the entry and the directory.
fn unpacked(
    arch: &str,
    suites: &[&str],
    pattern: &str,
    then: impl FnOnce(&Path) -> Result<()>,
) -> Result<(catalog::Entry, PathBuf)> {
    let dir = cache_dir()?.join(arch);
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let mirrors = mirrors()?;
    let mut found = Vec::new();
    for suite in suites {
        let base = mirrors
            .base(suite)
            .with_context(|| format!("no mirror in the apt sources serves {suite}"))?;
        let text = index(&dir, base, suite, arch)?;
        found.extend(
            catalog::matching(&text, pattern)
                .into_iter()
                .map(|e| (e, base.to_owned())),
        );
    }
    let Some((newest, base)) = catalog::newest(found.iter().map(|(e, _)| e.clone()).collect())
        .and_then(|n| found.into_iter().find(|(e, _)| *e == n))
    else {
        bail!("no package {pattern} in {suites:?}");
    };
    // The epoch's colon is no use in a file name.
    let stem = format!("{}_{}", newest.package, newest.version.replace(':', "%3a"));
    let root = dir.join(&stem);
    let done = root.join(".unpacked");
    if !done.exists() {
        let deb = dir.join(format!("{stem}.deb"));
        eprintln!("kernel: downloading {} {}", newest.package, newest.version);
        curl(&format!("{base}/{}", newest.filename), &deb)?;
        let sum = cmd::output(Command::new("sha256sum").arg(&deb))?;
        if sum.split_whitespace().next() != Some(newest.sha256.as_str()) {
            let _ = std::fs::remove_file(&deb);
            bail!(
                "{} does not match the index's SHA-256 {}",
                deb.display(),
                newest.sha256
            );
        }
        let _ = std::fs::remove_dir_all(&root);
        cmd::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))?;
        then(&root)?;
        std::fs::remove_file(&deb).with_context(|| format!("remove {}", deb.display()))?;
        std::fs::write(&done, b"").with_context(|| format!("write {}", done.display()))?;
    }
    Ok((newest, root))
}

/// Finds, downloads and unpacks the newest package of `k`.
pub fn kernel(k: &Kernel) -> Result<Unpacked> {
    let (newest, root) = unpacked(k.arch, k.suites, k.package, |root| {
        let release = only_release(root)?;
        cmd::run(Command::new("depmod").arg("-b").arg(root).arg(&release))
    })?;
    let release = only_release(&root)?;
    let vmlinuz = std::fs::read_dir(root.join("boot"))
        .with_context(|| format!("{}/boot", root.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("vmlinuz-"))
        })
        .with_context(|| format!("no vmlinuz in {}/boot", root.display()))?;
    Ok(Unpacked {
        package: format!("{} {}", newest.package, newest.version),
        modules: root.join("lib/modules").join(&release),
        release,
        vmlinuz,
        root,
    })
}

/// Where busybox-static installs its binary on the host.
const HOST_BUSYBOX: &str = "/bin/busybox";

/// A static busybox of `arch`: the host's (the busybox-static package) for amd64, else
/// busybox-static of that architecture from `suites`, unpacked into the cache.
pub fn busybox(arch: &str, suites: &[&str]) -> Result<PathBuf> {
    if arch == "amd64" {
        return Ok(PathBuf::from(HOST_BUSYBOX));
    }
    let (_, root) = unpacked(arch, suites, "busybox-static", |_| Ok(()))?;
    let bin = root.join("bin/busybox");
    if !bin.is_file() {
        bail!(
            "busybox-static for {arch} has no bin/busybox ({})",
            root.display()
        );
    }
    Ok(bin)
}

/// The one release under `lib/modules`.
fn only_release(root: &Path) -> Result<String> {
    let mut names: Vec<String> = std::fs::read_dir(root.join("lib/modules"))
        .with_context(|| format!("{}/lib/modules", root.display()))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    match names.len() {
        1 => Ok(names.remove(0)),
        _ => bail!("expected one kernel in {}: {names:?}", root.display()),
    }
}
