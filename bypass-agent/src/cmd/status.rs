//! `status`: what a running datapath holds and has counted ([`crate::report`]), as
//! aligned text or JSON.

use bypass_common::status::{KernelCheck, Key, Report};

use crate::{cli::StatusOpts, datapath::PinLayout, error::AgentError, report::Reading};

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
    let report = Reading::open(&PinLayout::new(&opts.pins.pin_dir))?.report;
    if opts.json {
        super::print_json(&report, "status")?;
    } else {
        print!("{}", render_text(&report));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use bypass_common::{
        Counters,
        status::{AddressOwner, AddressRefusals, EnabledBy, Features, LabelValue},
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
