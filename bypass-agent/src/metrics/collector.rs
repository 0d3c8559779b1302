//! The datapath's side of `/metrics`: read through the pins at every scrape, and the
//! counters of the stats catalogue grouped into labelled families.

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
};
use tracing::debug;

use std::sync::{Arc, Mutex};

use bypass_common::{PodCounts, Stat, checks::Outcome, status::KernelCheck};

use super::pods::{self, Monotonic, PodDirectory};

use crate::{
    datapath::{Counters, PinLayout},
    report::Reading,
};

/// Reads the datapath through its pins on every scrape, so the numbers are the
/// kernel's, whoever holds the datapath.
#[derive(Debug)]
pub(super) struct DatapathCollector {
    layout: PinLayout,
    /// Which pod each address is, for the per-pod counters.
    pods: Arc<PodDirectory>,
    /// What the per-pod counters last showed.
    shown: Mutex<Monotonic>,
}

impl DatapathCollector {
    /// A collector over the pins in `layout`, naming pods from `pods`.
    pub(super) fn new(layout: PinLayout, pods: Arc<PodDirectory>) -> Self {
        Self {
            layout,
            pods,
            shown: Mutex::new(Monotonic::default()),
        }
    }

    /// The per-pod counters: the datapath's counts by pod network namespace, named by
    /// the pods of this node, never less than last shown.
    fn encode_pods(
        &self,
        enc: &mut DescriptorEncoder,
        reading: &Reading,
    ) -> Result<(), std::fmt::Error> {
        let Some(totals) = &reading.pod_totals else {
            return Ok(());
        };
        // The owners name a namespace's pod where the datapath observes them.
        let r = &reading.report;
        let observed = reading.owners_pinned && r.netns_owners == "observe";
        let owners = observed.then_some(&r.address_owners[..]);
        let addrs = pods::netns_addrs(owners, &reading.pod_netns);
        let identities = self.pods.get();
        let shown = match self.shown.lock() {
            Ok(mut m) => m.update(totals, |netns| {
                pods::pod_name(netns, &addrs, identities.as_ref())
            }),
            Err(_) => return Ok(()),
        };
        for (name, help, value) in [
            (
                "bypass_pod_redirected_bytes",
                "Bytes this pod's sockets sent through the bypass (socket to socket), by pod of this node",
                (|c: &PodCounts| c.bytes) as fn(&PodCounts) -> u64,
            ),
            (
                "bypass_pod_connections",
                "Connections of this pod that were paired for the bypass, by pod of this node",
                |c: &PodCounts| c.connections,
            ),
        ] {
            let mut family = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (id, c) in &shown {
                let labels = [
                    ("namespace", id.namespace.as_str()),
                    ("pod", id.pod.as_str()),
                    ("owner", id.owner.as_str()),
                ];
                ConstCounter::new(value(c)).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// One unlabelled series of a constant metric.
fn constant(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    metric: impl EncodeMetric,
) -> Result<(), std::fmt::Error> {
    metric.encode(enc.encode_descriptor(name, help, None, metric.metric_type())?)
}

fn gauge(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    v: i64,
) -> Result<(), std::fmt::Error> {
    constant(enc, name, help, ConstGauge::new(v))
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
        let up = "1 when the pinned datapath could be read";
        let reading = match Reading::open(&self.layout) {
            Ok(r) => r,
            Err(e) => {
                debug!(error = %e, "datapath not readable for metrics");
                return gauge(&mut enc, "bypass_datapath_up", up, 0);
            }
        };
        gauge(&mut enc, "bypass_datapath_up", up, 1)?;
        encode_report(&mut enc, &reading)?;
        self.encode_pods(&mut enc, &reading)?;
        encode_counters(&mut enc, &reading.report.counters)
    }
}

/// The report's gauges and labelled families, as `status` shows its keys.
fn encode_report(enc: &mut DescriptorEncoder, reading: &Reading) -> Result<(), std::fmt::Error> {
    let r = &reading.report;
    let owned = reading.owners_pinned.then_some(r.address_owners.len());
    for (name, help, value) in [
        (
            "bypass_attached",
            "1 when sock_ops is attached and redirects are allowed",
            Some(i64::from(r.attached)),
        ),
        (
            "bypass_sockets",
            "Sockets in the SockHash",
            Some(count(r.sockets)),
        ),
        (
            "bypass_pod_cidrs",
            "Entries in the pod CIDR trie",
            Some(count(r.pod_cidrs.len())),
        ),
        (
            "bypass_pod_addresses",
            "Entries in the exact pod address map",
            Some(count(r.pod_addresses.len())),
        ),
        (
            "bypass_excluded_addresses",
            "Addresses never treated as a pod's (opted out)",
            Some(count(r.excluded_addresses.len())),
        ),
        (
            "bypass_owned_pod_addresses",
            "Pod addresses with an observed owning network namespace (--netns-owners=observe)",
            owned.map(count),
        ),
        (
            "bypass_sockets_capacity",
            "SockHash size (--max-sockets of the loaded datapath): alert on bypass_sockets / bypass_sockets_capacity",
            Some(r.max_sockets.map_or(0, i64::from)),
        ),
        (
            "bypass_heartbeat_remaining_seconds",
            "Seconds until sock_ops stops inserting unless the agent refreshes its heartbeat (0: expired)",
            Some(i64::try_from(r.heartbeat_seconds_left).unwrap_or(i64::MAX)),
        ),
    ] {
        if let Some(value) = value {
            gauge(enc, name, help, value)?;
        }
    }
    let mut family = enc.encode_descriptor(
        "bypass_pod_address_refusals",
        "Sockets refused for a pod address: used by another network namespace (foreign_namespace), or a client on it whose sequence numbers did not match (pairing)",
        None,
        MetricType::Counter,
    )?;
    for refusals in &r.refusals {
        let address = refusals.address.to_string();
        for (kind, n) in refusals.kinds() {
            let labels = [("address", address.as_str()), ("kind", kind)];
            ConstCounter::new(n).encode(family.encode_family(&labels)?)?;
        }
    }
    let mut family = enc.encode_descriptor(
        "bypass_program_skipped_runs",
        "Runs of a tracing program the kernel skipped because it was already running on the CPU (a task preempted inside it): a skipped read guard check can let a splice miss redirected bytes (docs/limitations.md)",
        None,
        MetricType::Counter,
    )?;
    for (program, n) in &reading.skipped_runs {
        ConstCounter::new(*n).encode(family.encode_family(&[("program", *program)])?)?;
    }
    labeled_gauges(
        enc,
        "bypass_kernel_info",
        "The running kernel's release (always 1)",
        "release",
        &[(r.kernel.as_str(), 1)],
    )?;
    let mut family = enc.encode_descriptor(
        "bypass_other_programs",
        "Another program's sock_ops or sk_msg program loaded on this node (always 1): sockets its sockmap holds cannot join ours",
        None,
        MetricType::Gauge,
    )?;
    for o in &reading.others {
        let id = o.id.to_string();
        let labels = [
            ("kind", o.kind),
            ("name", o.name.as_str()),
            ("owner", o.owner.unwrap_or("unknown")),
            ("id", id.as_str()),
        ];
        ConstGauge::new(1).encode(family.encode_family(&labels)?)?;
    }
    let features: Vec<(&str, i64)> = r
        .features
        .list()
        .iter()
        .map(|&(name, on)| (name, i64::from(on)))
        .collect();
    labeled_gauges(
        enc,
        "bypass_feature",
        "1 when the datapath guarantee is active on this kernel",
        "feature",
        &features,
    )?;
    let outcome = |c: &KernelCheck| match c.outcome.as_str() {
        o if o == Outcome::Passed.name() => Some(1),
        o if o == Outcome::Failed.name() => Some(0),
        _ => None,
    };
    let outcomes: Vec<(&str, i64)> = r
        .kernel_checks
        .iter()
        .filter_map(|c| Some((c.name.as_str(), outcome(c)?)))
        .collect();
    labeled_gauges(
        enc,
        "bypass_kernel_check",
        "1 when the kernel self-test saw the behaviour as TCP answers it, 0 when not \
         (checks not run are absent)",
        "check",
        &outcomes,
    )
}

/// The stats catalogue's counters: plain ones as `bypass_<name>_total`, those kept per
/// connection kind as one family each ([`families`]).
fn encode_counters(enc: &mut DescriptorEncoder, c: &Counters) -> Result<(), std::fmt::Error> {
    let values: Vec<(Stat, u64)> = Stat::ALL.iter().map(|&stat| (stat, c.get(stat))).collect();
    for family in families(&values) {
        match family {
            Series::Plain { name, help, value } => {
                constant(
                    enc,
                    &format!("bypass_{name}"),
                    help,
                    ConstCounter::new(value),
                )?;
            }
            Series::ByKind { base, kinds } => {
                let help = format!("{} by connection kind", base.replace('_', " "));
                let name = format!("bypass_{base}");
                let mut f = enc.encode_descriptor(&name, &help, None, MetricType::Counter)?;
                for (kind, v) in kinds {
                    let labels = [("kind", kind)];
                    ConstCounter::new(v).encode(f.encode_family(&labels)?)?;
                }
            }
        }
    }
    Ok(())
}

/// How the datapath counters are exported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Series {
    /// `bypass_<name>_total`.
    Plain {
        /// The stat's name.
        name: &'static str,
        /// Its help text.
        help: &'static str,
        /// Its value.
        value: u64,
    },
    /// `bypass_<base>_total{kind="..."}`, one series per kind.
    ByKind {
        /// The family's name ([`Stat::BY_HOP`]).
        base: &'static str,
        /// `(kind label, value)`, the label [`bypass_common::state::Hop::label`].
        kinds: Vec<(&'static str, u64)>,
    },
}

/// Groups counter values (pure): every counter kept per [`bypass_common::state::Hop`] kind
/// ([`Stat::hop_family`]) becomes a series of its family labelled `kind`, the family
/// where its first counter is; a plain counter named as such a family is the sum of
/// its kinds (every redirect belongs to a link of one kind) and is left out, so summing
/// the family gives it without counting twice.
pub fn families(values: &[(Stat, u64)]) -> Vec<Series> {
    let mut out: Vec<Series> = Vec::new();
    for &(stat, value) in values {
        if let Some((base, kind)) = stat.hop_family().map(|(base, kind)| (base, kind.label())) {
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
        } else if !Stat::BY_HOP.iter().any(|&(base, _)| base == stat.name()) {
            out.push(Series::Plain {
                name: stat.name(),
                help: stat.help(),
                value,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_by_kind_are_one_labelled_family() {
        let values = [
            (Stat::RedirectedBytes, 10),
            (Stat::PassedBytes, 1),
            (Stat::PairedPod, 2),
            (Stat::PairedLoopback, 3),
            (Stat::RedirectedBytesPod, 7),
            (Stat::RedirectedBytesTranslated, 3),
        ];
        let f = families(&values);
        assert_eq!(
            f,
            [
                Series::Plain {
                    name: "passed_bytes",
                    help: Stat::PassedBytes.help(),
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

    /// A collector of fixed counters, to see what `/metrics` shows of them.
    #[derive(Debug)]
    struct Fixed(Counters);

    impl Collector for Fixed {
        fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
            encode_counters(&mut enc, &self.0)
        }
    }

    #[test]
    fn counters_text_with_kind_labels() {
        let mut c = Counters::default();
        for s in bypass_common::Stat::ALL {
            c.set(s, u64::from(s.index()) + 100);
        }
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(Fixed(c)));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        let by_kind = "\
# HELP bypass_paired paired by connection kind
# TYPE bypass_paired counter
bypass_paired_total{kind=\"pod\"} 109
bypass_paired_total{kind=\"loopback\"} 110
bypass_paired_total{kind=\"translated\"} 111
# HELP bypass_redirected_bytes redirected bytes by connection kind
# TYPE bypass_redirected_bytes counter
bypass_redirected_bytes_total{kind=\"pod\"} 112
bypass_redirected_bytes_total{kind=\"loopback\"} 113
bypass_redirected_bytes_total{kind=\"translated\"} 114
";
        assert!(out.contains(by_kind), "{out}");
        // The sum of the kinds is not a series of its own; the per-kind counters are
        // not plain series either.
        assert!(!out.contains("bypass_redirected_bytes_total 103"), "{out}");
        assert!(!out.contains("bypass_paired_pod"), "{out}");
        assert!(out.contains("\nbypass_passed_bytes_total 105\n"), "{out}");
    }
}
