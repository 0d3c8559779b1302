//! What a reader observes: MSG_PEEK, FIONREAD, SO_RCVLOWAT, SO_RCVTIMEO, epoll
//! readiness, and the documented differences (MSG_WAITALL, splice reads, MSG_OOB).

use anyhow::{Result, bail, ensure};
use serde_json::Value;

use super::support::{Run, both, redirected, run_stepped, same};
use crate::support::{agent_with, num, privileged, two_pods};

#[test]
fn msg_peek_then_read() -> Result<()> {
    privileged!();
    let pods = two_pods()?;
    let (tcp, bypass) = both(&pods, 5405, &["--case", "peek"])?;
    same(
        &tcp,
        &bypass,
        &[],
        &["peek_len", "peek_matches", "read_len", "read_matches"],
    )
}

#[test]
fn fionread_counts_queued_bytes() -> Result<()> {
    privileged!();
    let pods = two_pods()?;
    let (tcp, bypass) = both(&pods, 5407, &["--case", "fionread"])?;
    // The agent's kernel self-test says how FIONREAD counts redirected bytes here,
    // natively or with its compensation (6.1: tcp_ioctl alone, compensated); where
    // neither works (6.1 under lockdown) they are missing, and the agent refuses to
    // bypass without --allow-unguarded.
    let checks = agent_with(&pods, &[])?.stats()?.kernel_checks;
    if outcome(&checks, "fionread_redirected") == "failed" {
        ensure!(
            num(&tcp.server, "fionread") == 3000 && num(&bypass.server, "fionread") == 0,
            "FIONREAD where the self-test found redirected bytes missing: {:?} {:?}",
            tcp.server,
            bypass.server
        );
        return Ok(());
    }
    ensure!(
        outcome(&checks, "fionread_redirected") == "passed",
        "{checks:?}"
    );
    same(&tcp, &bypass, &[], &["fionread"])?;
    ensure!(
        num(&bypass.server, "fionread") == 3000,
        "{:?}",
        bypass.server
    );
    Ok(())
}

/// Urgent bytes that came by TCP after redirected ones were read: once every byte is read,
/// FIONREAD says 0 as on TCP (TCP skips an urgent byte by moving `copied_seq`, which the
/// read accounting counts as read from the TCP queue: the FIONREAD compensation of 6.1
/// caps what it adds by what the receive queues hold).
#[test]
fn fionread_after_urgent_bytes() -> Result<()> {
    privileged!();
    let pods = two_pods()?;
    let (tcp, bypass) = both(&pods, 5441, &["--case", "urgent"])?;
    ensure!(
        tcp.server["stream"] == "abdeabdeabde",
        "TCP itself: {}",
        tcp.server
    );
    same(&tcp, &bypass, &[], &["stream", "fionread_end"])
}

/// What the agent's kernel self-test found for check `name`.
fn outcome<'a>(checks: &'a [bypass_common::status::KernelCheck], name: &str) -> &'a str {
    checks
        .iter()
        .find(|c| c.name == name)
        .map_or("absent", |c| c.outcome.as_str())
}

/// A reader with redirected and TCP bytes waiting at once, across a fallback to TCP and
/// back: FIONREAD, poll and edge-triggered epoll must say what they say on TCP. Where
/// the kernel's sockmap misreports FIONREAD and no compensation can run (this VM's
/// 6.18: no BPF trampolines, lockdown), the agent must say so and refuse to bypass
/// unless allowed, and only FIONREAD may differ, by the bytes that came by TCP.
#[test]
fn mixed_reader_sees_what_tcp_shows() -> Result<()> {
    privileged!();
    let pods = two_pods()?;
    let run = |agent: Option<&testbed::Agent>, port: u16| {
        let extra = ["--bytes", "64K"];
        run_stepped(&pods, agent, port, "mixed", &extra, ("waiting", "drained"))
    };
    let tcp = run(None, 5431)?;
    // The bound at 16 KiB: the 68 KiB stream falls back to TCP part-way, and comes back
    // once its reader has read everything.
    let agent = agent_with(&pods, &["--max-queued-bytes", "16K"])?;
    let bypass = run(Some(&agent), 5432)?;
    eprintln!(
        "tcp {}\nbypass {} {:?}",
        tcp.server, bypass.server, bypass.grew
    );
    let grew = Value::Object(bypass.grew.clone());
    ensure!(
        num(&grew, "redirected_bytes") >= 8192
            && num(&grew, "passed_bytes") > 0
            && num(&grew, "resumed") >= 1,
        "the bypassed run did not mix redirected and TCP bytes and come back: {grew}"
    );
    let waiting = 4096 + (64 << 10);
    for run in [&tcp, &bypass] {
        ensure!(
            num(&run.server, "received") == waiting + 4096,
            "{:?}",
            run.server
        );
    }
    ensure!(
        num(&tcp.server, "fionread_waiting") == waiting
            && tcp.server["poll_waiting"] == true
            && tcp.server["epoll_waiting"] == true
            && tcp.server["poll_drained"] == false
            && num(&tcp.server, "fionread_back") == 4096,
        "TCP itself: {}",
        tcp.server
    );
    let status = agent.stats()?;
    let observed = [
        "poll_waiting",
        "epoll_waiting",
        "fionread_drained",
        "poll_drained",
        "epoll_drained",
        "poll_back",
        "epoll_back",
    ];
    same(&tcp, &bypass, &[], &observed)?;
    if status.features.fionread {
        return same(&tcp, &bypass, &[], &["fionread_waiting", "fionread_back"]);
    }
    // FIONREAD misreported and not compensated: the self-test saw it, and the agent
    // does not bypass this kernel unless allowed.
    ensure!(
        outcome(&status.kernel_checks, "fionread_tcp") == "failed",
        "FIONREAD off without the self-test's failure: {:?}",
        status.kernel_checks
    );
    ensure!(
        num(&bypass.server, "fionread_waiting") < waiting,
        "FIONREAD off, yet right: {}",
        bypass.server
    );
    drop(agent);
    let port = crate::support::free_port()?;
    let mut opts = testbed::AgentOpts {
        allow_unguarded: false,
        ..pods.agent_opts()
    };
    opts.extra_args
        .extend(["--metrics-addr".to_owned(), format!("127.0.0.1:{port}")]);
    let default = testbed::Agent::start(&opts)?;
    let refused = default.stats()?.refused.unwrap_or_default();
    ensure!(
        refused.contains("fionread_tcp"),
        "an agent not allowed to bypass past a FIONREAD failure bypassed: {refused:?}"
    );
    // A refused node is not ready, and its readiness says why.
    kube_testenv::wait_for(
        "/readyz of the refused agent saying why",
        kube_testenv::NET,
        std::time::Duration::from_millis(100),
        || {
            let (code, body) = testbed::agent::http_get(port, "/readyz")?;
            ensure!(
                code == 503 && body.contains("refused") && body.contains("fionread_tcp"),
                "{code} {body}"
            );
            Ok(())
        },
    )?;
    Ok(())
}

#[test]
fn so_rcvlowat_is_honoured() -> Result<()> {
    privileged!();
    let pods = two_pods()?;
    let (tcp, bypass) = both(&pods, 5409, &["--case", "rcvlowat"])?;
    same(
        &tcp,
        &bypass,
        &[],
        &[
            "readable_with_500_of_1000",
            "readable_later",
            "first_read_len",
        ],
    )?;
    // The ingress queue ignores SO_RCVLOWAT, so the sender took TCP for this peer.
    ensure!(
        num(&Value::Object(bypass.grew.clone()), "passed_bytes") >= 1100,
        "the data to a peer with SO_RCVLOWAT should have gone by TCP: {:?}",
        bypass.grew
    );
    Ok(())
}

#[test]
fn so_rcvtimeo_times_out() -> Result<()> {
    privileged!();
    let pods = two_pods()?;
    let (tcp, bypass) = both(&pods, 5411, &["--case", "rcvtimeo"])?;
    same(&tcp, &bypass, &[], &["result", "waited_at_least_180ms"])
}

#[test]
fn epoll_readiness() -> Result<()> {
    privileged!();
    let pods = two_pods()?;
    let (tcp, bypass) = both(&pods, 5413, &["--case", "epoll"])?;
    same(
        &tcp,
        &bypass,
        &["out_ready"],
        &["in_before_data", "in_with_data", "read", "rdhup_after_fin"],
    )
}

#[test]
fn msg_waitall_returns_what_is_queued_known_difference() -> Result<()> {
    privileged!();
    let pods = two_pods()?;
    let (tcp, bypass) = both(&pods, 5421, &["--case", "waitall"])?;
    // tcp_bpf_recvmsg returns what the ingress queue holds and ignores MSG_WAITALL
    // (net/ipv4/tcp_bpf.c); the sender cannot see the reader's flags.
    ensure!(
        num(&tcp.server, "first_read_len") == 2000,
        "{:?}",
        tcp.server
    );
    ensure!(
        num(&bypass.server, "first_read_len") == 1000,
        "MSG_WAITALL behaves differently than documented: {:?}",
        bypass.server
    );
    Ok(())
}

#[test]
fn splice_read_guarded_or_known_difference() -> Result<()> {
    privileged!();
    let pods = two_pods()?;
    let (tcp, bypass) = both(&pods, 5423, &["--case", "splice-recv", "--bytes", "1M"])?;
    ensure!(
        tcp.server["ok"] == true && num(&tcp.server, "received") == 1 << 20,
        "{:?}",
        tcp.server
    );
    if testbed::kernel_probe()?.read_guard {
        // The read guard refuses the splice (EINVAL) while redirected bytes wait, the
        // reader falls back to read(2), as Go's io.Copy and HAProxy do, and gets every
        // byte; or the splice came first and its peer sent by TCP.
        ensure!(
            bypass.server["ok"] == true && num(&bypass.server, "received") == 1 << 20,
            "a splicing reader lost bytes under the read guard: {:?}",
            bypass.server
        );
        ensure!(
            num(&Value::Object(bypass.grew.clone()), "tcp_only_readers") >= 1,
            "the guard did not see the splice: {:?}",
            bypass.grew
        );
        return Ok(());
    }
    unguarded_splice_misses_bytes(&bypass, 1 << 20)
}

/// A splice while redirected bytes wait is refused however busy its CPU: three threads
/// on it read /dev/zero, so the read guard's check of every read(2) is often running in
/// a task preempted inside it. The kernel skips a tracing program (fmod_ret) on a CPU
/// where a preempted task is inside it, which a preemptible kernel (Linux 7's default)
/// lets happen, and a splice let through reads the empty TCP queue; the guard's checks
/// run as BPF LSM programs where the BPF LSM is active, which the kernel never skips
/// (HAProxy with `splice-auto` lost stream tails on 7.3 so).
#[test]
fn splice_refused_however_busy_the_cpu() -> Result<()> {
    privileged!();
    let pods = two_pods()?;
    let (tcp, bypass) = both(
        &pods,
        5491,
        &["--case", "splice-contended", "--bytes", "64K"],
    )?;
    const BYTES: u64 = 64 << 10;
    for run in [&tcp, &bypass] {
        ensure!(
            run.server["ok"] == true && num(&run.server, "received") == BYTES,
            "{:?}",
            run.server
        );
    }
    if testbed::kernel_probe()?.read_guard {
        ensure!(
            redirected(&bypass) >= BYTES,
            "the bytes did not wait in the ingress queue, so this shows nothing: {:?}",
            bypass.grew
        );
        ensure!(
            num(&bypass.server, "refused") == num(&bypass.server, "splices"),
            "splices went through the read guard with redirected bytes waiting: {:?}",
            bypass.server
        );
    }
    Ok(())
}

/// No read guard (the agent runs with --allow-unguarded): splice(2) from a socket reads
/// its TCP receive queue only (net/ipv4/tcp.c, tcp_splice_read): redirected bytes sit in
/// the ingress queue it never looks at, and the FIN behind them, which came by TCP,
/// reads as EOF. The server spliced fewer than the `sent` bytes.
fn unguarded_splice_misses_bytes(bypass: &Run, sent: u64) -> Result<()> {
    ensure!(
        num(&bypass.server, "received") < sent,
        "splice read every redirected byte: the kernel changed, update docs/limitations.md: {:?}",
        bypass.server
    );
    Ok(())
}

/// A socket that half-closed first closes when its peer's FIN comes (FIN_WAIT2, then
/// TIME_WAIT: TCP_CLOSE while the application still holds it), with its peer's last
/// redirected bytes still in its ingress queue: the guard must still refuse a splice
/// of it, or the splice reads the empty TCP queue and returns end of file (HAProxy
/// with `option splice-auto` lost stream tails so).
#[test]
fn splice_after_close_guarded_or_known_difference() -> Result<()> {
    privileged!();
    let pods = two_pods()?;
    // What TCP's receive queue takes unread (the reader reads only once closed).
    const BYTES: u64 = 32 << 10;
    let args = ["--case", "splice-after-close", "--bytes", "32K"];
    let (tcp, bypass) = both(&pods, 5481, &args)?;
    ensure!(
        tcp.server["ok"] == true
            && num(&tcp.server, "received") == BYTES
            && tcp.server["closed_before_reading"] == true,
        "{:?}",
        tcp.server
    );
    ensure!(
        redirected(&bypass) >= BYTES,
        "the bytes did not wait in the ingress queue, so this shows nothing: {:?}",
        bypass.grew
    );
    if testbed::kernel_probe()?.read_guard {
        ensure!(
            bypass.server["ok"] == true
                && num(&bypass.server, "received") == BYTES
                && bypass.server["refused"] == true,
            "a closed socket's splice was not refused while redirected bytes waited: {:?}",
            bypass.server
        );
        return Ok(());
    }
    unguarded_splice_misses_bytes(&bypass, BYTES)
}

/// A splice refused while redirected bytes wait (the read guard), then more bytes and the
/// FIN: once the FIN was reported, one read returns every byte waiting, as TCP's does.
/// HAProxy takes a shorter read after EPOLLRDHUP as the end of the stream, so a read
/// that stopped at the end of the ingress queue with the later bytes waiting in the TCP
/// queue lost them (the tails of `apps::haproxy::splice_*`): the sender goes on
/// redirecting to a reader that reads TCP only until it has read every redirected byte.
#[test]
fn splice_refused_then_one_read_takes_all() -> Result<()> {
    privileged!();
    let pods = two_pods()?;
    let run = |agent: Option<&testbed::Agent>, port: u16| {
        run_stepped(
            &pods,
            agent,
            port,
            "splice-switch",
            &[],
            ("sent", "spliced"),
        )
    };
    let tcp = run(None, 5485)?;
    let agent = agent_with(&pods, &[])?;
    let bypass = run(Some(&agent), 5486)?;
    eprintln!(
        "tcp {}\nbypass {} {:?}",
        tcp.server, bypass.server, bypass.grew
    );
    const SENT: u64 = 48 << 10;
    ensure!(
        num(&tcp.server, "spliced") == 16 << 10,
        "TCP itself: {}",
        tcp.server
    );
    ensure!(
        redirected(&bypass) >= 16 << 10,
        "the first bytes did not wait in the ingress queue, so this shows nothing: {:?}",
        bypass.grew
    );
    if testbed::kernel_probe()?.read_guard {
        ensure!(
            bypass.server["refused"] == true,
            "the splice was not refused while redirected bytes waited: {}",
            bypass.server
        );
    }
    for (what, run) in [("tcp", &tcp), ("bypass", &bypass)] {
        ensure!(
            run.server["ok"] == true && num(&run.server, "received") == SENT,
            "{what}: {}",
            run.server
        );
        ensure!(
            num(&run.server, "first_read") == num(&run.server, "waiting"),
            "{what}: one read after the FIN returned {} of the {} bytes waiting: {}",
            num(&run.server, "first_read"),
            num(&run.server, "waiting"),
            run.server
        );
    }
    Ok(())
}

#[test]
fn msg_oob_is_not_urgent_known_difference() -> Result<()> {
    privileged!();
    let pods = two_pods()?;
    // The probe writes at once: a write that races the end of the handshake takes TCP
    // (`unpaired_sends`), and then the urgent byte is TCP's. Run again until the five
    // bytes were redirected, which is what this is about (a few runs at most).
    for attempt in 0..5 {
        let (tcp, bypass) = both(&pods, 5425 + 10 * attempt, &["--case", "oob"])?;
        // An urgent byte redirected is an ordinary byte (the sk_msg program never sees
        // the send flags), and recv(MSG_OOB) on the ingress queue reads ordinary data.
        ensure!(
            tcp.server["oob"] == "c" && tcp.server["inline"] == "abde",
            "{:?}",
            tcp.server
        );
        if redirected(&bypass) < 5 {
            eprintln!("the writes raced the pairing (TCP's behaviour): again");
            continue;
        }
        ensure!(
            bypass.server != tcp.server,
            "MSG_OOB now works bypassed: the kernel changed, update docs/limitations.md: {:?}",
            bypass.server
        );
        return Ok(());
    }
    bail!("in 5 runs the urgent bytes were never redirected")
}

/// SO_PEEK_OFF set after bytes arrived: on TCP the second peek follows the first. The
/// ingress queue always peeks from its head, so on a bypassed socket with redirected
/// bytes unread the option is refused (EPERM) rather than applied and ignored; every
/// byte is then read as sent. (Kernels before 6.9 refuse SO_PEEK_OFF on TCP: both
/// paths then answer the same.)
#[test]
fn peek_off_after_bytes_arrived_is_honoured_or_refused() -> Result<()> {
    privileged!();
    let pods = two_pods()?;
    let (tcp, bypass) = both(&pods, 5437, &["--case", "peek-off-late"])?;
    let s = |r: &Run, k: &str| r.server[k].clone();
    ensure!(
        s(&tcp, "read_matches") == true && s(&bypass, "read_matches") == true,
        "bytes lost or changed: tcp {:?}, bypass {:?}",
        tcp.server,
        bypass.server
    );
    if s(&tcp, "set_peek_off") != "ok" {
        // No SO_PEEK_OFF on TCP here: the same answer bypassed.
        return same(&tcp, &bypass, &[], &["set_peek_off"]);
    }
    ensure!(
        s(&tcp, "second_peek_follows") == true,
        "TCP's own peek offset did not move: {:?}",
        tcp.server
    );
    if s(&bypass, "set_peek_off") == "ok" {
        ensure!(
            s(&bypass, "second_peek_follows") == true,
            "SO_PEEK_OFF was accepted on the bypassed socket but the second peek did not \
             follow the first: {:?}",
            bypass.server
        );
    } else {
        ensure!(
            s(&bypass, "set_peek_off") == "EPERM" && redirected(&bypass) > 0,
            "refused other than by the bypass (EPERM with redirected bytes): {:?} {:?}",
            bypass.server,
            bypass.grew
        );
    }
    Ok(())
}
