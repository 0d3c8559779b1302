//! Telemetry: a typed Prometheus registry (datapath counters and map sizes read from
//! the pins at scrape time, the agent's own reconcile counters), served with `/healthz`
//! and `/readyz` by a small HTTP/1 server.

use std::{
    convert::Infallible,
    fmt::Write as _,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, body::Bytes, service::service_fn};
use hyper_util::rt::TokioIo;
use prometheus_client::{
    collector::Collector,
    encoding::{
        DescriptorEncoder, EncodeLabelSet, EncodeLabelValue, EncodeMetric, LabelValueEncoder,
    },
    metrics::{
        MetricType, counter::ConstCounter, counter::Counter, family::Family, gauge::ConstGauge,
        gauge::Gauge,
    },
    registry::Registry,
};
use tracing::{debug, info, warn};

use crate::{
    datapath::{PinLayout, PinnedView, count_sockets},
    error::AgentError,
};

/// Default `--metrics-addr` of the Kubernetes agent.
pub const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:9464";

/// Kinds of reconcile errors, the `kind` label of `bypass_reconcile_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// A watch failed (API server unreachable, connection dropped, ...).
    Watch,
    /// The API server refused a list or watch (RBAC).
    Forbidden,
    /// A map insert or remove failed.
    MapUpdate,
    /// Attaching or detaching the datapath failed.
    Toggle,
    /// The node label had a value other than `true`/`false`.
    LabelValue,
    /// A pod address did not parse or was not unicast.
    PodAddress,
    /// A ServiceCIDR object's range did not parse.
    ServiceCidr,
    /// An opt-out annotation or namespace label had a value other than `true`/`false`.
    OptOutValue,
}

impl ErrorKind {
    /// Every kind, so each appears on `/metrics` from the start.
    pub const ALL: [Self; 8] = [
        Self::Watch,
        Self::Forbidden,
        Self::MapUpdate,
        Self::Toggle,
        Self::LabelValue,
        Self::PodAddress,
        Self::ServiceCidr,
        Self::OptOutValue,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Watch => "watch",
            Self::Forbidden => "forbidden",
            Self::MapUpdate => "map_update",
            Self::Toggle => "toggle",
            Self::LabelValue => "label_value",
            Self::PodAddress => "pod_address",
            Self::ServiceCidr => "service_cidr",
            Self::OptOutValue => "opt_out_value",
        }
    }
}

impl EncodeLabelValue for ErrorKind {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

/// Labels of `bypass_reconcile_errors_total`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ErrorLabels {
    /// What failed.
    pub kind: ErrorKind,
}

/// Readiness inputs, set by whoever drives the datapath.
#[derive(Debug, Default)]
pub struct Health {
    synced: AtomicBool,
    settled: AtomicBool,
}

impl Health {
    /// The watchers have listed everything once (standalone: always).
    pub fn set_synced(&self, v: bool) {
        self.synced.store(v, Ordering::Relaxed);
    }

    /// The datapath is as decided: attached, or deliberately off.
    pub fn set_settled(&self, v: bool) {
        self.settled.store(v, Ordering::Relaxed);
    }

    /// Ready: synced and settled.
    pub fn ready(&self) -> bool {
        self.synced.load(Ordering::Relaxed) && self.settled.load(Ordering::Relaxed)
    }

    fn describe(&self) -> String {
        format!(
            "synced={} datapath_settled={}",
            self.synced.load(Ordering::Relaxed),
            self.settled.load(Ordering::Relaxed)
        )
    }
}

/// The agent's own metrics, updated by the reconciler.
#[derive(Debug, Default)]
pub struct AgentMetrics {
    /// Pods whose addresses are in the map.
    pub pods_tracked: Gauge,
    /// Reconciles run.
    pub reconciles: Counter,
    /// Errors and rejections, by kind.
    pub errors: Family<ErrorLabels, Counter>,
    /// Whether the watchers have synced (0/1).
    pub synced: Gauge,
}

impl AgentMetrics {
    /// Counts one error of `kind`.
    pub fn error(&self, kind: ErrorKind) {
        self.errors.get_or_create(&ErrorLabels { kind }).inc();
    }
}

/// Registry, agent metrics and health, shared by the reconciler and the server.
#[derive(Debug)]
pub struct Telemetry {
    registry: Registry,
    /// The agent's own metrics.
    pub agent: Arc<AgentMetrics>,
    /// Readiness.
    pub health: Health,
}

impl Telemetry {
    /// A registry with the agent's metrics and a collector over the pins in `layout`.
    pub fn new(layout: PinLayout) -> Self {
        let agent = Arc::new(AgentMetrics::default());
        for kind in ErrorKind::ALL {
            // Created at zero so every kind is listed before its first error.
            let _ = agent.errors.get_or_create(&ErrorLabels { kind });
        }
        let mut registry = Registry::default();
        registry.register(
            "bypass_pods_tracked",
            "Pods on this node whose addresses are in the pod address map",
            agent.pods_tracked.clone(),
        );
        registry.register(
            "bypass_reconciles",
            "Reconciles of the maps and the toggle against the API",
            agent.reconciles.clone(),
        );
        registry.register(
            "bypass_reconcile_errors",
            "Reconcile errors and rejected input, by kind",
            agent.errors.clone(),
        );
        registry.register(
            "bypass_synced",
            "1 once the node, pod and namespace watchers have listed everything",
            agent.synced.clone(),
        );
        registry.register_collector(Box::new(DatapathCollector { layout }));
        Self {
            registry,
            agent,
            health: Health::default(),
        }
    }

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// Reads the datapath through its pins on every scrape, so the numbers are the
/// kernel's, whoever holds the datapath.
#[derive(Debug)]
struct DatapathCollector {
    layout: PinLayout,
}

fn counter(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    v: u64,
) -> Result<(), std::fmt::Error> {
    let c = ConstCounter::new(v);
    c.encode(enc.encode_descriptor(name, help, None, c.metric_type())?)
}

fn gauge(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    v: i64,
) -> Result<(), std::fmt::Error> {
    let g = ConstGauge::new(v);
    g.encode(enc.encode_descriptor(name, help, None, g.metric_type())?)
}

/// One gauge per value of `label`.
fn labeled_gauges(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &str,
    values: &[(&str, i64)],
) -> Result<(), std::fmt::Error> {
    let mut family = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (value, v) in values {
        let labels = [(label, *value)];
        ConstGauge::new(*v).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Collector for DatapathCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        labeled_gauges(
            &mut enc,
            "bypass_build_info",
            "The agent's version (always 1)",
            "version",
            &[(env!("CARGO_PKG_VERSION"), 1)],
        )?;
        let view = match PinnedView::open(&self.layout) {
            Ok(v) => v,
            Err(e) => {
                debug!(error = %e, "datapath not readable for metrics");
                return gauge(
                    &mut enc,
                    "bypass_datapath_up",
                    "1 when the pinned datapath could be read",
                    0,
                );
            }
        };
        gauge(
            &mut enc,
            "bypass_datapath_up",
            "1 when the pinned datapath could be read",
            1,
        )?;
        let attached = view.link_pinned && view.control.enabled().unwrap_or(false);
        gauge(
            &mut enc,
            "bypass_attached",
            "1 when sock_ops is attached and redirects are allowed",
            i64::from(attached),
        )?;
        gauge(
            &mut enc,
            "bypass_sockets",
            "Sockets in the SockHash",
            count(count_sockets(&view.sockets)),
        )?;
        gauge(
            &mut enc,
            "bypass_pod_cidrs",
            "Entries in the pod CIDR trie",
            count(view.pod_maps.cidrs().len()),
        )?;
        gauge(
            &mut enc,
            "bypass_pod_addresses",
            "Entries in the exact pod address map",
            count(view.pod_maps.addrs().len()),
        )?;
        gauge(
            &mut enc,
            "bypass_excluded_addresses",
            "Addresses never treated as a pod's (opted out)",
            count(view.pod_maps.excluded().len()),
        )?;
        let release = crate::datapath::kernel_release();
        labeled_gauges(
            &mut enc,
            "bypass_kernel",
            "The running kernel's release (always 1)",
            "release",
            &[(release.as_str(), 1)],
        )?;
        if let Ok(bits) = view.control.features() {
            let features = crate::status::Features::from_bits(bits, view.sockopt_pinned);
            let values: Vec<(&str, i64)> = features
                .list()
                .iter()
                .map(|&(name, on)| (name, i64::from(on)))
                .collect();
            labeled_gauges(
                &mut enc,
                "bypass_feature",
                "1 when the datapath guarantee is active on this kernel",
                "feature",
                &values,
            )?;
        }
        match view.stats.read() {
            Ok(c) => {
                let values: Vec<(&str, &str, u64)> = bypass_common::Stat::ALL
                    .iter()
                    .map(|&stat| (stat.name(), stat.help(), c.get(stat)))
                    .collect();
                for family in families(&values) {
                    match family {
                        Series::Plain { name, help, value } => {
                            counter(&mut enc, &format!("bypass_{name}"), help, value)?;
                        }
                        Series::ByKind { base, kinds } => {
                            let help = format!("{} by connection kind", base.replace('_', " "));
                            let name = format!("bypass_{base}");
                            let mut f =
                                enc.encode_descriptor(&name, &help, None, MetricType::Counter)?;
                            for (kind, v) in kinds {
                                let labels = [("kind", kind)];
                                ConstCounter::new(v).encode(f.encode_family(&labels)?)?;
                            }
                        }
                    }
                }
            }
            Err(e) => warn!(error = %e, "reading datapath counters for metrics"),
        }
        Ok(())
    }
}

/// The connection kinds a counter can be split by (the stats' `_pod`, `_loopback`,
/// `_translated` suffixes).
pub const KINDS: [&str; 3] = ["pod", "loopback", "translated"];

/// How the datapath counters are exported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Series<'a> {
    /// `bypass_<name>_total`.
    Plain {
        /// The stat's name.
        name: &'a str,
        /// Its help text.
        help: &'a str,
        /// Its value.
        value: u64,
    },
    /// `bypass_<base>_total{kind="..."}`, one series per kind.
    ByKind {
        /// The name without the kind suffix.
        base: &'a str,
        /// `(kind, value)`.
        kinds: Vec<(&'a str, u64)>,
    },
}

/// Groups `(name, help, value)` counters (pure): every `<base>_<kind>` becomes a series
/// of the `<base>` family labelled `kind`; a plain counter named `<base>` of such a
/// family is the sum of its kinds (every redirect belongs to a link of one kind) and is
/// left out, so summing the family gives it without counting twice.
pub fn families<'a>(values: &[(&'a str, &'a str, u64)]) -> Vec<Series<'a>> {
    let split = |name: &'a str| {
        KINDS.iter().find_map(|kind| {
            name.strip_suffix(kind)
                .and_then(|b| b.strip_suffix('_'))
                .map(|base| (base, *kind))
        })
    };
    let mut out: Vec<Series<'a>> = Vec::new();
    for &(name, help, value) in values {
        if let Some((base, kind)) = split(name) {
            let existing = out.iter_mut().find_map(|f| match f {
                Series::ByKind { base: b, kinds } if *b == base => Some(kinds),
                _ => None,
            });
            match existing {
                Some(kinds) => kinds.push((kind, value)),
                None => out.push(Series::ByKind {
                    base,
                    kinds: vec![(kind, value)],
                }),
            }
        } else {
            out.push(Series::Plain { name, help, value });
        }
    }
    let bases: Vec<&str> = out
        .iter()
        .filter_map(|f| match f {
            Series::ByKind { base, .. } => Some(*base),
            Series::Plain { .. } => None,
        })
        .collect();
    out.retain(|f| !matches!(f, Series::Plain { name, .. } if bases.contains(name)));
    out
}

/// Binds `addr` and serves `/metrics`, `/healthz` and `/readyz` until the runtime
/// stops. Returns the bound address (useful with port 0).
pub async fn serve(addr: SocketAddr, telemetry: Arc<Telemetry>) -> Result<SocketAddr, AgentError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| AgentError::MetricsBind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| AgentError::MetricsBind { addr, source })?;
    info!(addr = %bound, "serving /metrics, /healthz, /readyz");
    tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    warn!(error = %e, "metrics accept");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let t = telemetry.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| {
                    let t = t.clone();
                    async move { Ok::<_, Infallible>(respond(&req, &t)) }
                });
                if let Err(e) = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await
                {
                    debug!(error = %e, "metrics connection");
                }
            });
        }
    });
    Ok(bound)
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
    fn counters_by_kind_are_one_labelled_family() {
        let values = [
            ("redirected_bytes", "h", 10),
            ("passed_bytes", "h", 1),
            ("paired_pod", "h", 2),
            ("paired_loopback", "h", 3),
            ("redirected_bytes_pod", "h", 7),
            ("redirected_bytes_translated", "h", 3),
        ];
        let f = families(&values);
        assert_eq!(
            f,
            [
                Series::Plain {
                    name: "passed_bytes",
                    help: "h",
                    value: 1
                },
                Series::ByKind {
                    base: "paired",
                    kinds: vec![("pod", 2), ("loopback", 3)]
                },
                Series::ByKind {
                    base: "redirected_bytes",
                    kinds: vec![("pod", 7), ("translated", 3)]
                },
            ]
        );
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
        let (status, body) = get(&t, "/metrics");
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("bypass_pods_tracked 3"), "{body}");
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
