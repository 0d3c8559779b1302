//! One reading of the pins of a running datapath, by another process: the report that
//! `status` prints (text, JSON) and `/metrics` exports.

use std::{collections::BTreeMap, net::IpAddr};

use bypass_common::{
    PodCounts, Stat,
    status::{
        AddressOwner, AddressRefusals, Features, KernelCheck, Report, queue_bound_off_reason,
    },
};

use crate::{
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
    /// A pod address learned in each network namespace (`PinnedView::pod_netns`).
    pub pod_netns: BTreeMap<u64, IpAddr>,
}

impl Reading {
    /// Reads the pins under `layout` once.
    pub fn open(layout: &PinLayout) -> Result<Self, AgentError> {
        let view = PinnedView::open(layout)?;
        let others = crate::other_programs::list();
        let report = report(&view, layout, &others)?;
        Ok(Self {
            pod_totals: view.pod_totals(),
            pod_netns: view.pod_netns,
            owners_pinned: view.owners.is_some(),
            skipped_runs: view.skipped_runs,
            report,
            others,
        })
    }
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
            .then(|| crate::datapath::refusal_from_results(checks).why),
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
