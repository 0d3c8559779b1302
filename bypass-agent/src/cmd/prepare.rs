//! What the chart runs before the agent: `prepare-node`, its init container, mounts
//! bpffs on the host (the one step that needs a privileged container, for the mount to
//! propagate back to the host), so the agent's own container runs with capabilities
//! only; `prepare-namespace`, a pre-install hook, labels the release namespace for Pod
//! Security `privileged`, which `helm install --create-namespace` cannot.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use tracing::info;

use crate::{
    cli::{PrepareNamespaceOpts, PrepareNodeOpts},
    datapath,
    error::{AgentError, chain},
};

/// The Pod Security labels the agent's namespace needs: its pods use the host network,
/// hostPath volumes and a privileged init container.
pub fn pod_security_labels() -> BTreeMap<String, String> {
    ["enforce", "audit", "warn"]
        .iter()
        .map(|mode| {
            (
                format!("pod-security.kubernetes.io/{mode}"),
                "privileged".to_owned(),
            )
        })
        .chain([("bypass.dev/exclude".to_owned(), "true".to_owned())])
        .collect()
}

/// `prepare-node`: bpffs mounted where the pins go.
pub fn node(opts: &PrepareNodeOpts) -> Result<(), AgentError> {
    datapath::ensure_pin_dir_not_mount_root(&opts.pins.pin_dir)?;
    datapath::ensure_bpffs(&opts.pins.pin_dir)?;
    println!(
        "bpffs ready for {} (pins reach the host when /sys/fs/bpf is a shared mount)",
        opts.pins.pin_dir.display()
    );
    Ok(())
}

/// `prepare-namespace`: the labels of [`pod_security_labels`] on `--namespace`.
pub fn namespace(opts: &PrepareNamespaceOpts) -> Result<(), AgentError> {
    let rt = crate::runtime::current_thread()?;
    rt.block_on(async {
        let client = crate::k8s::client::connect(opts.kubeconfig.as_deref()).await?;
        let api: Api<Namespace> = Api::all(client);
        let patch = serde_json::json!({"metadata": {"labels": pod_security_labels()}});
        api.patch(
            &opts.namespace,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(|e| AgentError::Api {
            action: format!(
                "label namespace {} pod-security.kubernetes.io/enforce=privileged (the chart's hook needs patch on it)",
                opts.namespace
            ),
            detail: chain(&e),
            source: Box::new(e),
        })?;
        info!(namespace = %opts.namespace, "labelled for Pod Security privileged");
        println!("namespace {} labelled pod-security.kubernetes.io/enforce=privileged", opts.namespace);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_enforce_audit_and_warn_privileged() {
        let l = pod_security_labels();
        assert_eq!(l["pod-security.kubernetes.io/enforce"], "privileged");
        assert_eq!(l["pod-security.kubernetes.io/warn"], "privileged");
        assert_eq!(l["bypass.dev/exclude"], "true");
    }
}
