//! `status`: what a running datapath holds and has counted, read from its pins by
//! another process.

use std::net::IpAddr;

use bypass_common::Stat;
use serde::Serialize;

use crate::{
    cli::StatusOpts,
    datapath::{Counters, PinLayout, PinnedView},
    error::AgentError,
    toggle::{EnabledBy, LabelValue, Recorded},
};

/// The report, as printed.
#[derive(Debug, Serialize)]
pub struct Report {
    /// sock_ops attached and redirects allowed.
    pub attached: bool,
    /// Sockets in the SockHash now.
    pub sockets: usize,
    /// Entries in the socket address map: one per socket in the SockHash, each removed
    /// when its socket closes; null for a datapath pinned by a build without the map.
    pub addr_entries: Option<usize>,
    /// Bound, in bytes, on a peer's ingress queue (0: none).
    pub max_queued_bytes: u32,
    /// Counters.
    #[serde(flatten)]
    pub counters: Counters,
    /// Pod CIDRs in the trie.
    pub pod_cidrs: Vec<String>,
    /// Exact pod addresses.
    pub pod_addresses: Vec<IpAddr>,
    /// Service (ClusterIP) CIDRs.
    pub service_cidrs: Vec<String>,
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
}

/// Reads the pins and builds the report.
pub fn read(layout: &PinLayout) -> Result<Report, AgentError> {
    let view = PinnedView::open(layout)?;
    let recorded = Recorded::decode(view.control.agent_state()?);
    Ok(Report {
        attached: view.link_pinned && view.control.enabled()?,
        sockets: crate::datapath::count_sockets(&view.sockets),
        addr_entries: view.addrs.as_ref().map(crate::datapath::SockAddrs::len),
        max_queued_bytes: view.control.max_queued()?,
        counters: view.stats.read()?,
        pod_cidrs: view
            .pod_maps
            .cidrs()
            .iter()
            .map(ToString::to_string)
            .collect(),
        pod_addresses: view.pod_maps.addrs().into_iter().collect(),
        service_cidrs: view
            .pod_maps
            .service_cidrs()
            .iter()
            .map(ToString::to_string)
            .collect(),
        skip_ports: view.skip_ports.ports().into_iter().collect(),
        enabled_by: recorded.and_then(|r| r.enabled_by),
        label_value: recorded.map(|r| r.label),
        pin_dir: layout.root().display().to_string(),
    })
}

/// Renders the report as aligned text.
pub fn render_text(r: &Report) -> String {
    let c = &r.counters;
    let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    let mut rows: Vec<(&str, String)> = vec![
        ("attached", r.attached.to_string()),
        ("sockets", r.sockets.to_string()),
        ("addr_entries", opt(r.addr_entries.map(|n| n.to_string()))),
        ("max_queued_bytes", r.max_queued_bytes.to_string()),
    ];
    rows.extend(Stat::ALL.map(|s| (s.name(), c.get(s).to_string())));
    rows.extend([
        ("pod_cidrs", r.pod_cidrs.join(", ")),
        (
            "pod_addresses",
            r.pod_addresses
                .iter()
                .map(ToString::to_string)
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
        (
            "skip_ports",
            r.skip_ports
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(","),
        ),
        ("pin_dir", r.pin_dir.clone()),
    ]);
    rows.iter().map(|(k, v)| format!("{k:<28} {v}\n")).collect()
}

/// `bypass-agent status`.
pub fn status(opts: StatusOpts) -> Result<(), AgentError> {
    let report = read(&PinLayout::new(&opts.pins.pin_dir))?;
    if opts.json {
        let text = serde_json::to_string_pretty(&report).map_err(|e| AgentError::Bpf {
            action: "encode status".into(),
            detail: e.to_string(),
        })?;
        println!("{text}");
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
            addr_entries: Some(4),
            max_queued_bytes: 4 << 20,
            counters: Counters {
                redirected_bytes: 1024,
                ..Default::default()
            },
            pod_cidrs: vec!["10.0.0.0/24".into()],
            pod_addresses: vec!["fd00::2".parse().unwrap()],
            service_cidrs: vec!["10.96.0.0/12".into()],
            skip_ports: vec![15021],
            enabled_by: Some(EnabledBy::Label),
            label_value: Some(LabelValue::True),
            pin_dir: "/sys/fs/bpf/bypass".into(),
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
            "skip_ports",
            "pod_cidrs",
            "pod_addresses",
            "enabled_by",
            "label_value",
        ] {
            assert!(v.get(k).is_some(), "missing {k} in {v}");
        }
        assert_eq!(v["redirected_bytes"], 1024);
        assert_eq!(v["enabled_by"], "label");
        assert_eq!(v["label_value"], "true");
    }

    #[test]
    fn text_lists_counters() {
        let t = render_text(&sample());
        assert!(t.contains("redirected_bytes             1024"), "{t}");
        assert!(t.contains("attached                     true"), "{t}");
    }
}
