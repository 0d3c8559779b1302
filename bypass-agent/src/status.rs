//! `status`: what a running datapath holds and has counted, read from its pins by
//! another process.

use std::net::IpAddr;

use bypass_common::Stat;
use serde::{Deserialize, Serialize};

use crate::{
    cli::StatusOpts,
    datapath::{Counters, PinLayout, PinnedView},
    error::AgentError,
    toggle::{EnabledBy, LabelValue, Recorded},
};

/// The report, as printed (`status --json`), and as read back by the testbed. Fields
/// missing from the input read as their defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Report {
    /// sock_ops attached and redirects allowed.
    pub attached: bool,
    /// Sockets in the SockHash now.
    pub sockets: usize,
    /// Connecting sockets waiting for their peer to pair (removed when paired or
    /// closed).
    pub connectors: usize,
    /// Paired connections (removed when the connecting socket closes).
    pub links: usize,
    /// Bound, in bytes, on a peer's ingress queue (0: none).
    pub max_queued_bytes: u32,
    /// Size under which a stream of sends takes the TCP path (0: never).
    pub small_stream_bytes: u32,
    /// The running kernel's release.
    pub kernel: String,
    /// What the loaded programs do on this kernel.
    pub features: Features,
    /// Why the queue bound is off, when it is.
    pub queue_bound_off: Option<String>,
    /// Counters.
    #[serde(flatten)]
    pub counters: Counters,
    /// Pod CIDRs in the trie.
    pub pod_cidrs: Vec<String>,
    /// Exact pod addresses.
    pub pod_addresses: Vec<IpAddr>,
    /// Addresses never treated as a pod's (opted out), whatever CIDR holds them.
    pub excluded_addresses: Vec<IpAddr>,
    /// Service (ClusterIP) CIDRs.
    pub service_cidrs: Vec<String>,
    /// Service backends on this node's pods, `SERVICE_IP:PORT=POD_IP:PORT`: the only
    /// servers a translated connection from another pod is paired with.
    #[serde(default)]
    pub service_backends: Vec<String>,
    /// Ports left alone.
    pub skip_ports: Vec<u16>,
    /// Kubernetes mode: where the on/off state came from (`label` or `default`); null
    /// in standalone mode, or before a valid decision.
    pub enabled_by: Option<EnabledBy>,
    /// Kubernetes mode: what the node label held (`absent`, `true`, `false`,
    /// `invalid`); null in standalone mode.
    pub label_value: Option<LabelValue>,
    /// The pin directory read.
    pub pin_dir: String,
    /// Other sock_ops/sk_msg programs loaded on this node (Merbridge, Kmesh, ...).
    pub other_programs: Vec<String>,
    /// Why `insert_failures` is not zero: a full SockHash, or another program holding
    /// the sockets in its own sockmap.
    pub insert_failures_cause: Option<String>,
    /// Why the agent does not bypass this node, when it refuses to.
    #[serde(default)]
    pub refused: Option<String>,
    /// SockHash capacity (`--max-sockets` of the loaded datapath).
    pub max_sockets: Option<u32>,
    /// Seconds until the heartbeat lapses and sock_ops stops inserting (0: lapsed: no
    /// agent tends this datapath).
    pub heartbeat_seconds_left: u64,
    /// Which namespace may use a pod address (`--netns-owners`): `observe` or `any`.
    pub netns_owners: String,
    /// Each pod address the agent observed with its owning network namespace.
    pub address_owners: Vec<AddressOwner>,
    /// Pod addresses that sockets were refused for, with how often, by kind.
    pub refusals: Vec<AddressRefusals>,
}

/// A pod address and the cookie of the network namespace that owns it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddressOwner {
    /// The address.
    pub address: IpAddr,
    /// The namespace's cookie (`SO_NETNS_COOKIE`).
    pub netns: u64,
}

/// How often sockets were refused for one pod address.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddressRefusals {
    /// The address.
    pub address: IpAddr,
    /// Sockets of another namespace that used it while a pod owned it.
    pub foreign_namespace: u64,
    /// Pairings refused: accepted sockets whose client on it had other sequence
    /// numbers, or accepted sockets on it that are no backend of the address their
    /// client dialled.
    pub pairing: u64,
}

/// What the loaded programs guarantee on this kernel. Every one holds on every kernel
/// the agent loads on but FIONREAD, which counts redirected bytes only where the
/// kernel's sockmap keeps its queue length; the others can be off only because a hook
/// is not attached (after `uninstall`) or the bound was set to 0.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Features {
    /// What waits for a reader is bounded (`--max-queued-bytes`, or its own fixed
    /// receive buffer); past it, its peer sends by TCP until it has caught up.
    pub queue_bound: bool,
    /// A peer's SO_RCVLOWAT / SO_PEEK_OFF keep redirects away from it.
    pub receive_options: bool,
    /// `TCP_ULP` (kTLS) refused on bypassed sockets; MPTCP subflows never inserted.
    pub ulp_guard: bool,
    /// Bytes are read in the order they were sent: a direction goes back from TCP to
    /// redirects only once its peer has read every TCP byte with no reader inside.
    pub order: bool,
    /// The read guard is attached: a splice or zero-copy receive never misses a
    /// redirected byte.
    pub read_guard: bool,
    /// FIONREAD (`ioctl(SIOCINQ)`) counts redirected bytes: kernels whose sockmap keeps
    /// its queue length (`sk_psock.msg_tot_len`, not 6.1); elsewhere it reports only
    /// what came by TCP.
    pub fionread: bool,
}

impl Features {
    /// From the recorded feature bits, whether the setsockopt hook and the read guard
    /// are attached, and the bound in force.
    pub fn from_bits(bits: u32, sockopt_hook: bool, read_guard: bool, max_queued: u32) -> Self {
        Self {
            queue_bound: max_queued != 0,
            receive_options: sockopt_hook,
            ulp_guard: sockopt_hook,
            order: true,
            read_guard,
            fionread: bits & bypass_common::layout::features::NO_QUEUE_FIELD == 0,
        }
    }

    /// `(name, on)` pairs, for text and metrics.
    pub fn list(&self) -> [(&'static str, bool); 6] {
        [
            ("queue_bound", self.queue_bound),
            ("receive_options", self.receive_options),
            ("ulp_guard", self.ulp_guard),
            ("order", self.order),
            ("read_guard", self.read_guard),
            ("fionread", self.fionread),
        ]
    }
}

/// Why the queue bound is off, when it is.
pub fn queue_bound_off_reason(max_queued: u32) -> Option<&'static str> {
    (max_queued == 0).then_some("--max-queued-bytes 0 (no bound)")
}

/// Reads the pins and builds the report.
pub fn read(layout: &PinLayout) -> Result<Report, AgentError> {
    let view = PinnedView::open(layout)?;
    let recorded = Recorded::decode(view.control.agent_state()?);
    let bits = view.control.features()?;
    let max_queued = view.control.max_queued()?;
    let (connectors, links) = view.pairings.len();
    let counters = view.stats.read()?;
    let sockets = crate::datapath::count_sockets(&view.sockets);
    let max_sockets = aya::maps::MapInfo::from_pin(layout.map(bypass_common::names::MAP_SOCKETS))
        .ok()
        .map(|i| i.max_entries());
    let others = crate::other_programs::list();
    let insert_failures_cause = crate::other_programs::insert_failure_cause(
        counters.get(Stat::InsertFailures),
        sockets,
        max_sockets,
        &others,
    );
    Ok(Report {
        attached: view.link_pinned && view.control.enabled()?,
        sockets,
        connectors,
        links,
        max_queued_bytes: max_queued,
        small_stream_bytes: view.control.small_stream()?,
        kernel: crate::datapath::kernel_release(),
        features: Features::from_bits(bits, view.sockopt_pinned, view.guard_pinned, max_queued),
        queue_bound_off: queue_bound_off_reason(max_queued).map(str::to_owned),
        refused: view
            .control
            .refused()?
            .then(|| crate::datapath::REFUSED_UNGUARDED.to_owned()),
        counters,
        pod_cidrs: view
            .pod_maps
            .cidrs()
            .iter()
            .map(ToString::to_string)
            .collect(),
        pod_addresses: view.pod_maps.addrs().into_iter().collect(),
        excluded_addresses: view.pod_maps.excluded().into_iter().collect(),
        service_cidrs: view
            .pod_maps
            .service_cidrs()
            .iter()
            .map(ToString::to_string)
            .collect(),
        service_backends: view
            .pod_maps
            .service_backends()
            .iter()
            .map(ToString::to_string)
            .collect(),
        skip_ports: view.skip_ports.ports().into_iter().collect(),
        enabled_by: recorded.and_then(|r| r.enabled_by),
        label_value: recorded.map(|r| r.label),
        pin_dir: layout.root().display().to_string(),
        other_programs: others.iter().map(ToString::to_string).collect(),
        insert_failures_cause,
        max_sockets,
        heartbeat_seconds_left: crate::datapath::heartbeat_remaining(
            view.control.heartbeat_deadline()?,
        )
        .map_or(0, |d| d.as_secs()),
        netns_owners: if view.control.owners_off()? {
            "any"
        } else {
            "observe"
        }
        .to_owned(),
        address_owners: view
            .owners
            .as_ref()
            .map(|o| o.list())
            .unwrap_or_default()
            .into_iter()
            .map(|(address, netns)| AddressOwner { address, netns })
            .collect(),
        refusals: view
            .refusals
            .iter()
            .map(|(address, counts)| AddressRefusals {
                address: *address,
                foreign_namespace: counts[bypass_common::refusal::FOREIGN],
                pairing: counts[bypass_common::refusal::PAIRING],
            })
            .collect(),
    })
}

/// Renders the report as aligned text.
pub fn render_text(r: &Report) -> String {
    let c = &r.counters;
    let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    let join = |items: &[IpAddr]| {
        items
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut rows: Vec<(&str, String)> = vec![
        ("attached", r.attached.to_string()),
        ("sockets", r.sockets.to_string()),
        ("connectors", r.connectors.to_string()),
        ("links", r.links.to_string()),
        ("max_queued_bytes", r.max_queued_bytes.to_string()),
        ("small_stream_bytes", r.small_stream_bytes.to_string()),
        ("kernel", r.kernel.clone()),
        (
            "max_sockets",
            r.max_sockets
                .map_or_else(|| "-".to_owned(), |m| m.to_string()),
        ),
        (
            "heartbeat_seconds_left",
            r.heartbeat_seconds_left.to_string(),
        ),
    ];
    rows.extend(r.features.list().map(|(k, on)| {
        (
            k,
            if on {
                "on".to_owned()
            } else {
                "off".to_owned()
            },
        )
    }));
    if let Some(why) = &r.queue_bound_off {
        rows.push(("queue_bound_off", why.clone()));
    }
    if let Some(why) = &r.refused {
        rows.push(("refused", why.clone()));
    }
    rows.extend(Stat::ALL.map(|s| (s.name(), c.get(s).to_string())));
    rows.extend([
        ("pod_cidrs", r.pod_cidrs.join(", ")),
        ("pod_addresses", join(&r.pod_addresses)),
        ("excluded_addresses", join(&r.excluded_addresses)),
        ("netns_owners", r.netns_owners.clone()),
        (
            "address_owners",
            r.address_owners
                .iter()
                .map(|o| format!("{} netns {}", o.address, o.netns))
                .collect::<Vec<_>>()
                .join(", "),
        ),
        (
            "refusals",
            r.refusals
                .iter()
                .map(|x| {
                    format!(
                        "{} foreign_namespace {} pairing {}",
                        x.address, x.foreign_namespace, x.pairing
                    )
                })
                .collect::<Vec<_>>()
                .join(", "),
        ),
        (
            "enabled_by",
            opt(r.enabled_by.map(|b| format!("{b:?}").to_lowercase())),
        ),
        (
            "label_value",
            opt(r.label_value.map(|v| format!("{v:?}").to_lowercase())),
        ),
        ("service_cidrs", r.service_cidrs.join(", ")),
        ("service_backends", r.service_backends.join(", ")),
        (
            "skip_ports",
            r.skip_ports
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(","),
        ),
        ("pin_dir", r.pin_dir.clone()),
        ("other_programs", r.other_programs.join("; ")),
        (
            "insert_failures_cause",
            opt(r.insert_failures_cause.clone()),
        ),
    ]);
    rows.iter().map(|(k, v)| format!("{k:<28} {v}\n")).collect()
}

/// `bypass-agent status`.
pub fn status(opts: StatusOpts) -> Result<(), AgentError> {
    let report = read(&PinLayout::new(&opts.pins.pin_dir))?;
    if opts.json {
        crate::print_json(&report, "status")?;
    } else {
        print!("{}", render_text(&report));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Report {
        Report {
            attached: true,
            sockets: 4,
            connectors: 0,
            links: 2,
            max_queued_bytes: 4 << 20,
            small_stream_bytes: 256,
            kernel: "6.18.0".into(),
            features: Features::from_bits(0, true, true, 4 << 20),
            queue_bound_off: None,
            counters: Counters {
                redirected_bytes: 1024,
                ..Default::default()
            },
            pod_cidrs: vec!["10.0.0.0/24".into()],
            pod_addresses: vec!["fd00::2".parse().unwrap()],
            excluded_addresses: vec!["10.0.0.9".parse().unwrap()],
            service_cidrs: vec!["10.96.0.0/12".into()],
            service_backends: vec!["10.96.0.10:80=10.0.0.2:8080".into()],
            skip_ports: vec![15021],
            enabled_by: Some(EnabledBy::Label),
            label_value: Some(LabelValue::True),
            pin_dir: "/sys/fs/bpf/bypass".into(),
            other_programs: vec!["sk_msg mb_msg_redir (id 3, Merbridge)".into()],
            insert_failures_cause: None,
            refused: None,
            max_sockets: Some(65_536),
            heartbeat_seconds_left: 42,
            netns_owners: "observe".into(),
            address_owners: vec![AddressOwner {
                address: "10.0.0.2".parse().unwrap(),
                netns: 4097,
            }],
            refusals: vec![AddressRefusals {
                address: "10.0.0.2".parse().unwrap(),
                foreign_namespace: 3,
                pairing: 1,
            }],
        }
    }

    #[test]
    fn json_has_required_fields() {
        let v: serde_json::Value = serde_json::to_value(sample()).unwrap();
        for k in [
            "attached",
            "sockets",
            "redirected_messages",
            "redirected_bytes",
            "passed_messages",
            "insert_failures",
            "paired_translated",
            "redirected_bytes_loopback",
            "skipped_ports",
            "service_cidrs",
            "service_backends",
            "pair_unreachable",
            "skip_ports",
            "pod_cidrs",
            "pod_addresses",
            "enabled_by",
            "label_value",
            "kernel",
            "features",
            "excluded_addresses",
            "links",
            "ulp_refused",
            "unpaired_sends",
        ] {
            assert!(v.get(k).is_some(), "missing {k} in {v}");
        }
        assert_eq!(v["redirected_bytes"], 1024);
        assert_eq!(v["enabled_by"], "label");
        assert_eq!(v["label_value"], "true");
        assert_eq!(v["features"]["queue_bound"], true);
    }

    #[test]
    fn json_reads_back() {
        let r = sample();
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(serde_json::from_value::<Report>(v).unwrap(), r);
    }

    #[test]
    fn text_lists_counters() {
        let t = render_text(&sample());
        assert!(t.contains("redirected_bytes             1024"), "{t}");
        assert!(t.contains("attached                     true"), "{t}");
        assert!(t.contains("queue_bound                  on"), "{t}");
        assert!(t.contains("heartbeat_seconds_left       42"), "{t}");
        assert!(
            t.contains("address_owners               10.0.0.2 netns 4097"),
            "{t}"
        );
        assert!(
            t.contains("refusals                     10.0.0.2 foreign_namespace 3 pairing 1"),
            "{t}"
        );
    }
}
