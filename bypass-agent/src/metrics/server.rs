//! The HTTP/1 server of `/metrics`, `/healthz` and `/readyz`.

use std::{convert::Infallible, net::SocketAddr, sync::Arc, time::Duration};

use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, body::Bytes, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use tracing::{debug, info, warn};

use super::Telemetry;
use crate::error::AgentError;

/// Serves `/metrics`, `/healthz` and `/readyz` on `addr`, on a thread of its own with
/// its own runtime, until the agent exits: whatever its clients do (any pod can reach a
/// port on the node's address), they never take the thread that reconciles and cuts.
/// A failed bind (the port taken by another program on the node) does not stop the
/// agent: the datapath does not depend on it. It is logged and retried every [`RETRY`]
/// until it succeeds; until then the probes of a DaemonSet fail and say so.
pub fn serve(addr: SocketAddr, telemetry: Arc<Telemetry>) {
    let spawned = std::thread::Builder::new()
        .name(format!("metrics {addr}"))
        .spawn(move || match crate::runtime::current_thread() {
            Ok(rt) => rt.block_on(bind_then_serve(addr, telemetry)),
            Err(e) => warn!(error = %e, %addr, "metrics not served"),
        });
    if let Err(e) = spawned {
        warn!(error = %e, %addr, "metrics not served: no thread for them");
    }
}

/// How often a failed bind is retried.
pub const RETRY: Duration = Duration::from_secs(5);

/// At most this many connections are served at once. The others wait in the listening
/// socket's backlog, in the kernel: a pod that opens thousands of connections to the
/// port takes none of the agent's file descriptors or memory beyond these.
pub const MAX_CONNECTIONS: usize = 16;

/// A connection's next request head must arrive within this, or it is closed.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection is closed after this long, whatever it does (a scraper that keeps its
/// connection alive opens another), so that held connections cannot keep
/// [`MAX_CONNECTIONS`] from the scrapers for good.
const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);

async fn bind_then_serve(addr: SocketAddr, telemetry: Arc<Telemetry>) {
    let mut warned = false;
    let listener = loop {
        match bind(addr).await {
            Ok(l) => break l,
            Err(e) => {
                if !warned {
                    warn!(error = %e, retry_in = ?RETRY,
                        "metrics not served for now; the datapath runs without them");
                    warned = true;
                }
                tokio::time::sleep(RETRY).await;
            }
        }
    };
    accept_loop(listener, telemetry).await;
}

async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, AgentError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| AgentError::MetricsBind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| AgentError::MetricsBind { addr, source })?;
    info!(addr = %bound, "serving /metrics, /healthz, /readyz");
    Ok(listener)
}

async fn accept_loop(listener: tokio::net::TcpListener, telemetry: Arc<Telemetry>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        // A slot before the accept: beyond MAX_CONNECTIONS, connections stay queued.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                warn!(error = %e, "metrics accept");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let t = telemetry.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let svc = service_fn(move |req| {
                let t = t.clone();
                async move { Ok::<_, Infallible>(respond(&req, &t)) }
            });
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT);
            let conn = http.serve_connection(TokioIo::new(stream), svc);
            match tokio::time::timeout(CONNECTION_LIFETIME, conn).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => debug!(error = %e, "metrics connection"),
                Err(_) => debug!("metrics connection closed at the end of its lifetime"),
            }
        });
    }
}

/// The response to one request (pure apart from reading the pins for `/metrics`).
fn respond<B>(req: &Request<B>, t: &Telemetry) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, content_type: &str, body: String| {
        let mut resp = Response::new(Full::new(Bytes::from(body)));
        *resp.status_mut() = status;
        if let Ok(v) = content_type.parse() {
            resp.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
        }
        resp
    };
    const TEXT: &str = "text/plain; charset=utf-8";
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(StatusCode::METHOD_NOT_ALLOWED, TEXT, "GET only\n".into());
    }
    match req.uri().path() {
        "/metrics" => match t.encode() {
            Ok(body) => reply(
                StatusCode::OK,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                body,
            ),
            Err(_) => reply(
                StatusCode::INTERNAL_SERVER_ERROR,
                TEXT,
                "encoding failed\n".into(),
            ),
        },
        "/healthz" => reply(StatusCode::OK, TEXT, "ok\n".into()),
        "/readyz" => {
            if t.health.ready() {
                reply(StatusCode::OK, TEXT, "ready\n".into())
            } else {
                reply(
                    StatusCode::SERVICE_UNAVAILABLE,
                    TEXT,
                    format!("not ready: {}\n", t.health.describe()),
                )
            }
        }
        _ => reply(
            StatusCode::NOT_FOUND,
            TEXT,
            "try /metrics, /healthz or /readyz\n".into(),
        ),
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::{datapath::PinLayout, metrics::ErrorKind};

    fn telemetry() -> Telemetry {
        Telemetry::new(PinLayout::new(std::path::Path::new(
            "/nonexistent/bypass-test",
        )))
    }

    fn get(t: &Telemetry, path: &str) -> (StatusCode, String) {
        let req = Request::builder().uri(path).body(()).unwrap();
        let resp = respond(&req, t);
        let status = resp.status();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let body = rt
            .block_on(http_body_util::BodyExt::collect(resp.into_body()))
            .unwrap()
            .to_bytes();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[test]
    fn build_info_names_the_version() {
        let (_, body) = get(&telemetry(), "/metrics");
        assert!(
            body.contains(&format!(
                "bypass_build_info{{version=\"{}\"}} 1",
                env!("CARGO_PKG_VERSION")
            )),
            "{body}"
        );
    }

    #[test]
    fn readiness_follows_sync_and_settle() {
        let t = telemetry();
        assert_eq!(get(&t, "/readyz").0, StatusCode::SERVICE_UNAVAILABLE);
        t.health.set_synced(true);
        let (status, body) = get(&t, "/readyz");
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("datapath_settled=false"), "{body}");
        t.health.set_settled(true);
        assert_eq!(get(&t, "/readyz").0, StatusCode::OK);
        assert_eq!(get(&t, "/healthz"), (StatusCode::OK, "ok\n".into()));
        assert_eq!(get(&t, "/nope").0, StatusCode::NOT_FOUND);
    }

    #[test]
    fn metrics_list_agent_series_and_every_error_kind() {
        let t = telemetry();
        t.agent.pods_tracked.set(3);
        t.agent.error(ErrorKind::PodAddress);
        t.agent.error(ErrorKind::PodAddress);
        t.agent.reconcile_seconds.observe(0.003);
        let (status, body) = get(&t, "/metrics");
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("bypass_pods_tracked 3"), "{body}");
        // One pass of 3 ms: counted, and in the buckets from 4 ms up.
        assert!(body.contains("bypass_reconcile_seconds_count 1"), "{body}");
        assert!(
            body.contains("bypass_reconcile_seconds_bucket{le=\"0.004\"} 1")
                && body.contains("bypass_reconcile_seconds_bucket{le=\"0.002\"} 0"),
            "{body}"
        );
        assert!(
            body.contains("bypass_reconcile_errors_total{kind=\"pod_address\"} 2"),
            "{body}"
        );
        for kind in ErrorKind::ALL {
            assert!(
                body.contains(&format!("kind=\"{}\"", kind.as_str())),
                "{body}"
            );
        }
        // No datapath pinned at that path: reported, not an error.
        assert!(body.contains("bypass_datapath_up 0"), "{body}");
        assert!(body.trim_end().ends_with("# EOF"), "{body}");
    }
}
