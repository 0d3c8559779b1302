//! Ports in `--skip-ports` (Istio's health port by default) stay on the normal path;
//! `none` bypasses them.

use anyhow::{Result, ensure};
use testbed::{Agent, AgentOpts, ClientArgs, TwoPods, require::preflight_iptables};

use super::support::{ISTIO_HEALTH_PORT, growth};
use crate::support::{
    exchange::{assert_byte_exact, exchange},
    privileged,
};

/// Istio's health port 15021 is in the default `--skip-ports`: a pod-to-pod connection
/// on it stays on the normal path and is counted; with `--skip-ports none` the same
/// connection is bypassed.
#[test]
fn skip_ports_default_and_none() -> Result<()> {
    privileged!(preflight_iptables);
    let pods = TwoPods::new()?;
    let target = pods.b.v4_addr(ISTIO_HEALTH_PORT);
    let args = ClientArgs::bulk(4 << 20);
    let payload = args.send + args.recv;

    let mut agent = Agent::start(&pods.agent_opts())?;
    let x = exchange(&pods, &agent, target, target, &args)?;
    let why = growth(&x.before, &x.after);
    assert_byte_exact(&x, &args)?;
    ensure!(
        x.grew(|s| s.counters.skipped_ports) >= 1,
        "skipped_ports should grow: {why}"
    );
    ensure!(
        x.grew(|s| s.counters.redirected_bytes) == 0 && x.grew(|s| s.counters.paired_pod) == 0,
        "port {ISTIO_HEALTH_PORT} must not be bypassed by default: {why}"
    );
    ensure!(
        x.wire >= payload,
        "the wire carried {} B of {payload} B",
        x.wire
    );
    agent.stop()?;
    drop(agent);

    let agent = Agent::start(&AgentOpts {
        pin_dir: pods.pin_dir("noskip"),
        extra_args: vec!["--skip-ports".to_owned(), "none".to_owned()],
        ..pods.agent_opts()
    })?;
    let y = exchange(&pods, &agent, target, target, &args)?;
    let why = growth(&y.before, &y.after);
    assert_byte_exact(&y, &args)?;
    ensure!(
        y.grew(|s| s.counters.skipped_ports) == 0,
        "skipped_ports grew with --skip-ports none: {why}"
    );
    ensure!(
        y.grew(|s| s.counters.paired_pod) == 1
            && y.grew(|s| s.counters.redirected_bytes_pod) >= payload,
        "with --skip-ports none the connection should be bypassed: {why}"
    );
    ensure!(
        y.wire * 100 < payload,
        "the veth carried {} B of {payload} B: {why}",
        y.wire
    );
    Ok(())
}
