//! What the Kubernetes tests share: the label and annotation keys, the agent's options
//! in Kubernetes mode, and its maps and toggle state read through `status`, polled
//! until they match the API.

use std::{
    collections::BTreeSet,
    net::IpAddr,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Result, bail};
use testbed::{Agent, AgentOpts, AgentStatus, TwoPods};

use super::cluster::{Cluster, PodOpts};

/// "Within a second": how long a change in the API may take to reach the maps.
pub const PROPAGATION: Duration = testbed::steps::NET;
/// The node label that switches the bypass on and off.
pub const LABEL: &str = "bypass.dev/enabled";
/// The pod annotation and namespace label that opt out.
pub const EXCLUDE: &str = "bypass.dev/exclude";

/// The agent in Kubernetes mode on `node`, with the cluster's admin credentials and
/// its metrics on `metrics_port`.
pub fn start_agent(
    c: &Cluster,
    pods: &TwoPods,
    node: &str,
    metrics_port: u16,
    extra: &[&str],
) -> Result<Agent> {
    Agent::start(&kube_agent_opts(
        pods,
        node,
        &c.env.kubeconfig(),
        metrics_port,
        extra,
    ))
}

use crate::support::ensure_logged;
pub use crate::support::free_port;

/// Agent options for Kubernetes mode: no `--pod-cidr`, everything from the API.
pub fn kube_agent_opts(
    pods: &TwoPods,
    node: &str,
    kubeconfig: &Path,
    metrics_port: u16,
    extra: &[&str],
) -> AgentOpts {
    let mut opts = pods.agent_opts();
    opts.pod_cidrs.clear();
    opts.extra_args = [
        "--node-name".to_owned(),
        node.to_owned(),
        "--kubeconfig".to_owned(),
        kubeconfig.display().to_string(),
        "--metrics-addr".to_owned(),
        format!("127.0.0.1:{metrics_port}"),
    ]
    .into_iter()
    .chain(extra.iter().map(|s| (*s).to_owned()))
    .collect();
    opts
}

/// The strings of `list`, as a set.
pub fn strings(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

/// The addresses of `list`, as a set (unparsable entries left out).
pub fn addrs(list: &[&str]) -> BTreeSet<IpAddr> {
    list.iter().filter_map(|s| s.parse().ok()).collect()
}

/// A list of `status` as a set (the maps have no order).
pub fn set<T: Ord + Clone>(list: &[T]) -> BTreeSet<T> {
    list.iter().cloned().collect()
}

/// The agent's maps and toggle state, read from its pins by `bypass-agent status`.
pub fn seen(pin_dir: &Path) -> Result<AgentStatus> {
    Ok(serde_json::from_value(testbed::agent::status_json(
        pin_dir,
    )?)?)
}

/// Polls `status` until `ok` holds; fails after `timeout`. Returns how long it took.
pub fn wait_for(
    pin_dir: &Path,
    timeout: Duration,
    what: &str,
    ok: impl Fn(&AgentStatus) -> bool,
) -> Result<Duration> {
    let started = Instant::now();
    loop {
        let s = seen(pin_dir)?;
        if ok(&s) {
            let took = started.elapsed();
            eprintln!("  {what}: {took:.0?}");
            return Ok(took);
        }
        if started.elapsed() > timeout {
            bail!("{what}: not within {timeout:?}; the agent has {s:#?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits [`PROPAGATION`] at most until the pod addresses are `want`.
pub fn wait_addrs(pin_dir: &Path, what: &str, want: &BTreeSet<IpAddr>) -> Result<Duration> {
    wait_for(pin_dir, PROPAGATION, what, |s| {
        set(&s.pod_addresses) == *want
    })
}

/// Waits [`PROPAGATION`] at most until the Service CIDRs are `want`.
pub fn wait_service_cidrs(pin_dir: &Path, what: &str, want: &BTreeSet<String>) -> Result<Duration> {
    wait_for(pin_dir, PROPAGATION, what, |s| {
        set(&s.service_cidrs) == *want
    })
}

/// Lines of the agent's log that contain every one of `words`.
pub fn log_lines(agent: &Agent, words: &[&str]) -> usize {
    agent
        .stderr()
        .lines()
        .filter(|l| words.iter().all(|w| l.contains(w)))
        .count()
}

/// A node name of this test run.
/// Node `node` with no pod CIDRs, namespace `bk-apps`, and pods `a` and `b` there with
/// the IPv4 addresses of the two pods: the cluster side of the plain two-pod tests.
pub fn node_with_pods_a_b(c: &Cluster, pods: &TwoPods, node: &str) -> Result<()> {
    c.node(node, &[], &[])?;
    c.namespace("bk-apps", &[])?;
    for (name, pod) in [("a", &pods.a), ("b", &pods.b)] {
        let ip = pod.ipv4().to_string();
        c.pod("bk-apps", name, node, &[&ip], PodOpts::default())?;
    }
    Ok(())
}

pub fn node_name(pods: &TwoPods, what: &str) -> String {
    format!("bk-{}-{what}", pods.tag())
}

/// Two pods, the API server, and in it the node named after `what` with the pod CIDRs
/// `cidrs` and the namespace `ns`: where most Kubernetes tests begin.
pub fn cluster_with_node(
    what: &str,
    cidrs: &[&str],
    ns: &str,
) -> Result<(TwoPods, Cluster, String)> {
    let pods = TwoPods::new()?;
    let c = Cluster::start()?;
    let node = node_name(&pods, what);
    c.node(&node, cidrs, &[])?;
    c.namespace(ns, &[])?;
    Ok((pods, c, node))
}

/// The repository's `deploy/`.
pub fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// Two pods, `a` and `b`, of namespace `ns` on a node of their own, and an agent with
/// both in its maps.
pub struct TwoPodNode {
    pub pods: TwoPods,
    pub c: Cluster,
    pub agent: Agent,
    /// Pod a's IPv4 address, as the API has it.
    pub a4: String,
}

impl TwoPodNode {
    /// Starts it all: the node named after `label`.
    pub fn start(label: &str, ns: &str) -> Result<Self> {
        let pods = TwoPods::new()?;
        let c = Cluster::start()?;
        let node = node_name(&pods, label);
        c.node(&node, &[&pods.pod_cidr_v4(), &pods.pod_cidr_v6()], &[])?;
        c.namespace(ns, &[])?;
        let (a4, b4) = (pods.a.ipv4().to_string(), pods.b.ipv4().to_string());
        c.pod(ns, "a", &node, &[&a4], PodOpts::default())?;
        c.pod(ns, "b", &node, &[&b4], PodOpts::default())?;
        let agent = start_agent(&c, &pods, &node, free_port()?, &[])?;
        wait_addrs(agent.pin_dir(), "pods a and b in", &addrs(&[&a4, &b4]))?;
        Ok(Self { pods, c, agent, a4 })
    }
}

/// Waits (a net, [`testbed::steps::NET`]) until the agent logged `line`: it says it
/// cut, for `what`.
pub fn wait_cut_logged(agent: &Agent, line: &str, what: &str) -> Result<()> {
    ensure_logged(agent, line, &format!("the agent did not cut {what}"))?;
    Ok(())
}
