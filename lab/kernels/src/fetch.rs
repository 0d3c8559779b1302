//! Downloads a matrix kernel from Debian's archive (the package index, then the `.deb`
//! checked against the index's SHA-256, and the packages it is split into from 6.16 on:
//! `catalog::Entry::parts`), unpacks it and indexes its modules, and for a foreign
//! architecture its static busybox the same way; cached under `~/.cache/bypass/kernels`,
//! so the second run downloads nothing.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};
use xtask_lib::{cmd, workspace};

use super::{
    catalog::{self, Kernel, Mirrors},
    share::Share,
};

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
    /// How the guest sees the host's root, by the kernel's configuration.
    pub share: Share,
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
    let dir = workspace::cache_dir("kernels")?.join(arch);
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let mirrors = mirrors()?;
    let mut found = Vec::new();
    for suite in suites {
        let base = mirrors
            .base(suite)
            .with_context(|| format!("no mirror in the apt sources serves {suite}"))?;
        let text = index(&dir, base, suite, arch)?;
        let images = catalog::matching(&text, pattern);
        // The packages an image is split into, from the same index.
        let parts: Vec<String> = images.iter().flat_map(catalog::Entry::parts).collect();
        found.extend(
            images
                .into_iter()
                .chain(parts.iter().flat_map(|p| catalog::matching(&text, p)))
                .map(|e| (e, base.to_owned())),
        );
    }
    let found_images: Vec<(catalog::Entry, String)> = found
        .iter()
        .filter(|(e, _)| catalog::glob(pattern, &e.package))
        .cloned()
        .collect();
    let Some((newest, base)) =
        catalog::newest(found_images.iter().map(|(e, _)| e.clone()).collect())
            .and_then(|n| found_images.into_iter().find(|(e, _)| *e == n))
    else {
        bail!("no package {pattern} in {suites:?}");
    };
    // The epoch's colon is no use in a file name.
    let stem = format!("{}_{}", newest.package, newest.version.replace(':', "%3a"));
    let root = dir.join(&stem);
    let done = root.join(".unpacked");
    if !done.exists() {
        let mut debs = vec![(newest.clone(), base)];
        for part in newest.parts() {
            match found
                .iter()
                .find(|(e, _)| e.package == part && e.version == newest.version)
            {
                Some(found) => debs.push(found.clone()),
                // What the run needs (the image, the modules) is checked once unpacked;
                // a mirror may lack a part (this one serves no linux-base-6.18.15, no
                // linux-modules-6.19.x).
                None => eprintln!(
                    "kernel: {} {} names {part}, which no index of {suites:?} has: unpacking \
                     without it",
                    newest.package, newest.version
                ),
            }
        }
        let _ = std::fs::remove_dir_all(&root);
        for (e, base) in debs {
            let deb = dir.join(format!(
                "{}_{}.deb",
                e.package,
                e.version.replace(':', "%3a")
            ));
            eprintln!("kernel: downloading {} {}", e.package, e.version);
            curl(&format!("{base}/{}", e.filename), &deb)?;
            let sum = cmd::output(Command::new("sha256sum").arg(&deb))?;
            if sum.split_whitespace().next() != Some(e.sha256.as_str()) {
                let _ = std::fs::remove_file(&deb);
                bail!(
                    "{} does not match the index's SHA-256 {}",
                    deb.display(),
                    e.sha256
                );
            }
            cmd::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))?;
            std::fs::remove_file(&deb).with_context(|| format!("remove {}", deb.display()))?;
        }
        then(&root)?;
        std::fs::write(&done, b"").with_context(|| format!("write {}", done.display()))?;
    }
    Ok((newest, root))
}

/// Finds, downloads and unpacks the newest package of `k`.
pub fn kernel(k: &Kernel) -> Result<Unpacked> {
    let (newest, root) = unpacked(k.arch, k.suites, k.package, |root| {
        // Debian 13's packages install into /usr/lib/modules (merged /usr); depmod and
        // modprobe -d look in <root>/lib/modules, as the host's /lib does.
        if !root.join("lib").exists() && root.join("usr/lib/modules").is_dir() {
            std::os::unix::fs::symlink("usr/lib", root.join("lib"))
                .with_context(|| format!("link {}/lib to usr/lib", root.display()))?;
        }
        let release = only_release(root)?;
        cmd::run(Command::new("depmod").arg("-b").arg(root).arg(&release))
    })?;
    let release = only_release(&root)?;
    let modules = root.join("lib/modules").join(&release);
    // /boot/vmlinuz-<release> until 6.12; from 6.16 on, in the modules' directory.
    let vmlinuz = [
        root.join("boot").join(format!("vmlinuz-{release}")),
        modules.join("vmlinuz"),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .with_context(|| {
        format!(
            "no vmlinuz in {}/boot or {}",
            root.display(),
            modules.display()
        )
    })?;
    if !modules.join("kernel").is_dir() {
        bail!(
            "{} has no modules ({}/kernel): the package that holds them is missing from \
             the mirror",
            newest.package,
            modules.display()
        );
    }
    // The configuration is in linux-base-X from 6.16 on, which a mirror may lack; then
    // the modules tell (9p's own module).
    let config = [
        root.join("boot").join(format!("config-{release}")),
        modules.join("config"),
    ]
    .into_iter()
    .find(|p| p.is_file());
    let share = match &config {
        Some(config) => Share::of_config(
            &std::fs::read_to_string(config)
                .with_context(|| format!("read {}", config.display()))?,
        ),
        None => modules
            .join("kernel/fs/9p")
            .is_dir()
            .then_some(Share::NineP),
    };
    let Some(share) = share else {
        bail!(
            "{release} has neither 9p over virtio nor virtiofs ({}): the guest could not see \
             the host's root",
            config.map_or_else(
                || modules.display().to_string(),
                |c| c.display().to_string()
            )
        );
    };
    Ok(Unpacked {
        package: format!("{} {}", newest.package, newest.version),
        modules,
        release,
        vmlinuz,
        root,
        share,
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
