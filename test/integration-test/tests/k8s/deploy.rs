//! Every manifest in `deploy/` is listed by the kustomization and accepted by the API
//! server.

use std::collections::BTreeSet;

use anyhow::{Context as _, Result, ensure};
use kube::{
    Api,
    api::{DynamicObject, GroupVersionKind},
};
use serde_json::Value;

use super::{cluster::Cluster, support::deploy_dir};
use crate::support::privileged;

#[test]
fn k8s_deploy_manifests_accepted_by_the_api_server() -> Result<()> {
    // No netns or BPF here, but the same tools and root policy as the others.
    privileged!();
    let c = Cluster::start()?;
    let deploy = deploy_dir();
    // uninstall.yaml is applied after `kubectl delete -k`, never with the kustomization;
    // values.yaml is what the chart is rendered with.
    let mut files: Vec<String> = std::fs::read_dir(&deploy)?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| {
            n.ends_with(".yaml")
                && !["kustomization.yaml", "uninstall.yaml", "values.yaml"].contains(&n.as_str())
        })
        .collect();
    files.sort();
    // The kustomization lists every manifest, namespace first.
    let kust: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(deploy.join("kustomization.yaml"))?)?;
    let mut listed: Vec<String> = kust["resources"]
        .as_array()
        .context("kustomization without resources")?
        .iter()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    ensure!(
        listed.first().map(String::as_str) == Some("namespace.yaml"),
        "namespace must come first: {listed:?}"
    );
    listed.sort();
    ensure!(
        listed == files,
        "kustomization resources {listed:?} != manifests {files:?}"
    );
    ensure!(deploy.join("Containerfile").is_file(), "no Containerfile");

    // Namespaced objects need their namespace to exist for a dry run.
    c.apply_yaml(&deploy.join("namespace.yaml"), false)?;
    let mut kinds = BTreeSet::new();
    for f in &files {
        for obj in c.apply_yaml(&deploy.join(f), true)? {
            eprintln!("  accepted (dry run): {obj} from {f}");
            kinds.insert(obj.split('/').next().unwrap_or("").to_owned());
        }
    }
    for k in [
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "DaemonSet",
    ] {
        ensure!(kinds.contains(k), "no {k} in deploy/: {kinds:?}");
    }
    // The uninstall DaemonSet, in its own namespace (stored: a dry run cannot create the
    // namespace its DaemonSet needs; nothing runs it on this API server).
    for obj in c.apply_yaml(&deploy.join("uninstall.yaml"), false)? {
        eprintln!("  accepted: {obj} from uninstall.yaml");
    }
    // A dry run stores nothing.
    let ds: Api<DynamicObject> = Api::namespaced_with(
        c.client.clone(),
        "bypass-system",
        &kube::api::ApiResource::from_gvk(&GroupVersionKind::gvk("apps", "v1", "DaemonSet")),
    );
    ensure!(
        c.block(ds.get_opt("bypass-agent"))?.is_none(),
        "dry run stored the DaemonSet"
    );
    Ok(())
}
