//! Bad input (no node name, a bad kubeconfig, a missing Node, missing RBAC) fails
//! clearly, naming the fix, and leaves no datapath; deploy/'s RBAC is enough.

use std::path::Path;

use anyhow::{Context as _, Result, ensure};
use serde_json::json;
use testbed::{Agent, AgentOpts, agent::http_get};

use super::{
    cluster::PodOpts,
    support::{
        PROPAGATION, cluster_with_node, deploy_dir, free_port, kube_agent_opts, log_lines, strings,
        wait_for, wait_service_cidrs,
    },
};
use crate::support::privileged;

/// Starts the agent expecting it to fail; returns its stderr. No datapath may be left.
fn agent_fails(opts: &AgentOpts, env: &[(&str, Option<&str>)]) -> Result<String> {
    let mut cmd = testbed::agent::agent_command();
    cmd.args(opts.args())
        .env_remove("NODE_NAME")
        .env_remove("KUBECONFIG");
    for (k, v) in env {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    // It must exit, not retry: the net catches an agent that waits on (how fast it
    // exits is the machine's).
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = cmd.spawn().context("run bypass-agent")?;
    let out = testbed::PodChild::adopt(child, "bypass-agent").wait_output(testbed::steps::NET)?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    ensure!(!out.status.success(), "the agent did not fail: {stderr}");
    ensure!(
        !opts.pin_dir.exists(),
        "a failed start left {}",
        opts.pin_dir.display()
    );
    eprintln!("  {}", stderr.lines().last().unwrap_or(""));
    Ok(stderr)
}

#[test]
fn k8s_bad_input_fails_with_the_fix_and_deploy_rbac_suffices() -> Result<()> {
    privileged!();
    let (pods, c, node) = cluster_with_node("n", &["10.55.0.0/24"], "bk-apps")?;
    c.pod("bk-apps", "p", &node, &["10.55.0.5"], PodOpts::default())?;
    let admin = c.env.kubeconfig();
    let port = free_port()?;

    // Missing node name.
    let mut opts = kube_agent_opts(&pods, &node, &admin, port, &[]);
    opts.extra_args.drain(0..2);
    let err = agent_fails(&opts, &[])?;
    ensure!(
        err.contains("no node name") && err.contains("NODE_NAME"),
        "{err}"
    );
    let err = agent_fails(&opts, &[("NODE_NAME", Some(""))])?;
    ensure!(err.contains("no node name"), "{err}");

    // Unreadable and malformed kubeconfigs.
    let err = agent_fails(
        &kube_agent_opts(
            &pods,
            &node,
            Path::new("/nonexistent/kubeconfig"),
            port,
            &[],
        ),
        &[],
    )?;
    ensure!(
        err.contains("cannot use the kubeconfig /nonexistent/kubeconfig"),
        "{err}"
    );
    let garbage = c.env.dir().join("garbage.kubeconfig");
    std::fs::write(&garbage, "clusters: [[[")?;
    let err = agent_fails(&kube_agent_opts(&pods, &node, &garbage, port, &[]), &[])?;
    ensure!(err.contains("cannot use the kubeconfig"), "{err}");

    // A Node that does not exist.
    let err = agent_fails(
        &kube_agent_opts(&pods, "bk-no-such-node", &admin, port, &[]),
        &[],
    )?;
    ensure!(err.contains("node bk-no-such-node does not exist"), "{err}");

    // RBAC: nothing granted, then everything but watch.
    let nobody = c.env.user_kubeconfig("bk-nobody", &[])?;
    let err = agent_fails(&kube_agent_opts(&pods, &node, &nobody, port, &[]), &[])?;
    ensure!(
        err.contains("forbids the agent to get nodes") && err.contains("deploy/rbac.yaml"),
        "{err}"
    );
    let nowatch = c.env.user_kubeconfig("bk-nowatch", &[])?;
    c.grant(
        "bk-nowatch",
        "bk-nowatch",
        json!([{"apiGroups": [""], "resources": ["nodes", "pods", "namespaces"], "verbs": ["get", "list"]}]),
    )?;
    let err = agent_fails(&kube_agent_opts(&pods, &node, &nowatch, port, &[]), &[])?;
    ensure!(err.contains("forbids the agent to watch nodes"), "{err}");

    // The ServiceAccount with exactly deploy/'s RBAC is enough.
    let deploy = deploy_dir();
    for f in ["namespace.yaml", "serviceaccount.yaml", "rbac.yaml"] {
        c.apply_yaml(&deploy.join(f), false)?;
    }
    let sa = c.env.user_kubeconfig(
        "system:serviceaccount:bypass-system:bypass-agent",
        &["system:serviceaccounts"],
    )?;
    let agent = Agent::start(&kube_agent_opts(&pods, &node, &sa, port, &[]))?;
    wait_for(
        agent.pin_dir(),
        PROPAGATION,
        "pod address with deploy RBAC",
        |s| s.pod_addresses.len() == 1,
    )?;
    // ServiceCIDRs too: the default one, from --service-cluster-ip-range.
    wait_service_cidrs(
        agent.pin_dir(),
        "ServiceCIDRs with deploy RBAC",
        &strings(&["10.0.0.0/24"]),
    )?;
    ensure!(
        http_get(port, "/readyz")?.0 == 200,
        "not ready with deploy RBAC"
    );
    ensure!(
        log_lines(&agent, &["forbids"]) == 0,
        "deploy RBAC is not enough: {}",
        agent.stderr()
    );
    Ok(())
}
