//! The datapath between two pods on one node: bulk bytes each way over IPv4, IPv6 and a
//! dual-stack listener go socket to socket, byte-exact; connections with an end outside
//! the pod addresses are left alone; `--pod-ip` alone works; short connections that
//! send at once survive the insertion race; each pod's bytes and connections are
//! counted as its own (`bypass_pod_*_total`).

use crate::support::privileged;

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use crate::support::{
    Steps,
    exchange::{
        ABOVE_PAYLOAD, MIB64, assert_bypassed, assert_byte_exact, exchange, exchange_bypassed,
        exchange_exact,
    },
    hold_pair, num, pod_counts, probe_report,
};
use anyhow::{Result, ensure};
use testbed::{Agent, AgentOpts, ClientArgs, TwoPods};

#[test]
fn ipv4_64mib_each_way_bypassed() -> Result<()> {
    privileged!();
    let pods = TwoPods::new()?;
    let agent = Agent::start(&pods.agent_opts().max_queued(ABOVE_PAYLOAD))?;
    let args = ClientArgs::bulk(MIB64);
    exchange_bypassed(&pods, &agent, pods.b.v4_addr(5001), &args)
}

#[test]
fn ipv6_64mib_each_way_bypassed() -> Result<()> {
    privileged!();
    let pods = TwoPods::new()?;
    let agent = Agent::start(&pods.agent_opts().max_queued(ABOVE_PAYLOAD))?;
    let args = ClientArgs::bulk(MIB64);
    exchange_bypassed(&pods, &agent, pods.b.v6_addr(5002), &args)
}

#[test]
fn dual_stack_listener_ipv4_client_bypassed() -> Result<()> {
    privileged!();
    let pods = TwoPods::new()?;
    let agent = Agent::start(&pods.agent_opts().max_queued(ABOVE_PAYLOAD))?;
    let args = ClientArgs::bulk(MIB64).greeted();
    // [::]:port accepts IPv4 as ::ffff:a.b.c.d; the key encoding must meet the client's.
    let listen = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 5003);
    let x = exchange(&pods, &agent, listen, pods.b.v4_addr(5003), &args)?;
    assert_byte_exact(&x, &args)?;
    assert_bypassed(&x, &args)
}

#[test]
fn outside_pod_cidr_not_inserted_and_exact() -> Result<()> {
    privileged!();
    let pods = TwoPods::new()?;
    // Pod b also answers on an address in no --pod-cidr; pod a reaches it on-link from
    // its pod address, so one end of the connection is a pod and the other is not.
    let outside = pods.outside_cidr_v4();
    let b_outside = outside.replace(".0/24", ".2");
    pods.b.add_addr(&format!("{b_outside}/24"))?;
    pods.a.add_route(&outside)?;
    let agent = Agent::start(&pods.agent_opts())?;
    let args = ClientArgs::bulk(16 << 20);
    let connect: SocketAddr = format!("{b_outside}:5004").parse()?;
    let x = exchange(&pods, &agent, connect, connect, &args)?;
    assert_byte_exact(&x, &args)?;
    ensure!(
        x.grew(|s| s.counters.sockets_skipped) == 2,
        "sockets_skipped: {:?} -> {:?}",
        x.before,
        x.after
    );
    ensure!(
        x.grew(|s| s.counters.sockets_inserted) == 0,
        "inserted: {:?}",
        x.after
    );
    ensure!(
        x.grew(|s| s.counters.redirected_bytes) == 0,
        "redirected: {:?}",
        x.after
    );
    ensure!(x.after.sockets == 0, "sockets in the map: {:?}", x.after);
    let payload = args.send + args.recv;
    ensure!(
        x.wire >= payload,
        "the wire carried {} B of {payload} B",
        x.wire
    );
    Ok(())
}

#[test]
fn pod_ip_alone_redirects() -> Result<()> {
    privileged!();
    let pods = TwoPods::new()?;
    let opts = AgentOpts {
        pod_cidrs: Vec::new(),
        pod_ips: vec![pods.a.ipv4().to_string(), pods.b.ipv4().to_string()],
        ..pods.agent_opts().max_queued(ABOVE_PAYLOAD)
    };
    let agent = Agent::start(&opts)?;
    let st = agent.stats()?;
    ensure!(
        st.pod_cidrs.is_empty() && st.pod_addresses.len() == 2,
        "status: {st:?}"
    );
    let args = ClientArgs::bulk(16 << 20);
    exchange_bypassed(&pods, &agent, pods.b.v4_addr(5005), &args)?;
    // The IPv6 addresses are not pod addresses here: not inserted.
    let y = exchange_exact(
        &pods,
        &agent,
        pods.b.v6_addr(5006),
        &ClientArgs::bulk(1 << 20),
    )?;
    ensure!(
        y.grew(|s| s.counters.sockets_inserted) == 0 && y.grew(|s| s.counters.sockets_skipped) == 2,
        "{y:?}"
    );
    Ok(())
}

#[test]
fn thousand_short_connections_send_at_once() -> Result<()> {
    privileged!();
    let pods = TwoPods::new()?;
    let agent = Agent::start(&pods.agent_opts())?;
    let args = ClientArgs {
        send: 4096,
        recv: 4096,
        streams: 16,
        connections: 1000,
        msg_size: 1024,
        ..ClientArgs::default()
    };
    let x = exchange_exact(&pods, &agent, pods.b.v4_addr(5007), &args)?;
    ensure!(
        x.grew(|s| s.counters.sockets_inserted) == 2000,
        "inserted: {:?}",
        x.after
    );
    ensure!(
        x.grew(|s| s.counters.insert_failures) == 0,
        "insert failures: {:?}",
        x.after
    );
    // Closed connections leave the map.
    let left = agent.stats()?.sockets;
    ensure!(
        left == 0,
        "{left} sockets still in the map after every connection closed"
    );
    Ok(())
}

/// The pods' agent options with `/metrics` served on a free loopback port, and the port.
fn with_metrics(pods: &TwoPods) -> Result<(AgentOpts, u16)> {
    let port = crate::support::free_port()?;
    let opts = AgentOpts {
        extra_args: vec!["--metrics-addr".into(), format!("127.0.0.1:{port}")],
        ..pods.agent_opts()
    };
    Ok((opts, port))
}

/// Where the read guard runs, its checks run as BPF LSM programs wherever the kernel's
/// BPF LSM is active (the kernel's own list of active LSMs says so), which the kernel
/// runs on every call; as fmod_ret programs, which a preemptible kernel skips on a CPU
/// where a preempted task is inside them, only where it is not. `status`, `probe` and
/// the programs the pinned links run agree, and `/metrics` shows the runs the kernel
/// skipped of every tracing program pinned (none of an LSM program).
#[test]
fn read_guard_checks_run_as_lsm_where_the_bpf_lsm_runs() -> Result<()> {
    privileged!();
    let pods = TwoPods::new()?;
    let (opts, port) = with_metrics(&pods)?;
    let agent = Agent::start(&opts)?;
    let links = testbed::bpf::pinned_link_programs(
        &opts.pin_dir.join(bypass_common::names::PIN_LINKS_SUBDIR),
    )?;
    let tracing: Vec<&str> = bypass_common::names::all_hooks()
        .map(|h| h.program)
        .filter(|p| links.contains_key(*p))
        .collect();
    ensure!(!tracing.is_empty(), "no tracing program pinned: {links:?}");
    for program in &tracing {
        let series = format!("bypass_program_skipped_runs_total{{program=\"{program}\"}}");
        testbed::agent::metric(port, &series)?;
    }
    let status = agent.stats()?;
    let probe = testbed::kernel_probe()?;
    if !probe.read_guard {
        ensure!(
            !status.features.read_guard_lsm && probe.read_guard_runs_as == "none",
            "no read guard, yet status says read_guard_lsm {} and probe {}",
            status.features.read_guard_lsm,
            probe.read_guard_runs_as
        );
        return Ok(());
    }
    let lsm = testbed::bpf::bpf_lsm_active()?;
    let (name, prog_type) = if lsm {
        ("lsm", testbed::bpf::PROG_TYPE_LSM)
    } else {
        ("fmod_ret", testbed::bpf::PROG_TYPE_TRACING)
    };
    ensure!(
        status.features.read_guard_lsm == lsm && probe.read_guard_runs_as == name,
        "the BPF LSM active: {lsm}; status read_guard_lsm {}, probe {}; the agent logged:\n{}",
        status.features.read_guard_lsm,
        probe.read_guard_runs_as,
        agent.stderr()
    );
    for hook in bypass_common::names::GUARD_HOOKS
        .iter()
        .filter(|h| h.kind == bypass_common::names::HookKind::Guard)
    {
        let id = *links
            .get(hook.program)
            .ok_or_else(|| anyhow::anyhow!("no pinned link for {} in {links:?}", hook.program))?;
        let found = testbed::bpf::program_type(id)?;
        ensure!(
            found == prog_type,
            "{} runs as a program of type {found}, not {prog_type} ({name})",
            hook.program
        );
        if lsm {
            let series = format!(
                "bypass_program_skipped_runs_total{{program=\"{}\"}}",
                hook.program
            );
            let skipped = testbed::agent::metric(port, &series)?;
            ensure!(
                skipped == 0.0,
                "{series} is {skipped}: the kernel skipped an LSM program"
            );
        }
    }
    Ok(())
}

/// The kernel self-test's results are the same wherever they are shown: `status`, a
/// fresh `probe` (the same kernel answers the same), `check`, and `/metrics`; every
/// check of the catalogue is listed, the checks' own bytes were redirected, only the
/// read guard's checks are left out where it does not run, and FIONREAD's guarantee is
/// on exactly when its three checks passed.
#[test]
fn kernel_self_test_reported_everywhere() -> Result<()> {
    privileged!();
    let pods = TwoPods::new()?;
    let (opts, port) = with_metrics(&pods)?;
    let agent = Agent::start(&opts)?;
    let status = agent.stats()?;
    let checks = &status.kernel_checks;
    let names: Vec<&str> = checks.iter().map(|c| c.name.as_str()).collect();
    let catalogue: Vec<&str> = bypass_common::checks::CHECKS
        .iter()
        .map(|c| c.name)
        .collect();
    ensure!(names == catalogue, "status lists {names:?}");
    let outcome = |name: &str| {
        checks
            .iter()
            .find(|c| c.name == name)
            .map_or("absent", |c| c.outcome.as_str())
    };
    ensure!(outcome("redirects") == "passed", "{checks:?}");
    let guard = testbed::kernel_probe()?;
    for c in checks {
        let guard_check = bypass_common::checks::READ_GUARD
            .iter()
            .any(|&i| bypass_common::checks::CHECKS[i].name == c.name);
        ensure!(
            (c.outcome == "not run") == (guard_check && !guard.read_guard),
            "{} {} with the read guard {}",
            c.name,
            c.outcome,
            guard.read_guard
        );
    }
    let fionread = ["fionread_redirected", "fionread_tcp", "fionread_mixed"];
    ensure!(
        status.features.fionread == fionread.iter().all(|n| outcome(n) == "passed"),
        "features.fionread {} with {checks:?}",
        status.features.fionread
    );
    // A fresh probe runs the self-test again: the same kernel answers the same.
    let probed: Vec<(&str, &str)> = guard
        .kernel_checks
        .iter()
        .map(|c| (c.name.as_str(), c.outcome.as_str()))
        .collect();
    let shown: Vec<(&str, &str)> = checks
        .iter()
        .map(|c| (c.name.as_str(), c.outcome.as_str()))
        .collect();
    ensure!(probed == shown, "probe {probed:?}, status {shown:?}");
    for (name, outcome) in &shown {
        let series = format!("bypass_kernel_check{{check=\"{name}\"}}");
        match *outcome {
            "not run" => ensure!(
                testbed::agent::metric(port, &series).is_err(),
                "{series} shown for a check not run"
            ),
            o => ensure!(
                testbed::agent::metric(port, &series)? == f64::from(u8::from(o == "passed")),
                "{series} is not {o}"
            ),
        }
    }
    let out = testbed::agent::run_agent(&["check", "--json"], std::time::Duration::from_secs(600))?;
    let check: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    // check, probe and run agree on whether this node is bypassed, and say why not.
    ensure!(
        check["bypasses"] == serde_json::json!(guard.bypass_by_default)
            && out.status.success() == guard.bypass_by_default,
        "check ({}) and probe (bypass_by_default {}) disagree: {check}",
        out.status,
        guard.bypass_by_default
    );
    if let Some(why) = &guard.refusal {
        let said = check["items"].as_array().into_iter().flatten().any(|i| {
            i["check"] == "bypass"
                && i["level"] == "fail"
                && i["detail"]
                    .as_str()
                    .is_some_and(|d| d.contains(why.as_str()))
        });
        ensure!(
            said,
            "check --json does not fail the bypass with the probe's reason: {check}"
        );
        // Judged as the chart's allowUnguarded judges, the node passes where the agent
        // under test (started with --allow-unguarded) bypasses.
        let allowed = testbed::agent::run_agent(
            &["check", "--json", "--allow-unguarded"],
            std::time::Duration::from_secs(600),
        )?;
        let allowed_check: serde_json::Value = serde_json::from_slice(&allowed.stdout)?;
        ensure!(
            allowed_check["bypasses"] == true && allowed.status.success(),
            "check --allow-unguarded says the node is not bypassed while the agent bypasses it: {allowed_check}"
        );
    }
    let items = check["items"].as_array().cloned().unwrap_or_default();
    for (name, outcome) in &shown {
        let listed = items
            .iter()
            .any(|i| i["check"] == format!("kernel check {name}"));
        ensure!(
            listed == (*outcome == "failed"),
            "check --json and the self-test disagree on {name} ({outcome}): {check}"
        );
    }
    Ok(())
}

/// Per-pod accounting: pod a's and pod b's counters are what each one's sockets
/// redirected and how many of their connections were paired, open connections (a held
/// one) and closed ones (a greeted exchange, then the held one closing) alike; together
/// they are exactly the node's redirected bytes; no reading goes back, across the
/// closes too. Client (a) and server (b) send different amounts, so bytes counted for
/// the wrong pod show.
#[test]
fn per_pod_counters_follow_each_pods_bytes_and_connections() -> Result<()> {
    privileged!();
    let pods = TwoPods::new()?;
    let port = crate::support::free_port()?;
    // The bound's arguments kept: a struct update of `extra_args` would drop them.
    let mut opts = pods.agent_opts().max_queued(ABOVE_PAYLOAD);
    opts.extra_args
        .extend(["--metrics-addr".into(), format!("127.0.0.1:{port}")]);
    let agent = Agent::start(&opts)?;
    let start = agent.stats()?.counters.redirected_bytes;
    let node =
        |agent: &Agent| -> Result<u64> { Ok(agent.stats()?.counters.redirected_bytes - start) };
    ensure!(
        pod_counts(port, &pods.a)? == (0, 0) && pod_counts(port, &pods.b)? == (0, 0),
        "per-pod counters before any connection"
    );
    // Open: a held connection, a to b, its first chunk redirected.
    const CHUNK: u64 = 1 << 20;
    let steps = Steps::new(&pods, "perpod")?;
    let held = hold_pair(&pods, &agent, &steps, 5008, CHUNK)?;
    let (a1, b1) = (pod_counts(port, &pods.a)?, pod_counts(port, &pods.b)?);
    ensure!(
        a1.1 == 1 && b1.1 == 1,
        "one open connection each: a {a1:?}, b {b1:?}"
    );
    ensure!(
        a1.0 >= CHUNK && b1.0 == 0 && a1.0 + b1.0 == node(&agent)?,
        "the held chunk is a's (b sent nothing): a {a1:?}, b {b1:?}, node {}",
        node(&agent)?
    );
    // Closed: 6 greeted connections, every byte redirected, 2 MiB from a and 512 KiB
    // from b on each (plus each connection's header, greeting and verdicts).
    let args = ClientArgs {
        send: 2 << 20,
        recv: 512 << 10,
        connections: 6,
        ..ClientArgs::default()
    };
    let x = exchange_exact(&pods, &agent, pods.b.v4_addr(5009), &args.clone().greeted())?;
    assert_bypassed(&x, &args)?;
    let (a2, b2) = (pod_counts(port, &pods.a)?, pod_counts(port, &pods.b)?);
    let n = args.total_connections();
    let overhead = 256 * n;
    ensure!(
        a2.1 == 1 + n && b2.1 == 1 + n,
        "{} connections each: a {a2:?}, b {b2:?}",
        1 + n
    );
    let (sent, answered) = (a2.0 - a1.0, b2.0 - b1.0);
    ensure!(
        (n * args.send..=n * args.send + overhead).contains(&sent)
            && (n * args.recv..=n * args.recv + overhead).contains(&answered),
        "the exchange's bytes by pod: a {sent} B (sent {} B), b {answered} B (sent {} B)",
        n * args.send,
        n * args.recv
    );
    ensure!(
        a2.0 + b2.0 == node(&agent)?,
        "a {} B + b {} B is not the node's {} B",
        a2.0,
        b2.0,
        node(&agent)?
    );
    // The held connection sends its second chunk and closes: every reading until both
    // of its sockets closed (its link gone) is at least the one before.
    let open_links = agent.stats()?.links;
    steps.touch("more")?;
    let mut last = (a2, b2);
    let deadline = std::time::Instant::now() + testbed::steps::NET;
    loop {
        let links = agent.stats()?.links;
        let now = (pod_counts(port, &pods.a)?, pod_counts(port, &pods.b)?);
        ensure!(
            now.0.0 >= last.0.0
                && now.0.1 >= last.0.1
                && now.1.0 >= last.1.0
                && now.1.1 >= last.1.1,
            "a per-pod counter went back: {last:?} then {now:?}"
        );
        last = now;
        if links < open_links {
            break;
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "the held connection did not close"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let c = probe_report(held.client)?;
    let s = held.server.wait()?;
    ensure!(
        num(&c, "sent") == 2 * CHUNK && s["ok"] == true && num(&s, "received") == 2 * CHUNK,
        "held connection: {c} {s}"
    );
    let (a3, b3) = (pod_counts(port, &pods.a)?, pod_counts(port, &pods.b)?);
    ensure!(
        a3.1 == 1 + n && b3.1 == 1 + n && b3.0 == b2.0,
        "after the close: a {a3:?}, b {b3:?}"
    );
    ensure!(
        a3.0 >= a2.0 && a3.0 + b3.0 == node(&agent)?,
        "after the close, a {} B + b {} B is not the node's {} B",
        a3.0,
        b3.0,
        node(&agent)?
    );
    Ok(())
}
