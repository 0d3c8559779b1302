//! bpf-linker, built against the `libLLVM` of the pinned toolchain so that rustc and the
//! linker agree on the bitcode format. Reused when the installed one already does.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, anyhow, bail};
use xtask_lib::cmd;

use super::toolchain::Toolchain;

/// The bpf-linker release we build; 0.13 is the newest that supports LLVM 22 (rustc 1.95).
pub const VERSION: &str = "0.13.0";

/// Installs bpf-linker unless a matching one is there; returns the directory it is in,
/// which every cargo command puts first on PATH.
pub fn ensure(toolchain: &Toolchain, done: &mut Vec<String>) -> Result<PathBuf> {
    let root = install_root()?;
    let bin_dir = root.join("bin");
    let linker = bin_dir.join("bpf-linker");
    let llvm = ToolchainLlvm::find(&toolchain.sysroot)?;
    let Err(why) = check(&linker, &llvm) else {
        return Ok(bin_dir);
    };
    eprintln!(
        "setup: bpf-linker at {}: {why}; building {VERSION} against {} (about a minute)",
        linker.display(),
        llvm.lib.display()
    );
    let prefix = llvm_prefix(&root, &llvm)?;
    cmd::run_to_stderr(
        Command::new("rustup")
            .args(["run", &toolchain.channel, "cargo", "install"])
            .arg(format!("bpf-linker@{VERSION}"))
            .args(["--locked", "--force", "--no-default-features", "--features"])
            .arg(format!("llvm-{}", llvm.major))
            .arg("--root")
            .arg(&root)
            .env("LLVM_PREFIX", &prefix),
    )?;
    check(&linker, &llvm).map_err(|why| {
        anyhow!(
            "bpf-linker {VERSION} was built but does not check out: {why} ({})",
            linker.display()
        )
    })?;
    done.push(format!(
        "built bpf-linker {VERSION} against LLVM {} into {}",
        llvm.major,
        bin_dir.display()
    ));
    Ok(bin_dir)
}

/// Where `cargo install` puts binaries: `CARGO_INSTALL_ROOT`, else `CARGO_HOME`, else
/// `~/.cargo` (cargo's own order).
fn install_root() -> Result<PathBuf> {
    let from_env = |key| std::env::var_os(key).filter(|v| !v.is_empty());
    from_env("CARGO_INSTALL_ROOT")
        .or_else(|| from_env("CARGO_HOME"))
        .map(PathBuf::from)
        .or_else(|| from_env("HOME").map(|home| PathBuf::from(home).join(".cargo")))
        .ok_or_else(|| anyhow!("none of CARGO_INSTALL_ROOT, CARGO_HOME, HOME is set"))
}

/// The toolchain's shared LLVM, e.g. `<sysroot>/lib/libLLVM.so.22.1-rust-1.95.0-stable`.
struct ToolchainLlvm {
    /// The file itself; its name is also its soname, which bpf-linker records.
    lib: PathBuf,
    /// The major version, which names bpf-linker's cargo feature (`llvm-22`).
    major: u32,
}

impl ToolchainLlvm {
    fn find(sysroot: &Path) -> Result<Self> {
        let dir = sysroot.join("lib");
        let entries =
            fs::read_dir(&dir).with_context(|| format!("could not list {}", dir.display()))?;
        entries
            .filter_map(|entry| entry.ok())
            .find_map(|entry| {
                let major = llvm_major(&entry.file_name().to_string_lossy())?;
                Some(Self {
                    lib: entry.path(),
                    major,
                })
            })
            .ok_or_else(|| {
                anyhow!(
                    "no libLLVM.so.<version>-rust-* in {}: the toolchain ships no shared LLVM",
                    dir.display()
                )
            })
    }

    fn lib_dir(&self) -> &Path {
        self.lib.parent().unwrap_or(Path::new("/"))
    }

    fn soname(&self) -> String {
        self.lib
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

/// `libLLVM.so.22.1-rust-1.95.0-stable` → 22.
fn llvm_major(file_name: &str) -> Option<u32> {
    let version = file_name.strip_prefix("libLLVM.so.")?;
    if !version.contains("-rust-") {
        return None;
    }
    version.split(['.', '-']).next()?.parse().ok()
}

/// Why the linker at `linker` is not the one we want, if it is not. Runs it the way
/// rustc does under rustup, with the toolchain's `lib/` on LD_LIBRARY_PATH.
fn check(linker: &Path, llvm: &ToolchainLlvm) -> Result<(), String> {
    if !cmd::is_executable(linker) {
        return Err("not installed".into());
    }
    let with_toolchain_lib = |program: &Path| {
        let mut cmd = Command::new(program);
        cmd.env("LD_LIBRARY_PATH", llvm.lib_dir());
        cmd
    };
    let version = cmd::output(with_toolchain_lib(linker).arg("--version"))
        .map_err(|e| format!("does not run ({e:#})"))?;
    if version.trim() != format!("bpf-linker {VERSION}") {
        return Err(format!("is `{}`, not {VERSION}", version.trim()));
    }
    let ldd = cmd::output(with_toolchain_lib(Path::new("ldd")).arg(linker))
        .map_err(|e| format!("ldd failed ({e:#})"))?;
    let Some(linked) = linked_llvm(&ldd) else {
        return Err("does not link a shared libLLVM (built with its own LLVM)".into());
    };
    let same = |a: &Path, b: &Path| matches!((fs::canonicalize(a), fs::canonicalize(b)), (Ok(a), Ok(b)) if a == b);
    if !same(&linked, &llvm.lib) {
        return Err(format!(
            "links {}, not the toolchain's {}",
            linked.display(),
            llvm.lib.display()
        ));
    }
    Ok(())
}

/// The libLLVM that an `ldd` listing resolves to; `not found` comes back as the name.
fn linked_llvm(ldd: &str) -> Option<PathBuf> {
    ldd.lines().find_map(|line| {
        let (name, resolved) = line.trim().split_once(" => ")?;
        if !name.starts_with("libLLVM") {
            return None;
        }
        let path = resolved.split(" (").next().unwrap_or(resolved).trim();
        Some(PathBuf::from(if path == "not found" { name } else { path }))
    })
}

/// A folder that looks like an LLVM install to bpf-linker's build script (`lib/libLLVM.so`)
/// and stays after the install: bpf-linker's rpath points at its `lib/`, where the
/// soname link lets the linker start without LD_LIBRARY_PATH.
fn llvm_prefix(root: &Path, llvm: &ToolchainLlvm) -> Result<PathBuf> {
    let prefix = root.join("share/bypass/bpf-linker-llvm");
    let lib = prefix.join("lib");
    fs::create_dir_all(&lib).with_context(|| format!("could not create {}", lib.display()))?;
    for name in ["libLLVM.so".to_owned(), llvm.soname()] {
        let link = lib.join(&name);
        if link.symlink_metadata().is_ok() {
            fs::remove_file(&link)
                .with_context(|| format!("could not replace {}", link.display()))?;
        }
        std::os::unix::fs::symlink(&llvm.lib, &link)
            .with_context(|| format!("could not link {}", link.display()))?;
    }
    if !prefix.join("lib/libLLVM.so").exists() {
        bail!(
            "{} does not resolve",
            prefix.join("lib/libLLVM.so").display()
        );
    }
    Ok(prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_llvm_major_from_the_toolchain_file_name() {
        assert_eq!(llvm_major("libLLVM.so.22.1-rust-1.95.0-stable"), Some(22));
        assert_eq!(llvm_major("libLLVM.so.19.1-rust-1.84.0-nightly"), Some(19));
        assert_eq!(llvm_major("libLLVM-22-rust-1.95.0-stable.so"), None);
        assert_eq!(llvm_major("libLLVM.so.18.1"), None);
    }

    #[test]
    fn finds_the_linked_llvm_in_ldd_output() {
        let ok = "\tlinux-vdso.so.1 (0x00007ff2)\n\
                  \tlibLLVM.so.22.1-rust-1.95.0-stable => /t/lib/libLLVM.so.22.1-rust-1.95.0-stable (0x7f)\n\
                  \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x7f)\n";
        assert_eq!(
            linked_llvm(ok),
            Some(PathBuf::from("/t/lib/libLLVM.so.22.1-rust-1.95.0-stable"))
        );
        let missing = "\tlibLLVM.so.21.1-rust-1.90.0-stable => not found\n";
        assert_eq!(
            linked_llvm(missing),
            Some(PathBuf::from("libLLVM.so.21.1-rust-1.90.0-stable"))
        );
        assert_eq!(linked_llvm("\tlibc.so.6 => /lib/libc.so.6 (0x7f)\n"), None);
    }
}
