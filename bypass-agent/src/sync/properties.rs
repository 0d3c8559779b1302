//! Properties of the pure cores, checked on arbitrary input: by the fuzz targets in
//! `test/fuzz/` (through the `fuzz` feature), and on their kept corpus by the unit test
//! below, so every `cargo test` replays what the fuzzer found.

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv6Addr},
};

use k8s_openapi::api::{
    core::v1::{Namespace, Node, Pod},
    networking::v1::ServiceCIDR,
};
use serde::Deserialize;

use crate::{
    cidr::{Cidr, CidrError},
    sync::{self, Policy, Statics},
};

/// The CIDR parser on any bytes: it never panics; what it accepts prints back to text
/// that parses to the same CIDR, has no host bits and a trie key of the right shape;
/// what it rejects for host bits names a canonical form that it accepts.
pub fn cidr_parse(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match text.parse::<Cidr>() {
        Ok(c) => {
            let printed = c.to_string();
            assert_eq!(printed.parse::<Cidr>(), Ok(c), "{text:?} -> {printed}");
            let (len, bytes) = c.trie_key();
            assert!(len <= 128, "{printed}: trie prefix {len}");
            let (addr, prefix) = printed
                .split_once('/')
                .and_then(|(a, p)| Some((a.parse::<IpAddr>().ok()?, p.parse::<u32>().ok()?)))
                .unwrap_or((IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0));
            match addr {
                IpAddr::V4(v4) => {
                    assert_eq!(len, 96 + prefix, "{printed}");
                    assert_eq!(&bytes[..12], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]);
                    assert_eq!(&bytes[12..], &v4.octets());
                }
                IpAddr::V6(v6) => {
                    assert_eq!(len, prefix, "{printed}");
                    assert_eq!(bytes, v6.octets());
                }
            }
            // No bit set beyond the prefix.
            let bits = u128::from_be_bytes(bytes);
            let host = if len >= 128 { 0 } else { u128::MAX >> len };
            assert_eq!(bits & host, 0, "{printed} has host bits in its key");
        }
        Err(CidrError::HostBits { canonical, .. }) => {
            assert!(
                canonical.parse::<Cidr>().is_ok(),
                "{text:?}: suggested {canonical}, which is rejected"
            );
        }
        Err(e) => {
            assert!(!e.to_string().is_empty());
        }
    }
}

/// What the reconcile target reads: cluster objects and the maps' current contents, as
/// JSON.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ReconcileInput {
    /// This node's name.
    pub node_name: String,
    /// The Node object (its podCIDRs must change nothing).
    pub node: Option<Node>,
    /// Pods (of any node).
    pub pods: Vec<Pod>,
    /// Namespaces.
    pub namespaces: Vec<Namespace>,
    /// ServiceCIDR objects; absent: not listed yet.
    pub service_cidrs: Option<Vec<ServiceCIDR>>,
    /// `--service-cidr` values (unparseable ones are dropped).
    pub static_service_cidrs: Vec<String>,
    /// `--pod-cidr` values (unparseable ones are dropped).
    pub static_cidrs: Vec<String>,
    /// `--pod-ip` values.
    pub static_addrs: Vec<IpAddr>,
    /// CIDRs in the trie now (unparseable ones are dropped).
    pub current_cidrs: Vec<String>,
    /// Addresses in the map now.
    pub current_addrs: Vec<IpAddr>,
    /// Excluded addresses in the map now.
    pub current_excluded: Vec<IpAddr>,
    /// CIDRs in the Service CIDR trie now (unparseable ones are dropped).
    pub current_service_cidrs: Vec<String>,
}

/// Reconcile on any JSON: `desired` never panics and does not depend on the order of
/// pods, namespaces or ServiceCIDRs; its addresses are canonical; its Service CIDRs, once
/// known, include the flags; the plan from any current contents is disjoint, minimal,
/// and applied gives exactly the desired contents (the Service CIDR trie untouched
/// while the objects are unknown); from the desired contents it is empty.
pub fn reconcile(data: &[u8]) {
    let Ok(input) = serde_json::from_slice::<ReconcileInput>(data) else {
        return;
    };
    let policy = Policy {
        node: input.node_name.clone(),
        exclude_annotation: "bypass.dev/exclude".into(),
        exclude_namespace_label: "bypass.dev/exclude".into(),
        include_namespace_label: None,
    };
    let cidrs =
        |v: &[String]| -> BTreeSet<Cidr> { v.iter().filter_map(|s| s.parse().ok()).collect() };
    let statics = Statics {
        cidrs: cidrs(&input.static_cidrs),
        addrs: input.static_addrs.iter().copied().collect(),
        service_cidrs: cidrs(&input.static_service_cidrs),
        service_backends: BTreeSet::new(),
    };
    let want = sync::desired(
        &input.pods,
        &input.namespaces,
        input.service_cidrs.as_deref(),
        &policy,
        &statics,
    );
    let reversed = sync::desired(
        input.pods.iter().rev(),
        input.namespaces.iter().rev(),
        input.service_cidrs.as_ref().map(|v| v.iter().rev()),
        &policy,
        &statics,
    );
    assert_eq!(
        want, reversed,
        "desired depends on the order of the objects"
    );
    for a in &want.addrs {
        assert_eq!(*a, a.to_canonical(), "{a} is not canonical");
    }
    assert_eq!(want.cidrs, statics.cidrs, "only --pod-cidr makes CIDRs");
    assert!(
        want.addrs.is_disjoint(&want.excluded),
        "an address is a pod's or excluded, never both"
    );
    assert_eq!(want.service_cidrs.is_some(), input.service_cidrs.is_some());
    if let Some(s) = &want.service_cidrs {
        assert!(s.is_superset(&statics.service_cidrs));
    }

    let current = sync::Current {
        cidrs: cidrs(&input.current_cidrs),
        addrs: input.current_addrs.iter().copied().collect(),
        excluded: input.current_excluded.iter().copied().collect(),
        service_cidrs: cidrs(&input.current_service_cidrs),
        service_backends: BTreeSet::new(),
    };
    let (current_cidrs, current_addrs) = (&current.cidrs, &current.addrs);
    let p = sync::plan(&current, &want);
    let canonical: BTreeSet<IpAddr> = current_addrs.iter().map(IpAddr::to_canonical).collect();
    for c in &p.add_cidrs {
        assert!(!current_cidrs.contains(c) && !p.remove_cidrs.contains(c));
    }
    for c in &p.remove_cidrs {
        assert!(current_cidrs.contains(c) && !want.cidrs.contains(c));
    }
    for a in &p.add_addrs {
        assert!(!canonical.contains(a) && !p.remove_addrs.contains(a));
    }
    let mut after_cidrs = current_cidrs.clone();
    after_cidrs.extend(p.add_cidrs.iter().copied());
    for c in &p.remove_cidrs {
        after_cidrs.remove(c);
    }
    assert_eq!(after_cidrs, want.cidrs);
    let mut after_addrs = canonical.clone();
    after_addrs.extend(p.add_addrs.iter().copied());
    for a in &p.remove_addrs {
        after_addrs.remove(a);
    }
    assert_eq!(after_addrs, want.addrs);
    let mut after_excluded: BTreeSet<IpAddr> =
        current.excluded.iter().map(IpAddr::to_canonical).collect();
    after_excluded.extend(p.add_excluded.iter().copied());
    for a in &p.remove_excluded {
        assert!(after_excluded.remove(a), "{a} removed but not there");
    }
    assert_eq!(after_excluded, want.excluded);
    for c in &p.add_service_cidrs {
        assert!(!current.service_cidrs.contains(c) && !p.remove_service_cidrs.contains(c));
    }
    let mut after_services = current.service_cidrs.clone();
    after_services.extend(p.add_service_cidrs.iter().copied());
    for c in &p.remove_service_cidrs {
        assert!(after_services.remove(c), "{c} removed but not there");
    }
    assert_eq!(
        &after_services,
        want.service_cidrs
            .as_ref()
            .unwrap_or(&current.service_cidrs)
    );
    let reached = sync::Current {
        cidrs: want.cidrs.clone(),
        addrs: want.addrs.clone(),
        excluded: want.excluded.clone(),
        service_cidrs: after_services,
        service_backends: BTreeSet::new(),
    };
    assert!(sync::plan(&reached, &want).is_empty());
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    /// Every file of `test/fuzz/corpus/<target>`: the seeds and what the fuzzer kept.
    fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../test/fuzz/corpus")
            .join(target);
        let mut files: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| {
                let p = e.unwrap().path();
                let bytes = std::fs::read(&p).unwrap();
                (p, bytes)
            })
            .collect();
        files.sort();
        assert!(!files.is_empty(), "empty corpus {}", dir.display());
        files
    }

    #[test]
    fn cidr_corpus() {
        for (path, bytes) in corpus("cidr") {
            let r = std::panic::catch_unwind(|| cidr_parse(&bytes));
            assert!(r.is_ok(), "{} fails", path.display());
        }
    }

    #[test]
    fn reconcile_corpus() {
        let mut parsed = 0;
        for (path, bytes) in corpus("reconcile") {
            if serde_json::from_slice::<ReconcileInput>(&bytes).is_ok() {
                parsed += 1;
            }
            let r = std::panic::catch_unwind(|| reconcile(&bytes));
            assert!(r.is_ok(), "{} fails", path.display());
        }
        assert!(parsed >= 3, "the seeds should parse");
    }
}
