//! `status`: what a running datapath holds and has counted, read from its pins by
//! another process.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

pub use bypass_common::status::{
    AddressOwner, AddressRefusals, Features, KernelCheck, Key, Report, queue_bound_off_reason,
};
use bypass_common::{PodCounts, Stat};

use crate::{
    cli::StatusOpts,
    datapath::{PinLayout, PinnedView},
    error::AgentError,
    other_programs::OtherProgram,
    toggle::Recorded,
};

/// One reading of the pins: the report that `status` prints and `/metrics` exports, with
/// what only `/metrics` shows beside it.
pub struct Reading {
    /// The report.
    pub report: Report,
    /// The other programs, with the fields `/metrics` labels (the report names them).
    pub others: Vec<OtherProgram>,
    /// Each pinned tracing program's runs the kernel skipped.
    pub skipped_runs: Vec<(&'static str, u64)>,
    /// Whether the datapath has an owners map (one of an older build has none).
    pub owners_pinned: bool,
    /// What each pod network namespace carried (`PinnedView::pod_totals`).
    pub pod_totals: Option<BTreeMap<u64, PodCounts>>,
    /// Each network namespace's pod addresses, which name its pod.
    pub netns_addrs: BTreeMap<u64, BTreeSet<IpAddr>>,
}

impl Reading {
    /// Reads the pins under `layout` once.
    pub fn open(layout: &PinLayout) -> Result<Self, AgentError> {
        let view = PinnedView::open(layout)?;
        let others = crate::other_programs::list();
        let report = report(&view, layout, &others)?;
        // The owners name a namespace's pod where the datapath observes them.
        let observed = view.owners.is_some() && report.netns_owners == "observe";
        let owners = observed.then_some(&report.address_owners[..]);
        Ok(Self {
            netns_addrs: crate::metrics::pods::netns_addrs(owners, &view.pod_netns),
            pod_totals: view.pod_totals(),
            owners_pinned: view.owners.is_some(),
            skipped_runs: view.skipped_runs,
            report,
            others,
        })
    }
}

/// Reads the pins and builds the report.
pub fn read(layout: &PinLayout) -> Result<Report, AgentError> {
    Reading::open(layout).map(|r| r.report)
}

/// The report of what `view` holds.
fn report(
    view: &PinnedView,
    layout: &PinLayout,
    others: &[OtherProgram],
) -> Result<Report, AgentError> {
    let recorded = Recorded::decode(view.control.agent_state()?);
    let checks = view.control.checks()?;
    let max_queued = view.control.max_queued()?;
    let (connectors, links) = view.pairings.len();
    let counters = view.stats.read()?;
    let sockets = crate::datapath::count_sockets(&view.sockets);
    let max_sockets = aya::maps::MapInfo::from_pin(layout.map(bypass_common::names::MAP_SOCKETS))
        .ok()
        .map(|i| i.max_entries());
    let insert_failures_cause = crate::other_programs::insert_failure_cause(
        counters.get(Stat::InsertFailures),
        sockets,
        max_sockets,
        others,
    );
    Ok(Report {
        attached: view.link_pinned && view.control.enabled()?,
        sockets,
        connectors,
        links,
        max_queued_bytes: max_queued,
        small_stream_bytes: view.control.small_stream()?,
        kernel: crate::datapath::kernel_release(),
        features: Features::from_checks(
            checks,
            view.sockopt_pinned,
            view.guard_pinned,
            view.control.features()?,
            max_queued,
        ),
        kernel_checks: KernelCheck::list(checks),
        queue_bound_off: queue_bound_off_reason(max_queued).map(str::to_owned),
        refused: view
            .control
            .refused()?
            .then(|| crate::datapath::refusal_from_results(checks)),
        counters,
        pod_cidrs: strings(view.pod_maps.cidrs()),
        pod_addresses: view.pod_maps.addrs().into_iter().collect(),
        excluded_addresses: view.pod_maps.excluded().into_iter().collect(),
        service_cidrs: strings(view.pod_maps.service_cidrs()),
        service_backends: strings(view.pod_maps.service_backends()),
        skip_ports: view.skip_ports.ports().into_iter().collect(),
        enabled_by: recorded.and_then(|r| r.enabled_by),
        label_value: recorded.map(|r| r.label),
        pin_dir: layout.root().display().to_string(),
        other_programs: strings(others),
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
            .map(|(address, counts)| AddressRefusals::new(*address, *counts))
            .collect(),
    })
}

/// Each item as text.
fn strings<T: ToString>(items: impl IntoIterator<Item = T>) -> Vec<String> {
    items.into_iter().map(|i| i.to_string()).collect()
}

/// Keys the text leaves out while they are null (docs/cli.md says so).
const TEXT_ONLY_WHEN_SET: [&str; 2] = ["queue_bound_off", "refused"];

/// Renders the report as aligned text: the catalogue's keys in its order, a line each,
/// the guarantees at the top level.
pub fn render_text(r: &Report) -> String {
    let json = match serde_json::to_value(r) {
        Ok(serde_json::Value::Object(m)) => m,
        _ => return String::new(),
    };
    let mut rows: Vec<(&str, String)> = Vec::new();
    for key in Report::KEYS {
        let keys = if key.flatten {
            key.keys
        } else {
            std::slice::from_ref(key)
        };
        for k in keys {
            let v = json.get(k.name).unwrap_or(&serde_json::Value::Null);
            match v {
                serde_json::Value::Null if TEXT_ONLY_WHEN_SET.contains(&k.name) => {}
                serde_json::Value::Object(flags) => rows.extend(k.keys.iter().map(|f| {
                    let on = flags.get(f.name).and_then(serde_json::Value::as_bool);
                    (
                        f.name,
                        if on == Some(true) { "on" } else { "off" }.to_owned(),
                    )
                })),
                _ if k.name == "kernel_checks" => {
                    rows.push((k.name, checks_text(&r.kernel_checks)))
                }
                _ => rows.push((k.name, text(v, k.keys))),
            }
        }
    }
    rows.iter().map(|(k, v)| format!("{k:<28} {v}\n")).collect()
}

/// The kernel self-test in one line: each check's name and outcome.
fn checks_text(checks: &[KernelCheck]) -> String {
    let not_run = bypass_common::checks::Outcome::NotRun.name();
    if checks.iter().all(|c| c.outcome == not_run) {
        return "none ran".to_owned();
    }
    checks
        .iter()
        .map(|c| format!("{} {}", c.name, c.outcome))
        .collect::<Vec<_>>()
        .join(", ")
}

/// One value as text: null as `-`, a list joined by commas (semicolons when its items
/// hold commas), an entry ([`Key::keys`]) as its first value followed by each other
/// key and value.
fn text(v: &serde_json::Value, keys: &[Key]) -> String {
    use serde_json::Value;
    match v {
        Value::Null => "-".to_owned(),
        Value::String(s) => s.clone(),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(|i| text(i, keys)).collect();
            let sep = if items.iter().any(|i| i.contains(',')) {
                "; "
            } else {
                ", "
            };
            items.join(sep)
        }
        Value::Object(m) => keys
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let v = text(m.get(k.name).unwrap_or(&Value::Null), &[]);
                if i == 0 { v } else { format!("{} {v}", k.name) }
            })
            .collect::<Vec<_>>()
            .join(" "),
        other => other.to_string(),
    }
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
    use bypass_common::{
        Counters,
        status::{EnabledBy, LabelValue},
    };

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
            features: Features::from_checks(
                bypass_common::checks::Results::default().with(
                    bypass_common::checks::FIONREAD_TCP,
                    bypass_common::checks::Outcome::Passed,
                ),
                true,
                true,
                bypass_common::layout::features::GUARD_LSM,
                4 << 20,
            ),
            kernel_checks: KernelCheck::list(bypass_common::checks::Results::default().with(
                bypass_common::checks::FIONREAD_TCP,
                bypass_common::checks::Outcome::Passed,
            )),
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

    /// The keys `status --json` prints at the top, in order, as the catalogue lists
    /// them (`Report::KEYS`, the counters flattened among them).
    fn catalogue_keys() -> Vec<&'static str> {
        Report::KEYS
            .iter()
            .flat_map(|k| {
                if k.flatten {
                    k.keys.iter().map(|c| c.name).collect()
                } else {
                    vec![k.name]
                }
            })
            .collect()
    }

    #[test]
    fn json_keys_follow_the_catalogue() {
        let text = serde_json::to_string_pretty(&sample()).unwrap();
        let top: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("  \""))
            .filter_map(|l| l.split_once('"').map(|(k, _)| k))
            .collect();
        assert_eq!(top, catalogue_keys());
        let features: Vec<&str> = Features::KEYS.iter().map(|k| k.name).collect();
        assert_eq!(
            features,
            sample().features.list().map(|(k, _)| k).to_vec(),
            "list() follows KEYS"
        );
        let kinds: Vec<&str> = AddressRefusals::KEYS[1..].iter().map(|k| k.name).collect();
        assert_eq!(
            kinds,
            bypass_common::refusal::NAMES,
            "refusals follow their kinds"
        );
        let r = AddressRefusals::new("10.0.0.2".parse().unwrap(), [3, 1]);
        assert_eq!(r.kinds(), [("foreign_namespace", 3), ("pairing", 1)]);
    }

    #[test]
    fn text_has_every_key() {
        let r = Report {
            queue_bound_off: Some("off".into()),
            refused: Some("refused".into()),
            ..sample()
        };
        let text = render_text(&r);
        let mut shown: Vec<&str> = text
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        let mut want: Vec<&str> = catalogue_keys()
            .into_iter()
            .filter(|k| *k != "features")
            .chain(Features::KEYS.iter().map(|k| k.name))
            .collect();
        shown.sort_unstable();
        want.sort_unstable();
        assert_eq!(
            shown, want,
            "status's text shows each key of the catalogue once"
        );
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
