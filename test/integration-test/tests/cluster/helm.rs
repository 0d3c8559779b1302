//! The Helm chart as an operator installs it: into a namespace `--create-namespace`
//! makes, on a cluster that enforces Pod Security baseline by default; the agent
//! container without privileges; metrics on the node's IPv4 and IPv6 addresses;
//! `helm test` (the read-only `check`), the cluster-wide node view; `helm uninstall`
//! alone leaving nothing attached; a changed `maxSockets` taking effect on rollout,
//! with the agent's memory measured; the chart linted, rendered into `deploy/`, and
//! schema-checked with kubeconform.

use std::{net::SocketAddr, path::Path};

use anyhow::{Result, ensure};
use kube_testenv::{chart, deploy::AGENT_NS, image::VERSION};

use crate::{
    PORT, agent,
    agent::{
        HelmRelease, METRICS_PORT, agent_container, agent_memory, helm, helm_template, pins_left,
    },
    assert_normal_path, kube,
    kube::{k, label_node, repo},
    pods::Namespace,
    schema, veth_cost, wait_path,
};

/// The node's IPv6 address (`cargo xtask cluster`).
const NODE_IP6: &str = "fd00:123::1";

#[test]
fn helm_install_under_enforced_pod_security_unprivileged_ipv6_metrics_check_and_nodes() -> Result<()>
{
    // The cluster enforces baseline where a namespace says nothing: a host-network pod
    // in a fresh namespace is refused.
    let plain = Namespace::create("bt-psa", &[])?;
    let refused = k(&[
        "-n",
        &plain.name,
        "run",
        "hostnet",
        &format!("--image={}", crate::kube::TEST_IMAGE),
        "--overrides={\"spec\":{\"hostNetwork\":true}}",
        "--dry-run=server",
    ]);
    ensure!(
        refused
            .as_ref()
            .is_err_and(|e| e.to_string().contains("PodSecurity")),
        "a host-network pod was admitted in an unlabelled namespace: {refused:?}"
    );
    drop(plain);

    let _release = HelmRelease::install(&[&format!("image.tag={VERSION}")])?;
    // The hook labelled the namespace Helm made.
    let level = k(&[
        "get",
        "namespace",
        AGENT_NS,
        "-o",
        "jsonpath={.metadata.labels.pod-security\\.kubernetes\\.io/enforce}",
    ])?;
    ensure!(level == "privileged", "namespace enforce label: {level:?}");

    // The agent runs unprivileged with capabilities; only the init container is
    // privileged.
    let c = agent_container(false)?;
    let sc = &c["securityContext"];
    ensure!(sc["privileged"] == false, "agent securityContext: {sc}");
    ensure!(
        sc["capabilities"]["drop"][0] == "ALL"
            && sc["capabilities"]["add"]
                .as_array()
                .is_some_and(|a| a.iter().any(|v| v == "BPF")),
        "agent capabilities: {sc}"
    );
    ensure!(
        agent_container(true)?["securityContext"]["privileged"] == true,
        "the init container mounts bpffs"
    );

    // Metrics on both of the node's addresses, IPv6 without brackets in the flag.
    let args = c["args"].to_string();
    ensure!(args.contains("--metrics-ip=$(HOST_IPS)"), "args: {args}");
    for ip in [kube::NODE_IP, NODE_IP6] {
        let addr = SocketAddr::new(ip.parse()?, METRICS_PORT);
        let (code, body) = testbed::agent::http_get_at(addr, "/metrics")?;
        ensure!(code == 200, "{addr}: {code}");
        for series in [
            "bypass_kernel_info{release=",
            "bypass_sockets_capacity 65536",
            "bypass_heartbeat_remaining_seconds",
        ] {
            ensure!(body.contains(series), "{addr}: no {series} in /metrics");
        }
        ensure!(!body.contains("bypass_kernel{"), "the old name is gone");
    }

    // It bypasses.
    label_node(Some(true))?;
    let ns = Namespace::create("bt-helm-psa", &[])?;
    let server = ns.server_pod("server", &[])?;
    let client = ns.client_pod("client")?;
    let cost = wait_path(&client, &server, &format!("{}:{PORT}", server.ip), true)?;
    eprintln!("unprivileged agent: the server's veth carried {cost} bytes of 32 MiB");

    // The read-only preflight, as `helm test`.
    let out = helm(&[
        "test",
        agent::RELEASE,
        "-n",
        AGENT_NS,
        "--logs",
        "--timeout=900s",
    ])?;
    ensure!(
        out.contains("the agent can run on this node") && out.contains("bpf_get_netns_cookie"),
        "helm test: {out}"
    );
    ensure!(
        out.contains("IPv6"),
        "check did not look at the IPv6 address: {out}"
    );

    // The cluster-wide view, once the agent published its node.
    let mut table = String::new();
    kube::wait_for("the node's status", kube_testenv::NET, || {
        table = k(&[
            "-n",
            AGENT_NS,
            "exec",
            "ds/bypass-agent",
            "--",
            "bypass-agent",
            "nodes",
        ])?;
        ensure!(table.contains("bypassing"), "{table}");
        Ok(())
    })?;
    eprintln!("bypass-agent nodes:\n{table}");
    ensure!(
        table.contains(kube_testenv::deploy::NODE)
            && table.contains("ulp_guard")
            && table.contains("order"),
        "{table}"
    );
    // A field of every node-status object, by its JSONPath under the object.
    let node_status = |field: &str| {
        k(&[
            "-n",
            AGENT_NS,
            "get",
            "configmaps",
            "-l",
            "app.kubernetes.io/component=node-status",
            "-o",
            &format!("jsonpath={{.items[*].{field}}}"),
        ])
    };
    let labelled = node_status("metadata.labels.bypass\\.dev/state")?;
    ensure!(labelled == "bypassing", "state label: {labelled:?}");
    // It says when its agent last wrote it (`nodes` shows an old one as stale).
    let refreshed = node_status("data.refreshed")?;
    ensure!(
        refreshed
            .trim()
            .parse::<k8s_openapi::jiff::Timestamp>()
            .is_ok(),
        "refreshed: {refreshed:?}"
    );
    // Owned by its Node, so it goes with the node.
    let owner = node_status("metadata.ownerReferences[0]['kind','name','uid']")?;
    let node_uid = k(&[
        "get",
        "node",
        kube_testenv::deploy::NODE,
        "-o",
        "jsonpath={.metadata.uid}",
    ])?;
    ensure!(
        owner.split_whitespace().collect::<Vec<_>>()
            == ["Node", kube_testenv::deploy::NODE, node_uid.trim()],
        "owner of the node status: {owner:?} (the node's uid {node_uid:?})"
    );
    // The agent's account may write its own node's object, not another node's: the
    // admission policy reads the node bound into its token (impersonated here).
    let as_agent = |name: &str| {
        k(&[
            "-n",
            AGENT_NS,
            "create",
            "configmap",
            name,
            "--dry-run=server",
            "--as=system:serviceaccount:bypass-system:bypass-agent",
            &format!(
                "--as-user-extra=authentication.kubernetes.io/node-name={}",
                kube_testenv::deploy::NODE
            ),
        ])
    };
    let other = as_agent("bypass-node-another-node");
    ensure!(
        other
            .as_ref()
            .is_err_and(|e| e.to_string().contains("only its own node")),
        "another node's status object: {other:?}"
    );
    // Its own (a dry run: the object exists; create is refused as existing, not by the
    // policy, or accepted).
    if let Err(e) = as_agent(&format!("bypass-node-{}", kube_testenv::deploy::NODE)) {
        ensure!(!e.to_string().contains("only its own node"), "{e}");
    }
    Ok(())
}

#[test]
fn helm_uninstall_alone_leaves_nothing_attached() -> Result<()> {
    let mut release = HelmRelease::install(&[&format!("image.tag={VERSION}")])?;
    label_node(Some(true))?;
    let ns = Namespace::create("bt-helm-gone", &[])?;
    let server = ns.server_pod("server", &[])?;
    let client = ns.client_pod("client")?;
    let target = format!("{}:{PORT}", server.ip);
    wait_path(&client, &server, &target, true)?;
    let cgroup = testbed::cgroup::cgroup2_mount()?;
    ensure!(!pins_left().is_empty(), "nothing pinned while installed");

    release.uninstall()?;
    // Each agent saw its DaemonSet gone at exit and removed its datapath.
    kube::wait_for("the datapath removed", kube_testenv::NET, || {
        let left = pins_left();
        ensure!(left.is_empty(), "still pinned: {left:?}");
        Ok(())
    })?;
    let attached = testbed::bpf::sockops_attached(&cgroup)?;
    ensure!(
        attached == 0,
        "{attached} sock_ops program(s) still attached to {}",
        cgroup.display()
    );
    // The node label is still true: nothing bypasses any more.
    assert_normal_path(
        veth_cost(&client, &server, &target)?,
        "after helm uninstall",
    )?;
    Ok(())
}

#[test]
fn changed_max_sockets_takes_effect_on_rollout_and_memory_fits_the_limits() -> Result<()> {
    let release = HelmRelease::install(&[&format!("image.tag={VERSION}")])?;
    let capacity = || agent::metric("bypass_sockets_capacity");
    ensure!(capacity()? == 65_536.0, "default capacity");
    let default = agent_memory()?;
    let limit = |c: &serde_json::Value| c["resources"]["limits"]["memory"].to_string();
    let default_limit = limit(&agent_container(false)?);

    release.upgrade(&["maxSockets=262144"])?;
    kube::wait_for("the new capacity", kube_testenv::NET, || {
        let c = capacity()?;
        ensure!(c == 262_144.0, "capacity {c}");
        Ok(())
    })?;
    let four = agent_memory()?;
    let four_limit = limit(&agent_container(false)?);
    eprintln!(
        "agent memory cgroup after a fresh load: {} KiB at --max-sockets 65536 (limit {default_limit}), {} KiB at 262144 (limit {four_limit})",
        default >> 10,
        four >> 10
    );
    ensure!(
        four > default,
        "4x the sockets did not cost memory: {default} -> {four}"
    );
    for (used, lim) in [(default, &default_limit), (four, &four_limit)] {
        let mib: u64 = lim.trim_matches('"').trim_end_matches("Mi").parse()?;
        ensure!(
            used < mib << 20,
            "{used} bytes used, over the derived limit {lim}"
        );
    }
    Ok(())
}

#[test]
fn chart_lints_renders_deploy_and_passes_the_schema_check() -> Result<()> {
    let repo = repo();
    let chart_dir = repo.join(chart::CHART).display().to_string();
    let lint = helm(&["lint", "--strict", &chart_dir])?;
    ensure!(lint.contains("0 chart(s) failed"), "{lint}");
    // The schema refuses what the agent would.
    let bad = helm_template("x", None, None, &["maxSockets=1"]);
    ensure!(
        bad.is_err_and(|e| e.to_string().contains("maxSockets")),
        "the schema took maxSockets=1"
    );
    // The alerts' runbook links need a base, named when missing.
    let no_runbook = helm_template("x", None, None, &["prometheusRule.enabled=true"]);
    ensure!(
        no_runbook.is_err_and(|e| e
            .to_string()
            .contains("prometheusRule.runbookBaseUrl is empty")),
        "the alerts rendered without a runbook base URL"
    );
    // The namespace hook runs on Linux nodes, as a fixed unprivileged UID except on
    // OpenShift, whose restricted-v2 SCC assigns one and refuses a fixed one.
    let hook =
        |sets: &[&str]| helm_template("x", None, Some("templates/namespace-hook.yaml"), sets);
    let plain = hook(&[])?;
    ensure!(
        plain.contains("kubernetes.io/os: linux") && plain.contains("runAsUser: 65534"),
        "{plain}"
    );
    let openshift = hook(&["openshift.scc=true"])?;
    ensure!(
        openshift.contains("kubernetes.io/os: linux") && !openshift.contains("runAsUser"),
        "{openshift}"
    );
    // The chart declares the cluster versions it runs on, and helm refuses others.
    let old = helm(&["template", "x", &chart_dir, "--kube-version", "1.29.9"]);
    ensure!(
        old.is_err_and(|e| e.to_string().contains("kubeVersion")),
        "the chart installs on Kubernetes 1.29"
    );
    helm(&["template", "x", &chart_dir, "--kube-version", "1.30.0"])?;

    // deploy/ is the chart rendered.
    let helm_bin = kube_testenv::env_path("BYPASS_HELM", kube::FIX)?;
    let want = chart::split(&chart::render(&helm_bin, &repo)?)?;
    let drift = chart::drift(&chart::rendered_files(&repo.join("deploy"))?, &want);
    ensure!(
        drift.is_empty(),
        "deploy/ is not the chart rendered ({}): run `cargo xtask render-deploy`",
        drift.join(", ")
    );

    // kubeconform, strict, against this API server's schemas: the chart with its
    // defaults and with every optional part on, and every manifest of deploy/.
    let tmp = std::env::temp_dir().join(format!("bt-kubeconform-{}", std::process::id()));
    let schemas = tmp.join("schemas");
    schema::write_cluster_schemas(&schemas)?;
    let mut files = Vec::new();
    for (name, sets) in [
        ("defaults", vec![]),
        (
            "everything",
            vec![
                "metrics.service.enabled=true",
                "metrics.serviceMonitor.enabled=true",
                "prometheusRule.enabled=true",
                "prometheusRule.runbookBaseUrl=https://runbook.example/runbook.md",
                "dashboard.enabled=true",
                "openshift.scc=true",
                "createNamespace=true",
                "includeNamespaceLabel=bypass.dev/include",
                "skipPorts={15000,15021}",
                "serviceCIDRs={10.97.0.0/16,fd00:97::/108}",
                "image.registry=registry.example/bypass",
                "image.digest=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
                "imagePullSecrets[0].name=pull",
                "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=bypass.dev/capable",
                "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
                "resources.requests.memory=64Mi",
                "seLinuxOptions.type=spc_t",
            ],
        ),
    ] {
        let text = helm_template("bypass", Some(AGENT_NS), None, &sets)?;
        let file = tmp.join(format!("{name}.yaml"));
        std::fs::write(&file, text)?;
        files.push(file);
    }
    for f in std::fs::read_dir(repo.join("deploy"))?.flatten() {
        let name = f.file_name().to_string_lossy().into_owned();
        if name.ends_with(".yaml") && name != "kustomization.yaml" && name != "values.yaml" {
            files.push(f.path());
        }
    }
    let refs: Vec<&Path> = files.iter().map(|p| p.as_path()).collect();
    let summary = schema::kubeconform(&schemas, &refs, &["ServiceMonitor", "PrometheusRule"])?;
    eprintln!("kubeconform: {}", summary.trim());
    ensure!(summary.contains("Invalid: 0, Errors: 0"), "{summary}");
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(())
}
