//! The agent of `deploy/` as the bench switches it: installed for the run and removed
//! after it (the README's uninstall), and the node label set for a block and followed
//! until the agent's `status` agrees.

use std::{path::PathBuf, time::Duration};

use anyhow::{Result, anyhow, bail};
use kube_testenv::{Kubectl, deploy::label_arg, retry};

use crate::{driver::progress, model::Path};

/// How long the agent may take to follow the node label.
const LABEL_TIMEOUT: Duration = Duration::from_secs(60);

/// Whether `status --json` says the datapath is attached (pure).
pub fn attached_of(status: &serde_json::Value) -> Option<bool> {
    status.get("attached").and_then(serde_json::Value::as_bool)
}

/// `deploy/` applied (the node labelled `false` first) and rolled out; on drop the
/// README's uninstall (delete it, run `deploy/uninstall.yaml` until the node is clean,
/// delete that) and the label removed.
pub(super) struct Deployed<'a> {
    kube: &'a Kubectl,
    deploy: PathBuf,
}

impl<'a> Deployed<'a> {
    pub(super) fn apply(kube: &'a Kubectl, workspace: &std::path::Path) -> Result<Self> {
        let me = Self {
            kube,
            deploy: workspace.join("deploy"),
        };
        kube.label_node(Some(false))?;
        // As an operator does on a kernel with no read guard (a refused agent is not
        // ready, and its rollout would never finish).
        kube.apply_deploy(&me.deploy, !testbed::kernel_probe()?.bypass_by_default)?;
        Ok(me)
    }
}

impl Drop for Deployed<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.kube.uninstall_deploy(&self.deploy) {
            progress(&format!("cluster: uninstall of deploy/ failed: {e:#}"));
        }
    }
}

/// Labels the node for `path` and waits until the agent's `status` follows.
pub(super) fn set_path(kube: &Kubectl, path: Path) -> Result<()> {
    let want = match path {
        Path::Bypass => true,
        Path::Default => false,
        Path::Minimal | Path::Floor => {
            bail!("the cluster scenario has no {} path", path.name())
        }
    };
    kube.label_node(Some(want))?;
    retry(LABEL_TIMEOUT, Duration::from_millis(300), || {
        let status = kube.agent_status()?;
        match attached_of(&status) {
            Some(a) if a == want => Ok(()),
            _ => bail!("{status}"),
        }
    })
    .map_err(|e| {
        anyhow!(
            "the agent did not follow {} within {LABEL_TIMEOUT:?}: status {e:#}",
            label_arg(Some(want))
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attached_from_status() {
        assert_eq!(
            attached_of(&serde_json::json!({"attached": true, "sockets": 3})),
            Some(true)
        );
        assert_eq!(
            attached_of(&serde_json::json!({"attached": false})),
            Some(false)
        );
        assert_eq!(attached_of(&serde_json::json!({"sockets": 3})), None);
    }
}
