//! Per-node guarantees, published cluster-wide: each agent keeps one ConfigMap,
//! `bypass-node-<node>`, in its own namespace, saying whether its node is bypassing,
//! which guarantees hold on its kernel, or why it refused; `bypass-agent nodes` (or
//! `kubectl get configmaps -l app.kubernetes.io/component=node-status -L
//! bypass.dev/state`) shows the whole cluster. The object is owned by its Node, so the
//! garbage collector removes it with the node, and an agent whose DaemonSet is gone
//! deletes it as it removes the datapath; the chart's ValidatingAdmissionPolicy lets an
//! agent write only its own node's. Building and reading the object is pure; publishing
//! is thin I/O.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client,
    api::{ListParams, Patch, PatchParams},
};
use serde::{Deserialize, Serialize};

use crate::error::{AgentError, chain};

/// Label of every node-status object (`app.kubernetes.io/component`).
pub const COMPONENT: &str = "node-status";
/// Label holding the state, for `kubectl get -L`.
pub const STATE_LABEL: &str = "bypass.dev/state";
/// Field manager of the agent's server-side apply.
const MANAGER: &str = "bypass-agent";

/// The name of node `node`'s object.
pub fn object_name(node: &str) -> String {
    format!("bypass-node-{node}")
}

/// Where a node stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Loaded, waiting for the first sync.
    Starting,
    /// Attached: same-node pod connections are bypassed.
    Bypassing,
    /// Loaded and deliberately off (the node label, or --default-enabled=false).
    Off,
    /// The kernel lacks what the datapath needs: the agent idles on this node.
    Refused,
}

impl State {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::Bypassing => "bypassing",
            Self::Off => "off",
            Self::Refused => "refused",
        }
    }
}

/// What one node's agent publishes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// The node.
    pub node: String,
    /// Its state.
    pub state: State,
    /// Why it is off or refused; empty when bypassing.
    pub reason: String,
    /// `uname -r`.
    pub kernel: String,
    /// Guarantees active on this kernel (`status`'s `features`).
    pub guarantees: Vec<String>,
    /// Guarantees not active on this kernel.
    pub without: Vec<String>,
    /// The behaviours the kernel self-test found not as TCP answers them
    /// (`bypass_common::checks`).
    pub failed_checks: Vec<String>,
    /// The agent's version.
    pub version: String,
    /// When the agent last wrote it (RFC 3339, UTC): it republishes every
    /// [`REFRESH`] while it runs, so an older one is a stale node's.
    #[serde(default)]
    pub refreshed: Option<String>,
}

/// How often a running agent rewrites its node's status, changed or not.
pub const REFRESH: std::time::Duration = std::time::Duration::from_secs(60);
/// Past this age (five refreshes missed) a node's status is shown as stale: its agent
/// is not running, or cannot reach the API server.
pub const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(300);

/// Whether `a` and `b` say the same, whenever they were written (pure).
pub fn same_content(a: &NodeStatus, b: &NodeStatus) -> bool {
    NodeStatus {
        refreshed: None,
        ..a.clone()
    } == NodeStatus {
        refreshed: None,
        ..b.clone()
    }
}

/// The state `nodes` shows for `status` (pure): its own, unless its node is gone
/// (`node_exists` false) or it was not refreshed for [`STALE_AFTER`] by `now`.
pub fn shown_state(
    status: &NodeStatus,
    now: k8s_openapi::jiff::Timestamp,
    node_exists: bool,
) -> String {
    if !node_exists {
        return "gone (the node no longer exists)".to_owned();
    }
    let age = status
        .refreshed
        .as_deref()
        .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
        .map(|t| now.duration_since(t).unsigned_abs());
    match age {
        Some(age) if age <= STALE_AFTER => status.state.as_str().to_owned(),
        Some(age) => format!(
            "stale ({} for {} s: no agent refreshed it)",
            status.state.as_str(),
            age.as_secs()
        ),
        None => format!("stale ({}, never refreshed)", status.state.as_str()),
    }
}

/// The agent's DaemonSet, asked at exit whether the datapath stays
/// (`super::owner`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// `apps/v1` kind.
    pub kind: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
}

/// The ConfigMap for `status` in `namespace` (pure), owned by its Node (UID
/// `node_uid`, where known) so that it goes with the node.
pub fn to_config_map(status: &NodeStatus, namespace: &str, node_uid: Option<&str>) -> ConfigMap {
    let data: BTreeMap<String, String> = [
        ("node", status.node.clone()),
        ("state", status.state.as_str().to_owned()),
        ("reason", status.reason.clone()),
        ("kernel", status.kernel.clone()),
        ("guarantees", status.guarantees.join(",")),
        ("without", status.without.join(",")),
        ("failed_checks", status.failed_checks.join(",")),
        ("version", status.version.clone()),
        ("refreshed", status.refreshed.clone().unwrap_or_default()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let mut v = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": object_name(&status.node),
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/name": "bypass-agent",
                "app.kubernetes.io/component": COMPONENT,
                STATE_LABEL: status.state.as_str(),
            },
        },
        "data": data,
    });
    if let Some(uid) = node_uid {
        v["metadata"]["ownerReferences"] = serde_json::json!([{
            "apiVersion": "v1",
            "kind": "Node",
            "name": status.node,
            "uid": uid,
        }]);
    }
    serde_json::from_value(v).unwrap_or_default()
}

/// A node status read back from its ConfigMap (pure); `None` if it is not one.
pub fn from_config_map(cm: &ConfigMap) -> Option<NodeStatus> {
    let d = cm.data.as_ref()?;
    let get = |k: &str| d.get(k).cloned().unwrap_or_default();
    let list = |k: &str| -> Vec<String> {
        get(k)
            .split(',')
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let state = serde_json::from_value(serde_json::Value::String(get("state"))).ok()?;
    Some(NodeStatus {
        node: get("node"),
        state,
        reason: get("reason"),
        kernel: get("kernel"),
        guarantees: list("guarantees"),
        without: list("without"),
        failed_checks: list("failed_checks"),
        version: get("version"),
        refreshed: Some(get("refreshed")).filter(|r| !r.is_empty()),
    })
}

/// The cluster-wide table (pure): one row per node, sorted by node, each with the
/// state [`shown_state`] gives at `now` given the cluster's nodes (`None`: not known).
pub fn render_table(
    mut nodes: Vec<NodeStatus>,
    now: k8s_openapi::jiff::Timestamp,
    existing: Option<&[String]>,
) -> String {
    nodes.sort_by(|a, b| a.node.cmp(&b.node));
    let mut rows = vec![[
        "NODE".to_owned(),
        "STATE".to_owned(),
        "KERNEL".to_owned(),
        "GUARANTEES".to_owned(),
        "WITHOUT".to_owned(),
        "FAILED_CHECKS".to_owned(),
        "REASON".to_owned(),
    ]];
    for n in nodes {
        let dash = |v: String| if v.is_empty() { "-".to_owned() } else { v };
        let exists = existing.is_none_or(|e| e.contains(&n.node));
        let state = shown_state(&n, now, exists);
        rows.push([
            n.node,
            state,
            dash(n.kernel),
            dash(n.guarantees.join(",")),
            dash(n.without.join(",")),
            dash(n.failed_checks.join(",")),
            dash(n.reason),
        ]);
    }
    let widths: Vec<usize> = (0..7)
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    rows.iter()
        .map(|r| {
            let mut line = String::new();
            for (i, cell) in r.iter().enumerate() {
                if i == 6 {
                    line.push_str(cell);
                } else {
                    line.push_str(&format!("{cell:<w$}  ", w = widths[i]));
                }
            }
            line.trim_end().to_owned() + "\n"
        })
        .collect()
}

/// Writes `status` (server-side apply, so a restarted agent updates its node's object).
pub async fn publish(
    client: &Client,
    namespace: &str,
    status: &NodeStatus,
    node_uid: Option<&str>,
) -> Result<(), AgentError> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let cm = to_config_map(status, namespace, node_uid);
    api.patch(
        &object_name(&status.node),
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&cm),
    )
    .await
    .map(drop)
    .map_err(|e| AgentError::Api {
        action: format!(
            "publish node status {}/{}",
            namespace,
            object_name(&status.node)
        ),
        detail: chain(&e),
        source: Box::new(e),
    })
}

/// Deletes node `node`'s status object (gone already is done).
pub async fn remove(client: &Client, namespace: &str, node: &str) -> Result<(), AgentError> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    match api
        .delete(&object_name(node), &kube::api::DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(AgentError::Api {
            action: format!("delete node status {namespace}/{}", object_name(node)),
            detail: chain(&e),
            source: Box::new(e),
        }),
    }
}

/// Every node's status in `namespace`.
pub async fn list(client: &Client, namespace: &str) -> Result<Vec<NodeStatus>, AgentError> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let lp = ListParams::default().labels(&format!("app.kubernetes.io/component={COMPONENT}"));
    let cms = api.list(&lp).await.map_err(|e| AgentError::Api {
        action: format!("list node status in namespace {namespace}"),
        detail: chain(&e),
        source: Box::new(e),
    })?;
    Ok(cms.items.iter().filter_map(from_config_map).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(node: &str, state: State) -> NodeStatus {
        NodeStatus {
            node: node.into(),
            state,
            reason: if state == State::Refused {
                "kernel 5.10 lacks what the datapath needs".into()
            } else {
                String::new()
            },
            kernel: "6.1.0".into(),
            guarantees: vec!["receive_options".into(), "ulp_guard".into()],
            without: vec!["queue_bound".into()],
            failed_checks: if state == State::Refused {
                vec!["fionread_tcp".into()]
            } else {
                Vec::new()
            },
            version: "0.1.0".into(),
            refreshed: Some("2026-11-29T04:00:00Z".into()),
        }
    }

    #[test]
    fn a_status_not_refreshed_or_of_a_gone_node_is_not_shown_as_bypassing() {
        let s = sample("n1", State::Bypassing);
        let at = |t: &str| t.parse::<k8s_openapi::jiff::Timestamp>().unwrap();
        assert_eq!(
            shown_state(&s, at("2026-11-29T04:04:00Z"), true),
            "bypassing"
        );
        let stale = shown_state(&s, at("2026-11-29T04:10:00Z"), true);
        assert!(stale.starts_with("stale (bypassing for 600 s"), "{stale}");
        assert!(shown_state(&s, at("2026-11-29T04:01:00Z"), false).starts_with("gone"));
        let never = NodeStatus {
            refreshed: None,
            ..s.clone()
        };
        assert!(shown_state(&never, at("2026-11-29T04:01:00Z"), true).starts_with("stale"));
        // Written at another time, it says the same.
        assert!(same_content(&s, &never));
        let table = render_table(
            vec![s, sample("n2", State::Off)],
            at("2026-11-29T04:01:00Z"),
            Some(&["n2".to_owned()]),
        );
        assert!(table.contains("gone"), "{table}");
        assert!(
            table
                .lines()
                .any(|l| l.starts_with("n2") && l.contains(" off ")),
            "{table}"
        );
    }

    #[test]
    fn round_trips_through_its_config_map() {
        let s = sample("node-a", State::Bypassing);
        let cm = to_config_map(&s, "bypass-system", Some("u-1"));
        assert_eq!(cm.metadata.name.as_deref(), Some("bypass-node-node-a"));
        let labels = cm.metadata.labels.clone().unwrap();
        assert_eq!(labels[STATE_LABEL], "bypassing");
        assert_eq!(labels["app.kubernetes.io/component"], COMPONENT);
        let refs = cm.metadata.owner_references.clone().unwrap();
        assert_eq!(
            (
                refs[0].api_version.as_str(),
                refs[0].kind.as_str(),
                refs[0].name.as_str(),
                refs[0].uid.as_str()
            ),
            ("v1", "Node", "node-a", "u-1")
        );
        assert_eq!(from_config_map(&cm), Some(s));
        assert!(from_config_map(&ConfigMap::default()).is_none());
    }

    #[test]
    fn the_cluster_table_names_refusals_and_guarantees() {
        let t = render_table(
            vec![
                sample("node-b", State::Refused),
                sample("node-a", State::Bypassing),
            ],
            "2026-11-29T04:01:00Z".parse().unwrap(),
            None,
        );
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("NODE"), "{t}");
        assert!(
            lines[1].starts_with("node-a") && lines[1].contains("bypassing"),
            "{t}"
        );
        assert!(lines[1].contains("receive_options,ulp_guard") && lines[1].contains("queue_bound"));
        assert!(
            lines[2].contains("refused")
                && lines[2].contains("lacks what")
                && lines[2].contains("fionread_tcp"),
            "{t}"
        );
    }
}
