//! `cargo xtask setup`: installs what the project needs, only what is missing, and says
//! what it did: the pinned toolchain, bpf-linker against its LLVM, the Debian packages (the
//! apps suite's real applications among them),
//! and Go for the Kubernetes tests.

mod go;
mod linker;
mod packages;
mod toolchain;

use std::{path::PathBuf, process::Command, time::Instant};

use anyhow::Result;
use xtask_lib::workspace::{self, ToolchainSpec};

/// What a task needs installed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Toolchain and bpf-linker: enough to build.
    Build,
    /// Also the Debian packages that the tests, the demo and the benches run, and Go.
    All,
}

/// The installed tools, for the tasks that run cargo.
pub struct Tools {
    /// Directories to put first on PATH (where bpf-linker and go are).
    path_dirs: Vec<PathBuf>,
}

impl Tools {
    /// `cargo`, in the workspace root, finding our bpf-linker first.
    pub fn cargo(&self) -> Result<Command> {
        workspace::cargo(&self.path_dirs)
    }
}

/// `cargo xtask setup`.
pub fn run() -> Result<()> {
    ensure(Scope::All).map(drop)
}

/// Installs what `cargo xtask cluster up` needs and is missing: everything of
/// [`Scope::All`] and the container runtime's packages.
pub fn ensure_cluster() -> Result<Tools> {
    let tools = ensure(Scope::All)?;
    let mut done = Vec::new();
    packages::ensure_list(packages::CLUSTER, &mut done)?;
    for what in &done {
        eprintln!("setup: {what}");
    }
    Ok(tools)
}

/// Installs what a build for `target` (another architecture) and booting it need and is
/// missing: the target's standard library, Debian's cross toolchain, the emulator.
pub fn ensure_cross(target: &str) -> Result<()> {
    let started = Instant::now();
    let spec = ToolchainSpec::load()?;
    let mut done = Vec::new();
    toolchain::ensure_target(&spec.channel, target, &mut done)?;
    packages::ensure_list(packages::cross(target), &mut done)?;
    if !done.is_empty() {
        eprintln!(
            "setup: done for {target} ({:.0}s): {}",
            started.elapsed().as_secs_f32(),
            done.join("; ")
        );
    }
    Ok(())
}

/// Installs what `scope` needs and is missing; prints one line saying what it did.
pub fn ensure(scope: Scope) -> Result<Tools> {
    let started = Instant::now();
    let spec = ToolchainSpec::load()?;
    let mut done = Vec::new();
    let toolchain = toolchain::ensure(&spec, &mut done)?;
    let linker_dir = linker::ensure(&toolchain, &mut done)?;
    let mut path_dirs = vec![linker_dir.clone()];
    let mut checked = String::new();
    if scope == Scope::All {
        packages::ensure(&mut done)?;
        packages::ensure_apps(&mut done)?;
        let go_dir = go::ensure(&mut done)?;
        checked = format!(", Debian packages, go in {}", go_dir.display());
        path_dirs.push(go_dir);
    }
    let elapsed = started.elapsed().as_secs_f32();
    if done.is_empty() {
        eprintln!(
            "setup: nothing to do: toolchain {} ({}), bpf-linker {} in {}{checked} present ({elapsed:.1}s)",
            spec.channel,
            spec.components.join(", "),
            linker::VERSION,
            linker_dir.display(),
        );
    } else {
        eprintln!("setup: done ({elapsed:.0}s):");
        for what in &done {
            eprintln!("  - {what}");
        }
    }
    // Our own in-process lookups (`kube-testenv` finds `go` on PATH) see the same tools as
    // the cargo commands we start.
    let path = workspace::prepend_path(&path_dirs)?;
    // SAFETY: the xtask has one thread; nothing reads the environment concurrently.
    unsafe { std::env::set_var("PATH", path) };
    Ok(Tools { path_dirs })
}
