//! `status`: what a running datapath holds and has counted, read from its pins by
//! another process.

use std::net::IpAddr;

use serde::Serialize;

use crate::{
    cli::StatusOpts,
    datapath::{Counters, PinLayout, PinnedView},
    error::AgentError,
};

/// The report, as printed.
#[derive(Debug, Serialize)]
pub struct Report {
    /// sock_ops attached and redirects allowed.
    pub attached: bool,
    /// Sockets in the SockHash now.
    pub sockets: usize,
    /// Counters.
    #[serde(flatten)]
    pub counters: Counters,
    /// Pod CIDRs in the trie.
    pub pod_cidrs: Vec<String>,
    /// Exact pod addresses.
    pub pod_addresses: Vec<IpAddr>,
    /// The pin directory read.
    pub pin_dir: String,
}

/// Reads the pins and builds the report.
pub fn read(layout: &PinLayout) -> Result<Report, AgentError> {
    let view = PinnedView::open(layout)?;
    Ok(Report {
        attached: view.link_pinned && view.control.enabled()?,
        sockets: crate::datapath::count_sockets(&view.sockets),
        counters: view.stats.read()?,
        pod_cidrs: view.pod_maps.cidrs().iter().map(ToString::to_string).collect(),
        pod_addresses: view.pod_maps.addrs().into_iter().collect(),
        pin_dir: layout.root().display().to_string(),
    })
}

/// Renders the report as aligned text.
pub fn render_text(r: &Report) -> String {
    let c = &r.counters;
    let rows: [(&str, String); 13] = [
        ("attached", r.attached.to_string()),
        ("sockets", r.sockets.to_string()),
        ("sockets_inserted", c.sockets_inserted.to_string()),
        ("sockets_skipped", c.sockets_skipped.to_string()),
        ("insert_failures", c.insert_failures.to_string()),
        ("redirected_messages", c.redirected_messages.to_string()),
        ("redirected_bytes", c.redirected_bytes.to_string()),
        ("passed_messages", c.passed_messages.to_string()),
        ("passed_bytes", c.passed_bytes.to_string()),
        ("pod_cidrs", r.pod_cidrs.join(", ")),
        (
            "pod_addresses",
            r.pod_addresses
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        ),
        ("pin_dir", r.pin_dir.clone()),
        ("", String::new()),
    ];
    rows.iter()
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, v)| format!("{k:<20} {v}\n"))
        .collect()
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
            counters: Counters {
                redirected_bytes: 1024,
                ..Default::default()
            },
            pod_cidrs: vec!["10.0.0.0/24".into()],
            pod_addresses: vec!["fd00::2".parse().unwrap()],
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
            "pod_cidrs",
            "pod_addresses",
        ] {
            assert!(v.get(k).is_some(), "missing {k} in {v}");
        }
        assert_eq!(v["redirected_bytes"], 1024);
    }

    #[test]
    fn text_lists_counters() {
        let t = render_text(&sample());
        assert!(t.contains("redirected_bytes     1024"), "{t}");
        assert!(t.contains("attached             true"), "{t}");
    }
}
