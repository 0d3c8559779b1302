//! Full maps: with a SockHash of 4 sockets, the connections that do not fit take the
//! normal path, byte-exact; `insert_failures` counts their connecting sockets (the
//! accepting sides, with no client in the map, are skipped); the agent warns, once per
//! interval however many fail; and once the connections close, new ones are bypassed
//! again (their address entries went with them); `status` says the failures come from a
//! full SockHash. Another program's sk_msg program loaded on the node (Merbridge's
//! `mb_msg_redir` here) is named by `status` with its owner.

use crate::support::privileged;

use std::time::Duration;

use crate::support::{agent_with, num, two_pods, wait_for_log};
use anyhow::{Result, ensure};
use testbed::{Agent, ClientArgs, PeerClient, PeerServer, Report, TwoPods};

/// Ten connections open at once for about 2 s, 2 MiB each way.
fn ten_at_once(pods: &TwoPods, agent: &Agent, port: u16) -> Result<(Report, Report)> {
    let args = ClientArgs {
        streams: 10,
        msg_size: 16 * 1024,
        rate: 1 << 20,
        ..ClientArgs::bulk(2 << 20)
    };
    let before = agent.status()?;
    let wire0 = pods.wire_bytes()?;
    let addr = pods.b.v4_addr(port);
    let server = PeerServer::start(&pods.b, addr, 10)?;
    let client = PeerClient::spawn(&pods.a, addr, &args)?;
    let (client, server) = (client.wait()?, server.wait()?);
    let after = agent.status()?;
    let wire = pods.wire_bytes()? - wire0;
    ensure!(client.ok && server.ok, "{client:?} {server:?}");
    ensure!(
        client.bytes_sent == 10 * args.send && server.bytes_received == 10 * args.send,
        "c2s: {client:?}"
    );
    ensure!(
        server.bytes_sent == 10 * args.recv && client.bytes_received == 10 * args.recv,
        "s2c: {server:?}"
    );
    let grew = |k: &str| num(&after, k) - num(&before, k);
    eprintln!(
        "10 connections, SockHash of 4: inserted +{}, insert_failures +{}, redirected +{} B, \
         passed +{} B, wire {wire} B",
        grew("sockets_inserted"),
        grew("insert_failures"),
        grew("redirected_bytes"),
        grew("passed_bytes")
    );
    ensure!(
        grew("sockets_inserted") <= 4,
        "more sockets inserted than fit: {after}"
    );
    // A connecting socket that does not fit is a failure; its accepting side then has no
    // client in the map and is left out (skipped), not inserted alone. An accepting side
    // whose client did fit may find the map full too (connections established faster
    // than they are accepted, as under emulation): a failure as well.
    ensure!(
        grew("sockets_inserted") + grew("insert_failures") + grew("sockets_skipped") == 20
            && grew("insert_failures") >= 8
            && grew("sockets_skipped") <= grew("insert_failures")
            && grew("insert_failures") - grew("sockets_skipped") <= grew("sockets_inserted"),
        "every socket is inserted, counted as a failure, or (the accepting side of a \
         failure) skipped: {before} -> {after}"
    );
    // At most two of the ten connections have both ends in the map: the other eight
    // (32 MiB both ways) cross the veths.
    ensure!(wire >= 32 << 20, "only {wire} B on the normal path");
    Ok((client, server))
}

#[test]
fn full_sockhash_falls_back_counts_and_warns() -> Result<()> {
    privileged!("full_sockhash_falls_back_counts_and_warns");
    let pods = two_pods()?;
    let agent = agent_with(&pods, &["--max-sockets", "4"])?;
    ten_at_once(&pods, &agent, 5501)?;
    let st = agent.status()?;
    let cause = st["insert_failures_cause"].as_str().unwrap_or("");
    ensure!(
        cause.contains("SockHash full"),
        "insert failures not told as a full map: {st}"
    );
    const WARNING: &str = "sockets could not be inserted";
    ensure!(
        wait_for_log(&agent, WARNING),
        "no warning about the full map: {}",
        agent.stderr()
    );
    // More failures within the interval: no second warning.
    ten_at_once(&pods, &agent, 5502)?;
    std::thread::sleep(Duration::from_millis(1500));
    let warnings = agent.stderr().matches(WARNING).count();
    ensure!(
        warnings == 1,
        "{warnings} warnings within 30 s: {}",
        agent.stderr()
    );

    // Closed connections left the maps: a new one is bypassed.
    let st = agent.status()?;
    ensure!(
        num(&st, "sockets") == 0 && num(&st, "connectors") == 0 && num(&st, "links") == 0,
        "maps not empty after every connection closed: {st}"
    );
    let args = ClientArgs::bulk(8 << 20);
    let before = agent.status()?;
    let addr = pods.b.v4_addr(5503);
    let server = PeerServer::start(&pods.b, addr, 1)?;
    let client = testbed::run_client(&pods.a, addr, &args)?;
    let server = server.wait()?;
    ensure!(client.ok && server.ok, "{client:?} {server:?}");
    let after = agent.status()?;
    ensure!(
        num(&after, "sockets_inserted") - num(&before, "sockets_inserted") == 2
            && num(&after, "redirected_bytes") - num(&before, "redirected_bytes") >= 16 << 20,
        "not bypassed once there was room again: {after}"
    );
    Ok(())
}

/// Loads an sk_msg program that returns SK_PASS, named `name` (raw `bpf(2)`: the tests
/// build no BPF objects); it stays loaded while the descriptor is open.
fn load_sk_msg(name: &str) -> Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd as _;
    // mov r0, 1 (SK_PASS); exit
    let insns: [u8; 16] = [0xb7, 0, 0, 0, 1, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0];
    let license = b"GPL\0";
    // union bpf_attr for BPF_PROG_LOAD (include/uapi/linux/bpf.h).
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&16u32.to_ne_bytes()); // BPF_PROG_TYPE_SK_MSG
    attr[4..8].copy_from_slice(&2u32.to_ne_bytes());
    attr[8..16].copy_from_slice(&(insns.as_ptr() as u64).to_ne_bytes());
    attr[16..24].copy_from_slice(&(license.as_ptr() as u64).to_ne_bytes());
    let n = name.len().min(15);
    attr[48..48 + n].copy_from_slice(&name.as_bytes()[..n]);
    // Raw bpf(2): aya loads programs only from an ELF object, and this one has no ELF.
    // SAFETY: attr is a valid BPF_PROG_LOAD attribute whose pointers outlive the call.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, 5, attr.as_ptr(), attr.len()) };
    ensure!(
        fd >= 0,
        "BPF_PROG_LOAD {name}: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(i32::try_from(fd)?) })
}

#[test]
fn another_programs_sk_msg_is_named_with_its_owner() -> Result<()> {
    privileged!("another_programs_sk_msg_is_named_with_its_owner");
    let pods = two_pods()?;
    let agent = agent_with(&pods, &[])?;
    let before = agent.status()?;
    ensure!(
        !before.to_string().contains("mb_msg_redir"),
        "named before it was loaded: {before}"
    );
    let merbridge = load_sk_msg("mb_msg_redir")?;
    let st = agent.status()?;
    let others: Vec<&str> = st["other_programs"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
        .unwrap_or_default();
    ensure!(
        others
            .iter()
            .any(|o| o.starts_with("sk_msg mb_msg_redir") && o.ends_with("Merbridge)")),
        "Merbridge's program not named: {st}"
    );
    ensure!(
        !others.iter().any(|o| o.contains("bypass_")),
        "the agent's own programs listed as others: {st}"
    );
    let text = agent.status_text()?;
    ensure!(text.contains("Merbridge"), "{text}");
    drop(merbridge);
    Ok(())
}
