//! `run --node-name`: the agent as a Kubernetes node agent. Pod CIDRs come from the
//! Node, pod addresses from the Pods scheduled on it, the on/off switch from a Node
//! label; the watchers only feed the pure core (`sync`, `toggle`).
//!
//! `client` connects and checks at start; `watch` turns API events into stores,
//! `reconcile` makes the datapath match them, `controller` is the loop that joins the
//! two, `pace` says when it runs a pass; `node_status` publishes what the node does,
//! `owner` asks at exit whether the DaemonSet is gone.

pub mod client;
mod controller;
#[cfg(test)]
mod fixtures;
pub mod node_status;
pub mod owner;
mod pace;
mod reconcile;
mod watch;

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use tracing::{error, info, warn};

use crate::{
    datapath::{self, Datapath, PinLayout, Refusal, RefusalKind},
    error::AgentError,
    metrics::{self, Telemetry},
    runtime,
    sync::Statics,
};

/// What the Kubernetes agent needs besides the datapath configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    /// This node's name.
    pub node: String,
    /// A kubeconfig file; `None` means the pod's service account (in-cluster).
    pub kubeconfig: Option<PathBuf>,
    /// Node label key that turns the bypass on (`true`) and off (`false`).
    pub node_label: String,
    /// What an absent label means.
    pub default_enabled: bool,
    /// Pod annotation key that opts a pod out (`"true"`).
    pub exclude_annotation: String,
    /// Namespace label key that opts a namespace's pods out (`"true"`).
    pub exclude_namespace_label: String,
    /// Namespace label key that, when given, is the only way in (`"true"`).
    pub include_namespace_label: Option<String>,
    /// Addresses for `/metrics`, `/healthz`, `/readyz` (the node's, IPv4 and IPv6).
    pub metrics_addrs: Vec<SocketAddr>,
    /// Period of the full reconcile pass that repairs drift.
    pub resync: Duration,
    /// This agent's pod and namespace (downward API), when it runs in one: its node's
    /// status is published there, and its DaemonSet asked about at exit.
    pub pod: Option<PodRef>,
}

/// The agent's own pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    /// Namespace (`POD_NAMESPACE`).
    pub namespace: String,
    /// Name (`POD_NAME`).
    pub name: String,
}

/// How long a publish of the node's status may take before the pass goes on without it
/// (retried on the next pass).
const PUBLISH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Where the node's status goes, and the UID of the Node that owns it.
pub struct Publisher {
    client: kube::Client,
    namespace: String,
    node_uid: Option<String>,
    last: Option<node_status::NodeStatus>,
    /// When `last` was written.
    published: Option<std::time::Instant>,
    warned: bool,
}

impl Publisher {
    /// The owner's UID as the node watch sees it now: a node registered again (a new
    /// UID) gets its status written again at once, owned by the new object.
    pub fn set_node_uid(&mut self, uid: Option<String>) {
        if uid.is_some() && uid != self.node_uid {
            self.node_uid = uid;
            self.published = None;
        }
    }

    /// Publishes `status` unless it is what was published last; failures are logged
    /// once and retried on the next pass.
    pub async fn update(&mut self, mut status: node_status::NodeStatus) {
        let fresh = self
            .published
            .is_some_and(|t| t.elapsed() < node_status::REFRESH);
        if fresh
            && self
                .last
                .as_ref()
                .is_some_and(|l| node_status::same_content(l, &status))
        {
            return;
        }
        status.refreshed = Some(k8s_openapi::jiff::Timestamp::now().to_string());
        // The pass that cuts waits for this: an API server that stops answering without
        // closing the connection must not hold it (the client sets no read timeout).
        let published = tokio::time::timeout(
            PUBLISH_TIMEOUT,
            node_status::publish(
                &self.client,
                &self.namespace,
                &status,
                self.node_uid.as_deref(),
            ),
        )
        .await
        .unwrap_or_else(|_| {
            Err(AgentError::System {
                action: "publish the node status",
                source: std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("the API server did not answer within {PUBLISH_TIMEOUT:?}"),
                ),
            })
        });
        match published {
            Ok(()) => {
                if !self
                    .last
                    .as_ref()
                    .is_some_and(|l| node_status::same_content(l, &status))
                {
                    info!(state = status.state.as_str(), "node status published");
                }
                self.published = Some(std::time::Instant::now());
                self.last = Some(status);
                self.warned = false;
            }
            Err(e) if !self.warned => {
                self.warned = true;
                warn!(error = %e, "node status not published; retrying on the next pass");
            }
            Err(_) => {}
        }
    }
}

/// The status of a node whose datapath is loaded (pure apart from the kernel release).
pub fn loaded_status(
    node: &str,
    attached: bool,
    refused: Option<&str>,
    features: &bypass_common::status::Features,
    checks: bypass_common::checks::Results,
    why_off: &str,
) -> node_status::NodeStatus {
    let list = features.list();
    node_status::NodeStatus {
        node: node.to_owned(),
        state: match (refused, attached) {
            (Some(_), _) => node_status::State::Refused,
            (None, true) => node_status::State::Bypassing,
            (None, false) => node_status::State::Off,
        },
        reason: match (refused, attached) {
            (Some(why), _) => why.to_owned(),
            (None, true) => String::new(),
            (None, false) => why_off.to_owned(),
        },
        kernel: datapath::kernel_release(),
        guarantees: list
            .iter()
            .filter(|(_, on)| *on)
            .map(|(n, _)| (*n).to_owned())
            .collect(),
        without: list
            .iter()
            .filter(|(_, on)| !*on)
            .map(|(n, _)| (*n).to_owned())
            .collect(),
        failed_checks: checks.failed().map(|c| c.name.to_owned()).collect(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        refreshed: None,
    }
}

/// Runs the Kubernetes agent until SIGINT or SIGTERM.
pub fn run(
    settings: Settings,
    config: datapath::Config,
    statics: Statics,
) -> Result<(), AgentError> {
    runtime::current_thread()?.block_on(run_async(settings, config, statics))
}

async fn run_async(
    settings: Settings,
    config: datapath::Config,
    statics: Statics,
) -> Result<(), AgentError> {
    let shutdown = runtime::signals().await?;
    futures::pin_mut!(shutdown);
    // Configuration problems first: they need a person, not a retry.
    let client = client::connect(settings.kubeconfig.as_deref()).await?;
    let telemetry = Arc::new(Telemetry::new(PinLayout::new(&config.pin_dir)));
    for addr in &settings.metrics_addrs {
        metrics::serve(*addr, telemetry.clone());
    }

    let mut attempt = 0;
    loop {
        match client::preflight(&client, &settings.node).await? {
            client::Preflight::Ok => break,
            client::Preflight::Retry(why) => {
                let delay = client::retry_delay(attempt);
                warn!(error = %why, retry_in = ?delay, "the API server does not answer; retrying");
                attempt += 1;
                tokio::select! {
                    signal = &mut shutdown => {
                        info!(signal, "stopping before the datapath was loaded");
                        return Ok(());
                    }
                    () = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
    info!(node = %settings.node, "node found; get, list and watch allowed");

    // The DaemonSet this agent belongs to: the owner of its node status, and what is
    // asked at exit whether the datapath stays.
    let owner = match &settings.pod {
        Some(p) => owner::find(&client, &p.namespace, &p.name).await,
        None => None,
    };
    let allowed_at_start = match (&settings.pod, &owner) {
        (Some(p), Some(o)) => matches!(
            owner::check(&client, &p.namespace, o).await,
            owner::OwnerCheck::Present { .. }
        ),
        _ => false,
    };
    let node_uid = kube::Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .get(&settings.node)
        .await
        .ok()
        .and_then(|n| n.metadata.uid);
    let mut publisher = settings.pod.as_ref().map(|p| Publisher {
        client: client.clone(),
        namespace: p.namespace.clone(),
        node_uid,
        last: None,
        published: None,
        warned: false,
    });

    let mut dp = match Datapath::load(&config) {
        Ok(dp) => dp,
        Err(e @ AgentError::KernelLacks { .. }) => {
            // Report and idle: a node that cannot run the datapath must not crash-loop.
            error!(error = %e, "this node's kernel cannot run the datapath: idling (nothing loaded)");
            if let Some(p) = publisher.as_mut() {
                p.update(node_status::NodeStatus {
                    node: settings.node.clone(),
                    state: node_status::State::Refused,
                    reason: e.to_string(),
                    kernel: datapath::kernel_release(),
                    guarantees: Vec::new(),
                    without: Vec::new(),
                    failed_checks: Vec::new(),
                    version: env!("CARGO_PKG_VERSION").to_owned(),
                    refreshed: None,
                })
                .await;
            }
            telemetry.refused(&Refusal::new(RefusalKind::KernelFeatures, e.to_string()));
            telemetry.health.set_synced(true);
            telemetry.health.set_settled(true);
            let signal = (&mut shutdown).await;
            info!(signal, "stopping (idle: the kernel was refused)");
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    if let Some(refusal) = dp.refused() {
        telemetry.refused(refusal);
    }
    telemetry.health.set_settled(false);
    let signal = controller::run(
        client.clone(),
        &settings,
        statics,
        &mut dp,
        telemetry,
        publisher.as_mut(),
        &mut shutdown,
    )
    .await?;
    match dp.counters() {
        Ok(counters) => info!(signal, sockets = dp.socket_count(), ?counters, "stopping"),
        Err(e) => warn!(signal, error = %e, "stopping"),
    }
    if let (Some(p), Some(o)) = (&settings.pod, &owner) {
        let check = owner::check(&client, &p.namespace, o).await;
        let action = owner::on_exit(&check, allowed_at_start);
        info!(daemonset = %o.name, ?check, ?action, "asked whether the DaemonSet is still there");
        if action == owner::ExitAction::Remove {
            info!(
                "the DaemonSet is gone: removing the datapath from this node (bypassed connections continue by TCP)"
            );
            dp.remove_on_exit();
        }
    }
    drop(dp);
    Ok(())
}

#[cfg(test)]
mod tests {
    use hyper::{Method, header::CONTENT_TYPE};

    use super::{
        fixtures::{json_response, mock_client, status_response},
        node_status::{NodeStatus, State},
        *,
    };

    fn status(state: State) -> NodeStatus {
        NodeStatus {
            node: "node-a".into(),
            state,
            reason: String::new(),
            kernel: "6.1.0".into(),
            guarantees: vec!["ulp_guard".into()],
            without: Vec::new(),
            failed_checks: Vec::new(),
            version: "0.1.0".into(),
            refreshed: None,
        }
    }

    /// The node status goes out by server-side apply, owned by its Node; each change
    /// once, a failed write again on the next pass, and again when the Node's UID
    /// changes (registered again).
    #[tokio::test]
    async fn the_node_status_is_applied_once_per_change_and_retried_after_a_failure() {
        let (client, mut handle) = mock_client();
        let api_server = tokio::spawn(async move {
            let mut states = Vec::new();
            for (code, uid) in [(500, "u-1"), (200, "u-1"), (200, "u-1"), (200, "u-2")] {
                let (request, send) = handle.next_request().await.expect("a request");
                assert_eq!(request.method(), Method::PATCH);
                assert_eq!(
                    request.uri().path(),
                    "/api/v1/namespaces/bypass-system/configmaps/bypass-node-node-a"
                );
                let query: Vec<&str> = request.uri().query().unwrap_or("").split('&').collect();
                assert!(
                    query.contains(&"fieldManager=bypass-agent") && query.contains(&"force=true"),
                    "{query:?}"
                );
                assert_eq!(
                    request.headers()[CONTENT_TYPE],
                    "application/apply-patch+yaml"
                );
                let body: serde_json::Value =
                    serde_json::from_slice(&request.into_body().collect_bytes().await.unwrap())
                        .unwrap();
                let owner = &body["metadata"]["ownerReferences"][0];
                assert_eq!(
                    (&owner["kind"], &owner["name"], &owner["uid"]),
                    (&"Node".into(), &"node-a".into(), &uid.into())
                );
                assert_eq!(
                    body["metadata"]["labels"]["bypass.dev/state"],
                    body["data"]["state"]
                );
                // Each write says when it was made.
                let refreshed = body["data"]["refreshed"].as_str().unwrap_or_default();
                assert!(
                    refreshed.parse::<k8s_openapi::jiff::Timestamp>().is_ok(),
                    "refreshed {refreshed:?}"
                );
                states.push(body["data"]["state"].as_str().unwrap().to_owned());
                send.send_response(if code == 200 {
                    json_response(200, &body)
                } else {
                    status_response(code)
                });
            }
            // Nothing more until the agent lets go of its client.
            assert!(handle.next_request().await.is_none(), "a write too many");
            states
        });
        let mut publisher = Publisher {
            client,
            namespace: "bypass-system".into(),
            node_uid: Some("u-1".into()),
            last: None,
            published: None,
            warned: false,
        };
        publisher.update(status(State::Bypassing)).await; // 500
        publisher.update(status(State::Bypassing)).await; // retried
        publisher.update(status(State::Bypassing)).await; // unchanged: not written
        publisher.update(status(State::Off)).await;
        publisher.set_node_uid(Some("u-1".into())); // the same node: nothing
        publisher.update(status(State::Off)).await;
        publisher.set_node_uid(Some("u-2".into())); // registered again
        publisher.update(status(State::Off)).await;
        drop(publisher);
        assert_eq!(
            api_server.await.unwrap(),
            ["bypassing", "bypassing", "off", "off"]
        );
    }
}
