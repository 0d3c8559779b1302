//! A mock API server for the Kubernetes side's tests, as kube-rs controller-rs does it
//! (`src/fixtures.rs`): a `tower_test` mock service behind a real [`kube::Client`], so
//! the agent's own watchers, reflectors and requests run unchanged, without a server.
//! [`ApiServer`] answers lists from the objects a test gives and holds watches open
//! without an event; a request it does not expect (another path, a missing selector) is
//! answered 400 and reported to the test, which fails on it.

use std::collections::BTreeMap;

use hyper::{Method, Request, Response, StatusCode};
use kube::{Client, client::Body};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tower_test::mock::{self, Handle};

/// A client on a bare mock service, and the handle that sees its requests and answers
/// them, for a test that expects a fixed sequence.
pub(super) fn mock_client() -> (Client, Handle<Request<Body>, Response<Body>>) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    (Client::new(service, "default"), handle)
}

/// A response with `body` as JSON.
pub(super) fn json_response(status: u16, body: &Value) -> Response<Body> {
    let mut response = Response::new(Body::from(body.to_string().into_bytes()));
    *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
    response
}

/// A failure as the API server sends it: a `Status` object with the code.
pub(super) fn status_response(code: u16) -> Response<Body> {
    let reason = match code {
        403 => "Forbidden",
        404 => "NotFound",
        _ => "BadRequest",
    };
    json_response(
        code,
        &json!({
            "apiVersion": "v1",
            "kind": "Status",
            "status": "Failure",
            "message": format!("{reason} (mock API server)"),
            "reason": reason,
            "code": code,
        }),
    )
}

/// How [`ApiServer`] answers a list of one path.
pub(super) enum Answer {
    /// These objects, at resourceVersion 1.
    List(Vec<Value>),
    /// A failure with this code.
    Status(u16),
}

struct Route {
    /// `key=value` pairs (URL-encoded) every request of the path must carry.
    query: Vec<&'static str>,
    answer: Answer,
}

/// A mock API server that knows a few paths.
#[derive(Default)]
pub(super) struct ApiServer {
    routes: BTreeMap<&'static str, Route>,
}

impl ApiServer {
    /// Answers a list of `path` with `answer` and holds a watch of it open, if the
    /// request's query has each pair of `query` (URL-encoded, e.g.
    /// `fieldSelector=spec.nodeName%3Dnode-a`).
    pub(super) fn route(
        mut self,
        path: &'static str,
        query: &[&'static str],
        answer: Answer,
    ) -> Self {
        self.routes.insert(
            path,
            Route {
                query: query.to_vec(),
                answer,
            },
        );
        self
    }

    /// Serves until the client is gone. Returns the client, and where each unexpected
    /// request (`METHOD URI`) is reported.
    pub(super) fn start(self) -> (Client, mpsc::UnboundedReceiver<String>) {
        let (client, mut handle) = mock_client();
        let (unexpected, reported) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            // Watches answered by nothing: they stay open, as a quiet API server's do.
            let mut held = Vec::new();
            while let Some((request, send)) = handle.next_request().await {
                let uri = request.uri();
                let pairs: Vec<&str> = uri.query().unwrap_or("").split('&').collect();
                let route = self
                    .routes
                    .get(uri.path())
                    .filter(|_| request.method() == Method::GET)
                    .filter(|r| r.query.iter().all(|q| pairs.contains(q)));
                match route {
                    None => {
                        let _ = unexpected.send(format!("{} {uri}", request.method()));
                        send.send_response(status_response(400));
                    }
                    Some(_) if pairs.contains(&"watch=true") => held.push(send),
                    Some(Route {
                        answer: Answer::List(items),
                        ..
                    }) => send.send_response(json_response(
                        200,
                        &json!({
                            "apiVersion": "v1",
                            "kind": "List",
                            "metadata": { "resourceVersion": "1" },
                            "items": items,
                        }),
                    )),
                    Some(Route {
                        answer: Answer::Status(code),
                        ..
                    }) => send.send_response(status_response(*code)),
                }
            }
        });
        (client, reported)
    }
}
