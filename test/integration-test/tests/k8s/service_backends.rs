//! Service backends follow the Services and their EndpointSlices (with the
//! `--service-backend` flags): an endpoint on a pod of the agent's node enters the map
//! under the Service's ClusterIP and port, moves when the slice's address changes, and
//! leaves when the slice is deleted; an endpoint that is no pod of the node never enters.
//! One namespace naming the node's pods on more ports than the map holds fills only its
//! share of it.

use std::{cell::Cell, collections::BTreeSet, path::Path, time::Duration};

use anyhow::{Result, ensure};
use bypass_common::names::MAX_SERVICE_BACKENDS;
use serde_json::{Value, json};
use testbed::agent::{http_get, metric};

use super::{
    cluster::PodOpts,
    support::{
        addrs, cluster_with_node, free_port, log_lines, seen, set, start_agent, strings,
        wait_addrs, wait_for,
    },
};
use crate::support::privileged;

/// How long a change of the Services or EndpointSlices may take to reach the map:
/// generous, what is checked here is that the map follows them.
/// A net for each change to reach the maps (see `testbed::steps::NET`).
const DEADLINE: Duration = testbed::steps::NET;

/// A ClusterIP in the API server's service range (10.0.0.0/24, `kube-testenv`), not
/// the `kubernetes` Service's (10.0.0.1).
const CLUSTER_IP: &str = "10.0.0.42";

/// Given with `--service-backend`: in the map from the first listing on, whatever the
/// API says.
const FLAG: &str = "10.0.0.99:443=10.33.1.9:8443";

#[test]
fn k8s_service_backends_follow_endpointslices() -> Result<()> {
    privileged!();
    let (pods, c, node) = cluster_with_node("sb", &[], "bk-apps")?;
    c.pod("bk-apps", "web", &node, &["10.33.1.7"], PodOpts::default())?;
    c.pod("bk-apps", "web2", &node, &["10.33.1.8"], PodOpts::default())?;
    let port = free_port()?;
    let agent = start_agent(&c, &pods, &node, port, &["--service-backend", FLAG])?;
    let pin = agent.pin_dir().to_path_buf();
    wait_addrs(&pin, "pods in", &addrs(&["10.33.1.7", "10.33.1.8"]))?;
    // Set by the first poll that sees the flag's entry, cleared by any poll after that
    // does not.
    let flag = FlagWatch::default();
    flag.wait(&pin, "the flag once listed", &strings(&[FLAG]))?;

    // Port 80 to the pods' port named "web"; the slice names the port "http" as the
    // Service does, with the number the name resolves to. 10.33.9.9 is no pod of
    // this node.
    c.service(
        "bk-apps",
        "web",
        CLUSTER_IP,
        json!([{"name": "http", "port": 80, "targetPort": "web"}]),
    )?;
    let slice_ports = json!([{"name": "http", "port": 8080, "protocol": "TCP"}]);
    c.endpoint_slice(
        "bk-apps",
        "web-1",
        "web",
        &node,
        &["10.33.1.7", "10.33.9.9"],
        slice_ports,
    )?;
    flag.wait(
        &pin,
        "the node's endpoint in",
        &strings(&[FLAG, "10.0.0.42:80=10.33.1.7:8080"]),
    )?;

    c.endpoint_slice_addrs("bk-apps", "web-1", &node, &["10.33.1.8"])?;
    flag.wait(
        &pin,
        "the changed endpoint in, the old one out",
        &strings(&[FLAG, "10.0.0.42:80=10.33.1.8:8080"]),
    )?;

    c.delete_endpoint_slice("bk-apps", "web-1")?;
    flag.wait(&pin, "the deleted slice's endpoint out", &strings(&[FLAG]))?;
    ensure!(
        flag.held(),
        "the --service-backend entry left the map at some point"
    );
    ensure!(http_get(port, "/readyz")?.0 == 200, "not ready");
    Ok(())
}

/// A tenant's Service and hand-written EndpointSlices (which may name any of the node's
/// pod addresses, on any ports) giving more backends than the map holds: the tenant's fill
/// the map while it is alone, another namespace's backend then still enters, no map
/// update fails, and the backends left out are counted and logged by namespace.
#[test]
fn k8s_service_backends_one_namespace_cannot_fill_the_map() -> Result<()> {
    privileged!();
    let (pods, c, node) = cluster_with_node("sbfill", &[], "bk-apps")?;
    c.namespace("bk-tenant", &[])?;
    c.pod("bk-apps", "web", &node, &["10.33.1.7"], PodOpts::default())?;
    c.pod("bk-tenant", "t", &node, &["10.33.1.8"], PodOpts::default())?;
    let port = free_port()?;
    let agent = start_agent(&c, &pods, &node, port, &[])?;
    let pin = agent.pin_dir().to_path_buf();
    wait_addrs(&pin, "pods in", &addrs(&["10.33.1.7", "10.33.1.8"]))?;

    // 100 ports (the most a slice may carry) in 100 slices, each slice giving every port
    // another target port, on both pod addresses: 20,000 backends.
    const PORTS: u16 = 100;
    const SLICES: u16 = 100;
    let given = usize::from(PORTS) * usize::from(SLICES) * 2;
    let capacity = MAX_SERVICE_BACKENDS as usize;
    ensure!(
        given > capacity,
        "the tenant must give more than the map holds"
    );
    let ports: Vec<Value> = (0..PORTS)
        .map(|i| json!({"name": format!("p{i}"), "port": 1000 + i, "targetPort": 2000 + i}))
        .collect();
    c.service("bk-tenant", "flood", "10.0.0.50", Value::Array(ports))?;
    for s in 0..SLICES {
        let ports: Vec<Value> = (0..PORTS)
            .map(|i| json!({"name": format!("p{i}"), "port": 10_000 + s * PORTS + i, "protocol": "TCP"}))
            .collect();
        c.endpoint_slice(
            "bk-tenant",
            &format!("flood-{s}"),
            "flood",
            &node,
            &["10.33.1.7", "10.33.1.8"],
            Value::Array(ports),
        )?;
    }
    let tenant = |s: &testbed::AgentStatus| {
        s.service_backends
            .iter()
            .filter(|b| b.starts_with("10.0.0.50:"))
            .count()
    };
    wait_for(
        &pin,
        DEADLINE,
        "the map full of the tenant's backends",
        |s| tenant(s) == capacity,
    )?;

    c.service(
        "bk-apps",
        "web",
        CLUSTER_IP,
        json!([{"name": "http", "port": 80, "targetPort": 8080}]),
    )?;
    let slice_ports = json!([{"name": "http", "port": 8080, "protocol": "TCP"}]);
    c.endpoint_slice(
        "bk-apps",
        "web-1",
        "web",
        &node,
        &["10.33.1.7"],
        slice_ports,
    )?;
    let web = "10.0.0.42:80=10.33.1.7:8080";
    wait_for(&pin, DEADLINE, "the other namespace's backend in", |s| {
        s.service_backends.iter().any(|b| b == web)
    })?;
    let s = seen(&pin)?;
    ensure!(
        s.service_backends.len() == capacity && tenant(&s) == capacity - 1,
        "the map holds {} backends, {} of them the tenant's (want {capacity} and {})",
        s.service_backends.len(),
        tenant(&s),
        capacity - 1
    );
    let left_out = metric(port, "bypass_service_backends_left_out")?;
    ensure!(
        left_out == (given - (capacity - 1)) as f64,
        "bypass_service_backends_left_out is {left_out}, want {}",
        given - (capacity - 1)
    );
    let failed = metric(port, "bypass_reconcile_errors_total{kind=\"map_update\"}")?;
    ensure!(failed == 0.0, "{failed} map updates failed");
    ensure!(
        log_lines(&agent, &["cannot hold every Service backend", "bk-tenant"]) >= 1,
        "no warning names the tenant's namespace"
    );
    Ok(())
}

/// Whether the flag's entry, once seen in the map, stayed in it at every poll.
#[derive(Default)]
struct FlagWatch {
    seen: Cell<bool>,
    lost: Cell<bool>,
}

impl FlagWatch {
    /// Polls until the Service backends are `want`, noting the flag's entry each time.
    fn wait(&self, pin: &Path, what: &str, want: &BTreeSet<String>) -> Result<Duration> {
        wait_for(pin, DEADLINE, what, |s| {
            let have = set(&s.service_backends);
            if have.contains(FLAG) {
                self.seen.set(true);
            } else if self.seen.get() {
                self.lost.set(true);
            }
            have == *want
        })
    }

    fn held(&self) -> bool {
        self.seen.get() && !self.lost.get()
    }
}

/// A tenant's EndpointSlices, each carrying as much annotation as the API takes:
/// every agent keeps every EndpointSlice of the cluster, and must keep none of what it
/// does not read. [`PAD_SLICES`] slices of 250 KiB of annotations each, then one that
/// gives a backend on the node's pod (the watch delivers in order: once its backend is
/// in the map, the agent has seen them all); the agent's resident memory grows by less
/// than half of what they carry.
#[test]
fn k8s_tenant_annotations_cost_the_agent_no_memory() -> Result<()> {
    privileged!();
    let (pods, c, node) = cluster_with_node("sbpad", &[], "bk-tenant")?;
    c.pod("bk-tenant", "t", &node, &["10.33.1.8"], PodOpts::default())?;
    let port = free_port()?;
    let agent = start_agent(&c, &pods, &node, port, &[])?;
    let pin = agent.pin_dir().to_path_buf();
    wait_addrs(&pin, "pods in", &addrs(&["10.33.1.8"]))?;
    let rss = || -> Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", agent.pid()))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kib| kib * 1024)
            .ok_or_else(|| anyhow::anyhow!("no VmRSS in the agent's status"))
    };
    let before = rss()?;

    const PAD: usize = 250 * 1024;
    let pad = "x".repeat(PAD);
    c.service(
        "bk-tenant",
        "pad",
        "10.0.0.51",
        json!([{"name": "http", "port": 80, "targetPort": 8080}]),
    )?;
    for s in 0..PAD_SLICES {
        let name = format!("pad-{s}");
        c.endpoint_slice(
            "bk-tenant",
            &name,
            "pad",
            &node,
            &["10.33.1.8"],
            json!([{"name": "other", "port": 9090, "protocol": "TCP"}]),
        )?;
        c.block(c.endpoint_slices("bk-tenant").patch(
            &name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"annotations": {"pad": pad}}})),
        ))?;
    }
    c.endpoint_slice(
        "bk-tenant",
        "pad-last",
        "pad",
        &node,
        &["10.33.1.8"],
        json!([{"name": "http", "port": 8080, "protocol": "TCP"}]),
    )?;
    let backend = "10.0.0.51:80=10.33.1.8:8080";
    wait_for(&pin, DEADLINE, "the last slice's backend in", |s| {
        s.service_backends.iter().any(|b| b == backend)
    })?;
    let after = rss()?;
    let carried = (PAD_SLICES * PAD) as u64;
    eprintln!(
        "{PAD_SLICES} slices carrying {} KiB of annotations: the agent's resident memory \
         {} -> {} KiB",
        carried / 1024,
        before / 1024,
        after / 1024
    );
    ensure!(
        after < before + carried / 2,
        "the agent's resident memory grew by {} KiB with {} KiB of annotations it never reads",
        after.saturating_sub(before) / 1024,
        carried / 1024
    );
    Ok(())
}

/// The annotated slices of [`k8s_tenant_annotations_cost_the_agent_no_memory`].
const PAD_SLICES: usize = 64;
