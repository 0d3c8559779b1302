//! The API client: configuration (kubeconfig or in-cluster), and the checks made once
//! at start so that a wrong node name, unreadable credentials or missing RBAC stop the
//! agent with a message that names the fix instead of a silent, empty watch.

use std::{path::Path, time::Duration};

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::{
    Api, Client, Config,
    api::{ListParams, WatchParams},
    config::{KubeConfigOptions, Kubeconfig},
};

use crate::error::{AgentError, chain};

/// What a failed API call means for the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The API server could not be reached or did not answer: retry later.
    Transient(String),
    /// 404.
    NotFound(String),
    /// 403: RBAC.
    Forbidden(String),
    /// 401: credentials.
    Unauthorized(String),
    /// Anything else the API server answered.
    Other(String),
}

/// Classifies a client error (pure).
pub fn classify(err: &kube::Error) -> Failure {
    match err {
        kube::Error::Api(status) => {
            let msg = if status.message.is_empty() {
                status.reason.clone()
            } else {
                status.message.clone()
            };
            match status.code {
                401 => Failure::Unauthorized(msg),
                403 => Failure::Forbidden(msg),
                404 => Failure::NotFound(msg),
                429 | 500..=599 => Failure::Transient(msg),
                _ => Failure::Other(msg),
            }
        }
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => {
            Failure::Transient(chain(err))
        }
        _ => Failure::Other(chain(err)),
    }
}

/// Builds the client from a kubeconfig file, or from the pod's service account when
/// none is given.
pub async fn connect(kubeconfig: Option<&Path>) -> Result<Client, AgentError> {
    let mut config = match kubeconfig {
        Some(path) => {
            let bad = |source| AgentError::Kubeconfig {
                path: path.to_path_buf(),
                source,
            };
            let kc = Kubeconfig::read_from(path).map_err(bad)?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(bad)?
        }
        None => Config::incluster().map_err(|source| AgentError::NoKubeConfig { source })?,
    };
    // An absent API server should show within seconds, not after the default 30 s.
    config.connect_timeout = Some(Duration::from_secs(5));
    Client::try_from(config).map_err(|e| AgentError::Api {
        action: "build the API client".into(),
        detail: chain(&e),
        source: Box::new(e),
    })
}

/// Turns a failed start-up call into the agent's error; a transient one is given back.
fn fatal(
    err: kube::Error,
    verb: &'static str,
    resource: &'static str,
    node: &str,
) -> Result<AgentError, kube::Error> {
    let source = |err| -> crate::error::BoxError { Box::new(err) };
    Ok(match classify(&err) {
        Failure::Transient(_) => return Err(err),
        Failure::NotFound(_) if resource == "nodes" => AgentError::NodeNotFound {
            node: node.to_owned(),
        },
        Failure::Forbidden(detail) => AgentError::Forbidden {
            verb,
            resource,
            detail,
            source: source(err),
        },
        Failure::Unauthorized(detail) => AgentError::Unauthorized {
            detail,
            source: source(err),
        },
        Failure::NotFound(detail) | Failure::Other(detail) => AgentError::Api {
            action: format!("{verb} {resource}"),
            detail,
            source: source(err),
        },
    })
}

/// Result of one start-up check round.
#[derive(Debug)]
pub enum Preflight {
    /// Everything the agent needs is allowed and the node exists.
    Ok,
    /// The API server did not answer; the message says what failed.
    Retry(String),
}

/// How long to wait between start-up checks while the API server does not answer (and
/// between probes of an API the agent can do without).
pub fn retry_delay(attempt: u32) -> Duration {
    Duration::from_millis(500u64.saturating_mul(1 << attempt.min(6))).min(Duration::from_secs(30))
}

/// Checks that the node exists and that the agent may get, list and watch what it
/// needs. A definite answer (404, 403, 401) is an error; no answer is [`Preflight::Retry`].
pub async fn preflight(client: &Client, node: &str) -> Result<Preflight, AgentError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::all(client.clone());
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let node_field = format!("metadata.name={node}");
    let pod_field = format!("spec.nodeName={node}");

    macro_rules! check {
        ($call:expr, $verb:literal, $resource:literal) => {
            match $call.await {
                Ok(_) => {}
                Err(e) => {
                    return match fatal(e, $verb, $resource, node) {
                        Ok(err) => Err(err),
                        Err(e) => Ok(Preflight::Retry(format!(
                            "{} {}: {}",
                            $verb,
                            $resource,
                            chain(&e)
                        ))),
                    };
                }
            }
        };
    }
    check!(nodes.get(node), "get", "nodes");
    check!(
        nodes.list(&ListParams::default().fields(&node_field)),
        "list",
        "nodes"
    );
    check!(
        pods.list(&ListParams::default().fields(&pod_field).limit(1)),
        "list",
        "pods"
    );
    check!(
        namespaces.list(&ListParams::default().limit(1)),
        "list",
        "namespaces"
    );
    // A watch that is refused fails on the response head, before any event: drop it
    // as soon as it is accepted.
    let wp = |fields: &str| WatchParams::default().fields(fields).timeout(1);
    check!(nodes.watch(&wp(&node_field), "0"), "watch", "nodes");
    check!(pods.watch(&wp(&pod_field), "0"), "watch", "pods");
    check!(
        namespaces.watch(&WatchParams::default().timeout(1), "0"),
        "watch",
        "namespaces"
    );
    Ok(Preflight::Ok)
}

#[cfg(test)]
mod tests {
    use kube::core::Status;

    use super::*;

    fn api(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(Status::failure(message, "Reason").with_code(code).boxed())
    }

    #[test]
    fn classifies_api_answers() {
        assert_eq!(
            classify(&api(403, "nope")),
            Failure::Forbidden("nope".into())
        );
        assert_eq!(
            classify(&api(401, "who")),
            Failure::Unauthorized("who".into())
        );
        assert_eq!(
            classify(&api(404, "gone")),
            Failure::NotFound("gone".into())
        );
        assert_eq!(
            classify(&api(503, "busy")),
            Failure::Transient("busy".into())
        );
        assert_eq!(
            classify(&api(429, "slow")),
            Failure::Transient("slow".into())
        );
        assert_eq!(classify(&api(422, "bad")), Failure::Other("bad".into()));
        assert_eq!(classify(&api(403, "")), Failure::Forbidden("Reason".into()));
    }

    #[test]
    fn retry_delay_grows_and_caps() {
        assert_eq!(retry_delay(0), Duration::from_millis(500));
        assert_eq!(retry_delay(1), Duration::from_secs(1));
        assert_eq!(retry_delay(5), Duration::from_secs(16));
        assert_eq!(retry_delay(6), Duration::from_secs(30));
        assert_eq!(retry_delay(60), Duration::from_secs(30));
    }

    #[test]
    fn start_up_errors_name_the_fix() {
        let e = fatal(api(404, "nodes \"x\" not found"), "get", "nodes", "x").unwrap();
        assert!(matches!(e, AgentError::NodeNotFound { .. }));
        assert!(e.to_string().contains("--node-name"), "{e}");
        let e = fatal(api(403, "forbidden"), "watch", "pods", "x").unwrap();
        let msg = e.to_string();
        assert!(
            msg.contains("watch") && msg.contains("pods") && msg.contains("rbac"),
            "{msg}"
        );
        let e = fatal(api(401, "Unauthorized"), "get", "nodes", "x").unwrap();
        assert!(matches!(e, AgentError::Unauthorized { .. }));
        let io = kube::Error::ReadEvents(std::io::Error::other("reset"));
        assert!(fatal(io, "get", "nodes", "x").is_err());
    }
}
