//! Socket options and upper-layer protocols: kTLS (TCP_ULP) refused on bypassed sockets,
//! setsockopt answers unchanged, TCP Fast Open and MPTCP left on TCP.

use anyhow::{Result, ensure};
use serde_json::Value;

use super::support::{both, redirected, run_case, same};
use crate::support::{ProbeServer, agent_with, num, privileged, probe_client, two_pods};

/// kTLS and every other upper-layer protocol: a bypassed socket refuses
/// `setsockopt(TCP_ULP)` with EPERM. kTLS runs the sk_msg verdict on the plaintext
/// record before encrypting (net/tls/tls_sw.c), so a redirect would hand the peer
/// plaintext where TCP carries a TLS record, and a kTLS receiver would read redirected
/// bytes as if decrypted. The normal path's answer is the kernel's own (ENOENT without
/// the tls module, as here; success with it); a socket that is not bypassed gets that
/// same answer; the refused call leaves the stream byte-exact and bypassed.
#[test]
fn ulp_refused_on_bypassed_socket() -> Result<()> {
    privileged!();
    let pods = two_pods()?;
    let args = ["--case", "ulp", "--bytes", "256K"];
    let (tcp, bypass) = both(&pods, 5420, &args)?;
    for (side, r) in [("client", &tcp.client), ("server", &tcp.server)] {
        ensure!(
            r["ulp"] != "EPERM" && r["ok"] == true,
            "normal path {side}: {r}"
        );
    }
    for (side, r) in [("client", &bypass.client), ("server", &bypass.server)] {
        ensure!(
            r["ulp"] == "EPERM" && r["ok"] == true,
            "bypassed {side} must refuse TCP_ULP and stay byte-exact: {r}"
        );
    }
    let g = Value::Object(bypass.grew.clone());
    ensure!(num(&g, "ulp_refused") == 2, "ulp_refused: {g}");
    ensure!(
        redirected(&bypass) >= 512 << 10,
        "the stream left the bypass after the refusal: {g}"
    );

    // Not bypassed (addresses outside the pod CIDRs): the kernel's own answer.
    let outside = pods.outside_cidr_v4();
    let (a_out, b_out) = (
        outside.replace(".0/24", ".1"),
        outside.replace(".0/24", ".2"),
    );
    pods.a.add_addr(&format!("{a_out}/24"))?;
    pods.b.add_addr(&format!("{b_out}/24"))?;
    let agent = agent_with(&pods, &[])?;
    let args = crate::support::to_strings(&args);
    let addr = format!("{b_out}:5422").parse()?;
    let server = ProbeServer::start(&pods.b, addr, &args)?;
    let client = probe_client(&pods.a, addr, &args)?;
    let server = server.wait()?;
    drop(agent);
    ensure!(
        client["ulp"] == tcp.client["ulp"] && server["ulp"] == tcp.server["ulp"],
        "a socket the datapath does not hold got another answer: {client} {server}"
    );
    Ok(())
}

/// A socket that was bypassed keeps its psock, and what was redirected to it, after it
/// disconnects (`connect(AF_UNSPEC)` empties only the TCP queue): kTLS stays refused on
/// it, where the normal path answers as the kernel does.
#[test]
fn ulp_refused_after_disconnect() -> Result<()> {
    privileged!();
    let pods = two_pods()?;
    let (tcp, bypass) = both(&pods, 5432, &["--case", "ulp-after-disconnect"])?;
    ensure!(tcp.client["ulp"] != "EPERM", "normal path: {}", tcp.client);
    ensure!(
        bypass.client["ulp"] == "EPERM",
        "a once-bypassed socket accepted TCP_ULP after a disconnect: {}",
        bypass.client
    );
    Ok(())
}

/// The setsockopt hook is attached to every process's sockets in the cgroup: ordinary
/// options (and two longer than a page, which a hook that mishandles them turns into
/// EFAULT) get exactly the answers they get without the agent, on a bypassed socket and
/// on a fresh one.
#[test]
fn setsockopt_answers_unchanged() -> Result<()> {
    privileged!();
    let pods = two_pods()?;
    let (tcp, bypass) = both(&pods, 5424, &["--case", "sockopts", "--bytes", "1M"])?;
    same(
        &tcp,
        &bypass,
        &["connected", "unconnected"],
        &["ok", "received"],
    )?;
    ensure!(
        !tcp.client.to_string().contains("EFAULT"),
        "EFAULT without the agent: {}",
        tcp.client
    );
    ensure!(
        tcp.client["connected"]["TCP_NODELAY"] == "ok",
        "{}",
        tcp.client
    );
    Ok(())
}

/// TCP Fast Open: the first connection fetches a cookie, and its first write, made by
/// the sendto that connects, goes on in plain tcp_sendmsg after the handshake (past any
/// sk_msg program); the second carries its first bytes in the SYN. The server reads
/// each only once everything has landed, so a redirected byte that overtook those would
/// show. Both are byte-exact, and a socket with bytes already sent or queued to TCP, or
/// connecting for a Fast Open send, is never inserted, so no sk_msg runs on its sends.
#[test]
fn tcp_fast_open_stays_on_tcp_byte_exact() -> Result<()> {
    privileged!();
    let pods = two_pods()?;
    for pod in [&pods.a, &pods.b] {
        xtask_lib::cmd::ip(&[
            "netns",
            "exec",
            pod.netns().name(),
            "sysctl",
            "-qw",
            "net.ipv4.tcp_fastopen=3",
        ])?;
    }
    let agent = agent_with(&pods, &[])?;
    let run = run_case(
        &pods,
        Some(&agent),
        5428,
        &[
            "--case",
            "tfo",
            "--connections",
            "2",
            "--bytes",
            "256K",
            "--hold-ms",
            "300",
        ],
    )?;
    let g = Value::Object(run.grew.clone());
    eprintln!("tfo: {} {} {g}", run.client, run.server);
    let conns = run.server["connections"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    ensure!(
        conns.len() == 2
            && conns
                .iter()
                .all(|c| c["ok"] == true && num(c, "received") == 256 << 10),
        "not byte-exact: {}",
        run.server
    );
    ensure!(
        num(&run.client["connections"][1], "in_syn") > 0,
        "the second connection did not use TCP Fast Open: {}",
        run.client
    );
    ensure!(
        num(&g, "sockets_inserted") == 0 && num(&g, "passed_messages") == 0,
        "a TCP Fast Open socket was inserted or ran sk_msg: {g}"
    );
    Ok(())
}

/// MPTCP: the subflows are TCP sockets with the "mptcp" upper-layer protocol, which
/// owns the byte stream; they are never inserted, and the connection is byte-exact.
#[test]
fn mptcp_subflows_never_inserted() -> Result<()> {
    privileged!();
    let pods = two_pods()?;
    let agent = agent_with(&pods, &[])?;
    let run = run_case(
        &pods,
        Some(&agent),
        5430,
        &["--case", "mptcp", "--bytes", "4M"],
    )?;
    let g = Value::Object(run.grew.clone());
    eprintln!("mptcp: {} {} {g}", run.client, run.server);
    ensure!(
        run.client["ok"] == true
            && run.server["ok"] == true
            && num(&run.server, "received") == 4 << 20
            && num(&run.client, "received") == 4 << 20,
        "not byte-exact: {} {}",
        run.client,
        run.server
    );
    ensure!(
        num(&g, "sockets_inserted") == 0 && num(&g, "redirected_bytes") == 0,
        "an MPTCP subflow was inserted: {g}"
    );
    ensure!(num(&g, "ulp_skipped") >= 2, "subflows not seen: {g}");
    Ok(())
}
