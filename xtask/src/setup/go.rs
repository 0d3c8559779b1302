//! Go, which the Kubernetes tests need to build kube-apiserver and etcd (`kube-testenv`). A Go
//! of at least [`MIN`] that is already here is used; otherwise a pinned release is fetched
//! from the Go module proxy (module `golang.org/toolchain`, the zip `go` itself downloads
//! when it switches toolchains) into the cache, and checked against a pinned SHA-256.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, anyhow, bail};
use xtask_lib::{cmd, workspace};

/// The oldest Go that builds the pinned Kubernetes release (its `go.mod` says `go 1.25.0`).
pub const MIN: GoVersion = GoVersion(1, 25, 0);
/// The release fetched when no suitable Go is here.
const PINNED: &str = "1.26.8";
/// SHA-256 of `golang.org/toolchain@v0.0.1-go<PINNED>.linux-<arch>.zip` on
/// proxy.golang.org. Its `bin/go` is byte-identical to the official go1.26.8 tarball's.
const ZIP_SHA256: &[(&str, &str)] = &[
    (
        "amd64",
        "30c2b1bf7dcc88d3eb0a1364e47ddd9128edb3110a30e8a0ef61cd5856b31de7",
    ),
    (
        "arm64",
        "02b36b6787b3ac767668f630e2998df45a3b1f9ffee08d1bf3ef6487cd658d99",
    ),
];
/// Where `/usr/local/go` installs (the official tarball) put it, even when not on PATH.
const USUAL: &str = "/usr/local/go/bin/go";

/// `go1.26.8` as numbers, comparable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct GoVersion(pub u32, pub u32, pub u32);

impl std::fmt::Display for GoVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

/// Finds or fetches a Go of at least [`MIN`]; returns the directory of its `go`, which
/// setup puts first on PATH so every `go` lookup finds this one.
pub fn ensure(done: &mut Vec<String>) -> Result<PathBuf> {
    let cached = workspace::cache_dir("go")?.join(format!("go{PINNED}"));
    let on_path = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .map(|dir| dir.join("go"));
    let candidates = on_path.chain([PathBuf::from(USUAL), cached.join("bin/go")]);
    let mut too_old = Vec::new();
    for go in candidates.filter(|go| cmd::is_executable(go)) {
        match version(&go) {
            Some(v) if v >= MIN => return bin_dir(&go),
            Some(v) => too_old.push(format!("{} is {v}", go.display())),
            None => too_old.push(format!("{} does not run", go.display())),
        }
    }
    let why = if too_old.is_empty() {
        "no Go here".to_owned()
    } else {
        too_old.join(", ")
    };
    eprintln!(
        "setup: {why}; fetching Go {PINNED} from proxy.golang.org into {}",
        cached.display()
    );
    fetch(&cached)?;
    let go = cached.join("bin/go");
    match version(&go) {
        Some(v) if v >= MIN => {}
        Some(v) => bail!("fetched Go is {v}, not >= {MIN} ({})", go.display()),
        None => bail!("fetched Go does not run ({})", go.display()),
    }
    done.push(format!("fetched Go {PINNED} into {}", cached.display()));
    bin_dir(&go)
}

fn bin_dir(go: &Path) -> Result<PathBuf> {
    go.parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| anyhow!("{} has no parent directory", go.display()))
}

/// `go env GOVERSION`, parsed; `None` if it does not run or says something else.
fn version(go: &Path) -> Option<GoVersion> {
    let out = cmd::output(Command::new(go).args(["env", "GOVERSION"])).ok()?;
    parse_version(out.trim())
}

/// `go1.26.8` → 1.26.8; `go1.25rc1` → 1.25.0 (a pre-release of 1.25 counts as 1.25.0).
fn parse_version(s: &str) -> Option<GoVersion> {
    let rest = s.strip_prefix("go")?;
    let mut parts = rest.split('.').map(|p| {
        let digits: String = p.chars().take_while(char::is_ascii_digit).collect();
        digits.parse::<u32>().ok()
    });
    let major = parts.next()??;
    let minor = parts.next()??;
    let patch = parts.next().flatten().unwrap_or(0);
    Some(GoVersion(major, minor, patch))
}

/// Downloads, checks and unpacks the pinned toolchain zip into `dest` (with curl, unzip
/// and sha256sum, which setup's Debian packages provide).
fn fetch(dest: &Path) -> Result<()> {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => bail!("no pinned Go for {other}: install Go >= {MIN} on PATH"),
    };
    let Some((_, sha256)) = ZIP_SHA256.iter().find(|(a, _)| *a == arch) else {
        bail!("no pinned checksum of Go {PINNED} for linux-{arch}");
    };
    let module = format!("golang.org/toolchain@v0.0.1-go{PINNED}.linux-{arch}");
    let url = format!(
        "https://proxy.golang.org/golang.org/toolchain/@v/v0.0.1-go{PINNED}.linux-{arch}.zip"
    );
    let parent = dest
        .parent()
        .ok_or_else(|| anyhow!("{} has no parent directory", dest.display()))?;
    let work = parent.join(format!(".fetch-{}", std::process::id()));
    fs::create_dir_all(&work).with_context(|| format!("could not create {}", work.display()))?;
    let result = (|| {
        let zip = work.join("go.zip");
        cmd::run_to_stderr(
            Command::new("curl")
                .args(["--proto", "=https", "-fsSL", "--retry", "3", "-o"])
                .arg(&zip)
                .arg(&url),
        )?;
        let sum = cmd::output(Command::new("sha256sum").arg(&zip))?;
        let got = sum.split_whitespace().next().unwrap_or_default();
        if got != *sha256 {
            bail!("{url} has SHA-256 {got}, expected {sha256}");
        }
        cmd::run_to_stderr(
            Command::new("unzip")
                .arg("-q")
                .arg(&zip)
                .arg("-d")
                .arg(&work),
        )?;
        if dest.exists() {
            fs::remove_dir_all(dest)
                .with_context(|| format!("could not remove the old {}", dest.display()))?;
        }
        fs::rename(work.join(&module), dest)
            .with_context(|| format!("could not move {module} to {}", dest.display()))
    })();
    // Best effort: a leftover download folder only wastes space.
    let _ = fs::remove_dir_all(&work);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_versions() {
        assert_eq!(parse_version("go1.26.8"), Some(GoVersion(1, 26, 8)));
        assert_eq!(parse_version("go1.25rc1"), Some(GoVersion(1, 25, 0)));
        assert_eq!(parse_version("go1.19"), Some(GoVersion(1, 19, 0)));
        assert_eq!(parse_version("devel +abc"), None);
    }

    #[test]
    fn compares_like_releases() {
        assert!(GoVersion(1, 26, 8) >= MIN);
        assert!(GoVersion(1, 25, 0) >= MIN);
        assert!(GoVersion(1, 24, 11) < MIN);
        assert!(GoVersion(1, 100, 0) > GoVersion(1, 25, 3));
    }
}
