//! Telemetry: a typed Prometheus registry (datapath counters and map sizes read from
//! the pins at scrape time, the agent's own reconcile counters), served with `/healthz`
//! and `/readyz` by a small HTTP/1 server.

mod collector;
pub mod pods;
mod server;

use std::{
    fmt::Write as _,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use prometheus_client::{
    encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder},
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};
pub use server::{MAX_CONNECTIONS, serve};

use crate::datapath::{PinLayout, Refusal, RefusalKind};

/// Default port of `/metrics`, `/healthz` and `/readyz` (`--metrics-port`). Not 9464,
/// OpenTelemetry's Prometheus exporter default, which an OpenTelemetry collector or SDK
/// on a hostNetwork pod takes; 19464 lies outside the Prometheus exporters' range
/// (9100-9999, fully allocated), the NodePort range (30000-32767) and Linux's
/// ephemeral ports (32768-60999, so no outgoing connection can hold it), and is used by
/// none of kubelet (10248-10259), kube-proxy (10249, 10256), Cilium (4240, 9962-9965),
/// Calico (9091, 9099), Istio (15000-15090) or Linkerd (4191).
pub const DEFAULT_METRICS_PORT: u16 = 19_464;

/// Default address of the metrics server in Kubernetes mode when no address is given:
/// loopback only.
pub const DEFAULT_METRICS_IP: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// Where to serve metrics (pure): `--metrics-addr`, or each of `--metrics-ip` (the
/// node's addresses, IPv4 and IPv6, as the downward API's `status.hostIPs` gives them:
/// comma-separated, no brackets) on `--metrics-port`. Empty when none is given and
/// `default_on` is false (standalone).
pub fn metrics_addrs(
    addr: Option<SocketAddr>,
    ips: &[IpAddr],
    port: Option<u16>,
    default_on: bool,
) -> Vec<SocketAddr> {
    if let Some(a) = addr {
        return vec![a];
    }
    if ips.is_empty() && port.is_none() && !default_on {
        return Vec::new();
    }
    let port = port.unwrap_or(DEFAULT_METRICS_PORT);
    let mut out: Vec<SocketAddr> = if ips.is_empty() {
        vec![SocketAddr::new(DEFAULT_METRICS_IP, port)]
    } else {
        ips.iter().map(|ip| SocketAddr::new(*ip, port)).collect()
    };
    out.dedup();
    out
}

#[cfg(test)]
mod addr_tests {
    use super::*;

    #[test]
    fn every_refusal_reason_listed_at_zero_until_refused() {
        let t = Telemetry::new(PinLayout::new(std::path::Path::new(
            "/nonexistent/bypass-metrics-test",
        )));
        let text = t.encode().unwrap();
        for kind in RefusalKind::ALL {
            assert!(
                text.contains(&format!(
                    "bypass_refused{{reason=\"{}\"}} 0\n",
                    kind.label()
                )),
                "{text}"
            );
        }
        t.refused(&Refusal::unguarded());
        let text = t.encode().unwrap();
        assert!(
            text.contains("bypass_refused{reason=\"no_read_guard\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("bypass_refused{reason=\"self_test\"} 0\n"),
            "{text}"
        );
    }

    #[test]
    fn every_node_address_ipv6_included() {
        let ips: Vec<IpAddr> = vec!["10.0.0.5".parse().unwrap(), "fd00::5".parse().unwrap()];
        let a = metrics_addrs(None, &ips, Some(19464), true);
        let shown: Vec<String> = a.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["10.0.0.5:19464", "[fd00::5]:19464"]);
        assert_eq!(
            metrics_addrs(None, &[], None, true),
            [SocketAddr::new(DEFAULT_METRICS_IP, DEFAULT_METRICS_PORT)]
        );
        assert!(metrics_addrs(None, &[], None, false).is_empty());
        let given: SocketAddr = "[::1]:1".parse().unwrap();
        assert_eq!(metrics_addrs(Some(given), &ips, None, true), [given]);
    }
}

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
    /// A cut the cut map could not hold (full): every bypassed connection of the node
    /// was cut instead.
    CutMapFull,
}

impl ErrorKind {
    /// Every kind, so each appears on `/metrics` from the start.
    pub const ALL: [Self; 9] = [
        Self::Watch,
        Self::Forbidden,
        Self::MapUpdate,
        Self::Toggle,
        Self::LabelValue,
        Self::PodAddress,
        Self::ServiceCidr,
        Self::OptOutValue,
        Self::CutMapFull,
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
            Self::CutMapFull => "cut_map_full",
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
    /// Why this node is not bypassed, if the agent refused it.
    refused: std::sync::Mutex<Option<String>>,
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

    /// The agent refused to bypass this node, for `why`: it is not ready (a rollout
    /// that bypasses nothing does not look healthy), and `/readyz` says why.
    pub fn set_refused(&self, why: &str) {
        if let Ok(mut r) = self.refused.lock() {
            *r = Some(why.to_owned());
        }
    }

    fn refusal(&self) -> Option<String> {
        self.refused.lock().ok().and_then(|r| r.clone())
    }

    /// Ready: synced and settled, and not refused.
    pub fn ready(&self) -> bool {
        self.synced.load(Ordering::Relaxed)
            && self.settled.load(Ordering::Relaxed)
            && self.refusal().is_none()
    }

    fn describe(&self) -> String {
        let mut s = format!(
            "synced={} datapath_settled={}",
            self.synced.load(Ordering::Relaxed),
            self.settled.load(Ordering::Relaxed)
        );
        if let Some(why) = self.refusal() {
            s.push_str(&format!(" refused: {why}"));
        }
        s
    }
}

/// The agent's own metrics, updated by the reconciler.
#[derive(Debug)]
pub struct AgentMetrics {
    /// Pods whose addresses are in the map.
    pub pods_tracked: Gauge,
    /// Service backends of this node's pods left out of the backend map because their
    /// namespaces give more than their share of it (their connections take TCP).
    pub service_backends_left_out: Gauge,
    /// Reconciles run.
    pub reconciles: Counter,
    /// How long each reconcile pass took, seconds.
    pub reconcile_seconds: Histogram,
    /// Errors and rejections, by kind.
    pub errors: Family<ErrorLabels, Counter>,
    /// Whether the watchers have synced (0/1).
    pub synced: Gauge,
    /// 1 with the reason when the kernel was refused and the agent idles.
    pub refused: Family<RefusedLabels, Gauge>,
    /// Link and address events heard (datagrams), each waking the owners pass.
    pub link_events: Counter,
    /// Times the kernel dropped link and address events (the socket's buffer
    /// overflowed); each wakes a pass that reads every namespace.
    pub link_events_lost: Counter,
    /// 1 for whose link and address events the agent hears ([`EVENT_SCOPES`]), 0 for
    /// the others.
    pub link_event_scope: Family<ScopeLabels, Gauge>,
}

/// Labels of `bypass_link_event_scope`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ScopeLabels {
    /// One of [`EVENT_SCOPES`].
    pub scope: &'static str,
}

/// Whose link and address events the agent hears: every namespace the node's has an id
/// for (with `CAP_NET_BROADCAST`), the node's own only (a pod's address removed inside
/// it waits for the poll), or none (every change waits for the poll).
pub const EVENT_SCOPES: [&str; 3] = ["all_namespaces", "node", "none"];

/// Labels of `bypass_refused`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RefusedLabels {
    /// What kind of refusal ([`RefusalKind::label`]); the sentence is in the log and
    /// `/readyz`.
    pub reason: &'static str,
}

impl Default for AgentMetrics {
    fn default() -> Self {
        Self {
            pods_tracked: Gauge::default(),
            service_backends_left_out: Gauge::default(),
            reconciles: Counter::default(),
            // 0.5 ms to about 8 s.
            reconcile_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 15)),
            errors: Family::default(),
            synced: Gauge::default(),
            refused: Family::default(),
            link_events: Counter::default(),
            link_events_lost: Counter::default(),
            link_event_scope: Family::default(),
        }
    }
}

impl AgentMetrics {
    /// Counts one error of `kind`.
    pub fn error(&self, kind: ErrorKind) {
        self.errors.get_or_create(&ErrorLabels { kind }).inc();
    }

    /// Whose link and address events are heard now: `scope`, one of [`EVENT_SCOPES`].
    pub fn link_event_scope(&self, scope: &str) {
        for s in EVENT_SCOPES {
            self.link_event_scope
                .get_or_create(&ScopeLabels { scope: s })
                .set(i64::from(s == scope));
        }
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
    /// Which pod each tracked address is (Kubernetes mode), for the per-pod counters.
    pub pods: Arc<pods::PodDirectory>,
}

impl Telemetry {
    /// A registry with the agent's metrics and a collector over the pins in `layout`.
    pub fn new(layout: PinLayout) -> Self {
        let agent = Arc::new(AgentMetrics::default());
        for kind in ErrorKind::ALL {
            // Created at zero so every kind is listed before its first error.
            let _ = agent.errors.get_or_create(&ErrorLabels { kind });
        }
        // No events until the owners' reader subscribes.
        agent.link_event_scope("none");
        // Every reason listed at 0 before any refusal, so the family is on every
        // agent's `/metrics`.
        for kind in RefusalKind::ALL {
            let _ = agent.refused.get_or_create(&RefusedLabels {
                reason: kind.label(),
            });
        }
        let mut registry = Registry::default();
        registry.register(
            "bypass_pods_tracked",
            "Pods on this node whose addresses are in the pod address map",
            agent.pods_tracked.clone(),
        );
        registry.register(
            "bypass_service_backends_left_out",
            "Service backends on this node's pods left out of the backend map (full) because \
             their namespaces give more than an equal share of it; their connections take TCP",
            agent.service_backends_left_out.clone(),
        );
        registry.register(
            "bypass_link_events",
            "Link and address events the agent heard; each wakes the read of the node's \
             namespaces that cuts the connections of a pod whose network went down or away",
            agent.link_events.clone(),
        );
        registry.register(
            "bypass_link_events_lost",
            "Times the kernel dropped link and address events (the agent's socket overflowed); \
             each wakes a read of every namespace",
            agent.link_events_lost.clone(),
        );
        registry.register(
            "bypass_link_event_scope",
            "1 for whose link and address events the agent hears: all_namespaces \
             (CAP_NET_BROADCAST), node (its own: an address removed inside a pod waits for the \
             poll) or none (every change waits for the poll)",
            agent.link_event_scope.clone(),
        );
        registry.register(
            "bypass_reconciles",
            "Reconciles of the maps and the toggle against the API",
            agent.reconciles.clone(),
        );
        registry.register(
            "bypass_reconcile_seconds",
            "How long each reconcile pass took",
            agent.reconcile_seconds.clone(),
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
        registry.register(
            "bypass_refused",
            "1 for the kind of reason the agent refuses to bypass this node for, 0 for the others (kernel_features, self_test, no_read_guard; the sentence is in /readyz and the log)",
            agent.refused.clone(),
        );
        let pods = Arc::new(pods::PodDirectory::default());
        registry.register_collector(Box::new(collector::DatapathCollector::new(
            layout,
            pods.clone(),
        )));
        Self {
            registry,
            agent,
            health: Health::default(),
            pods,
        }
    }

    /// The kernel was refused: the agent idles, and says why (in `/metrics` and
    /// `/readyz`).
    pub fn refused(&self, refusal: &Refusal) {
        self.health.set_refused(&refusal.why);
        self.agent
            .refused
            .get_or_create(&RefusedLabels {
                reason: refusal.kind.label(),
            })
            .set(1);
    }

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}
