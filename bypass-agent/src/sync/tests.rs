//! The pure sync core against Kubernetes objects built in memory.

use serde_json::json;

use super::*;

const NODE: &str = "node-a";

fn policy() -> Policy {
    Policy {
        node: NODE.into(),
        exclude_annotation: "bypass.dev/exclude".into(),
        exclude_namespace_label: "bypass.dev/exclude".into(),
        include_namespace_label: None,
    }
}

fn pod(ns: &str, name: &str, node: &str, ips: &[&str]) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"namespace": ns, "name": name},
        "spec": {"nodeName": node, "containers": [{"name": "c"}]},
        "status": {
            "phase": "Running",
            "podIP": ips.first(),
            "podIPs": ips.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>(),
        },
    }))
    .unwrap()
}

fn with(mut p: Pod, f: impl FnOnce(&mut Pod)) -> Pod {
    f(&mut p);
    p
}

fn ns(name: &str, labels: &[(&str, &str)]) -> Namespace {
    let labels: BTreeMap<_, _> = labels.iter().copied().collect();
    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap()
}

fn ips(list: &[&str]) -> BTreeSet<IpAddr> {
    list.iter().map(|s| s.parse().unwrap()).collect()
}

fn cidrs(list: &[&str]) -> BTreeSet<Cidr> {
    list.iter().map(|s| s.parse().unwrap()).collect()
}

fn run(pods: &[Pod], nss: &[Namespace]) -> Desired {
    desired(pods, nss, UNKNOWN, &policy(), &Statics::default())
}

/// ServiceCIDRs not listed yet.
const UNKNOWN: Option<&[ServiceCIDR]> = None;

fn service_cidr(name: &str, list: &[&str], ready: Option<bool>) -> ServiceCIDR {
    let conditions: Vec<_> = ready
        .map(|r| {
            json!({
                "type": "Ready",
                "status": if r { "True" } else { "False" },
                "lastTransitionTime": "2026-01-01T00:00:00Z",
                "reason": "", "message": "",
            })
        })
        .into_iter()
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"cidrs": list},
        "status": {"conditions": conditions},
    }))
    .unwrap()
}

fn current(cidrs_: &[&str], addrs_: &[&str], services: &[&str]) -> Current {
    Current {
        cidrs: cidrs(cidrs_),
        addrs: ips(addrs_),
        excluded: BTreeSet::new(),
        service_cidrs: cidrs(services),
        service_backends: BTreeSet::new(),
    }
}

#[test]
fn dual_stack_pods_and_no_node_cidrs() {
    let pods = [
        pod("default", "a", NODE, &["10.244.1.2", "fd00:10:244:1::2"]),
        pod("default", "b", NODE, &["10.244.1.3"]),
    ];
    let d = run(&pods, &[]);
    // Only Pod objects make pod addresses: nothing from the node's podCIDRs.
    assert!(d.cidrs.is_empty());
    assert_eq!(
        d.addrs,
        ips(&["10.244.1.2", "10.244.1.3", "fd00:10:244:1::2"])
    );
    assert_eq!(d.pods_tracked, 2);
    assert!(d.rejections.is_empty());
}

#[test]
fn ineligible_pods_contribute_nothing() {
    let pods = [
        pod("default", "other", "node-b", &["10.244.2.2"]),
        pod("default", "unscheduled", "", &["10.244.1.9"]),
        with(pod("default", "host", NODE, &["192.168.0.10"]), |p| {
            p.spec.as_mut().unwrap().host_network = Some(true);
        }),
        with(pod("default", "done", NODE, &["10.244.1.4"]), |p| {
            p.status.as_mut().unwrap().phase = Some("Succeeded".into());
        }),
        with(pod("default", "failed", NODE, &["10.244.1.5"]), |p| {
            p.status.as_mut().unwrap().phase = Some("Failed".into());
        }),
        with(pod("default", "optout", NODE, &["10.244.1.6"]), |p| {
            p.metadata.annotations =
                Some([("bypass.dev/exclude".to_owned(), "true".to_owned())].into());
        }),
        pod("quiet", "in-excluded-ns", NODE, &["10.244.1.7"]),
        pod("default", "pending", NODE, &[]),
    ];
    let nss = [
        ns("quiet", &[("bypass.dev/exclude", "true")]),
        ns("default", &[]),
    ];
    let d = run(&pods, &nss);
    assert!(d.addrs.is_empty(), "{:?}", d.addrs);
    assert_eq!(d.pods_tracked, 0);
    // Opted-out and host-network pods' addresses are never a pod's, whatever CIDR
    // holds them; other nodes', finished and address-less pods are simply absent.
    assert_eq!(
        d.excluded,
        ips(&["192.168.0.10", "10.244.1.6", "10.244.1.7"])
    );
    let counts = &d.pods;
    assert_eq!(counts.get("tracked"), None);
    assert_eq!(counts["other_node"], 2);
    assert_eq!(counts["host_network"], 1);
    assert_eq!(counts["finished"], 2);
    assert_eq!(counts["excluded"], 1);
    assert_eq!(counts["namespace_excluded"], 1);
    assert_eq!(counts["no_address"], 1);
}

#[test]
fn opt_out_false_keeps_pod_and_bad_values_opt_out_with_rejection() {
    let keep = with(pod("default", "keep", NODE, &["10.244.1.2"]), |p| {
        p.metadata.annotations =
            Some([("bypass.dev/exclude".to_owned(), "false".to_owned())].into());
    });
    let odd = with(pod("default", "odd", NODE, &["10.244.1.3"]), |p| {
        p.metadata.annotations = Some([("bypass.dev/exclude".to_owned(), "yes".to_owned())].into());
    });
    let in_odd_ns = pod("weird", "w", NODE, &["10.244.1.4"]);
    let in_open_ns = pod("open", "o", NODE, &["10.244.1.5"]);
    let nss = [
        ns("weird", &[("bypass.dev/exclude", "TRUE")]),
        ns("open", &[("bypass.dev/exclude", "false")]),
    ];
    let d = run(&[keep, odd, in_odd_ns, in_open_ns], &nss);
    assert_eq!(d.addrs, ips(&["10.244.1.2", "10.244.1.5"]));
    let objects: Vec<_> = d
        .rejections
        .iter()
        .map(|r| (r.kind, r.object.as_str()))
        .collect();
    assert_eq!(
        objects,
        [
            (RejectionKind::OptOutValue, "namespace weird"),
            (RejectionKind::OptOutValue, "pod default/odd"),
        ]
    );
}

#[test]
fn malformed_addresses_are_rejected_one_by_one() {
    let p = pod("default", "m", NODE, &["10.244.1.010", "fd00::2"]);
    let only_bad = pod("default", "bad", NODE, &["not-an-ip"]);
    let special = pod(
        "default",
        "lo",
        NODE,
        &["127.0.0.1", "0.0.0.0", "ff02::1", "::"],
    );
    let d = run(&[p, only_bad, special], &[]);
    assert_eq!(d.addrs, ips(&["fd00::2"]));
    assert_eq!(d.pods_tracked, 1);
    let bad: BTreeSet<_> = d
        .rejections
        .iter()
        .filter(|r| r.kind == RejectionKind::PodAddress)
        .map(|r| r.value.as_str())
        .collect();
    assert_eq!(
        bad,
        [
            "10.244.1.010",
            "not-an-ip",
            "127.0.0.1",
            "0.0.0.0",
            "ff02::1",
            "::"
        ]
        .into()
    );
    let r = d
        .rejections
        .iter()
        .find(|r| r.value == "not-an-ip")
        .unwrap();
    assert_eq!(r.object, "pod default/bad");
    assert_eq!(r.field, "status.podIPs");
    assert!(r.to_string().contains("not an IP address"), "{r}");
}

#[test]
fn pod_ip_fallback_and_mapped_addresses() {
    let legacy: Pod = serde_json::from_value(json!({
        "metadata": {"namespace": "d", "name": "legacy"},
        "spec": {"nodeName": NODE, "containers": []},
        "status": {"podIP": "10.244.1.8"},
    }))
    .unwrap();
    let mapped = pod("d", "mapped", NODE, &["::ffff:10.244.1.9"]);
    let d = run(&[legacy, mapped], &[]);
    assert_eq!(d.addrs, ips(&["10.244.1.8", "10.244.1.9"]));
}

#[test]
fn opt_out_wins_over_a_shared_address() {
    let out = with(pod("d", "out", NODE, &["10.244.1.2"]), |p| {
        p.metadata.annotations =
            Some([("bypass.dev/exclude".to_owned(), "true".to_owned())].into());
    });
    let other = pod("d", "other", NODE, &["10.244.1.2", "10.244.1.3"]);
    let d = run(&[out, other], &[]);
    assert_eq!(d.addrs, ips(&["10.244.1.3"]));
    assert_eq!(d.excluded, ips(&["10.244.1.2"]));
    // Only a tracked address names its pod (the per-pod counters' labels).
    let names: Vec<(IpAddr, &str)> = d
        .identities
        .iter()
        .map(|(ip, id)| (*ip, id.pod.as_str()))
        .collect();
    assert_eq!(names, [("10.244.1.3".parse().unwrap(), "other")]);
    assert_eq!(d.identities[&"10.244.1.3".parse().unwrap()].namespace, "d");
}

#[test]
fn plan_moves_addresses_between_pod_and_excluded() {
    let want = Desired {
        addrs: ips(&["10.244.1.3"]),
        excluded: ips(&["10.244.1.2"]),
        ..Desired::default()
    };
    let p = plan(
        &Current {
            addrs: ips(&["10.244.1.2"]),
            excluded: ips(&["::ffff:10.244.1.3"]),
            ..Current::default()
        },
        &want,
    );
    assert_eq!(
        p.add_excluded,
        vec!["10.244.1.2".parse::<IpAddr>().unwrap()]
    );
    assert_eq!(
        p.remove_addrs,
        vec!["10.244.1.2".parse::<IpAddr>().unwrap()]
    );
    assert_eq!(p.add_addrs, vec!["10.244.1.3".parse::<IpAddr>().unwrap()]);
    assert_eq!(
        p.remove_excluded,
        vec!["10.244.1.3".parse::<IpAddr>().unwrap()]
    );
}

#[test]
fn statics_always_kept() {
    let statics = Statics {
        cidrs: cidrs(&["10.99.0.0/16"]),
        addrs: ips(&["::ffff:10.98.0.1"]),
        ..Statics::default()
    };
    let d = desired(&[], &[], UNKNOWN, &policy(), &statics);
    assert_eq!(d.cidrs, cidrs(&["10.99.0.0/16"]));
    assert_eq!(d.addrs, ips(&["10.98.0.1"]));
}

#[test]
fn shared_address_of_finished_and_running_pod_is_kept() {
    let old = with(pod("d", "old", NODE, &["10.244.1.2"]), |p| {
        p.status.as_mut().unwrap().phase = Some("Succeeded".into());
    });
    let new = pod("d", "new", NODE, &["10.244.1.2"]);
    assert_eq!(run(&[old, new], &[]).addrs, ips(&["10.244.1.2"]));
}

#[test]
fn plan_adds_and_removes() {
    let want = Desired {
        cidrs: cidrs(&["10.244.1.0/24", "fd00::/64"]),
        addrs: ips(&["10.244.1.2", "fd00::2"]),
        ..Desired::default()
    };
    let p = plan(
        &current(
            &["10.244.1.0/24", "10.0.0.0/8"],
            &["10.244.1.3", "fd00::2"],
            &[],
        ),
        &want,
    );
    assert_eq!(p.add_cidrs, vec!["fd00::/64".parse::<Cidr>().unwrap()]);
    assert_eq!(p.remove_cidrs, vec!["10.0.0.0/8".parse::<Cidr>().unwrap()]);
    assert_eq!(p.add_addrs, vec!["10.244.1.2".parse::<IpAddr>().unwrap()]);
    assert_eq!(
        p.remove_addrs,
        vec!["10.244.1.3".parse::<IpAddr>().unwrap()]
    );
    assert!(!p.is_empty());
    assert!(
        plan(
            &Current {
                cidrs: want.cidrs.clone(),
                addrs: want.addrs.clone(),
                ..Current::default()
            },
            &want
        )
        .is_empty()
    );
}

#[test]
fn plan_treats_mapped_current_as_ipv4() {
    let want = Desired {
        addrs: ips(&["10.244.1.2"]),
        ..Desired::default()
    };
    assert!(plan(&current(&[], &["::ffff:10.244.1.2"], &[]), &want).is_empty());
}

/// CIDRs given in IPv4-mapped form, written to the tries and read back: the next plan
/// changes nothing (it used to remove them, turning the bypass off).
#[test]
fn plan_keeps_mapped_cidrs_read_back_from_the_trie() {
    let given = cidrs(&["::ffff:10.244.0.0/112", "fd00::/64"]);
    let services = cidrs(&["::ffff:10.96.0.0/108"]);
    let want = Desired {
        cidrs: given.clone(),
        service_cidrs: Some(services.clone()),
        ..Desired::default()
    };
    let read_back = |set: &BTreeSet<Cidr>| -> BTreeSet<Cidr> {
        set.iter()
            .map(|c| {
                let (len, bytes) = c.trie_key();
                Cidr::from_trie_key(len, bytes).unwrap()
            })
            .collect()
    };
    let now = Current {
        cidrs: read_back(&given),
        service_cidrs: read_back(&services),
        ..Current::default()
    };
    let p = plan(&now, &want);
    assert!(p.is_empty(), "{p:?}");
}

#[test]
fn address_change_moves_the_entry() {
    let before = run(&[pod("d", "p", NODE, &["10.244.1.2"])], &[]);
    let after = run(&[pod("d", "p", NODE, &["10.244.1.3"])], &[]);
    let p = plan(
        &Current {
            addrs: before.addrs,
            ..Current::default()
        },
        &after,
    );
    assert_eq!(p.add_addrs, vec!["10.244.1.3".parse::<IpAddr>().unwrap()]);
    assert_eq!(
        p.remove_addrs,
        vec!["10.244.1.2".parse::<IpAddr>().unwrap()]
    );
}

#[test]
fn new_rejections_reports_each_once() {
    let a = run(&[pod("d", "x", NODE, &["bogus"])], &[]);
    let b = run(
        &[
            pod("d", "x", NODE, &["bogus"]),
            pod("d", "y", NODE, &["nope"]),
        ],
        &[],
    );
    assert_eq!(new_rejections(&BTreeSet::new(), &a.rejections).len(), 1);
    let fresh = new_rejections(&a.rejections, &b.rejections);
    assert_eq!(fresh.len(), 1);
    assert_eq!(fresh[0].value, "nope");
    assert!(new_rejections(&b.rejections, &b.rejections).is_empty());
}

#[test]
fn service_cidrs_are_the_flags_and_every_object() {
    let statics = Statics {
        service_cidrs: cidrs(&["10.96.0.0/12"]),
        ..Statics::default()
    };
    let objects = [
        service_cidr(
            "kubernetes",
            &["10.0.0.0/24", "fd00:10:96::/112"],
            Some(true),
        ),
        // Not Ready yet, or terminating: its ClusterIPs may still be in use.
        service_cidr("extra", &["10.1.0.0/16"], None),
        service_cidr("draining", &["10.2.0.0/16"], Some(false)),
        service_cidr("empty", &[], None),
    ];
    let d = desired(&[], &[], Some(&objects), &policy(), &statics);
    assert_eq!(
        d.service_cidrs,
        Some(cidrs(&[
            "10.96.0.0/12",
            "10.0.0.0/24",
            "fd00:10:96::/112",
            "10.1.0.0/16",
            "10.2.0.0/16",
        ]))
    );
    assert!(d.rejections.is_empty());
    // Service CIDRs are not pod CIDRs.
    assert!(d.cidrs.is_empty());
}

#[test]
fn service_cidrs_unknown_or_unavailable() {
    let statics = Statics {
        service_cidrs: cidrs(&["10.96.0.0/12"]),
        ..Statics::default()
    };
    // Not listed yet: leave the trie alone.
    let d = desired(&[], &[], UNKNOWN, &policy(), &statics);
    assert_eq!(d.service_cidrs, None);
    let p = plan(&current(&[], &[], &["10.5.0.0/16"]), &d);
    assert!(p.is_empty(), "{p:?}");
    // No ServiceCIDR API, or forbidden: the flags alone.
    let d = desired(&[], &[], Some(&[][..]), &policy(), &statics);
    assert_eq!(d.service_cidrs, Some(cidrs(&["10.96.0.0/12"])));
}

#[test]
fn malformed_service_cidr_is_rejected_and_the_rest_kept() {
    let objects = [
        service_cidr("legacy", &["10.9.0.5/16", "fd00:9::/112"], None),
        service_cidr("junk", &["nonsense"], None),
        service_cidr("good", &["10.3.0.0/16"], Some(true)),
    ];
    let pods = [pod("d", "p", NODE, &["10.244.1.2"])];
    let d = desired(&pods, &[], Some(&objects), &policy(), &Statics::default());
    assert_eq!(
        d.service_cidrs,
        Some(cidrs(&["fd00:9::/112", "10.3.0.0/16"]))
    );
    assert_eq!(d.addrs, ips(&["10.244.1.2"]), "pod sync unaffected");
    let got: Vec<_> = d
        .rejections
        .iter()
        .map(|r| {
            (
                r.kind,
                r.object.as_str(),
                r.field.as_str(),
                r.value.as_str(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (
                RejectionKind::ServiceCidr,
                "servicecidr junk",
                "spec.cidrs",
                "nonsense"
            ),
            (
                RejectionKind::ServiceCidr,
                "servicecidr legacy",
                "spec.cidrs",
                "10.9.0.5/16"
            ),
        ]
    );
    let r = &d.rejections.iter().nth(1).unwrap();
    assert!(r.reason.contains("did you mean 10.9.0.0/16"), "{r}");
    assert_eq!(r.kind.as_str(), "service_cidr");
}

#[test]
fn plan_moves_service_cidrs() {
    let objects = [service_cidr("kubernetes", &["10.0.0.0/24"], Some(true))];
    let want = desired(
        &[],
        &[],
        Some(&objects),
        &policy(),
        &Statics {
            service_cidrs: cidrs(&["10.96.0.0/12"]),
            ..Statics::default()
        },
    );
    let p = plan(&current(&[], &[], &["10.96.0.0/12", "10.7.0.0/16"]), &want);
    assert_eq!(
        p.add_service_cidrs,
        vec!["10.0.0.0/24".parse::<Cidr>().unwrap()]
    );
    assert_eq!(
        p.remove_service_cidrs,
        vec!["10.7.0.0/16".parse::<Cidr>().unwrap()]
    );
    assert!(p.add_cidrs.is_empty() && p.remove_cidrs.is_empty());
    assert!(!p.is_empty());
    let done = current(&[], &[], &["10.96.0.0/12", "10.0.0.0/24"]);
    assert!(plan(&done, &want).is_empty());
}

#[test]
fn bandwidth_annotated_pods_keep_the_veth_path() {
    let shaped = |name: &str, key: &str, ip: &str| {
        with(pod("default", name, NODE, &[ip]), |p| {
            p.metadata.annotations = Some([(key.to_owned(), "10M".to_owned())].into());
        })
    };
    let pods = [
        shaped("in", "kubernetes.io/ingress-bandwidth", "10.244.1.2"),
        shaped("out", "kubernetes.io/egress-bandwidth", "10.244.1.3"),
        pod("default", "plain", NODE, &["10.244.1.4"]),
    ];
    let d = run(&pods, &[]);
    assert_eq!(d.addrs, ips(&["10.244.1.4"]));
    // Excluded, not merely absent: a --pod-cidr covering them does not bring them in.
    assert_eq!(d.excluded, ips(&["10.244.1.2", "10.244.1.3"]));
    assert_eq!(d.pods["bandwidth"], 2);
    assert_eq!(d.pods["tracked"], 1);
}

#[test]
fn namespace_opt_in_admits_only_labelled_namespaces() {
    let opt_in = Policy {
        include_namespace_label: Some("bypass.dev/include".into()),
        ..policy()
    };
    let pods = [
        pod("canary", "a", NODE, &["10.244.1.2"]),
        pod("rest", "b", NODE, &["10.244.1.3"]),
        pod("unseen", "c", NODE, &["10.244.1.4"]),
        pod("both", "d", NODE, &["10.244.1.5"]),
        pod("odd", "e", NODE, &["10.244.1.6"]),
    ];
    let nss = [
        ns("canary", &[("bypass.dev/include", "true")]),
        ns("rest", &[("bypass.dev/include", "false")]),
        // An opt-out wins over an opt-in.
        ns(
            "both",
            &[
                ("bypass.dev/include", "true"),
                ("bypass.dev/exclude", "true"),
            ],
        ),
        ns("odd", &[("bypass.dev/include", "yes")]),
    ];
    let d = desired(&pods, &nss, UNKNOWN, &opt_in, &Statics::default());
    assert_eq!(d.addrs, ips(&["10.244.1.2"]));
    assert_eq!(
        d.excluded,
        ips(&["10.244.1.3", "10.244.1.4", "10.244.1.5", "10.244.1.6"]),
        "pods not opted in are excluded, so a --pod-cidr cannot bring them in"
    );
    assert!(
        d.rejections
            .iter()
            .any(|r| r.object == "namespace odd" && r.value == "yes"),
        "{:?}",
        d.rejections
    );
    // The counts logged come from the same namespace rule as the maps.
    assert_eq!(
        d.pods,
        BTreeMap::from([("namespace_excluded", 4), ("tracked", 1)])
    );
    // Without opt-in the same namespaces are all in but the opted-out one.
    let d = run(&pods, &nss);
    assert_eq!(
        d.addrs,
        ips(&["10.244.1.2", "10.244.1.3", "10.244.1.4", "10.244.1.6"])
    );
    assert_eq!(
        d.pods,
        BTreeMap::from([("namespace_excluded", 1), ("tracked", 4)])
    );
}

#[test]
fn service_backends_follow_the_flags_and_wait_until_known() {
    let b: crate::backend::Backend = "10.96.0.10:80=10.244.1.2:8080".parse().unwrap();
    let stale: crate::backend::Backend = "10.96.0.10:80=10.244.1.3:8080".parse().unwrap();
    let statics = Statics {
        service_backends: [b].into(),
        ..Statics::default()
    };
    let mut have = current(&[], &[], &[]);
    have.service_backends = [stale].into();
    let p = plan(&have, &Desired::from_statics(&statics));
    assert_eq!(
        (p.add_service_backends, p.remove_service_backends),
        (vec![b], vec![stale])
    );
    let unknown = Desired {
        service_backends: None,
        ..Desired::from_statics(&statics)
    };
    assert!(
        plan(&have, &unknown).is_empty(),
        "not known yet: the map stays"
    );
}
