//! Finding the testbed's tools (`bypass-peer`, `bypass-probe`, `bypass-proxy`): an
//! environment variable names one, else it sits next to the running executable (or next
//! to its `deps/` directory, for cargo's test binaries).

use std::path::PathBuf;

use anyhow::{Context as _, Result, bail};

/// The tool `name`: `$env` if set, else `name` beside the running executable.
pub fn tool_bin(name: &str, env: &str) -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(env) {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().context("find the running executable")?;
    let mut dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let p = dir.join(name);
    if !p.is_file() {
        bail!(
            "no {name} at {} (cargo build -p testbed --bins, or set {env})",
            p.display()
        );
    }
    Ok(p)
}
