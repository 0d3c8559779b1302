//! End to end on the one-node cluster of `cargo xtask cluster up` (kubelet, containerd,
//! the CNI bridge, kube-proxy in iptables mode): `kubectl apply -k deploy/`, real pods,
//! bytes measured on their veths. Run by `cargo xtask test --cluster`, one at a time.
//! Each test deploys the agent and ends with the README's uninstall (guards on drop).

mod agent;
mod helm;
mod kube;
mod monitoring;
mod pods;
mod schema;
mod versions;

use std::time::Duration;

use agent::{Deployed, HelmRelease, metric, pins_left};
use anyhow::{Result, ensure};
use kube::{PORT, label_node};
use kube_testenv::image::{ROLLOUT_TAG_SUFFIX, VERSION};
use pods::{Namespace, Pod, Running, exchange};

/// Bytes each way per exchange.
const PAYLOAD: &str = "16M";
const PAYLOAD_BYTES: u64 = 16 << 20;
/// What a bypassed exchange may leave on a veth: handshakes, FINs, ACKs.
const BYPASSED_MAX: u64 = 256 << 10;

/// Runs an exchange; returns the bytes the server pod's veth carried meanwhile.
pub(crate) fn veth_cost(client: &Pod, server: &Pod, target: &str) -> Result<u64> {
    let before = server.veth_bytes()?;
    exchange(client, target, PAYLOAD)?;
    Ok(server.veth_bytes()? - before)
}

fn assert_bypassed(cost: u64, what: &str) -> Result<()> {
    ensure!(
        cost < BYPASSED_MAX,
        "{what}: the veth carried {cost} bytes of a {PAYLOAD_BYTES}-byte-each-way exchange: not bypassed"
    );
    Ok(())
}

pub(crate) fn assert_normal_path(cost: u64, what: &str) -> Result<()> {
    ensure!(
        cost >= 2 * PAYLOAD_BYTES,
        "{what}: the veth carried only {cost} bytes of a {PAYLOAD_BYTES}-byte-each-way exchange: bypassed"
    );
    Ok(())
}

/// Waits until an exchange has the expected path (the agent applies labels and
/// annotations within a moment of the API's change).
pub(crate) fn wait_path(client: &Pod, server: &Pod, target: &str, bypassed: bool) -> Result<u64> {
    let mut last = 0;
    kube::wait_for(
        if bypassed { "bypassed" } else { "normal path" },
        kube_testenv::NET,
        || {
            last = veth_cost(client, server, target)?;
            if bypassed {
                assert_bypassed(last, target)
            } else {
                assert_normal_path(last, target)
            }
        },
    )
    .map_err(|e| {
        // What the agent saw, for the failure's message.
        let status = kube::k(&[
            "-n",
            "bypass-system",
            "exec",
            "ds/bypass-agent",
            "--",
            "bypass-agent",
            "status",
        ])
        .unwrap_or_else(|e| e.to_string());
        let log = kube::k(&[
            "-n",
            "bypass-system",
            "logs",
            "ds/bypass-agent",
            "--tail=40",
        ])
        .unwrap_or_else(|e| e.to_string());
        e.context(format!("agent status:\n{status}\nagent log:\n{log}"))
    })?;
    Ok(last)
}

#[test]
fn daemonset_ready_pods_bypassed_only_once_labelled_status_and_metrics() -> Result<()> {
    let deployed = Deployed::apply()?;
    let ns = Namespace::create("bt-pods", &[])?;
    let server = ns.server_pod("server", &[])?;
    let client = ns.client_pod("client")?;
    let target = format!("{}:{PORT}", server.ip);

    // Before the node is labelled: the normal path (deploy/ is opt-in per node).
    assert_normal_path(veth_cost(&client, &server, &target)?, "unlabelled node")?;
    ensure!(
        deployed.status()?["attached"] == false,
        "attached before the label"
    );

    label_node(Some(true))?;
    let redirected_before = deployed.counter("redirected_bytes")?;
    let cost = wait_path(&client, &server, &target, true)?;
    eprintln!("labelled: the server's veth carried {cost} bytes of 32 MiB");
    let status = deployed.status()?;
    ensure!(status["attached"] == true, "status: {status}");
    let redirected = deployed.counter("redirected_bytes")? - redirected_before;
    ensure!(
        redirected >= 2 * PAYLOAD_BYTES,
        "status redirected_bytes grew by {redirected} only"
    );
    ensure!(deployed.counter("paired_pod")? >= 1, "no pod pair counted");
    let by_kind = metric("bypass_redirected_bytes_total{kind=\"pod\"}")?;
    ensure!(
        by_kind >= (2 * PAYLOAD_BYTES) as f64,
        "metrics: pod kind {by_kind}"
    );
    let (_, body) = agent::http_get("/metrics")?;
    ensure!(
        body.contains(&format!("bypass_build_info{{version=\"{VERSION}\"}} 1")),
        "no build info in /metrics"
    );
    ensure!(agent::http_get("/readyz")?.0 == 200, "/readyz");
    // The chart grants what hearing every pod namespace's address events needs (the
    // agent says at info when it cannot, the chart's level).
    let log = kube::k(&["-n", "bypass-system", "logs", "ds/bypass-agent"])?;
    ensure!(
        log.contains("kernel self-test") && !log.contains("no CAP_NET_BROADCAST"),
        "the agent cannot hear pods' address events: {log}"
    );

    // Off and on again, live.
    label_node(Some(false))?;
    wait_path(&client, &server, &target, false)?;
    label_node(Some(true))?;
    wait_path(&client, &server, &target, true)?;
    Ok(())
}

#[test]
fn opt_outs_by_pod_annotation_and_namespace_label_hold_by_traffic() -> Result<()> {
    let _deployed = Deployed::apply()?;
    label_node(Some(true))?;
    let ns = Namespace::create("bt-optout", &[])?;
    let client = ns.client_pod("client")?;
    let plain = ns.server_pod("plain", &[])?;
    let excluded = ns.server_pod("excluded", &[("bypass.dev/exclude", "true")])?;
    wait_path(&client, &plain, &format!("{}:{PORT}", plain.ip), true)?;
    let cost = veth_cost(&client, &excluded, &format!("{}:{PORT}", excluded.ip))?;
    assert_normal_path(cost, "annotated server")?;

    let out = Namespace::create("bt-optout-ns", &[("bypass.dev/exclude", "true")])?;
    let out_client = out.client_pod("client")?;
    let out_server = out.server_pod("server", &[])?;
    let cost = veth_cost(
        &out_client,
        &out_server,
        &format!("{}:{PORT}", out_server.ip),
    )?;
    assert_normal_path(cost, "namespace labelled out")?;
    // Across namespaces: one end opted out is enough.
    let cost = veth_cost(&client, &out_server, &format!("{}:{PORT}", out_server.ip))?;
    assert_normal_path(cost, "server in an opted-out namespace")?;
    Ok(())
}

#[test]
fn pod_to_clusterip_through_kube_proxy_is_bypassed() -> Result<()> {
    let deployed = Deployed::apply()?;
    label_node(Some(true))?;
    let ns = Namespace::create("bt-svc", &[])?;
    let server = ns.server_pod("server", &[])?;
    let client = ns.client_pod("client")?;
    kube::apply(&format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: server\n  namespace: {}\nspec:\n  selector:\n    app: server\n  ports:\n  - port: 80\n    targetPort: {PORT}\n",
        ns.name
    ))?;
    let vip = kube::k(&[
        "-n",
        &ns.name,
        "get",
        "service",
        "server",
        "-o",
        "jsonpath={.spec.clusterIP}",
    ])?;
    ensure!(vip.starts_with("10.97."), "ClusterIP {vip}");
    let translated_before = deployed.counter("paired_translated")?;
    // kube-proxy writes its rules within a moment of the EndpointSlice.
    let cost = wait_path(&client, &server, &format!("{vip}:80"), true)?;
    eprintln!("ClusterIP {vip}: the server's veth carried {cost} bytes of 32 MiB");
    ensure!(
        deployed.counter("paired_translated")? > translated_before,
        "the connection to the ClusterIP was not paired as translated"
    );
    ensure!(
        metric("bypass_redirected_bytes_total{kind=\"translated\"}")? >= (2 * PAYLOAD_BYTES) as f64,
        "metrics: translated kind"
    );
    Ok(())
}

/// Per-pod accounting on the cluster: after bypassed exchanges between a bare pod and a
/// Deployment's pod, each has its series named by its namespace, its name and its
/// workload (`Deployment/web`, none for the bare pod), with at least what it sent; a
/// deleted pod's series goes.
#[test]
fn per_pod_counters_named_by_namespace_pod_and_workload_go_with_the_pod() -> Result<()> {
    let _deployed = Deployed::apply()?;
    label_node(Some(true))?;
    let ns = Namespace::create("bt-perpod", &[])?;
    let server = ns.server_deployment("web")?;
    let client = ns.client_pod("client")?;
    let target = format!("{}:{PORT}", server.ip);
    wait_path(&client, &server, &target, true)?;
    exchange(&client, &target, PAYLOAD)?;
    let series = |name: &str, pod: &str, owner: &str| {
        format!("{name}{{namespace=\"bt-perpod\",pod=\"{pod}\",owner=\"{owner}\"}}")
    };
    let bytes = "bypass_pod_redirected_bytes_total";
    let conns = "bypass_pod_connections_total";
    for (pod, owner) in [(server.name.as_str(), "Deployment/web"), ("client", "")] {
        // Two bypassed exchanges at least, PAYLOAD each way (all but what a bypassed
        // exchange may leave on the veth), all closed.
        let want = 2 * (PAYLOAD_BYTES - BYPASSED_MAX);
        let sent = metric(&series(bytes, pod, owner))?;
        ensure!(sent >= want as f64, "{pod}: {sent} B, want at least {want}");
        let paired = metric(&series(conns, pod, owner))?;
        ensure!(paired >= 2.0, "{pod}: {paired} connections");
    }
    kube::k(&[
        "-n",
        &ns.name,
        "delete",
        "pod",
        "client",
        "--wait=true",
        "--timeout=900s",
    ])?;
    kube::wait_for("the deleted pod's series gone", kube_testenv::NET, || {
        let (_, body) = agent::http_get("/metrics")?;
        ensure!(
            !body.contains("pod=\"client\""),
            "still shown: {}",
            body.lines()
                .filter(|l| l.contains("pod=\"client\""))
                .collect::<Vec<_>>()
                .join("; ")
        );
        Ok(())
    })?;
    ensure!(
        metric(&series(bytes, &server.name, "Deployment/web"))?
            >= (2 * (PAYLOAD_BYTES - BYPASSED_MAX)) as f64,
        "the server's series went with the client's"
    );
    Ok(())
}

#[test]
fn rolling_update_keeps_an_established_connection_bypassed_and_byte_exact() -> Result<()> {
    let deployed = Deployed::apply()?;
    label_node(Some(true))?;
    let ns = Namespace::create("bt-rollout", &[])?;
    let server = ns.server_pod("server", &[])?;
    let client = ns.client_pod("client")?;
    let target = format!("{}:{PORT}", server.ip);
    wait_path(&client, &server, &target, true)?;
    let old_pod = deployed.pod()?;

    // 48 MiB each way at 3 MiB/s: the stream runs through the whole rollout.
    let before = server.veth_bytes()?;
    let running = Running::start(&client, &target, "48M", "3M")?;
    std::thread::sleep(Duration::from_secs(3));
    kube::k(&[
        "-n",
        "bypass-system",
        "set",
        "image",
        "ds/bypass-agent",
        &format!("agent=bypass-agent:{VERSION}{ROLLOUT_TAG_SUFFIX}"),
    ])?;
    deployed.wait_rollout()?;
    let new_pod = deployed.pod()?;
    ensure!(new_pod != old_pod, "the rollout kept pod {old_pod}");
    let image = kube::k(&[
        "-n",
        "bypass-system",
        "get",
        "pod",
        &new_pod,
        "-o",
        "jsonpath={.spec.containers[0].image}",
    ])?;
    ensure!(
        image.ends_with(&format!("{VERSION}{ROLLOUT_TAG_SUFFIX}")),
        "new pod runs {image}"
    );
    let report = running.finish()?;
    let cost = server.veth_bytes()? - before;
    eprintln!("rollout: 96 MiB byte-exact, the server's veth carried {cost} bytes");
    ensure!(report["bytes_received"] == 48 << 20, "report: {report}");
    ensure!(
        cost < BYPASSED_MAX,
        "the veth carried {cost} bytes during the rollout: the connection left the bypass"
    );
    Ok(())
}

#[test]
fn delete_then_readme_uninstall_leaves_nothing_pinned_or_attached() -> Result<()> {
    {
        let _deployed = Deployed::apply()?;
        label_node(Some(true))?;
        let ns = Namespace::create("bt-uninstall", &[])?;
        let server = ns.server_pod("server", &[])?;
        let client = ns.client_pod("client")?;
        wait_path(&client, &server, &format!("{}:{PORT}", server.ip), true)?;
        ensure!(!pins_left().is_empty(), "no pins while deployed");
        // `kubectl delete -k deploy/` alone: each agent sees its DaemonSet gone at exit
        // and removes its datapath.
        kube::k(&[
            "delete",
            "-k",
            &kube::deploy_dir().display().to_string(),
            "--wait=true",
            "--timeout=900s",
        ])?;
        kube::wait_for("the datapath removed", kube_testenv::NET, || {
            let left = pins_left();
            ensure!(left.is_empty(), "still pinned: {left:?}");
            Ok(())
        })?;
        // _deployed's drop: the README's uninstall.yaml finds nothing left.
    }
    let left = pins_left();
    ensure!(left.is_empty(), "left pinned: {left:?}");
    // And the datapath is really gone: the same exchange takes the veths.
    let ns = Namespace::create("bt-after", &[])?;
    let server = ns.server_pod("server", &[])?;
    let client = ns.client_pod("client")?;
    label_node(Some(true))?;
    let cost = veth_cost(&client, &server, &format!("{}:{PORT}", server.ip))?;
    label_node(None)?;
    assert_normal_path(cost, "after uninstall")
}

#[test]
fn helm_chart_installs_bypasses_and_upgrades_with_a_connection_kept() -> Result<()> {
    let release = HelmRelease::install(&[&format!("image.tag={VERSION}")])?;
    let ns = Namespace::create("bt-helm", &[])?;
    let server = ns.server_pod("server", &[])?;
    let client = ns.client_pod("client")?;
    let target = format!("{}:{PORT}", server.ip);
    // The chart's default is opt-in too.
    assert_normal_path(veth_cost(&client, &server, &target)?, "unlabelled node")?;
    label_node(Some(true))?;
    wait_path(&client, &server, &target, true)?;

    let before = server.veth_bytes()?;
    let running = Running::start(&client, &target, "32M", "3M")?;
    std::thread::sleep(Duration::from_secs(2));
    release.upgrade(&[
        &format!("image.tag={VERSION}{ROLLOUT_TAG_SUFFIX}"),
        "skipPorts=15021",
        "serviceCIDRs={10.97.0.0/16}",
    ])?;
    let pod = agent::agent_pod()?;
    let args = kube::k(&[
        "-n",
        "bypass-system",
        "get",
        "pod",
        &pod,
        "-o",
        "jsonpath={.spec.containers[0].image} {.spec.containers[0].args}",
    ])?;
    ensure!(
        args.contains(&format!("{VERSION}{ROLLOUT_TAG_SUFFIX}"))
            && args.contains("--skip-ports=15021")
            && args.contains("--service-cidr=10.97.0.0/16"),
        "upgraded pod: {args}"
    );
    let status = agent::agent_status()?;
    ensure!(
        status.to_string().contains("15021"),
        "skip ports not applied: {status}"
    );
    running.finish()?;
    let cost = server.veth_bytes()? - before;
    eprintln!("helm upgrade: 64 MiB byte-exact, the server's veth carried {cost} bytes");
    ensure!(
        cost < BYPASSED_MAX,
        "the veth carried {cost} bytes during the upgrade"
    );
    drop(ns);
    drop(release);
    ensure!(pins_left().is_empty(), "left pinned: {:?}", pins_left());
    Ok(())
}
