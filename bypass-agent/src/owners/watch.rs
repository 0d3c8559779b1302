//! The agent's pass over the node's namespaces: scan, decide, write the owners map, cut
//! the connections of addresses that lost their owner.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    time::Duration,
};

use tracing::{info, warn};

use super::{HostNamespace, PodAddresses, cut_astray_or_retry, plan, resolve, scan};
use crate::{datapath::Datapath, error::AgentError};

/// How often the agent reads the node's namespaces (also after every reconcile pass and
/// when a link or an address changes: [`super::Events`]).
pub const INTERVAL: Duration = Duration::from_secs(1);

/// A testing knob: the poll's interval in whole seconds instead of [`INTERVAL`], so a
/// test can tell a cut an event caused from one the poll did.
pub const POLL_ENV: &str = "BYPASS_TESTING_OWNERS_POLL_SECONDS";

/// The poll's interval: [`INTERVAL`], or [`POLL_ENV`]'s.
pub fn poll_interval() -> Result<Duration, AgentError> {
    parse_poll(std::env::var_os(POLL_ENV).as_deref())
}

/// The poll's interval from [`POLL_ENV`]'s value, if it is set (pure).
fn parse_poll(value: Option<&std::ffi::OsStr>) -> Result<Duration, AgentError> {
    match value {
        None => Ok(INTERVAL),
        Some(v) => v
            .to_str()
            .and_then(|s| s.parse::<u64>().ok())
            .filter(|s| *s >= 1)
            .map(Duration::from_secs)
            .ok_or_else(|| AgentError::System {
                action: "read BYPASS_TESTING_OWNERS_POLL_SECONDS (a whole number of seconds, at least 1; unset it for the default, 1)",
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("{v:?} is not one"),
                ),
            }),
    }
}

/// What one pass found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Addresses with an owner.
    pub owned: usize,
    /// Addresses claimed by more than one namespace.
    pub contested: BTreeSet<IpAddr>,
    /// Namespaces that hold more pod addresses than a pod does, with how many: they own
    /// none.
    pub crowded: BTreeMap<u64, usize>,
    /// Namespaces read.
    pub namespaces: usize,
    /// Namespaces that could not be read.
    pub unreadable: usize,
    /// Connections cut because an address lost its owner.
    pub cut: usize,
}

/// Keeps the owners map in step with the node's namespaces.
pub struct Watcher {
    host: HostNamespace,
    last: Report,
    /// Addresses that lost their owner and whose connections are not cut yet (a cut
    /// that failed is tried again on the next pass, whatever the map says by then).
    uncut: BTreeSet<IpAddr>,
    /// The namespaces whose per-pod counts the last pass kept.
    kept: BTreeSet<u64>,
    /// The node's own addresses, as last read.
    node: BTreeSet<IpAddr>,
    /// Whether a pass has cut every link astray since this agent started
    /// ([`Datapath::cut_links_astray`]): once per start, until it succeeds.
    audited: bool,
}

impl Watcher {
    /// A watcher for `dp`, or `None` when the ownership check is off
    /// (`--netns-owners=any`). Call from a thread in the node's network namespace.
    pub fn new(dp: &Datapath) -> Result<Option<Self>, AgentError> {
        if !dp.netns_owners() {
            return Ok(None);
        }
        Ok(Some(Self {
            host: HostNamespace::current()?,
            last: Report::default(),
            uncut: BTreeSet::new(),
            kept: BTreeSet::new(),
            node: BTreeSet::new(),
            audited: false,
        }))
    }

    /// One pass. Logs what changed.
    pub fn pass(&mut self, dp: &mut Datapath) -> Result<Report, AgentError> {
        let found = scan(&self.host)?;
        let pods = PodAddresses::of(dp);
        // A read of the node's addresses that failed keeps the last one's.
        if let Some(node) = found.node {
            self.node = node;
        }
        // The node's addresses are nobody's where only the flags' CIDRs make them pod
        // addresses: an address a Pod's status gives (Kubernetes mode) stays its pod's,
        // whatever the node holds too.
        let node: BTreeSet<IpAddr> = self
            .node
            .iter()
            .filter(|ip| !pods.addrs.contains(ip))
            .copied()
            .collect();
        let owners = resolve(found.claims, &node, |ip| pods.contains(ip));
        let p = plan(&dp.owners(), &owners.owned);
        // Written first (a lost address is nobody's before its connections are cut, so
        // none is inserted again meanwhile), every entry tried; the cut runs whatever
        // the writes did, and is retried until it succeeds.
        let written = dp.write_owners(&p);
        self.uncut.extend(p.lost.keys().copied());
        let mut cut = if self.uncut.is_empty() {
            0
        } else {
            let n = dp.cut_links(&self.uncut)?;
            self.uncut.clear();
            n
        };
        // The losses above are those this agent saw. What an earlier agent wrote into
        // the pinned maps and had not cut when it stopped (killed, upgraded in place,
        // its cut failing until then) no pass can see as a change: once per start, every
        // link whose sides no longer stand where they were paired is cut.
        // A failure is retried on the next pass, and does not hold up this one.
        if !self.audited
            && let Some(astray) = cut_astray_or_retry(dp)
        {
            cut += astray;
            self.audited = true;
        }
        written?;
        // The per-pod counts of namespaces that are gone (their pods with them) go.
        // Kept while a namespace lives, owner or not now: a pod that takes its own
        // interface down a moment does not drop what its closed connections carried.
        // Only namespaces that owned a pod address when their sockets were inserted
        // have entries, so they are bounded by the pods of this node.
        // A namespace's entry goes once two passes in a row did not find it, and never
        // after a pass that could not read every namespace (one read failing once is
        // not one gone).
        let keep_now: BTreeSet<u64> = owners
            .owned
            .values()
            .copied()
            .chain(found.alive.iter().copied())
            .collect();
        let keep: BTreeSet<u64> = keep_now.union(&self.kept).copied().collect();
        let pruned = if found.unreadable > 0 {
            Ok(0)
        } else {
            dp.prune_pod_counts(&keep)
        };
        self.kept = keep_now;
        let report = Report {
            owned: owners.owned.len(),
            contested: owners.contested,
            crowded: owners.crowded,
            namespaces: found.namespaces,
            unreadable: found.unreadable,
            cut,
        };
        if !p.is_empty() {
            info!(
                owned = report.owned,
                added = p.set.len() - p.lost.keys().filter(|ip| !p.remove.contains(ip)).count(),
                lost = ?p.lost.keys().collect::<Vec<_>>(),
                connections_cut = cut,
                "pod address owners changed"
            );
        }
        for ip in report.contested.difference(&self.last.contested) {
            warn!(address = %ip, "two network namespaces hold this pod address on interfaces that reach the node: it is nobody's (its connections keep TCP) until one of them lets it go");
        }
        for (netns, n) in &report.crowded {
            if !self.last.crowded.contains_key(netns) {
                warn!(
                    netns_cookie = netns,
                    pod_addresses = n,
                    at_most = super::MAX_OWNED_PER_NAMESPACE,
                    "a network namespace holds more pod addresses than a pod does: it owns none of them (its connections keep TCP) until it holds at most this many"
                );
            }
        }
        if report.unreadable > 0 && self.last.unreadable == 0 {
            warn!(
                unreadable = report.unreadable,
                "some network namespaces could not be read (gone meanwhile, or the agent lacks CAP_SYS_ADMIN): their pods are not bypassed"
            );
        }
        self.last = report.clone();
        pruned?;
        Ok(report)
    }

    /// The last pass's report.
    pub fn last(&self) -> &Report {
        &self.last
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    #[test]
    fn the_poll_knob_takes_whole_seconds_and_names_itself_otherwise() {
        assert_eq!(parse_poll(None).unwrap(), INTERVAL);
        assert_eq!(
            parse_poll(Some(OsStr::new("3600"))).unwrap(),
            Duration::from_secs(3600)
        );
        for bad in ["0", "-1", "1.5", "", "soon"] {
            let e = parse_poll(Some(OsStr::new(bad))).unwrap_err().to_string();
            assert!(e.contains(POLL_ENV) && e.contains(bad), "{bad}: {e}");
        }
    }
}
