//! The agent of `deploy/` on the one-node cluster, as the cluster tests and the bench's
//! cluster scenario install, switch and remove it: `kubectl apply -k deploy/` and its
//! rollout, the node label the agent obeys, its `status --json` through `kubectl exec`,
//! and the README's uninstall.

use std::path::Path;

use anyhow::{Context as _, Result};

use crate::Kubectl;

/// The cluster's one node (`cargo xtask cluster`).
pub const NODE: &str = "bypass-node";
/// The node label the agent of `deploy/` obeys.
pub const NODE_LABEL: &str = "bypass.dev/enabled";
/// The agent's namespace in `deploy/`.
pub const AGENT_NS: &str = "bypass-system";
/// The agent's DaemonSet in `deploy/`.
pub const AGENT_DS: &str = "ds/bypass-agent";

/// `bypass.dev/enabled=true|false`, or `bypass.dev/enabled-` to remove it (pure).
pub fn label_arg(value: Option<bool>) -> String {
    match value {
        Some(v) => format!("{NODE_LABEL}={v}"),
        None => format!("{NODE_LABEL}-"),
    }
}

impl Kubectl {
    /// Sets the node label [`NODE_LABEL`] (`None` removes it).
    pub fn label_node(&self, value: Option<bool>) -> Result<()> {
        self.run(&["label", "node", NODE, &label_arg(value), "--overwrite"])
            .map(drop)
    }

    /// `bypass-agent status --json` of the DaemonSet's pod.
    pub fn agent_status(&self) -> Result<serde_json::Value> {
        let text = self.run(&[
            "-n",
            AGENT_NS,
            "exec",
            AGENT_DS,
            "--",
            "bypass-agent",
            "status",
            "--json",
        ])?;
        serde_json::from_str(&text).with_context(|| format!("parse status --json: {text}"))
    }

    /// Waits until the agent DaemonSet's rollout is complete and its pod Ready.
    pub fn wait_rollout(&self) -> Result<()> {
        self.run(&[
            "-n",
            AGENT_NS,
            "rollout",
            "status",
            AGENT_DS,
            "--timeout=900s",
        ])
        .map(drop)
    }

    /// What an operator does on nodes whose kernel has no read guard (`bypass-agent
    /// probe`): `kubectl set env` of `BYPASS_ALLOW_UNGUARDED=true` on the agent's
    /// DaemonSet (`--allow-unguarded`), and the rollout waited for.
    pub fn allow_unguarded(&self) -> Result<()> {
        self.run(&[
            "-n",
            AGENT_NS,
            "set",
            "env",
            AGENT_DS,
            "BYPASS_ALLOW_UNGUARDED=true",
        ])?;
        self.wait_rollout()
    }

    /// `kubectl apply -k <deploy>`, then, where the kernel has no read guard
    /// (`allow_unguarded`), [`Self::allow_unguarded`], and the rollout waited for: an
    /// agent that refuses its node is not ready, so its rollout would never finish.
    pub fn apply_deploy(&self, deploy: &Path, allow_unguarded: bool) -> Result<()> {
        self.run(&["apply", "-k", &deploy.display().to_string()])?;
        if allow_unguarded {
            return self.allow_unguarded();
        }
        self.wait_rollout()
    }

    /// The README's uninstall: `kubectl delete -k <deploy>`, then [`Self::clean_nodes`].
    pub fn uninstall_deploy(&self, deploy: &Path) -> Result<()> {
        self.run(&[
            "delete",
            "-k",
            &deploy.display().to_string(),
            "--ignore-not-found",
            "--wait=true",
            "--timeout=900s",
        ])?;
        self.clean_nodes(deploy)
    }

    /// `<deploy>/uninstall.yaml` until every node is clean, then deleted; the node label
    /// removed.
    pub fn clean_nodes(&self, deploy: &Path) -> Result<()> {
        let manifest = deploy.join("uninstall.yaml").display().to_string();
        self.run(&["apply", "-f", &manifest])?;
        let cleaned = self.run(&[
            "-n",
            "bypass-uninstall",
            "rollout",
            "status",
            "ds/bypass-uninstall",
            "--timeout=900s",
        ]);
        self.run(&["delete", "-f", &manifest, "--wait=true", "--timeout=900s"])?;
        self.label_node(None)?;
        cleaned.map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_arguments() {
        assert_eq!(label_arg(Some(true)), "bypass.dev/enabled=true");
        assert_eq!(label_arg(Some(false)), "bypass.dev/enabled=false");
        assert_eq!(label_arg(None), "bypass.dev/enabled-");
    }
}
