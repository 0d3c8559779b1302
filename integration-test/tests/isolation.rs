//! Isolation: the pins are root's alone (the pin directory 0700 on a bpffs mounted
//! 0700, every pin 0600), and only connections whose two ends are pod addresses are
//! inserted: not loopback inside a pod, not two pods talking over addresses outside the
//! pod CIDRs.

mod support;

use std::{os::unix::fs::MetadataExt as _, os::unix::process::CommandExt as _, process::Command};

use anyhow::{Context as _, Result, ensure};
use support::{ProbeServer, agent_with, num, probe_client, two_pods};
use testbed::preflight;

/// The mode bits of a path.
fn mode(p: &std::path::Path) -> Result<u32> {
    Ok(std::fs::metadata(p)
        .with_context(|| format!("stat {}", p.display()))?
        .mode()
        & 0o7777)
}

#[test]
fn pins_are_root_only() -> Result<()> {
    if !preflight("pins_are_root_only")? {
        return Ok(());
    }
    let pods = two_pods()?;
    let agent = agent_with(&pods, &[])?;
    let dir = agent.pin_dir().to_path_buf();
    let bpffs = dir.parent().context("pin dir has a parent")?;
    ensure!(
        mode(bpffs)? & 0o077 == 0,
        "{} is mode {:o}: other users can reach the pins",
        bpffs.display(),
        mode(bpffs)?
    );
    ensure!(mode(&dir)? == 0o700, "pin dir mode {:o}", mode(&dir)?);
    let mut pins = 0;
    for sub in ["maps", "progs", "links"] {
        for e in std::fs::read_dir(dir.join(sub))? {
            let p = e?.path();
            let md = std::fs::metadata(&p)?;
            ensure!(
                md.uid() == 0 && md.mode() & 0o077 == 0,
                "{} is uid {} mode {:o}",
                p.display(),
                md.uid(),
                md.mode() & 0o7777
            );
            pins += 1;
        }
    }
    ensure!(pins >= 9, "only {pins} pins");
    // Another user can neither list the pins nor open one.
    let control = dir.join("maps").join("BYPASS_CONTROL");
    let out = Command::new("/bin/sh")
        .arg("-c")
        .arg(format!(
            "ls {} >/dev/null 2>&1 && echo listed; cat {} >/dev/null 2>&1 && echo opened; echo done",
            dir.display(),
            control.display()
        ))
        .uid(65534)
        .gid(65534)
        .output()
        .context("run a shell as nobody")?;
    let seen = String::from_utf8_lossy(&out.stdout);
    ensure!(seen.trim() == "done", "nobody could: {seen}");
    Ok(())
}

#[test]
fn only_pod_to_pod_connections_are_inserted() -> Result<()> {
    if !preflight("only_pod_to_pod_connections_are_inserted")? {
        return Ok(());
    }
    let pods = two_pods()?;
    // Both pods also hold an address outside the pod CIDRs, on-link to each other.
    let outside = pods.outside_cidr_v4();
    let a_out = outside.replace(".0/24", ".1");
    let b_out = outside.replace(".0/24", ".2");
    pods.a.add_addr(&format!("{a_out}/24"))?;
    pods.b.add_addr(&format!("{b_out}/24"))?;
    let agent = agent_with(&pods, &[])?;
    let args: Vec<String> = ["--case", "duplex", "--bytes", "1M"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    for (name, listen_pod, listen, connect_pod, connect) in [
        (
            "loopback inside pod a",
            &pods.a,
            "127.0.0.1:5601",
            &pods.a,
            "127.0.0.1:5601",
        ),
        (
            "pod a to pod b over addresses outside the pod CIDRs",
            &pods.b,
            &*format!("{b_out}:5602"),
            &pods.a,
            &*format!("{b_out}:5602"),
        ),
    ] {
        let before = agent.status()?;
        let server = ProbeServer::start(listen_pod, listen.parse()?, &args)?;
        let client = probe_client(connect_pod, connect.parse()?, &args)?;
        let server = server.wait()?;
        let after = agent.status()?;
        let grew = |k: &str| num(&after, k) - num(&before, k);
        ensure!(
            client["ok"] == true && server["ok"] == true,
            "{name}: {client} {server}"
        );
        ensure!(
            grew("sockets_inserted") == 0 && grew("redirected_bytes") == 0,
            "{name}: inserted: {before} -> {after}"
        );
        ensure!(
            grew("sockets_skipped") == 2,
            "{name}: not seen as skipped: {after}"
        );
    }
    Ok(())
}
