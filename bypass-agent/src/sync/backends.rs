//! Pure: the Service backends on this node's pods, from the Services and their
//! EndpointSlices: for each ClusterIP and TCP port of a Service, every endpoint address
//! of its slices that is one of this node's pod addresses, with the slice's port of the
//! same name. Every endpoint counts whatever its conditions (ready, serving,
//! terminating): the question is which pods kube-proxy could route a connection to.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
};

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};

use crate::backend::Backend;

/// The EndpointSlice label that names its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The backends the Services and EndpointSlices give whose target is in `local` (this
/// node's pod addresses, canonical), by the namespace of the Service that gives them.
/// Headless Services, ClusterIPs that do not parse, ports that are not TCP, FQDN slices
/// and endpoint addresses of another family than the ClusterIP are skipped.
pub fn service_backends<'a>(
    services: impl IntoIterator<Item = &'a Service>,
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
    local: &BTreeSet<IpAddr>,
) -> BTreeMap<String, BTreeSet<Backend>> {
    // The slices of each Service, by (namespace, Service name).
    let mut by_service: BTreeMap<(&str, &str), Vec<&EndpointSlice>> = BTreeMap::new();
    for slice in slices {
        let namespace = slice.metadata.namespace.as_deref().unwrap_or("");
        if let Some(name) = slice
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SERVICE_NAME_LABEL))
        {
            by_service.entry((namespace, name)).or_default().push(slice);
        }
    }
    let mut out: BTreeMap<String, BTreeSet<Backend>> = BTreeMap::new();
    for service in services {
        let namespace = service.metadata.namespace.as_deref().unwrap_or("");
        let name = service.metadata.name.as_deref().unwrap_or("");
        let Some(slices) = by_service.get(&(namespace, name)) else {
            continue;
        };
        let Some(spec) = service.spec.as_ref() else {
            continue;
        };
        let ports = spec.ports.as_deref().unwrap_or_default();
        let mut mine = BTreeSet::new();
        for vip in cluster_ips(service) {
            for port in ports.iter().filter(|p| tcp(p.protocol.as_deref())) {
                let Some(vip_port) = port_number(Some(port.port)) else {
                    continue;
                };
                for slice in slices {
                    let Some(target_port) = slice_port(slice, port.name.as_deref()) else {
                        continue;
                    };
                    for addr in slice_addrs(slice) {
                        if addr.is_ipv4() == vip.is_ipv4() && local.contains(&addr) {
                            mine.insert(Backend::new(
                                SocketAddr::new(vip, vip_port),
                                SocketAddr::new(addr, target_port),
                            ));
                        }
                    }
                }
            }
        }
        if !mine.is_empty() {
            out.entry(namespace.to_owned())
                .or_default()
                .append(&mut mine);
        }
    }
    out
}

/// The backends that fit in the map, shared between namespaces ([`fair_share`]).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Share {
    /// The backends to write.
    pub chosen: BTreeSet<Backend>,
    /// For each namespace that gives more than its share, how many of its backends
    /// are left out (their connections take TCP).
    pub left_out: BTreeMap<String, usize>,
}

/// At most `capacity` of the backends `by_namespace` gives, shared max-min fairly: a
/// namespace that gives no more than an equal share of what the smaller ones leave
/// gets all of its backends, and the rest is split evenly between the others, each
/// keeping its first backends in order (the same ones from pass to pass). So however
/// many Services and EndpointSlices one namespace writes (a tenant can name any of the
/// node's pod addresses, on any ports), it fills only its own share, never another
/// namespace's, and whose backends are left out is said by namespace.
pub fn fair_share(capacity: usize, by_namespace: &BTreeMap<String, BTreeSet<Backend>>) -> Share {
    let mut order: Vec<(&String, &BTreeSet<Backend>)> = by_namespace.iter().collect();
    // Smallest first; a namespace's name breaks ties, so the split is the same each pass.
    order.sort_by_key(|(ns, b)| (b.len(), *ns));
    let mut share = Share::default();
    let mut room = capacity;
    let count = order.len();
    for (i, (ns, backends)) in order.into_iter().enumerate() {
        let equal = room / (count - i);
        let take = backends.len().min(equal);
        // A backend is its Service's (its ClusterIP's): no two namespaces give the same.
        share.chosen.extend(backends.iter().take(take).copied());
        room -= take;
        if take < backends.len() {
            share.left_out.insert(ns.clone(), backends.len() - take);
        }
    }
    share
}

/// A Service's ClusterIPs (`spec.clusterIPs`, or the older `spec.clusterIP`), canonical;
/// none for a headless Service (`None`), one without (ExternalName) or one that does
/// not parse.
fn cluster_ips(service: &Service) -> BTreeSet<IpAddr> {
    let Some(spec) = service.spec.as_ref() else {
        return BTreeSet::new();
    };
    let values: Vec<&String> = match spec.cluster_ips.as_ref() {
        Some(list) if !list.is_empty() => list.iter().collect(),
        _ => spec.cluster_ip.iter().collect(),
    };
    values
        .into_iter()
        .filter_map(|v| v.parse::<IpAddr>().ok())
        .map(|ip| ip.to_canonical())
        .collect()
}

/// Whether a port's protocol is TCP (absent means TCP).
fn tcp(protocol: Option<&str>) -> bool {
    matches!(protocol, None | Some("TCP"))
}

/// A port number from the API, if it is one (1..=65535).
fn port_number(port: Option<i32>) -> Option<u16> {
    port.and_then(|p| u16::try_from(p).ok()).filter(|p| *p != 0)
}

/// The TCP port of `slice` named `name` (an absent and an empty name are the same).
fn slice_port(slice: &EndpointSlice, name: Option<&str>) -> Option<u16> {
    let name = name.unwrap_or("");
    slice
        .ports
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|p| p.name.as_deref().unwrap_or("") == name && tcp(p.protocol.as_deref()))
        .and_then(|p| port_number(p.port))
}

/// The endpoint addresses of `slice` that are IP addresses, canonical (an FQDN slice
/// has none): each endpoint's first, the one kube-proxy routes to (the others are
/// never a destination of its DNAT).
fn slice_addrs(slice: &EndpointSlice) -> impl Iterator<Item = IpAddr> + '_ {
    slice
        .endpoints
        .iter()
        .filter_map(|e| e.addresses.first())
        .filter_map(|a| a.parse::<IpAddr>().ok())
        .map(|ip| ip.to_canonical())
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn service(ns: &str, name: &str, cluster_ips: &[&str], ports: Value) -> Service {
        serde_json::from_value(json!({
            "metadata": {"namespace": ns, "name": name},
            "spec": {"clusterIP": cluster_ips.first(), "clusterIPs": cluster_ips, "ports": ports},
        }))
        .unwrap()
    }

    fn slice(
        ns: &str,
        name: &str,
        service: &str,
        family: &str,
        addrs: &[&str],
        ports: Value,
    ) -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"namespace": ns, "name": name, "labels": {SERVICE_NAME_LABEL: service}},
            "addressType": family,
            "endpoints": addrs.iter().map(|a| json!({"addresses": [a], "conditions": {"ready": false, "terminating": true}})).collect::<Vec<_>>(),
            "ports": ports,
        }))
        .unwrap()
    }

    /// A slice of Service apps/web.
    fn web(name: &str, family: &str, addrs: &[&str], ports: Value) -> EndpointSlice {
        slice("apps", name, "web", family, addrs, ports)
    }

    fn local(list: &[&str]) -> BTreeSet<IpAddr> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    fn backends(list: &[&str]) -> BTreeSet<Backend> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    fn run(services: &[Service], slices: &[EndpointSlice], here: &[&str]) -> BTreeSet<Backend> {
        service_backends(services, slices, &local(here))
            .into_values()
            .flatten()
            .collect()
    }

    #[test]
    fn named_ports_pair_by_name() {
        let svc = service(
            "apps",
            "web",
            &["10.96.0.10"],
            json!([
                {"name": "http", "port": 80, "targetPort": "web"},
                {"name": "admin", "port": 9000, "protocol": "TCP", "targetPort": 9001},
            ]),
        );
        let s = web(
            "web-abc",
            "IPv4",
            &["10.244.0.7", "10.244.0.8"],
            json!([
                {"name": "admin", "port": 9001, "protocol": "TCP"},
                {"name": "http", "port": 8080},
            ]),
        );
        assert_eq!(
            run(&[svc], &[s], &["10.244.0.7", "10.244.0.8"]),
            backends(&[
                "10.96.0.10:80=10.244.0.7:8080",
                "10.96.0.10:80=10.244.0.8:8080",
                "10.96.0.10:9000=10.244.0.7:9001",
                "10.96.0.10:9000=10.244.0.8:9001",
            ])
        );
    }

    #[test]
    fn an_unnamed_port_matches_an_unnamed_or_empty_one() {
        let svc = service("apps", "web", &["10.96.0.10"], json!([{"port": 80}]));
        let empty = web(
            "a",
            "IPv4",
            &["10.244.0.7"],
            json!([{"name": "", "port": 8080}]),
        );
        let absent = web("b", "IPv4", &["10.244.0.8"], json!([{"port": 8081}]));
        assert_eq!(
            run(&[svc], &[empty, absent], &["10.244.0.7", "10.244.0.8"]),
            backends(&[
                "10.96.0.10:80=10.244.0.7:8080",
                "10.96.0.10:80=10.244.0.8:8081"
            ])
        );
    }

    #[test]
    fn a_port_name_mismatch_gives_nothing() {
        let svc = service(
            "apps",
            "web",
            &["10.96.0.10"],
            json!([{"name": "http", "port": 80}]),
        );
        let other = web(
            "a",
            "IPv4",
            &["10.244.0.7"],
            json!([{"name": "https", "port": 8443}]),
        );
        let unnamed = web("b", "IPv4", &["10.244.0.7"], json!([{"port": 8080}]));
        assert!(run(&[svc], &[other, unnamed], &["10.244.0.7"]).is_empty());
    }

    #[test]
    fn two_families_pair_each_with_its_own() {
        let svc = service(
            "apps",
            "web",
            &["10.96.0.10", "fd00:96::a"],
            json!([{"name": "http", "port": 80}]),
        );
        let v4 = web(
            "v4",
            "IPv4",
            &["10.244.0.7"],
            json!([{"name": "http", "port": 8080}]),
        );
        let v6 = web(
            "v6",
            "IPv6",
            &["fd00:244::7"],
            json!([{"name": "http", "port": 8080}]),
        );
        assert_eq!(
            run(&[svc], &[v4, v6], &["10.244.0.7", "fd00:244::7"]),
            backends(&[
                "10.96.0.10:80=10.244.0.7:8080",
                "[fd00:96::a]:80=[fd00:244::7]:8080"
            ])
        );
    }

    #[test]
    fn mapped_addresses_are_canonical() {
        let svc = service("apps", "web", &["::ffff:10.96.0.10"], json!([{"port": 80}]));
        let s = web("a", "IPv6", &["::ffff:10.244.0.7"], json!([{"port": 8080}]));
        assert_eq!(
            run(&[svc], &[s], &["10.244.0.7"]),
            backends(&["10.96.0.10:80=10.244.0.7:8080"])
        );
    }

    #[test]
    fn headless_unparsable_and_absent_cluster_ips_are_skipped() {
        let ports = json!([{"port": 80}]);
        let headless = service("apps", "headless", &["None"], ports.clone());
        let bad = service("apps", "bad", &["10.96.0.300"], ports.clone());
        let external: Service = serde_json::from_value(json!({
            "metadata": {"namespace": "apps", "name": "ext"},
            "spec": {"type": "ExternalName", "externalName": "example.com", "ports": ports},
        }))
        .unwrap();
        let slices: Vec<_> = ["headless", "bad", "ext"]
            .iter()
            .map(|s| {
                slice(
                    "apps",
                    s,
                    s,
                    "IPv4",
                    &["10.244.0.7"],
                    json!([{"port": 8080}]),
                )
            })
            .collect();
        assert!(run(&[headless, bad, external], &slices, &["10.244.0.7"]).is_empty());
    }

    #[test]
    fn only_the_cluster_ip_field_counts_when_cluster_ips_is_absent() {
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"namespace": "apps", "name": "web"},
            "spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 80}]},
        }))
        .unwrap();
        let s = web("a", "IPv4", &["10.244.0.7"], json!([{"port": 8080}]));
        assert_eq!(
            run(&[svc], &[s], &["10.244.0.7"]),
            backends(&["10.96.0.10:80=10.244.0.7:8080"])
        );
    }

    #[test]
    fn udp_and_sctp_ports_are_skipped() {
        let svc = service(
            "apps",
            "dns",
            &["10.96.0.10"],
            json!([
                {"name": "dns", "port": 53, "protocol": "UDP"},
                {"name": "sctp", "port": 99, "protocol": "SCTP"},
                {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
            ]),
        );
        let s = slice(
            "apps",
            "a",
            "dns",
            "IPv4",
            &["10.244.0.7"],
            json!([
                {"name": "dns", "port": 5353, "protocol": "UDP"},
                {"name": "sctp", "port": 99, "protocol": "SCTP"},
                {"name": "dns-tcp", "port": 5353, "protocol": "TCP"},
            ]),
        );
        assert_eq!(
            run(&[svc], &[s], &["10.244.0.7"]),
            backends(&["10.96.0.10:53=10.244.0.7:5353"])
        );
    }

    #[test]
    fn slices_of_another_service_or_namespace_are_ignored() {
        let svc = service("apps", "web", &["10.96.0.10"], json!([{"port": 80}]));
        let other_service = slice(
            "apps",
            "a",
            "api",
            "IPv4",
            &["10.244.0.7"],
            json!([{"port": 8080}]),
        );
        let other_namespace = slice(
            "ops",
            "b",
            "web",
            "IPv4",
            &["10.244.0.8"],
            json!([{"port": 8080}]),
        );
        let mut unlabelled = web("c", "IPv4", &["10.244.0.9"], json!([{"port": 8080}]));
        unlabelled.metadata.labels = None;
        assert!(
            run(
                &[svc],
                &[other_service, other_namespace, unlabelled],
                &["10.244.0.7", "10.244.0.8", "10.244.0.9"]
            )
            .is_empty()
        );
    }

    #[test]
    fn endpoints_on_other_nodes_fqdn_and_other_families_are_ignored() {
        let svc = service("apps", "web", &["10.96.0.10"], json!([{"port": 80}]));
        let s = web(
            "a",
            "IPv4",
            &["10.244.0.7", "10.244.1.7"],
            json!([{"port": 8080}]),
        );
        let fqdn = web("b", "FQDN", &["db.example.com"], json!([{"port": 8080}]));
        let v6 = web("c", "IPv6", &["fd00:244::7"], json!([{"port": 8080}]));
        assert_eq!(
            run(&[svc], &[s, fqdn, v6], &["10.244.0.7", "fd00:244::7"]),
            backends(&["10.96.0.10:80=10.244.0.7:8080"])
        );
    }

    #[test]
    fn every_endpoint_counts_whatever_its_conditions() {
        let svc = service("apps", "web", &["10.96.0.10"], json!([{"port": 80}]));
        let s: EndpointSlice = serde_json::from_value(json!({
            "metadata": {"namespace": "apps", "name": "a", "labels": {SERVICE_NAME_LABEL: "web"}},
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.244.0.7"], "conditions": {"ready": true, "serving": true}},
                {"addresses": ["10.244.0.8"], "conditions": {"ready": false, "serving": true, "terminating": true}},
                {"addresses": ["10.244.0.9"], "conditions": {"ready": false, "serving": false}},
                {"addresses": ["10.244.0.10"]},
            ],
            "ports": [{"port": 8080}],
        }))
        .unwrap();
        let here = ["10.244.0.7", "10.244.0.8", "10.244.0.9", "10.244.0.10"];
        assert_eq!(run(&[svc], &[s], &here).len(), 4);
    }

    #[test]
    fn a_slice_port_without_a_number_gives_nothing() {
        let svc = service("apps", "web", &["10.96.0.10"], json!([{"port": 80}]));
        let s = web("a", "IPv4", &["10.244.0.7"], json!([{"name": ""}]));
        assert!(run(&[svc], &[s], &["10.244.0.7"]).is_empty());
    }

    #[test]
    fn only_an_endpoints_first_address_is_a_backend() {
        let svc = service(
            "default",
            "web",
            &["10.96.0.10"],
            json!([{"name": "http", "port": 80, "targetPort": 8080}]),
        );
        let slice: EndpointSlice = serde_json::from_value(json!({
            "metadata": {"namespace": "default", "name": "web-1",
                "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": [{"addresses": ["10.244.0.7", "10.244.0.8"]}],
        }))
        .unwrap();
        let local: BTreeSet<IpAddr> = ["10.244.0.7", "10.244.0.8"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        let got: Vec<String> = service_backends([&svc], [&slice], &local)
            .values()
            .flatten()
            .map(ToString::to_string)
            .collect();
        assert_eq!(got, ["10.96.0.10:80=10.244.0.7:8080"]);
    }

    /// `n` backends, ClusterIPs 10.96.`tag`.x, on as many ports as they need.
    fn many(tag: u8, n: u16) -> BTreeSet<Backend> {
        (0..n)
            .map(|i| {
                format!("10.96.{tag}.{}:{}=10.244.0.7:8080", i % 250, 1 + i / 250)
                    .parse()
                    .unwrap()
            })
            .collect()
    }

    #[test]
    fn one_namespace_fills_only_its_own_share() {
        let tenant = many(1, 20_000);
        let by_ns: BTreeMap<String, BTreeSet<Backend>> = [
            ("tenant".to_owned(), tenant.clone()),
            ("shop".to_owned(), many(2, 3)),
            ("bank".to_owned(), many(3, 5)),
        ]
        .into();
        let share = fair_share(16_384, &by_ns);
        assert_eq!(share.chosen.len(), 16_384);
        assert!(share.chosen.is_superset(&by_ns["shop"]));
        assert!(share.chosen.is_superset(&by_ns["bank"]));
        assert_eq!(
            share.left_out,
            [("tenant".to_owned(), 20_000 - (16_384 - 8))].into()
        );
        // The tenant keeps its first backends in order, the same ones each pass.
        let kept: BTreeSet<Backend> = tenant.iter().take(16_376).copied().collect();
        assert!(share.chosen.is_superset(&kept));
        // Writing more moves none of the others' backends out.
        let mut more = by_ns.clone();
        more.insert("tenant".to_owned(), many(1, 40_000));
        let after = fair_share(16_384, &more);
        assert!(after.chosen.is_superset(&by_ns["shop"]));
        assert!(after.chosen.is_superset(&by_ns["bank"]));
        assert_eq!(after.chosen.len(), 16_384);
    }

    #[test]
    fn namespaces_over_their_share_split_what_is_left_evenly() {
        let by_ns: BTreeMap<String, BTreeSet<Backend>> = [
            ("a".to_owned(), many(1, 100)),
            ("b".to_owned(), many(2, 100)),
            ("c".to_owned(), many(3, 10)),
        ]
        .into();
        let share = fair_share(110, &by_ns);
        assert_eq!(share.chosen.len(), 110);
        assert!(share.chosen.is_superset(&by_ns["c"]));
        assert_eq!(
            share.left_out,
            [("a".to_owned(), 50), ("b".to_owned(), 50)].into()
        );
        // Room for all: nothing is left out.
        let all = fair_share(16_384, &by_ns);
        assert_eq!(all.chosen.len(), 210);
        assert!(all.left_out.is_empty());
        // No room: everything is.
        let none = fair_share(0, &by_ns);
        assert!(none.chosen.is_empty());
        assert_eq!(none.left_out.values().sum::<usize>(), 210);
    }
}
