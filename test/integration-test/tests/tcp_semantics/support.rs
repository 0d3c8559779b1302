//! What the semantics matrix shares: one run of a `bypass-test-tool probe` case with the
//! counter growth meanwhile, the case on both paths, and the comparison of their reports.

use anyhow::{Result, ensure};
use serde_json::Value;
use testbed::{Agent, TwoPods};

use crate::support::{ProbeServer, Steps, agent_with, num, probe_client, to_strings};

/// What one run of a case saw, and what the datapath counted meanwhile.
#[derive(Debug)]
pub struct Run {
    pub client: Value,
    pub server: Value,
    /// Counter growth (empty on the normal path).
    pub grew: serde_json::Map<String, Value>,
}

pub fn run_case(pods: &TwoPods, agent: Option<&Agent>, port: u16, args: &[&str]) -> Result<Run> {
    let args = to_strings(args);
    let before = agent.map(Agent::status).transpose()?;
    let server = ProbeServer::start(&pods.b, pods.b.v4_addr(port), &args)?;
    let client = probe_client(&pods.a, pods.b.v4_addr(port), &args)?;
    let server = server.wait()?;
    let mut grew = serde_json::Map::new();
    if let (Some(a), Some(before)) = (agent, before) {
        let after = a.status()?;
        if let Some(obj) = after.as_object() {
            for (k, v) in obj {
                if let (Some(x), Some(y)) = (v.as_u64(), before.get(k).and_then(Value::as_u64)) {
                    grew.insert(k.clone(), Value::from(x.saturating_sub(y)));
                }
            }
        }
    }
    Ok(Run {
        client,
        server,
        grew,
    })
}

/// [`run_case`] of probe case `case` with `extra`, then `--mark-file` and `--go-file` at
/// the steps `mark` and `go` of its own [`Steps`] (`{case}-{port}`).
pub fn run_stepped(
    pods: &TwoPods,
    agent: Option<&Agent>,
    port: u16,
    case: &str,
    extra: &[&str],
    (mark, go): (&str, &str),
) -> Result<Run> {
    let steps = Steps::new(pods, &format!("{case}-{port}"))?;
    let (mark, go) = (steps.arg(mark), steps.arg(go));
    let mut args = vec!["--case", case];
    args.extend_from_slice(extra);
    args.extend(["--mark-file", &mark, "--go-file", &go]);
    run_case(pods, agent, port, &args)
}

/// The case on the normal path, then bypassed (the agent started in between).
pub fn both(pods: &TwoPods, port: u16, args: &[&str]) -> Result<(Run, Run)> {
    both_with(pods, port, args, &[])
}

/// [`both`], the agent started with `agent_args`.
pub fn both_with(
    pods: &TwoPods,
    port: u16,
    args: &[&str],
    agent_args: &[&str],
) -> Result<(Run, Run)> {
    let tcp = run_case(pods, None, port, args)?;
    let agent = agent_with(pods, agent_args)?;
    let bypass = run_case(pods, Some(&agent), port + 1, args)?;
    eprintln!(
        "{args:?}\n  tcp:    {} {}\n  bypass: {} {} {:?}",
        tcp.client, tcp.server, bypass.client, bypass.server, bypass.grew
    );
    ensure!(
        num(&Value::Object(bypass.grew.clone()), "sockets_inserted") >= 2,
        "the bypassed run was not bypassed: {:?}",
        bypass.grew
    );
    Ok((tcp, bypass))
}

/// The two runs agree on `fields` of the client's and the server's report.
pub fn same(tcp: &Run, bypass: &Run, client: &[&str], server: &[&str]) -> Result<()> {
    let sides = [
        ("client", client, &tcp.client, &bypass.client),
        ("server", server, &tcp.server, &bypass.server),
    ];
    for (side, fields, tcp, bypass) in sides {
        for f in fields {
            ensure!(
                tcp.get(f) == bypass.get(f),
                "{side} {f}: normal path {:?}, bypassed {:?}",
                tcp.get(f),
                bypass.get(f)
            );
        }
    }
    Ok(())
}

pub fn redirected(r: &Run) -> u64 {
    num(&Value::Object(r.grew.clone()), "redirected_bytes")
}
