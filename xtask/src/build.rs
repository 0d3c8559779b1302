//! `cargo xtask build`: builds the agent (with its embedded kernel object) and says where
//! it is; `--check` also runs the formatter and clippy on the workspace.

use std::{path::PathBuf, process::Command};

use anyhow::{Context as _, Result, bail};
use xtask_lib::{cmd, workspace};

use crate::setup::{self, Tools};

/// Options of `cargo xtask build`, shared by the tasks that build first.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Build the debug profile (`target/debug/bypass-agent`) instead of release.
    #[arg(long)]
    pub debug: bool,
}

/// Arguments of `cargo xtask build`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub options: Options,
    /// Then run `cargo fmt --check` and `cargo clippy --workspace --all-targets -D warnings`.
    #[arg(long)]
    pub check: bool,
}

/// `cargo xtask build`.
pub fn run(args: &Args) -> Result<()> {
    let tools = setup::ensure(setup::Scope::Build)?;
    build_agent(&tools, &args.options)?;
    if args.check {
        lint(&tools)?;
    }
    Ok(())
}

/// Builds `bypass-agent` and returns the path of the binary.
pub fn build_agent(tools: &Tools, opts: &Options) -> Result<PathBuf> {
    let mut cargo = tools.cargo()?;
    // --locked: the agent is built from the committed Cargo.lock, never a resolved one.
    cargo.args(["build", "--locked", "--package", workspace::AGENT]);
    if !opts.debug {
        cargo.arg("--release");
    }
    cmd::run(&mut cargo)?;
    let profile = if opts.debug { "debug" } else { "release" };
    let agent = workspace::target_dir()?
        .join(profile)
        .join(workspace::AGENT);
    let size = agent
        .metadata()
        .with_context(|| format!("the build succeeded but {} is missing", agent.display()))?
        .len();
    println!(
        "build: {} ({size} bytes, {:.1} MiB)",
        agent.display(),
        size as f64 / (1024.0 * 1024.0)
    );
    Ok(agent)
}

/// Builds the test tool of `testbed` ([`workspace::TEST_TOOL`]) that the privileged
/// tests, the test image and the bench run, in release or in the dev profile, and
/// returns its path. The tests look for it next to their own executable, and cargo
/// builds only the tested package's binaries for its tests: whoever runs
/// `integration-test` builds it first, in the tests' profile (`cargo test` uses the dev
/// profile).
pub fn build_test_tool(tools: &Tools, release: bool) -> Result<PathBuf> {
    let mut cargo = tools.cargo()?;
    cargo
        .args(["build", "--package", workspace::TESTBED])
        .args(["--bin", workspace::TEST_TOOL]);
    if release {
        cargo.arg("--release");
    }
    cmd::run(&mut cargo)?;
    let bin = workspace::target_dir()?
        .join(if release { "release" } else { "debug" })
        .join(workspace::TEST_TOOL);
    if !bin.is_file() {
        bail!("the build succeeded but {} is missing", bin.display());
    }
    Ok(bin)
}

/// Builds the agent of each of [`workspace::PREVIOUS_AGENTS`], which the upgrade tests
/// run before and after this build, once: that commit's tree is exported from this
/// clone's history (`git archive`) into its own directory under the target directory,
/// keyed by the commit, and built there with its own lock file and toolchain file, in
/// one target directory for all of them; its binary is copied beside its tree. A later
/// call finds them built.
pub fn build_previous_agents(tools: &Tools) -> Result<()> {
    for commit in workspace::PREVIOUS_AGENTS {
        build_previous_agent(tools, commit)?;
    }
    Ok(())
}

/// Builds the agent of `commit` as [`build_previous_agents`] does (once); returns its
/// binary.
pub fn build_previous_agent(tools: &Tools, commit: &str) -> Result<PathBuf> {
    let target = workspace::target_dir()?;
    let bin = workspace::previous_agent_bin(&target, commit);
    if bin.is_file() {
        return Ok(bin);
    }
    let root = workspace::root();
    let known = Command::new("git")
        .current_dir(root)
        .args(["cat-file", "-e", &format!("{commit}^{{commit}}")])
        .status()
        .context("run git (the upgrade tests build earlier commits of the agent)")?;
    if !known.success() {
        bail!(
            "commit {commit} (in workspace::PREVIOUS_AGENTS, the agents the upgrade tests \
             switch to and from) is not in this clone's history: clone without --depth, or \
             run `git fetch --unshallow`"
        );
    }
    let dir = workspace::previous_agent_dir(&target, commit);
    if !dir.join("Cargo.toml").is_file() {
        // Exported beside, then renamed: a killed export is never taken for a tree.
        let partial = dir.with_extension("partial");
        let _ = std::fs::remove_dir_all(&partial);
        std::fs::create_dir_all(&partial)
            .with_context(|| format!("create {}", partial.display()))?;
        export_commit(root, commit, &partial)?;
        std::fs::rename(&partial, &dir)
            .with_context(|| format!("rename {} to {}", partial.display(), dir.display()))?;
    }
    // The commits share a target directory, where cargo names a workspace's own crates
    // alike whatever the commit and takes them as built when their sources are older
    // than the artifacts: `git archive` dates every file at its commit, so another
    // commit's tree would reuse the artifacts of the one built last. Dated now, this
    // tree's crates are built again (the dependencies from the registry are reused).
    touch_tree(&dir)?;
    let built_in = workspace::previous_agents_target(&target);
    let mut cargo = tools.cargo()?;
    cargo
        .current_dir(&dir)
        .env("CARGO_TARGET_DIR", &built_in)
        .args([
            "build",
            "--locked",
            "--release",
            "--package",
            workspace::AGENT,
        ]);
    cmd::run(&mut cargo)
        .with_context(|| format!("build the agent of {commit} in {}", dir.display()))?;
    let built = built_in.join("release").join(workspace::AGENT);
    // Copied beside, then renamed: a killed copy is never taken for a binary.
    let partial = bin.with_extension("partial");
    std::fs::copy(&built, &partial)
        .with_context(|| format!("copy {} to {}", built.display(), partial.display()))?;
    std::fs::rename(&partial, &bin)
        .with_context(|| format!("rename {} to {}", partial.display(), bin.display()))?;
    println!("build: {} (the agent of {commit})", bin.display());
    Ok(bin)
}

/// Dates every file under `dir` now.
fn touch_tree(dir: &std::path::Path) -> Result<()> {
    let now = std::time::SystemTime::now();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d).with_context(|| format!("read {}", d.display()))? {
            let entry = entry?;
            let path = entry.path();
            if entry.file_type()?.is_dir() {
                pending.push(path);
            } else {
                std::fs::File::options()
                    .write(true)
                    .open(&path)
                    .and_then(|f| f.set_modified(now))
                    .with_context(|| format!("date {} now", path.display()))?;
            }
        }
    }
    Ok(())
}

/// Writes the tree of `commit` (of the repository at `root`) into `dir`: `git archive`
/// piped into `tar -x`, both checked.
fn export_commit(root: &std::path::Path, commit: &str, dir: &std::path::Path) -> Result<()> {
    use std::process::Stdio;
    let mut archive = Command::new("git")
        .current_dir(root)
        .args(["archive", "--format=tar", commit])
        .stdout(Stdio::piped())
        .spawn()
        .context("start git archive")?;
    let stdout = archive
        .stdout
        .take()
        .context("git archive has no standard output")?;
    let untar = Command::new("tar")
        .arg("-x")
        .arg("-C")
        .arg(dir)
        .stdin(stdout)
        .status()
        .context("run tar -x")?;
    let archived = archive.wait().context("wait for git archive")?;
    if !archived.success() || !untar.success() {
        bail!(
            "exporting {commit} into {} failed (git archive {archived}, tar {untar})",
            dir.display()
        );
    }
    Ok(())
}

/// `cargo fmt --check`, and clippy with warnings denied on the whole workspace: the host
/// crates for the host, the kernel crate for the BPF target (on the host its `no_std`
/// binary clashes with std's panic handler). Runs all three, then reports every failure.
fn lint(tools: &Tools) -> Result<()> {
    let mut fmt = tools.cargo()?;
    fmt.args(["fmt", "--all", "--check"]);
    let mut host = tools.cargo()?;
    host.args(["clippy", "--workspace", "--exclude", workspace::EBPF])
        .args(["--exclude", workspace::MINIMAL_EBPF])
        .args(["--all-targets", "--", "-D", "warnings"]);
    let mut bpf = tools.cargo()?;
    // Unstable `-Z build-std` on the stable toolchain, as the agent's build script does.
    bpf.env("RUSTC_BOOTSTRAP", "1")
        .args(["clippy", "--package", workspace::EBPF])
        .args(["--package", workspace::MINIMAL_EBPF, "--release"])
        .args(["--target", bpf_target(), "-Z", "build-std=core"])
        .args(["--", "-D", "warnings"]);
    let mut failed = Vec::new();
    for mut cargo in [fmt, host, bpf] {
        let status = cmd::status(&mut cargo)?;
        if !status.success() {
            failed.push(format!("`{}` ({status})", cmd::display(&cargo)));
        }
    }
    if !failed.is_empty() {
        bail!("{} failed", failed.join(", "));
    }
    println!("build: fmt and clippy clean");
    Ok(())
}

/// The BPF target of the host's byte order, as aya-build chooses it.
fn bpf_target() -> &'static str {
    if cfg!(target_endian = "big") {
        "bpfeb-unknown-none"
    } else {
        "bpfel-unknown-none"
    }
}

/// Builds `bins` (`(package, binary)`) for `target`, another architecture, with Debian's
/// cross compiler `gcc` as linker (and as the C compiler of build scripts such as ring's),
/// in the profile of `opts`, into `<target dir>/cross` (a target directory of its own:
/// no wait on the host builds' lock). aya-build builds the kernel object for the BPF
/// target of the agent's byte order (`bpfel` for aarch64, as on x86_64) and embeds it
/// as on the host. Returns the binaries' paths, in the order of `bins`.
pub fn build_cross(
    tools: &Tools,
    opts: &Options,
    target: &str,
    gcc: &str,
    bins: &[(&str, &str)],
) -> Result<Vec<PathBuf>> {
    let dir = workspace::target_dir()?.join("cross");
    let mut cargo = tools.cargo()?;
    cargo
        .env("CARGO_TARGET_DIR", &dir)
        .env(linker_var(target), gcc)
        .env(format!("CC_{}", target.replace('-', "_")), gcc)
        .args(["build", "--target", target]);
    for (package, bin) in bins {
        cargo.args(["--package", package, "--bin", bin]);
    }
    if !opts.debug {
        cargo.arg("--release");
    }
    cmd::run(&mut cargo)?;
    let profile = if opts.debug { "debug" } else { "release" };
    let out: Vec<PathBuf> = bins
        .iter()
        .map(|(_, bin)| dir.join(target).join(profile).join(bin))
        .collect();
    for p in &out {
        if !p.is_file() {
            bail!("the build succeeded but {} is missing", p.display());
        }
        println!("build: {}", p.display());
    }
    Ok(out)
}

/// Cargo's variable for the linker of `target`.
fn linker_var(target: &str) -> String {
    format!(
        "CARGO_TARGET_{}_LINKER",
        target.to_ascii_uppercase().replace(['-', '.'], "_")
    )
}

/// What the kernel matrix builds: with the pinned toolchain and setup's tools.
impl kernel_matrix::Build for Tools {
    fn test_tools(&self) -> Result<()> {
        build_test_tool(self, false)?;
        build_previous_agents(self)?;
        crate::apps::build("debug").map(drop)
    }

    fn cargo(&self) -> Result<std::process::Command> {
        Tools::cargo(self)
    }

    fn cross(
        &self,
        cross: &kernel_matrix::arch::Cross,
        debug: bool,
        bins: &[(&str, &str)],
    ) -> Result<Vec<PathBuf>> {
        setup::ensure_cross(cross.rust_target)?;
        build_cross(self, &Options { debug }, cross.rust_target, cross.gcc, bins)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linker_variable_of_a_target() {
        assert_eq!(
            linker_var("aarch64-unknown-linux-gnu"),
            "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER"
        );
    }
}
