//! The traffic shapes the sweep runs through. `default`: the client dials the server
//! pod's address. `mesh`: both pods behind a sidecar proxy and iptables REDIRECT, as
//! Istio's sidecar mode (app → sidecar A → sidecar B → app over 127.0.0.1). `clusterip`:
//! the client dials a Service VIP that kube-proxy-shaped iptables chains DNAT to the
//! server pod.
//!
//! Pure: the port plan ([`Chain`]), the hop counters of `bypass-agent status --json`
//! and their deltas. I/O: [`Setup`] writes the rules (built by `testbed::iptables`, as
//! the mesh tests do) into the pods' namespaces, where they vanish with them, and runs
//! the `bypass-test-tool proxy` sidecars (`testbed::Proxy`, killed on drop).

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::PathBuf,
};

use anyhow::{Context as _, Result, bail};
use bypass_common::Stat;
use serde::{Deserialize, Serialize};
use testbed::{
    Proxy, ProxyOpts, TwoPods,
    iptables::{self, ClusterIp, Family, Rule},
};

use crate::model::Placement;

/// Which path the client's bytes take to the server.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
pub enum Scenario {
    /// Pod address to pod address.
    #[default]
    Default,
    /// App → iptables REDIRECT → sidecar proxy A → sidecar proxy B (REDIRECT) → app.
    Mesh,
    /// App → Service VIP, DNAT by kube-proxy-shaped chains to the server pod.
    Clusterip,
    /// Pod address to pod address between two real pods of the one-node cluster of
    /// `cargo xtask cluster`, the agent deployed as `deploy/`'s DaemonSet and switched
    /// by the node label (see [`crate::cluster`]).
    Cluster,
}

impl Scenario {
    /// Its name on the command line, in JSON and in file names.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Default => "default",
            Scenario::Mesh => "mesh",
            Scenario::Clusterip => "clusterip",
            Scenario::Cluster => "cluster",
        }
    }

    /// Whether this is the default scenario (serde: not written, so a default run's
    /// `bench.json` keeps its shape).
    pub fn is_default(&self) -> bool {
        *self == Scenario::Default
    }

    /// Where its results go unless `--out` says otherwise: `results/latest` for the
    /// default (the README links there), `results/latest-<name>` for the others.
    pub fn default_out(self) -> PathBuf {
        match self {
            Scenario::Default => PathBuf::from("results/latest"),
            s => PathBuf::from(format!("results/latest-{}", s.name())),
        }
    }

    /// One line on the path the bytes take, for the report.
    pub fn describe(self) -> &'static str {
        match self {
            Scenario::Default => "pod A -> pod B (pod addresses)",
            Scenario::Mesh => {
                "client -> REDIRECT :15001 sidecar A -> pod B:P -> REDIRECT :15006 sidecar B -> 127.0.0.1:P server \
                 (3 TCP connections per measured connection: 2 translated hops, 1 loopback hop)"
            }
            Scenario::Clusterip => {
                "client -> Service VIP:P -> kube-proxy-shaped DNAT (KUBE-SERVICES/KUBE-SVC/KUBE-SEP, client netns) -> pod B:P"
            }
            Scenario::Cluster => {
                "pod client -> pod server (real pods of the one-node cluster: kubelet, containerd, CNI bridge); \
                 the agent is deploy/'s DaemonSet, bypass = node labelled bypass.dev/enabled=true, default = labelled false"
            }
        }
    }
}

/// The mark sidecar A puts on its upstream sockets, excluded from the REDIRECT (as
/// Istio's 1337).
pub const MESH_MARK: u32 = 1337;
/// Istio's outbound capture port; sidecar A of chain `i` listens on this + 100·i.
pub const OUTBOUND_PORT: u16 = 15001;
/// Istio's inbound capture port; sidecar B of chain `i` listens on this + 100·i.
pub const INBOUND_PORT: u16 = 15006;
/// Istio's control ports, the agent's default `--skip-ports`: no port of the bench may
/// be one of them, or the bypass would leave it alone.
pub const ISTIO_CONTROL_PORTS: [u16; 10] = [
    15000, 15004, 15010, 15012, 15014, 15017, 15020, 15021, 15053, 15090,
];
/// qperf's data port (`--ip_port`) for the server on CPU n is this + n. The scenarios
/// fix it so the iptables rules can name it; the default scenario leaves it ephemeral.
pub const QPERF_DATA_PORT: u16 = 19865;
/// The Service VIP's host part in the testbed's Service CIDR.
const SERVICE_VIP_HOST: u8 = 10;

/// One intercepted port of the mesh: the app's port, the two sidecars' listen ports and
/// the CPUs they are pinned to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chain {
    /// What it carries (`qperf-data`, `sockperf`), for names and comments.
    pub name: String,
    /// The server's port: what the client dials, what sidecar B's upstream is.
    pub app_port: u16,
    /// Sidecar A's listen port in pod A.
    pub outbound: u16,
    /// Sidecar B's listen port in pod B.
    pub inbound: u16,
    /// CPU of the client and sidecar A.
    pub client_cpu: usize,
    /// CPU of sidecar B and the server.
    pub server_cpu: usize,
}

/// The chains for `placements`: per server CPU, one for qperf's data port and one for
/// sockperf's port. Sidecar A runs where the client runs, sidecar B where the server
/// runs, so same-CPU is all on one CPU and cross-CPU puts client + sidecar A on one,
/// sidecar B + server on the other, for the bypass and the default path alike.
pub fn chains(
    placements: &[Placement],
    qperf_data: fn(usize) -> u16,
    sockperf: fn(usize) -> u16,
) -> Result<Vec<Chain>> {
    let mut by_server: BTreeMap<usize, usize> = BTreeMap::new();
    for p in placements {
        if let Some(&c) = by_server.get(&p.server_cpu)
            && c != p.client_cpu
        {
            bail!(
                "placements with server CPU {} differ in client CPU ({c} and {}); the mesh has one sidecar A per server CPU",
                p.server_cpu,
                p.client_cpu
            );
        }
        by_server.insert(p.server_cpu, p.client_cpu);
    }
    let mut out = Vec::new();
    for (&server_cpu, &client_cpu) in &by_server {
        for (name, port) in [
            ("qperf-data", qperf_data(server_cpu)),
            ("sockperf", sockperf(server_cpu)),
        ] {
            let i = out.len() as u16;
            out.push(Chain {
                name: name.to_owned(),
                app_port: port,
                outbound: OUTBOUND_PORT + 100 * i,
                inbound: INBOUND_PORT + 100 * i,
                client_cpu,
                server_cpu,
            });
        }
    }
    for c in &out {
        for port in [c.app_port, c.outbound, c.inbound] {
            if ISTIO_CONTROL_PORTS.contains(&port) {
                bail!("port {port} of chain {} is an Istio control port", c.name);
            }
        }
    }
    Ok(out)
}

/// The agent's per-hop counters in `status --json`, in the order the report shows them.
pub const HOP_COUNTERS: [&str; 8] = [
    Stat::PairedPod.name(),
    Stat::PairedLoopback.name(),
    Stat::PairedTranslated.name(),
    Stat::RedirectedBytesPod.name(),
    Stat::RedirectedBytesLoopback.name(),
    Stat::RedirectedBytesTranslated.name(),
    Stat::PairRejected.name(),
    Stat::SkippedPorts.name(),
];

/// Every non-negative integer field of a `status --json` object.
pub fn counters_of(status: &serde_json::Value) -> BTreeMap<String, u64> {
    status
        .as_object()
        .map(|o| {
            o.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_u64()?)))
                .collect()
        })
        .unwrap_or_default()
}

/// `after - before` per counter present in `after` (a counter absent before counts
/// from zero; gauges such as `sockets` come out as their growth, saturating at zero).
pub fn delta(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(k, &v)| {
            (
                k.clone(),
                v.saturating_sub(before.get(k).copied().unwrap_or(0)),
            )
        })
        .collect()
}

/// What a bypassed block of `connections` measured connections must show, or the
/// reasons it does not: every hop of every connection paired, none rejected.
pub fn hop_problems(
    scenario: Scenario,
    connections: u64,
    c: &BTreeMap<String, u64>,
) -> Vec<String> {
    let get = |k: &str| c.get(k).copied();
    let mut p = Vec::new();
    let mut want = |key: &str, min: u64| match get(key) {
        None => p.push(format!("status --json has no {key}")),
        Some(v) if v < min => p.push(format!(
            "{key} = {v}, expected at least {min} for {connections} measured connections"
        )),
        Some(_) => {}
    };
    match scenario {
        Scenario::Default | Scenario::Cluster => want("paired_pod", connections),
        Scenario::Mesh => {
            want("paired_translated", 2 * connections);
            want("paired_loopback", connections);
        }
        Scenario::Clusterip => want("paired_translated", connections),
    }
    if let Some(v) = get("pair_rejected")
        && v > 0
    {
        p.push(format!("pair_rejected = {v}"));
    }
    p
}

/// What is missing to run `scenario`, if anything.
pub fn missing(scenario: Scenario) -> Vec<String> {
    let mut m = Vec::new();
    if scenario != Scenario::Default
        && let Some(why) = iptables::missing()
    {
        m.push(why);
    }
    if scenario == Scenario::Mesh
        && let Err(e) = testbed::tools::test_tool()
    {
        m.push(format!("{e:#}"));
    }
    m
}

/// A scenario applied to a [`TwoPods`]: its rules written, its proxies running (killed
/// on drop; the rules go with the namespaces).
#[derive(Debug)]
pub struct Setup {
    /// Which.
    pub scenario: Scenario,
    /// The address the clients dial.
    pub target: IpAddr,
    /// The address the servers listen on.
    pub listen: IpAddr,
    /// Extra `bypass-agent run` arguments.
    pub agent_args: Vec<String>,
    /// Whether qperf runs on its fixed data port ([`QPERF_DATA_PORT`] + server CPU)
    /// instead of an ephemeral one, so the rules can name it.
    pub fixed_data_port: bool,
    /// What was set up, for the environment record.
    pub summary: String,
    proxies: Vec<Proxy>,
}

/// The servers' ports per server CPU.
#[derive(Clone, Copy, Debug)]
pub struct Ports {
    /// qperf's control (listen) port.
    pub qperf: fn(usize) -> u16,
    /// qperf's data port when fixed.
    pub qperf_data: fn(usize) -> u16,
    /// sockperf's port.
    pub sockperf: fn(usize) -> u16,
}

impl Setup {
    /// Applies `scenario` to `pods` for `placements`.
    pub fn apply(
        scenario: Scenario,
        pods: &TwoPods,
        placements: &[Placement],
        ports: Ports,
    ) -> Result<Self> {
        let server = IpAddr::V4(pods.b.ipv4());
        let mut s = Self {
            scenario,
            target: server,
            listen: server,
            agent_args: Vec::new(),
            fixed_data_port: scenario != Scenario::Default,
            summary: String::new(),
            proxies: Vec::new(),
        };
        match scenario {
            Scenario::Default => {}
            Scenario::Mesh => {
                let chains = chains(placements, ports.qperf_data, ports.sockperf)?;
                for c in &chains {
                    iptables::apply(
                        pods.a.netns(),
                        Family::V4,
                        &iptables::sidecar_outbound(c.app_port, MESH_MARK, c.outbound),
                    )?;
                    iptables::apply(
                        pods.b.netns(),
                        Family::V4,
                        &iptables::sidecar_inbound(c.app_port, c.inbound),
                    )?;
                }
                // Sidecar B dials 127.0.0.1, so the servers listen on every address.
                s.listen = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
                let any = |port| SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port);
                let mut parts = Vec::new();
                for c in &chains {
                    let mut a =
                        ProxyOpts::new(any(c.outbound), SocketAddr::new(server, c.app_port));
                    a.mark = MESH_MARK;
                    a.cpus = vec![c.client_cpu];
                    s.proxies.push(Proxy::start(&pods.a, &a)?);
                    let mut b = ProxyOpts::new(
                        any(c.inbound),
                        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), c.app_port),
                    );
                    b.cpus = vec![c.server_cpu];
                    s.proxies.push(Proxy::start(&pods.b, &b)?);
                    parts.push(format!(
                        "{} :{} via A:{} (CPU {}) and B:{} (CPU {})",
                        c.name, c.app_port, c.outbound, c.client_cpu, c.inbound, c.server_cpu
                    ));
                }
                s.summary = format!("mesh chains: {}", parts.join("; "));
            }
            Scenario::Clusterip => {
                let cidr = pods.service_cidr_v4();
                let vip = service_vip(&cidr)?;
                let mut cpus: Vec<usize> = placements.iter().map(|p| p.server_cpu).collect();
                cpus.sort_unstable();
                cpus.dedup();
                let services: Vec<ClusterIp> = cpus
                    .iter()
                    .flat_map(|&cpu| {
                        [
                            ("qperf", (ports.qperf)(cpu)),
                            ("qperf-data", (ports.qperf_data)(cpu)),
                            ("sockperf", (ports.sockperf)(cpu)),
                        ]
                        .map(|(name, port)| ClusterIp {
                            name: format!("bench/bypass:{name}-{cpu}"),
                            vip: SocketAddr::new(IpAddr::V4(vip), port),
                            backends: vec![SocketAddr::new(server, port)],
                            cluster_cidr: pods.pod_cidr_v4(),
                        })
                    })
                    .collect();
                if let Some(svc) = services
                    .iter()
                    .find(|svc| ISTIO_CONTROL_PORTS.contains(&svc.vip.port()))
                {
                    bail!("service port {} is an Istio control port", svc.vip.port());
                }
                // The VIP is routed like any off-pod address; the DNAT picks the pod.
                pods.a.add_route(&cidr)?;
                iptables::apply(pods.a.netns(), Family::V4, &service_rules(&services))?;
                s.target = IpAddr::V4(vip);
                s.agent_args = vec!["--service-cidr".to_owned(), cidr.clone()];
                // Each Service's backend, as kube-proxy's EndpointSlices would give it
                // in a cluster: a translated connection is paired only to one.
                for svc in &services {
                    for be in &svc.backends {
                        s.agent_args.push("--service-backend".to_owned());
                        s.agent_args.push(format!("{}={be}", svc.vip));
                    }
                }
                s.summary = format!(
                    "service {vip} in --service-cidr {cidr}, ports {} DNAT to {server}",
                    services
                        .iter()
                        .map(|svc| svc.vip.port().to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                );
            }
            Scenario::Cluster => {
                bail!("the cluster scenario runs real pods (crate::cluster), not the testbed's")
            }
        }
        Ok(s)
    }

    /// Fails when a proxy has exited.
    pub fn check(&self) -> Result<()> {
        for p in &self.proxies {
            if exited(p.pid()) {
                bail!(
                    "a sidecar proxy (pid {}) exited: {}",
                    p.pid(),
                    p.stderr().trim()
                );
            }
        }
        Ok(())
    }
}

/// The VIP of a Service CIDR: its `.10`, as a cluster's DNS Service often is.
pub fn service_vip(cidr: &str) -> Result<Ipv4Addr> {
    let net: Ipv4Addr = cidr
        .split_once('/')
        .map_or(cidr, |(a, _)| a)
        .parse()
        .with_context(|| format!("service CIDR {cidr}"))?;
    let [a, b, c, _] = net.octets();
    Ok(Ipv4Addr::new(a, b, c, SERVICE_VIP_HOST))
}

/// kube-proxy's rules for several Services: each Service's rules, the chains and jumps
/// they share (`KUBE-SERVICES`, `KUBE-POSTROUTING`, ...) only once.
pub fn service_rules(services: &[ClusterIp]) -> Vec<Rule> {
    let mut out: Vec<Rule> = Vec::new();
    for svc in services {
        for rule in iptables::kube_proxy_rules(svc) {
            if !out.contains(&rule) {
                out.push(rule);
            }
        }
    }
    out
}

/// Whether process `pid` has exited (a zombie counts: nobody reaped it yet).
fn exited(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
        // The state follows the command name, which is in parentheses.
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_none_or(|state| state == "Z" || state == "X")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qd(cpu: usize) -> u16 {
        QPERF_DATA_PORT + cpu as u16
    }

    fn sp(cpu: usize) -> u16 {
        11111 + cpu as u16
    }

    #[test]
    fn chains_per_server_cpu() {
        let c = chains(&[Placement::cross_cpu(), Placement::same_cpu()], qd, sp).unwrap();
        let ports: Vec<_> = c
            .iter()
            .map(|c| {
                (
                    c.app_port,
                    c.outbound,
                    c.inbound,
                    c.client_cpu,
                    c.server_cpu,
                )
            })
            .collect();
        assert_eq!(
            ports,
            [
                (19865, 15001, 15006, 0, 0),
                (11111, 15101, 15106, 0, 0),
                (19866, 15201, 15206, 0, 1),
                (11112, 15301, 15306, 0, 1),
            ]
        );
        let odd = Placement {
            name: "x".into(),
            client_cpu: 1,
            server_cpu: 1,
        };
        assert!(chains(&[Placement::cross_cpu(), odd], qd, sp).is_err());
    }

    #[test]
    fn no_chain_port_is_skipped() {
        let many: Vec<Placement> = (0..8)
            .map(|cpu| Placement {
                name: format!("p{cpu}"),
                client_cpu: 0,
                server_cpu: cpu,
            })
            .collect();
        let c = chains(&many, qd, sp).unwrap();
        assert_eq!(c.len(), 16);
        assert!(c.iter().all(|c| !ISTIO_CONTROL_PORTS.contains(&c.outbound)
            && !ISTIO_CONTROL_PORTS.contains(&c.inbound)));
    }

    #[test]
    fn services_share_kube_chains() {
        let svc = |name: &str, port| ClusterIp {
            name: format!("bench/bypass:{name}"),
            vip: SocketAddr::new("10.96.7.10".parse().unwrap(), port),
            backends: vec![SocketAddr::new("10.88.7.2".parse().unwrap(), port)],
            cluster_cidr: "10.88.7.0/24".into(),
        };
        let rules: Vec<String> = service_rules(&[svc("a", 19765), svc("b", 11111)])
            .iter()
            .map(|r| r.join(" "))
            .collect();
        let count = |needle: &str| rules.iter().filter(|r| r.as_str() == needle).count();
        assert_eq!(count("-t nat -N KUBE-SERVICES"), 1);
        assert_eq!(
            rules
                .iter()
                .filter(|r| r.ends_with("-j KUBE-SERVICES") && r.contains("-A OUTPUT"))
                .count(),
            1
        );
        assert_eq!(rules.iter().filter(|r| r.contains("-j DNAT")).count(), 2);
        assert!(
            rules
                .iter()
                .any(|r| r.ends_with("--to-destination 10.88.7.2:11111"))
        );
    }

    #[test]
    fn vip_of_cidr() {
        assert_eq!(
            service_vip("10.96.42.0/24").unwrap(),
            Ipv4Addr::new(10, 96, 42, 10)
        );
        assert!(service_vip("fd96::/112").is_err());
    }

    #[test]
    fn exited_processes() {
        assert!(!exited(std::process::id()));
        assert!(exited(u32::MAX));
    }

    #[test]
    fn counters_and_problems() {
        let before = counters_of(&serde_json::json!({
            "attached": true, "paired_translated": 1, "sockets": 4, "pod_cidrs": []
        }));
        let after = counters_of(&serde_json::json!({
            "attached": true, "paired_translated": 9, "paired_loopback": 4,
            "pair_rejected": 0, "sockets": 2
        }));
        let d = delta(&before, &after);
        assert_eq!(d["paired_translated"], 8);
        assert_eq!(d["paired_loopback"], 4);
        assert_eq!(d["sockets"], 0);
        assert!(!d.contains_key("attached"));
        assert!(hop_problems(Scenario::Mesh, 4, &d).is_empty());
        let p = hop_problems(Scenario::Mesh, 5, &d);
        assert_eq!(p.len(), 2, "{p:?}");
        let mut r = d.clone();
        r.insert("pair_rejected".into(), 2);
        assert!(hop_problems(Scenario::Clusterip, 8, &r)[0].contains("pair_rejected"));
        assert!(hop_problems(Scenario::Clusterip, 1, &BTreeMap::new())[0].contains("no paired"));
        // Pod to pod: every measured connection is a pod-to-pod pair at least.
        let mut pods = BTreeMap::from([("paired_pod".to_owned(), 3)]);
        assert!(hop_problems(Scenario::Default, 3, &pods).is_empty());
        pods.insert("paired_pod".into(), 2);
        assert!(hop_problems(Scenario::Default, 3, &pods)[0].contains("paired_pod = 2"));
    }

    #[test]
    fn out_dirs() {
        assert_eq!(
            Scenario::Default.default_out(),
            PathBuf::from("results/latest")
        );
        assert_eq!(
            Scenario::Mesh.default_out(),
            PathBuf::from("results/latest-mesh")
        );
    }
}
