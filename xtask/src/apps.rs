//! The apps suite's own programs (`test/testbed/apps/`): the Go module's commands built with
//! `go build`, the Java server with `javac`, the Node.js script copied, all into
//! `<target>/<profile>/apps/`, where the tests look beside their own executable (as for
//! testbed's test tool). Skipped when a stamp of the sources says the build is current.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};
use xtask_lib::{cmd, workspace};

/// The sources, under the workspace root.
const SOURCES: &str = "test/testbed/apps";
/// Where the built programs go, beside the test binaries of a profile.
pub const OUT_DIR: &str = "apps";
/// The stamp: a tag of every source file and of the tool versions that built them.
const STAMP: &str = ".stamp";

/// Builds the programs for the `profile` (`debug`, `release`) unless current; returns
/// their directory.
pub fn build(profile: &str) -> Result<PathBuf> {
    let src = workspace::root().join(SOURCES);
    let out = workspace::target_dir()?.join(profile).join(OUT_DIR);
    let tag = format!("{:016x}", source_tag(&src)?);
    let stamp = out.join(STAMP);
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s.trim() == tag) && complete(&src, &out) {
        return Ok(out);
    }
    eprintln!(
        "apps: building the apps suite's programs into {}",
        out.display()
    );
    // A half-updated directory never keeps an old stamp.
    let _ = std::fs::remove_file(&stamp);
    build_go(&src.join("go"), &out.join("go"))?;
    build_java(&src.join("java"), &out.join("java"))?;
    let node = out.join("node");
    std::fs::create_dir_all(&node).with_context(|| format!("create {}", node.display()))?;
    std::fs::copy(src.join("node/pipe.js"), node.join("pipe.js")).context("copy pipe.js")?;
    std::fs::write(&stamp, &tag).with_context(|| format!("write {}", stamp.display()))?;
    Ok(out)
}

/// Whether `out` holds a program for every Go command, the Java class and the script.
fn complete(src: &Path, out: &Path) -> bool {
    let commands = std::fs::read_dir(src.join("go/cmd"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name())
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    !commands.is_empty()
        && commands.iter().all(|c| out.join("go").join(c).is_file())
        && out.join("java/NioEcho.class").is_file()
        && out.join("node/pipe.js").is_file()
}

/// `go build` of every command of the module: static (no C toolchain needed), modules
/// from the Go module proxy into a cache of our own, checked against the committed
/// go.sum and never edited, with the installed toolchain only.
fn build_go(module: &Path, out: &Path) -> Result<()> {
    let mut go = Command::new("go");
    go.args(["build", "-trimpath", "-o"])
        .arg(format!("{}/", out.display()))
        .arg("./cmd/...")
        .current_dir(module)
        .env("GOMODCACHE", workspace::cache_dir("apps")?.join("gomod"))
        .env("GOFLAGS", "-mod=readonly")
        .env("GOTOOLCHAIN", "local")
        .env("CGO_ENABLED", "0");
    cmd::run(&mut go).context("build the apps suite's Go programs (is Go >= 1.25 on PATH?)")
}

/// `javac` of every `.java` file of `dir`.
fn build_java(dir: &Path, out: &Path) -> Result<()> {
    let mut sources = files(dir)?;
    sources.retain(|p| p.extension().is_some_and(|e| e == "java"));
    if !cmd::on_path("javac") {
        bail!("javac is not on PATH: run `cargo xtask setup` (openjdk-17-jdk-headless)");
    }
    let mut javac = Command::new("javac");
    javac.arg("-d").arg(out).args(&sources);
    cmd::run(&mut javac)
}

/// A tag of every file under `dir` (names and contents) and of the `go` and `javac`
/// versions.
fn source_tag(dir: &Path) -> Result<u64> {
    let mut bytes = Vec::new();
    for path in files(dir)? {
        bytes.extend_from_slice(path.to_string_lossy().as_bytes());
        bytes.extend(std::fs::read(&path).with_context(|| format!("read {}", path.display()))?);
    }
    for (tool, arg) in [("go", "version"), ("javac", "-version")] {
        if let Ok(out) = cmd::output(Command::new(tool).arg(arg)) {
            bytes.extend_from_slice(out.as_bytes());
        }
    }
    Ok(kernel_matrix::cache_tag(&bytes))
}

/// Every file under `dir`, sorted.
fn files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).with_context(|| format!("read {}", d.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                todo.push(path);
            } else {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}
