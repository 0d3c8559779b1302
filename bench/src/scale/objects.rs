//! The cluster the scale bench creates (pure): how many of each object, where each pod
//! runs and which address it has, and the objects themselves as API JSON. Node `0` is
//! the agent's; its pods are `p-00000-<j>`, every other node's pods share the rest.

use std::net::Ipv4Addr;

use serde_json::{Value, json};

/// How large the cluster is (`bypass-bench scale`'s options, their defaults a large
/// cluster's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::Args)]
pub struct Counts {
    /// Nodes, the agent's included.
    #[arg(long, default_value_t = 5_000)]
    pub nodes: u32,
    /// Pods, the agent's node's included.
    #[arg(long, default_value_t = 150_000)]
    pub pods: u32,
    /// Pods on the agent's node.
    #[arg(long, default_value_t = 100)]
    pub node_pods: u32,
    /// Namespaces the objects are spread over.
    #[arg(long, default_value_t = 100)]
    pub namespaces: u32,
    /// Services, each with one EndpointSlice.
    #[arg(long, default_value_t = 10_000)]
    pub services: u32,
    /// NetworkPolicies.
    #[arg(long, default_value_t = 1_000)]
    pub policies: u32,
}

impl Counts {
    /// What cannot be laid out: too few nodes, more pods on a node than its /24 holds,
    /// more pods than the cluster's address range.
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if self.nodes < 2 {
            p.push("--nodes must be at least 2 (the agent's and one other)".to_owned());
        }
        if self.namespaces == 0 {
            p.push("--namespaces must be at least 1".to_owned());
        }
        if self.node_pods == 0 || self.node_pods > MAX_PODS_PER_NODE {
            p.push(format!(
                "--node-pods must be 1..={MAX_PODS_PER_NODE} (one /24 per node)"
            ));
        }
        if self.pods < self.node_pods {
            p.push("--pods must be at least --node-pods".to_owned());
        }
        if self.nodes >= 2 && self.others_per_node() > MAX_PODS_PER_NODE {
            p.push(format!(
                "{} pods over {} other nodes is more than {MAX_PODS_PER_NODE} a node: raise --nodes",
                self.pods - self.node_pods,
                self.nodes - 1
            ));
        }
        if self.nodes > MAX_NODES {
            p.push(format!(
                "--nodes must be at most {MAX_NODES} (one /24 each in {POD_RANGE})"
            ));
        }
        p
    }

    /// Pods on each node other than the agent's, rounded up.
    fn others_per_node(&self) -> u32 {
        (self.pods - self.node_pods).div_ceil(self.nodes - 1)
    }

    /// Every pod: (node, index on the node), the agent's node's first.
    pub fn pods(&self) -> impl Iterator<Item = PodRef> + '_ {
        let own = (0..self.node_pods).map(|index| PodRef { node: 0, index });
        let rest = (0..self.pods - self.node_pods).filter_map(|k| self.other_pod(k));
        own.chain(rest)
    }

    /// The `k`-th pod (modulo their number) of the nodes other than the agent's; none
    /// when there are none.
    pub fn other_pod(&self, k: u32) -> Option<PodRef> {
        let others = self.pods - self.node_pods;
        if others == 0 {
            return None;
        }
        let k = k % others;
        let per = self.others_per_node().max(1);
        Some(PodRef {
            node: 1 + k / per,
            index: k % per,
        })
    }
}

/// Pod addresses: node `n` has `100.64.0.0/10`'s `n`-th /24.
pub const POD_RANGE: &str = "100.64.0.0/10";
const POD_BASE: u32 = u32::from_be_bytes([100, 64, 0, 0]);
/// The /24s of [`POD_RANGE`] after the nodes' hold the latency probes' addresses.
const MAX_NODES: u32 = 12_000;
/// A /24 less the network and broadcast addresses.
pub const MAX_PODS_PER_NODE: u32 = 254;
/// The ServiceCIDR the bench adds, so the Services get ClusterIPs (the API server's own
/// range is small).
pub const SERVICE_CIDR: &str = "10.96.0.0/16";

/// One pod: its node and its index there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodRef {
    /// Node number (0: the agent's).
    pub node: u32,
    /// Index on the node.
    pub index: u32,
}

impl PodRef {
    /// `p-<node>-<index>`.
    pub fn name(&self) -> String {
        format!("p-{:05}-{}", self.node, self.index)
    }

    /// Its address: the node's /24, host `index + 1`.
    pub fn ip(&self) -> Ipv4Addr {
        Ipv4Addr::from(POD_BASE + self.node * 256 + self.index + 1)
    }

    /// Its namespace, of `namespaces`.
    pub fn namespace(&self, namespaces: u32) -> String {
        namespace((self.node * 7 + self.index) % namespaces)
    }
}

/// The address latency probe `k` gives a pod of the agent's node: never used before in
/// the run (past the nodes' /24s), so its arrival in the map is this probe's.
pub fn probe_ip(k: u32) -> Ipv4Addr {
    Ipv4Addr::from(POD_BASE + MAX_NODES * 256 + k % (1 << 20))
}

/// Namespace `i`.
pub fn namespace(i: u32) -> String {
    format!("scale-{i:03}")
}

/// Node `n`'s name (node 0 is the agent's).
pub fn node_name(n: u32) -> String {
    format!("node-{n:05}")
}

/// Namespace `i` as API JSON.
pub fn namespace_json(i: u32) -> Value {
    json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": namespace(i) } })
}

/// Namespace `i`'s `default` ServiceAccount as API JSON.
pub fn service_account_json(i: u32) -> Value {
    json!({
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": { "name": "default", "namespace": namespace(i) },
    })
}

/// Node `n` as API JSON.
pub fn node_json(n: u32) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": { "name": node_name(n), "labels": { "kubernetes.io/os": "linux" } },
        "spec": { "podCIDR": format!("{}/24", Ipv4Addr::from(POD_BASE + n * 256)) },
    })
}

/// A pod as API JSON (the spec; its status is written after, through `/status`).
pub fn pod_json(p: PodRef, namespaces: u32) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": p.name(), "namespace": p.namespace(namespaces),
            "labels": { "app": format!("a{}", p.index % 50) },
        },
        "spec": {
            "nodeName": node_name(p.node),
            "containers": [{ "name": "app", "image": "registry.k8s.io/pause:3.10" }],
        },
    })
}

/// A running pod's status with address `ip`, as a merge patch of `/status`.
pub fn pod_status_patch(ip: Ipv4Addr) -> Value {
    json!({ "status": {
        "phase": "Running",
        "podIP": ip.to_string(),
        "podIPs": [{ "ip": ip.to_string() }],
    }})
}

/// Service `k`'s name and namespace.
pub fn service_ref(k: u32, namespaces: u32) -> (String, String) {
    (format!("svc-{k:05}"), namespace(k % namespaces))
}

/// Service `k` as API JSON (a ClusterIP allocated by the API server).
pub fn service_json(k: u32, namespaces: u32) -> Value {
    let (name, ns) = service_ref(k, namespaces);
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": { "name": name, "namespace": ns },
        "spec": {
            "selector": { "app": format!("a{}", k % 50) },
            "ports": [{ "name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080 }],
        },
    })
}

/// The pods behind Service `k` at churn generation `generation`: three, the first 1 in
/// 50 Services with one on the agent's node (so its backend map is not empty).
pub fn service_endpoints(counts: &Counts, k: u32, generation: u32) -> Vec<PodRef> {
    let mut out = Vec::new();
    if k.is_multiple_of(50) {
        out.push(PodRef {
            node: 0,
            index: (k / 50) % counts.node_pods,
        });
    }
    out.extend(
        (0..3u32)
            .filter_map(|e| counts.other_pod(k.wrapping_mul(3) + e + generation.wrapping_mul(7))),
    );
    out
}

/// Service `k`'s EndpointSlice at `generation` as API JSON.
pub fn endpoint_slice_json(counts: &Counts, k: u32, generation: u32) -> Value {
    let (name, ns) = service_ref(k, counts.namespaces);
    let endpoints: Vec<Value> = service_endpoints(counts, k, generation)
        .iter()
        .map(|p| {
            json!({
                "addresses": [p.ip().to_string()],
                "conditions": { "ready": true },
                "nodeName": node_name(p.node),
            })
        })
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {
            "name": format!("{name}-s"), "namespace": ns,
            "labels": { "kubernetes.io/service-name": name },
        },
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{ "name": "http", "port": 8080, "protocol": "TCP" }],
    })
}

/// NetworkPolicy `k`'s name and namespace.
pub fn policy_ref(k: u32, namespaces: u32) -> (String, String) {
    (format!("np-{k:05}"), namespace(k % namespaces))
}

/// NetworkPolicy `k` at `generation` (the port it allows) as API JSON.
pub fn policy_json(k: u32, namespaces: u32, generation: u32) -> Value {
    let (name, ns) = policy_ref(k, namespaces);
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": { "name": name, "namespace": ns },
        "spec": {
            "podSelector": { "matchLabels": { "app": format!("a{}", k % 50) } },
            "policyTypes": ["Ingress"],
            "ingress": [{ "ports": [{ "protocol": "TCP", "port": 8000 + generation % 1000 }] }],
        },
    })
}

/// The ServiceCIDR the bench adds ([`SERVICE_CIDR`]).
pub fn service_cidr_json() -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR",
        "metadata": { "name": "scale" },
        "spec": { "cidrs": [SERVICE_CIDR] },
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn counts() -> Counts {
        Counts {
            nodes: 50,
            pods: 1_000,
            node_pods: 100,
            namespaces: 10,
            services: 200,
            policies: 20,
        }
    }

    #[test]
    fn every_pod_has_its_own_name_and_address_and_the_agent_node_its_share() {
        let c = counts();
        let pods: Vec<PodRef> = c.pods().collect();
        assert_eq!(pods.len(), 1_000);
        let names: BTreeSet<String> = pods.iter().map(PodRef::name).collect();
        let ips: BTreeSet<Ipv4Addr> = pods.iter().map(PodRef::ip).collect();
        assert_eq!((names.len(), ips.len()), (1_000, 1_000));
        assert_eq!(pods.iter().filter(|p| p.node == 0).count(), 100);
        assert!(
            pods.iter()
                .all(|p| p.node < c.nodes && p.index < MAX_PODS_PER_NODE)
        );
        assert_eq!(
            PodRef { node: 0, index: 0 }.ip(),
            Ipv4Addr::new(100, 64, 0, 1)
        );
        assert_eq!(
            PodRef { node: 2, index: 9 }.ip(),
            Ipv4Addr::new(100, 64, 2, 10)
        );
        // Probe addresses are nobody's.
        assert!((0..500).map(probe_ip).all(|ip| !ips.contains(&ip)));
    }

    #[test]
    fn counts_that_cannot_be_laid_out_are_named() {
        assert!(counts().problems().is_empty());
        let crowded = Counts {
            nodes: 3,
            ..counts()
        };
        assert!(
            crowded.problems()[0].contains("raise --nodes"),
            "{crowded:?}"
        );
        let one = Counts {
            nodes: 1,
            ..counts()
        };
        assert!(one.problems()[0].contains("--nodes must be at least 2"));
    }

    #[test]
    fn a_slice_names_existing_pods_and_one_in_fifty_has_one_on_the_agent_node() {
        let c = counts();
        let all: BTreeSet<String> = c.pods().map(|p| p.ip().to_string()).collect();
        let mut on_node = 0;
        for k in 0..c.services {
            let slice = endpoint_slice_json(&c, k, 3);
            for e in slice["endpoints"].as_array().unwrap() {
                let ip = e["addresses"][0].as_str().unwrap();
                assert!(all.contains(ip), "{ip}");
                on_node += usize::from(e["nodeName"] == node_name(0));
            }
        }
        assert_eq!(on_node, 4);
        // A new generation moves the endpoints.
        assert_ne!(endpoint_slice_json(&c, 1, 0), endpoint_slice_json(&c, 1, 1));
    }
}
