//! An upgrade and a rollback of the agent between two builds, as an operator makes them
//! with Helm, under a connection held between two pods: the release moves from an earlier
//! build of the same layout (`workspace::SAME_LAYOUT_AGENT_COMMIT`, image tag
//! `-earlier`) to this one with `helm upgrade`, and back with `helm rollback`. Each build
//! replaces the other's programs in place, so the held connection stays bypassed, and
//! every exchange on it is byte-exact.

use std::{
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use kube_testenv::{
    deploy::AGENT_NS,
    image::{EARLIER_TAG_SUFFIX, TEST_TOOL_PATH, VERSION},
};

use crate::{
    BYPASSED_MAX, PORT,
    agent::{self, HelmRelease},
    kube::{k, label_node},
    pods::{Namespace, Pod},
    wait_path,
};

/// Bytes each way per exchange on the held connection.
const STEP: u64 = 8 << 20;
/// Where the held connection's server listens, in the server pod beside the peer's.
const HELD_PORT: u16 = PORT + 1;
/// The held echo's step files, in the pods' `/tmp`.
const READY: &str = "/tmp/held-ready";
const SEND: &str = "/tmp/held-send";
const BACK: &str = "/tmp/held-back";

#[test]
fn helm_upgrade_and_rollback_between_builds_keep_a_held_connection_bypassed_and_exact() -> Result<()>
{
    let earlier_tag = format!("{VERSION}{EARLIER_TAG_SUFFIX}");
    let release = HelmRelease::install(&[&format!("image.tag={earlier_tag}")])?;
    let ns = Namespace::create("bt-versions", &[])?;
    let server = ns.server_pod("server", &[])?;
    let client = ns.client_pod("client")?;
    label_node(Some(true))?;
    wait_path(&client, &server, &format!("{}:{PORT}", server.ip), true)?;

    let versions = [
        ("the earlier build", None),
        ("this build (helm upgrade)", Some(Switch::Upgrade)),
        ("the earlier build (helm rollback)", Some(Switch::Rollback)),
    ];
    let held = [
        "--case".to_owned(),
        "held-echo".to_owned(),
        "--steps".to_owned(),
        versions.len().to_string(),
        "--bytes".to_owned(),
        STEP.to_string(),
    ];
    let listen = format!("0.0.0.0:{HELD_PORT}");
    let mut held_server = spawn_probe(
        &server,
        &["server", "--listen", &listen, "--ready-file", READY],
        &held,
    )?;
    wait_for_file(
        &server,
        READY,
        &mut held_server,
        "the held connection's server",
        |_| true,
    )?;
    let target = format!("{}:{HELD_PORT}", server.ip);
    let mut held_client = spawn_probe(
        &client,
        &[
            "client",
            "--connect",
            &target,
            "--go-file",
            SEND,
            "--mark-file",
            BACK,
        ],
        &held,
    )?;

    for (step, (when, switch)) in versions.iter().enumerate() {
        let before_pod = agent::agent_pod()?;
        match switch {
            None => {}
            Some(Switch::Upgrade) => release.upgrade(&[&format!("image.tag={VERSION}")])?,
            Some(Switch::Rollback) => release.rollback(1)?,
        }
        let pod = agent::agent_pod()?;
        let image = agent::pod_jsonpath(&pod, "{.spec.containers[0].image}")?;
        let want = if matches!(switch, Some(Switch::Upgrade)) {
            VERSION.to_owned()
        } else {
            earlier_tag.clone()
        };
        ensure!(
            image.ends_with(&format!(":{want}")),
            "{when}: the agent pod {pod} runs {image}"
        );
        if switch.is_some() {
            ensure!(pod != before_pod, "{when}: the agent pod {pod} was kept");
            // The new build took the pinned datapath over in place.
            let log = k(&["-n", AGENT_NS, "logs", &pod])?;
            ensure!(
                log.contains("Upgraded"),
                "{when}: the agent did not replace the datapath in place:\n{log}"
            );
        }
        let redirected = agent::counter("redirected_bytes")?;
        let wire = server.veth_bytes()?;
        client
            .exec(&["sh", "-c", &format!(": > {SEND}.{step}")])
            .output()
            .context("create the step file")?;
        // Written in one piece once the step came back: a partial read is read again.
        let report = wait_for_file(
            &client,
            &format!("{BACK}.{step}"),
            &mut held_client,
            &format!("{when}: step {step}"),
            |text| serde_json::from_str::<serde_json::Value>(text).is_ok(),
        )?;
        let report: serde_json::Value = serde_json::from_str(&report)
            .with_context(|| format!("{when}: step {step}'s report: {report}"))?;
        ensure!(report["exact"] == true, "{when}: step {step}: {report}");
        let (redirected, wire) = (
            agent::counter("redirected_bytes")? - redirected,
            server.veth_bytes()? - wire,
        );
        eprintln!("held echo, {when}: redirected {redirected} B, veth {wire} B: {report}");
        ensure!(
            redirected >= 2 * STEP && wire < BYPASSED_MAX,
            "{when}: the held connection did not stay bypassed (redirected {redirected} B, \
             {wire} B on the server's veth, 2 x {STEP} exchanged)"
        );
    }
    let client_report = finish(held_client, "client")?;
    let server_report = finish(held_server, "server")?;
    let echoed = server_report["echoed"].as_u64().unwrap_or(0);
    ensure!(
        client_report["ok"] == true
            && server_report["ok"] == true
            && echoed == versions.len() as u64 * STEP,
        "the held connection: client {client_report}, server {server_report}"
    );
    Ok(())
}

/// How the release moves to the next build.
enum Switch {
    Upgrade,
    Rollback,
}

/// `bypass-test-tool probe <args> <held>` in `pod`, through `kubectl exec`.
fn spawn_probe(pod: &Pod, args: &[&str], held: &[String]) -> Result<Child> {
    let mut all: Vec<&str> = vec![TEST_TOOL_PATH, "probe"];
    all.extend(args);
    all.extend(held.iter().map(String::as_str));
    pod.exec(&all)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("kubectl exec {}: {}", pod.name, all.join(" ")))
}

/// Waits until `path` exists in `pod` with a text that is `done`, and returns the text,
/// while `probe` runs: a net of minutes against a hang, failing at once if the probe
/// exits first.
fn wait_for_file(
    pod: &Pod,
    path: &str,
    probe: &mut Child,
    what: &str,
    done: impl Fn(&str) -> bool,
) -> Result<String> {
    let started = Instant::now();
    loop {
        let out = pod.exec(&["cat", path]).output()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() && done(&text) {
            return Ok(text);
        }
        if let Some(status) = probe.try_wait()? {
            bail!("{what}: the probe exited ({status}) before {path} was written");
        }
        if started.elapsed() > kube_testenv::NET {
            bail!("{what}: {path} not written within {:?}", kube_testenv::NET);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The JSON report a probe prints when it exits.
fn finish(probe: Child, what: &str) -> Result<serde_json::Value> {
    let out = probe.wait_with_output()?;
    ensure!(
        out.status.success(),
        "the held {what} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .with_context(|| {
            format!(
                "the held {what} printed no report ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
    Ok(serde_json::from_str(line)?)
}
