//! Whether the agent's DaemonSet still exists, asked when the agent stops: a rolling
//! update or a restart leaves the datapath pinned for the next agent to adopt; a
//! DaemonSet that is gone (`helm uninstall`, `kubectl delete -k deploy/`) takes the
//! datapath with it, on every node, with nothing else to run. The decision is pure
//! ([`on_exit`]); finding the owner and asking the API server is thin I/O.

use std::time::Duration;

use k8s_openapi::api::{apps::v1::DaemonSet, core::v1::Pod};
use kube::{Api, Client};

use super::{
    client::{Failure, classify},
    node_status::Owner,
};

/// What the API server said about the DaemonSet at exit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerCheck {
    /// It exists; `deleting` when it has a deletion timestamp (foreground deletion),
    /// `same` when its UID is the one the agent started under.
    Present {
        /// Being deleted.
        deleting: bool,
        /// The same object the agent started under.
        same: bool,
    },
    /// 404.
    Gone,
    /// 401: the service account's token no longer authenticates (the account went
    /// with the release).
    Unauthorized,
    /// 403.
    Forbidden,
    /// No answer, or another error.
    Unknown(String),
}

/// What to do with the datapath on exit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitAction {
    /// Leave it pinned for the next agent (its heartbeat bounds how long it keeps
    /// inserting if none comes).
    Keep,
    /// Detach and remove the pins: the DaemonSet is gone.
    Remove,
}

/// The decision (pure). `allowed_at_start`: the agent could read its DaemonSet when it
/// started, so a 403 now means its RBAC was deleted with it (Helm and `kubectl delete`
/// remove the RoleBinding while the pods are still terminating).
pub fn on_exit(check: &OwnerCheck, allowed_at_start: bool) -> ExitAction {
    match check {
        OwnerCheck::Present {
            deleting: false, ..
        } => ExitAction::Keep,
        OwnerCheck::Present { deleting: true, .. } | OwnerCheck::Gone => ExitAction::Remove,
        OwnerCheck::Unauthorized => ExitAction::Remove,
        OwnerCheck::Forbidden if allowed_at_start => ExitAction::Remove,
        OwnerCheck::Forbidden | OwnerCheck::Unknown(_) => ExitAction::Keep,
    }
}

/// The DaemonSet that owns pod `namespace/pod` (its controller owner reference).
pub async fn find(client: &Client, namespace: &str, pod: &str) -> Option<Owner> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let p = api.get(pod).await.ok()?;
    p.metadata
        .owner_references?
        .into_iter()
        .find(|r| r.controller == Some(true) && r.kind == "DaemonSet")
        .map(|r| Owner {
            kind: r.kind,
            name: r.name,
            uid: r.uid,
        })
}

/// Asks for `owner` in `namespace`, within a few seconds (the pod's grace period is
/// short).
pub async fn check(client: &Client, namespace: &str, owner: &Owner) -> OwnerCheck {
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), namespace);
    match tokio::time::timeout(Duration::from_secs(5), api.get(&owner.name)).await {
        Err(_) => OwnerCheck::Unknown("no answer within 5 s".into()),
        Ok(Ok(ds)) => OwnerCheck::Present {
            deleting: ds.metadata.deletion_timestamp.is_some(),
            same: ds.metadata.uid.as_deref() == Some(owner.uid.as_str()),
        },
        Ok(Err(e)) => match classify(&e) {
            Failure::NotFound(_) => OwnerCheck::Gone,
            Failure::Unauthorized(_) => OwnerCheck::Unauthorized,
            Failure::Forbidden(_) => OwnerCheck::Forbidden,
            Failure::Transient(m) | Failure::Other(m) => OwnerCheck::Unknown(m),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rollout_keeps_an_uninstall_removes() {
        let present = |deleting, same| OwnerCheck::Present { deleting, same };
        assert_eq!(on_exit(&present(false, true), true), ExitAction::Keep);
        // Deleted and created again (kubectl replace): the new one's pods adopt.
        assert_eq!(on_exit(&present(false, false), true), ExitAction::Keep);
        assert_eq!(on_exit(&present(true, true), true), ExitAction::Remove);
        assert_eq!(on_exit(&OwnerCheck::Gone, true), ExitAction::Remove);
        assert_eq!(
            on_exit(&OwnerCheck::Unauthorized, false),
            ExitAction::Remove
        );
        // RBAC removed with the DaemonSet; never granted is no evidence.
        assert_eq!(on_exit(&OwnerCheck::Forbidden, true), ExitAction::Remove);
        assert_eq!(on_exit(&OwnerCheck::Forbidden, false), ExitAction::Keep);
        // An API server that does not answer: keep; the heartbeat bounds it.
        assert_eq!(
            on_exit(&OwnerCheck::Unknown("timeout".into()), true),
            ExitAction::Keep
        );
    }
}
