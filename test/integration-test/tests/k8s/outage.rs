//! The API server away: the datapath keeps what it had and the maps match the API once
//! it is back; an agent started without one waits, live but not ready.

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::json;
use testbed::{
    Agent, ClientArgs, TwoPods,
    agent::{http_get, metric},
};

use super::{
    cluster::{Cluster, PodOpts, client_for},
    support::{
        PROPAGATION, addrs, cluster_with_node, free_port, kube_agent_opts, node_name,
        node_with_pods_a_b, seen, set, start_agent, wait_addrs, wait_for,
    },
};
use crate::support::{
    exchange::{BOUND_ABOVE_PAYLOAD, exchange_bypassed},
    privileged,
};

#[test]
fn k8s_api_server_outage_keeps_datapath_then_resyncs() -> Result<()> {
    privileged!();
    let pods = TwoPods::new()?;
    let mut c = Cluster::start()?;
    let node = node_name(&pods, "n");
    node_with_pods_a_b(&c, &pods, &node)?;
    let (a4, b4) = (pods.a.ipv4().to_string(), pods.b.ipv4().to_string());
    c.pod(
        "bk-apps",
        "gone-later",
        &node,
        &["10.66.0.60"],
        PodOpts::default(),
    )?;
    let port = free_port()?;
    let agent = start_agent(&c, &pods, &node, port, &BOUND_ABOVE_PAYLOAD)?;
    let pin = agent.pin_dir().to_path_buf();
    let before = addrs(&[&a4, &b4, "10.66.0.60"]);
    wait_addrs(&pin, "addresses in", &before)?;
    let second = c.env.start_second_apiserver()?;
    let c2 = c.block(client_for(&second))?;

    c.env.stop_apiserver()?;
    let watch_errors = |p| metric(p, "bypass_reconcile_errors_total{kind=\"watch\"}");
    let deadline = Instant::now() + testbed::steps::NET;
    while watch_errors(port)? < 1.0 {
        ensure!(
            Instant::now() < deadline,
            "the agent did not notice the API server going away"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Meanwhile, through a second API server on the same etcd: one pod goes, one comes.
    let pods2: Api<Pod> = Api::namespaced(c2.clone(), "bk-apps");
    c.block(pods2.delete(
        "gone-later",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
    ))?;
    let new: Pod = serde_json::from_value(json!({
        "metadata": {"name": "new"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "bypass.invalid/none:0"}]},
    }))?;
    c.block(pods2.create(&PostParams::default(), &new))?;
    c.block(pods2.patch_status(
        "new",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running", "podIP": "10.66.0.61", "podIPs": [{"ip": "10.66.0.61"}]}})),
    ))?;

    // The datapath keeps working and keeps what it had.
    let bulk = ClientArgs::bulk(16 << 20);
    exchange_bypassed(&pods, &agent, pods.b.v4_addr(5201), &bulk)?;
    let s = seen(&pin)?;
    ensure!(
        s.attached && set(&s.pod_addresses) == before,
        "changed while the API server was away: {s:#?}"
    );
    ensure!(
        http_get(port, "/healthz")?.0 == 200,
        "an API outage must not fail liveness"
    );

    // Back: the agent relists and matches the API.
    c.env.start_apiserver()?;
    drop(c2);
    wait_for(
        &pin,
        testbed::steps::NET,
        "maps match the API after the outage",
        |s| set(&s.pod_addresses) == addrs(&[&a4, &b4, "10.66.0.61"]),
    )?;
    exchange_bypassed(&pods, &agent, pods.b.v4_addr(5202), &bulk)
}

#[test]
fn k8s_agent_waits_for_an_absent_api_server() -> Result<()> {
    privileged!();
    let (pods, mut c, node) = cluster_with_node("n", &["10.44.0.0/24"], "bk-apps")?;
    c.pod("bk-apps", "p", &node, &["10.44.0.5"], PodOpts::default())?;
    c.env.stop_apiserver()?;
    let port = free_port()?;
    let opts = kube_agent_opts(&pods, &node, &c.env.kubeconfig(), port, &[]);
    std::thread::scope(|s| -> Result<()> {
        // Agent::start returns once the datapath is attached.
        let starting = s.spawn(|| Agent::start(&opts));
        std::thread::sleep(Duration::from_secs(3));
        ensure!(
            !starting.is_finished(),
            "the agent gave up while the API server was away"
        );
        ensure!(
            http_get(port, "/healthz")?.0 == 200,
            "not live while waiting"
        );
        ensure!(
            http_get(port, "/readyz")?.0 == 503,
            "ready without an API server"
        );
        ensure!(
            !opts.pin_dir.exists(),
            "datapath loaded before the API server answered"
        );
        c.env.start_apiserver()?;
        let agent = starting
            .join()
            .map_err(|_| anyhow::anyhow!("agent start panicked"))??;
        wait_for(
            agent.pin_dir(),
            PROPAGATION,
            "pod address once the API server is up",
            |s| s.pod_addresses.len() == 1,
        )?;
        ensure!(
            http_get(port, "/readyz")?.0 == 200,
            "not ready after the API server came up"
        );
        Ok(())
    })
}
