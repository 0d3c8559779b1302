//! A temporary directory for one server or client (configuration, data, logs, step
//! files), removed with everything in it on drop.

use std::{
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};

use crate::names;

/// A directory under the system's temporary directory, named with the testbed's prefix
/// and a unique tag.
#[derive(Debug)]
pub struct WorkDir {
    path: PathBuf,
}

impl WorkDir {
    /// Creates `<tmp>/<prefix>-<tag>-<what>`, readable by every user (servers that drop
    /// privileges read their files from it).
    pub fn new(what: &str) -> Result<Self> {
        let path = std::env::temp_dir().join(names::resource(&names::unique_tag(), what));
        std::fs::create_dir(&path).with_context(|| format!("create {}", path.display()))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
            .with_context(|| format!("chmod {}", path.display()))?;
        Ok(Self { path })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `name` inside it.
    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Writes `name` inside it.
    pub fn write(&self, name: &str, contents: impl AsRef<[u8]>) -> Result<PathBuf> {
        let p = self.join(name);
        std::fs::write(&p, contents).with_context(|| format!("write {}", p.display()))?;
        Ok(p)
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.path) {
            eprintln!("testbed: cleanup: remove {}: {e}", self.path.display());
        }
    }
}
