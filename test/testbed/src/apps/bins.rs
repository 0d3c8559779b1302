//! Where the apps suite's programs are: Debian's (on `PATH`, in the sbin directories,
//! or in PostgreSQL's versioned directory, which Debian keeps off `PATH`) and the
//! suite's own, built by `cargo xtask test` into `apps/` beside the test binaries
//! (`$BYPASS_APPS_DIR` overrides); and what a workload needs that is missing.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

/// The environment variable that names the directory of the suite's built programs.
pub const APPS_DIR_ENV: &str = "BYPASS_APPS_DIR";

/// What one workload runs.
#[derive(Clone, Copy, Debug)]
pub struct Needs {
    /// Debian's programs, by name.
    pub system: &'static [&'static str],
    /// The suite's own, by path under the apps directory (`go/echo`, `java/NioEcho.class`).
    pub built: &'static [&'static str],
}

impl Needs {
    /// Every missing program, with how to get it.
    pub fn missing(&self) -> Vec<String> {
        let mut m: Vec<String> = self
            .system
            .iter()
            .filter(|name| system(name).is_err())
            .map(|name| format!("{name} is not installed (cargo xtask setup)"))
            .collect();
        m.extend(
            self.built
                .iter()
                .filter_map(|rel| built(rel).err())
                .map(|e| format!("{e:#}")),
        );
        m
    }
}

/// Debian's program `name`.
pub fn system(name: &str) -> Result<PathBuf> {
    let path_dirs = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    let fixed = ["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from);
    path_dirs
        .into_iter()
        .chain(fixed)
        .chain(postgres_bin_dir())
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
        .ok_or_else(|| anyhow::anyhow!("{name} is not installed (cargo xtask setup)"))
}

/// PostgreSQL's program `name`: from its versioned directory first, where Debian keeps
/// `initdb` and `postgres` (`/usr/bin` holds only wrappers for the client programs).
pub fn postgres(name: &str) -> Result<PathBuf> {
    match postgres_bin_dir().map(|d| d.join(name)) {
        Some(p) if is_executable(&p) => Ok(p),
        _ => system(name),
    }
}

/// The suite's program at `rel` under the apps directory.
pub fn built(rel: &str) -> Result<PathBuf> {
    let p = crate::tools::tool_dir("apps", APPS_DIR_ENV)?.join(rel);
    if !p.is_file() {
        bail!(
            "no {} (cargo xtask test builds the apps suite's programs, or set {APPS_DIR_ENV})",
            p.display()
        );
    }
    Ok(p)
}

/// `/usr/lib/postgresql/<newest>/bin`, where Debian puts initdb and postgres.
fn postgres_bin_dir() -> Option<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse().ok()?;
            Some((v, e.path().join("bin")))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, dir)| dir)
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    p.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_sh_and_names_what_is_missing() {
        assert!(system("sh").is_ok());
        let needs = Needs {
            system: &["sh", "no-such-program-here"],
            built: &[],
        };
        let m = needs.missing();
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(m[0].contains("no-such-program-here"), "{m:?}");
    }
}
