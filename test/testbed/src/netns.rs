//! A named network namespace (`ip netns add`), deleted on drop.

use std::path::PathBuf;

use anyhow::Result;
use xtask_lib::cmd;

/// A network namespace under /run/netns. Processes still inside keep it alive after
/// the drop; kill them first ([`crate::CgroupGuard`] does).
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates the namespace and brings its loopback up.
    pub fn create(name: &str) -> Result<Self> {
        cmd::ip(&["netns", "add", name])?;
        let ns = Self {
            name: name.to_owned(),
        };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// The namespace `name` that exists already, to delete on drop (what a killed run
    /// left, [`crate::reap`]).
    pub(crate) fn existing(name: &str) -> Self {
        Self {
            name: name.to_owned(),
        }
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The file `setns` opens.
    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }

    /// Runs `ip -n <name> args...`.
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        let mut full = vec!["-n", self.name.as_str()];
        full.extend_from_slice(args);
        cmd::ip(&full)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(e) = cmd::ip(&["netns", "delete", &self.name]) {
            eprintln!("testbed: cleanup: {e:#}");
        }
    }
}
