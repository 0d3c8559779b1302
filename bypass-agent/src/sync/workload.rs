//! Which pod, and which workload, a pod address belongs to: the labels of the per-pod
//! counters (`bypass_pod_redirected_bytes_total{namespace,pod,owner}`), from the Pod
//! objects the agent already watches (no other object is read, so no other RBAC).

use k8s_openapi::api::core::v1::Pod;

/// A pod as the per-pod counters name it.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodIdentity {
    /// Its namespace (empty in standalone mode).
    pub namespace: String,
    /// Its name (in standalone mode, its lowest address).
    pub pod: String,
    /// Its workload, `Kind/name` ([`workload_owner`]); empty for a pod no controller
    /// owns, and in standalone mode.
    pub owner: String,
}

impl PodIdentity {
    /// A pod known by its Pod object.
    pub fn of(pod: &Pod) -> Self {
        Self {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            pod: pod.metadata.name.clone().unwrap_or_default(),
            owner: workload_owner(pod),
        }
    }
}

/// The workload that runs `pod`, `Kind/name`, from its controller owner reference: a
/// ReplicaSet named as a Deployment's (`<deployment>-<pod-template-hash>`, the hash
/// the pod carries in its `pod-template-hash` label) is that Deployment's; any other
/// controller is itself (`StatefulSet/db`, `DaemonSet/agent`, `Job/backup-2912`,
/// `ReplicaSet/rs`). Empty when no controller owns the pod. Pure: read from the pod
/// alone, never by asking the API server for the owner.
pub fn workload_owner(pod: &Pod) -> String {
    let Some(r) = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
    else {
        return String::new();
    };
    if r.kind == "ReplicaSet"
        && let Some(hash) = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("pod-template-hash"))
        && let Some(deployment) = r
            .name
            .strip_suffix(hash.as_str())
            .and_then(|n| n.strip_suffix('-'))
        && !deployment.is_empty()
    {
        return format!("Deployment/{deployment}");
    }
    format!("{}/{}", r.kind, r.name)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    use super::*;

    fn pod(owner: Option<(&str, &str, bool)>, hash: Option<&str>) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("web-5d8f7c9b4-x2kqp".into());
        p.metadata.namespace = Some("shop".into());
        p.metadata.owner_references = owner.map(|(kind, name, controller)| {
            vec![OwnerReference {
                kind: kind.into(),
                name: name.into(),
                controller: Some(controller),
                ..OwnerReference::default()
            }]
        });
        p.metadata.labels = hash.map(|h| [("pod-template-hash".to_owned(), h.to_owned())].into());
        p
    }

    #[test]
    fn a_deployments_replicaset_is_the_deployment() {
        let p = pod(
            Some(("ReplicaSet", "web-5d8f7c9b4", true)),
            Some("5d8f7c9b4"),
        );
        assert_eq!(workload_owner(&p), "Deployment/web");
        assert_eq!(
            PodIdentity::of(&p),
            PodIdentity {
                namespace: "shop".into(),
                pod: "web-5d8f7c9b4-x2kqp".into(),
                owner: "Deployment/web".into(),
            }
        );
    }

    #[test]
    fn other_controllers_are_themselves_and_no_controller_is_none() {
        // A ReplicaSet of its own (no template hash, or one its name does not end in).
        let rs = pod(Some(("ReplicaSet", "cache", true)), None);
        assert_eq!(workload_owner(&rs), "ReplicaSet/cache");
        let rs = pod(Some(("ReplicaSet", "cache", true)), Some("5d8f7c9b4"));
        assert_eq!(workload_owner(&rs), "ReplicaSet/cache");
        let rs = pod(Some(("ReplicaSet", "-abc", true)), Some("abc"));
        assert_eq!(workload_owner(&rs), "ReplicaSet/-abc");
        let sts = pod(Some(("StatefulSet", "db", true)), None);
        assert_eq!(workload_owner(&sts), "StatefulSet/db");
        // An owner that is not the controller names no workload.
        let not_controller = pod(Some(("ConfigMap", "x", false)), None);
        assert_eq!(workload_owner(&not_controller), "");
        assert_eq!(workload_owner(&pod(None, None)), "");
    }
}
