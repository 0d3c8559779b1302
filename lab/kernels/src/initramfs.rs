//! The initramfs that boots a matrix kernel into the host's filesystem: a static
//! busybox of the guest's architecture, the kernel's own 9p, virtio and overlay modules
//! (with what they depend on, in load order), and the `/init` of [`super::guest::init`].
//! Cached next to the kernel.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};
use xtask_lib::cmd;

use super::fetch::Unpacked;

/// Builds (or reuses) the initramfs for `k` from `busybox`, the `modules` `/init` loads
/// before it can mount the host's root, and `init`; returns its path.
pub fn build(k: &Unpacked, busybox: &Path, modules: &[&str], init: &str) -> Result<PathBuf> {
    let tag = crate::cache_tag(format!("{init}\n{modules:?}\n{}", busybox.display()).as_bytes());
    let out = k.root.join(format!("initramfs-{tag:016x}.cpio.gz"));
    if out.exists() {
        return Ok(out);
    }
    let dir = k.root.join("initramfs.d");
    let _ = std::fs::remove_dir_all(&dir);
    for d in ["bin", "mods", "proc", "sys", "dev", "host", "newroot", "rw"] {
        std::fs::create_dir_all(dir.join(d)).with_context(|| format!("create {d}"))?;
    }
    std::fs::copy(busybox, dir.join("bin/busybox"))
        .with_context(|| format!("copy {} (install busybox-static)", busybox.display()))?;
    for (i, module) in load_order(k, modules)?.iter().enumerate() {
        let name = module
            .file_name()
            .and_then(|n| n.to_str())
            .context("module file name")?;
        let target = dir.join("mods").join(format!(
            "{i:02}-{}",
            name.trim_end_matches(".xz").trim_end_matches(".zst")
        ));
        if name.ends_with(".xz") {
            let bytes = cmd::output_bytes(Command::new("xz").arg("-dc").arg(module))?;
            std::fs::write(&target, bytes)?;
        } else if name.ends_with(".zst") {
            let bytes = cmd::output_bytes(Command::new("zstd").arg("-dc").arg(module))?;
            std::fs::write(&target, bytes)?;
        } else {
            std::fs::copy(module, &target)?;
        }
    }
    let init_file = dir.join("init");
    std::fs::write(&init_file, init)?;
    cmd::run(Command::new("chmod").arg("755").arg(&init_file))?;
    cmd::run(
        Command::new("sh")
            .arg("-c")
            .arg("find . | cpio -o -H newc --quiet | gzip -1 > \"$1\"")
            .arg("sh")
            .arg(&out)
            .current_dir(&dir),
    )
    .context("pack the initramfs (cpio, gzip)")?;
    std::fs::remove_dir_all(&dir).ok();
    Ok(out)
}

/// The files of `modules` and their dependencies, each once, in load order.
fn load_order(k: &Unpacked, modules: &[&str]) -> Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = Vec::new();
    for m in modules {
        let text = cmd::output(
            Command::new("modprobe")
                .arg("-d")
                .arg(&k.root)
                .arg("-S")
                .arg(&k.release)
                .arg("--show-depends")
                .arg(m),
        )
        .with_context(|| format!("modules of {m} (install kmod)"))?;
        let paths = insmod_paths(&text);
        if paths.is_empty() && !text.contains("builtin") {
            bail!("{} has no module {m}: {text}", k.release);
        }
        for p in paths {
            if !out.contains(&p) {
                out.push(p);
            }
        }
    }
    Ok(out)
}

/// The files of `insmod PATH` lines (`builtin NAME` lines need nothing).
fn insmod_paths(show_depends: &str) -> Vec<PathBuf> {
    show_depends
        .lines()
        .filter_map(|l| l.trim().strip_prefix("insmod "))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(|p| Path::new(p).to_path_buf())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn show_depends_lines() {
        let text = "insmod /k/net/9p/9pnet.ko \nbuiltin virtio\ninsmod /k/fs/9p/9p.ko.xz opt=1\n";
        assert_eq!(
            insmod_paths(text),
            vec![
                PathBuf::from("/k/net/9p/9pnet.ko"),
                PathBuf::from("/k/fs/9p/9p.ko.xz")
            ]
        );
    }
}
