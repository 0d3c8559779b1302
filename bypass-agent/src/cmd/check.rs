//! `bypass-agent check`: a read-only preflight of this node. It leaves nothing loaded
//! or attached (the feature probes create and close a map or a two-instruction program,
//! as the agent's own preflight does; the kernel self-test loads the datapath's
//! programs apart from any pinned one, runs its checks on loopback in a private network
//! namespace, and unloads them) and reports what decides whether the agent runs
//! here, and how: the kernel's features, BTF, the read guard, the kernel self-test,
//! where cgroup2 is, whether bpffs
//! is a shared mount, the namespace's Pod Security level, other sockmap owners, the
//! metrics address (IPv6 included) and whether its port is free. The verdict is pure
//! ([`Item`], [`verdict`]); gathering the facts is thin I/O.

use std::{
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
};

use serde::Serialize;

use crate::{
    cli::CheckOpts,
    datapath::{self, preflight},
    error::AgentError,
    metrics,
};

/// How one finding bears on running the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// Fine.
    Ok,
    /// The agent runs, with less (a guarantee off, a manual step needed).
    Warn,
    /// The agent cannot run here.
    Fail,
}

/// One finding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Item {
    /// What was checked.
    pub check: String,
    /// Its bearing.
    pub level: Level,
    /// What was found, and the fix when it is not ok.
    pub detail: String,
}

fn item(check: &str, level: Level, detail: impl Into<String>) -> Item {
    Item {
        check: check.to_owned(),
        level,
        detail: detail.into(),
    }
}

/// The report of `check`.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// `uname -r`.
    pub kernel: String,
    /// Every finding.
    pub items: Vec<Item>,
    /// Whether the agent can run here (no [`Level::Fail`] but the bypass's).
    pub runs: bool,
    /// Whether `run` (with `--allow-unguarded` if asked) bypasses this node.
    pub bypasses: bool,
}

/// The finding that decides whether `run` bypasses this node (pure): `refusal` is why
/// it would not by default, `allowed_refusal` why it would not even with
/// `--allow-unguarded`, and `allow_unguarded` whether this check judges as with it.
pub fn bypass_item(
    refusal: Option<&str>,
    allowed_refusal: Option<&str>,
    allow_unguarded: bool,
) -> Item {
    match (refusal, allowed_refusal) {
        (None, _) => item(BYPASS, Level::Ok, "`run` bypasses this node"),
        (Some(why), None) if allow_unguarded => item(
            BYPASS,
            Level::Warn,
            format!("`run` bypasses this node only because of --allow-unguarded: {why}"),
        ),
        (Some(why), None) => item(
            BYPASS,
            Level::Fail,
            format!(
                "`run` does not bypass this node: {why} (the chart: allowUnguarded=true; \
                 check with --allow-unguarded to judge as it)"
            ),
        ),
        (Some(_), Some(why)) => item(
            BYPASS,
            Level::Fail,
            format!("`run` does not bypass this node, with or without --allow-unguarded: {why}"),
        ),
    }
}

/// The name of [`bypass_item`]'s finding.
pub const BYPASS: &str = "bypass";

/// Whether the agent can run given `items` (pure).
pub fn verdict(items: &[Item]) -> bool {
    items.iter().all(|i| i.level != Level::Fail)
}

/// The kernel feature findings from the probes (pure).
pub fn feature_items(found: &[(preflight::Need, preflight::Found)]) -> Vec<Item> {
    found
        .iter()
        .map(|(need, f)| match f {
            preflight::Found::Yes => item(need.what, Level::Ok, "present"),
            preflight::Found::No => item(
                need.what,
                Level::Fail,
                format!("missing: {}; the agent refuses this kernel", need.why),
            ),
            preflight::Found::Unknown(e) => item(
                need.what,
                Level::Warn,
                format!("could not probe ({e}): run check with the agent's privileges"),
            ),
        })
        .collect()
}

/// Whether the mount at `point` propagates with the host's, from a mountinfo text
/// (pure): `shared:N` (the host's own, or a Bidirectional volume) or `master:N` (a
/// container's HostToContainer view of a shared host mount); `None` when nothing is
/// mounted there.
pub fn shared_mount(mountinfo: &str, point: &Path) -> Option<(String, bool)> {
    mountinfo.lines().rev().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let fields: Vec<&str> = left.split_whitespace().collect();
        if Path::new(fields.get(4)?) != point {
            return None;
        }
        let fstype = right.split_whitespace().next()?.to_owned();
        let shared = fields
            .iter()
            .skip(6)
            .any(|f| f.starts_with("shared:") || f.starts_with("master:"));
        Some((fstype, shared))
    })
}

/// The bpffs finding from what is mounted at `point` (pure).
pub fn bpffs_item(found: Option<(String, bool)>, point: &Path) -> Item {
    let name = "bpffs";
    match found {
        None => item(
            name,
            Level::Warn,
            format!(
                "nothing mounted at {}: the agent (or the chart's init container) mounts it; for its pins to outlive the container the host's {} must be a shared mount (`mount --make-shared {}` on hosts without systemd)",
                point.display(),
                point.display(),
                point.display()
            ),
        ),
        Some((fs, _)) if fs != "bpf" => item(
            name,
            Level::Fail,
            format!(
                "{} is a {fs} mount, not bpf: mount bpffs there",
                point.display()
            ),
        ),
        Some((_, true)) => item(
            name,
            Level::Ok,
            format!("{} is a bpf mount shared with the host", point.display()),
        ),
        Some((_, false)) => item(
            name,
            Level::Warn,
            format!(
                "{} is bpf but not shared: pins made in the agent's container do not reach the host (a restart cannot adopt); run `mount --make-shared {}` (systemd hosts share every mount)",
                point.display(),
                point.display()
            ),
        ),
    }
}

/// The metrics address finding (pure): `free` says whether a bind there succeeded.
pub fn metrics_item(addr: SocketAddr, free: Result<(), String>) -> Item {
    let family = match addr.ip() {
        IpAddr::V4(_) => "IPv4",
        IpAddr::V6(_) => "IPv6",
    };
    match free {
        Ok(()) => item(
            "metrics address",
            Level::Ok,
            format!("{addr} ({family}) is free"),
        ),
        Err(e) => item(
            "metrics address",
            Level::Warn,
            format!(
                "{addr} ({family}) cannot be bound ({e}): an agent already runs here, or another program holds the port; the agent still runs and retries; pick another metricsPort"
            ),
        ),
    }
}

/// The Pod Security finding from the namespace's `enforce` label (pure).
pub fn pod_security_item(namespace: &str, enforce: Option<Option<String>>) -> Item {
    let name = "pod security";
    match enforce {
        None => item(
            name,
            Level::Warn,
            format!("namespace {namespace} not readable from here"),
        ),
        Some(Some(level)) if level == "privileged" => item(
            name,
            Level::Ok,
            format!("namespace {namespace} enforces privileged"),
        ),
        Some(level) => item(
            name,
            Level::Fail,
            format!(
                "namespace {namespace} enforces {} (the cluster default when unlabelled): the agent's pods are refused; label it pod-security.kubernetes.io/enforce=privileged (the chart's namespace hook does)",
                level.as_deref().unwrap_or("the cluster's default level")
            ),
        ),
    }
}

/// `bypass-agent check`: prints the report; fails when the agent cannot run here.
pub fn check(opts: &CheckOpts) -> Result<(), AgentError> {
    let report = gather(opts);
    if opts.json {
        super::print_json(&report, "the check report")?;
    } else {
        println!("kernel {}", report.kernel);
        for i in &report.items {
            let l = match i.level {
                Level::Ok => "ok  ",
                Level::Warn => "warn",
                Level::Fail => "FAIL",
            };
            println!("{l}  {:<58} {}", i.check, i.detail);
        }
        println!(
            "{}",
            match (report.runs, report.bypasses) {
                (true, true) => "the agent can run on this node, and bypasses it",
                (true, false) => "the agent can run on this node, but does not bypass it",
                (false, _) => "the agent cannot run on this node",
            }
        );
    }
    if report.runs && report.bypasses {
        Ok(())
    } else {
        Err(AgentError::CheckFailed)
    }
}

/// The kernel self-test's findings (pure): one item for the whole when every check
/// ran passed, one per check that failed (`run` refuses the node for it, or, for those
/// `--allow-unguarded` covers, bypasses only with it).
pub fn check_items(checks: &[bypass_common::status::KernelCheck], fionread: &str) -> Vec<Item> {
    let failed: Vec<Item> = checks
        .iter()
        .filter(|c| c.outcome == "failed")
        .map(|c| {
            let allowed = bypass_common::checks::index(&c.name).is_some_and(|i| {
                bypass_common::checks::CHECKS[i].needed == bypass_common::checks::Needed::Guarded
            });
            item(
                &format!("kernel check {}", c.name),
                if allowed { Level::Warn } else { Level::Fail },
                format!(
                    "this kernel does not answer as TCP does: {}; `run` {}",
                    c.what,
                    if allowed {
                        "bypasses this node only with --allow-unguarded"
                    } else {
                        "does not bypass this node"
                    }
                ),
            )
        })
        .collect();
    if !failed.is_empty() {
        return failed;
    }
    vec![item(
        "kernel self-test",
        Level::Ok,
        format!(
            "{} behaviours as TCP answers them (FIONREAD compensation: {fionread})",
            checks.iter().filter(|c| c.outcome == "passed").count()
        ),
    )]
}

fn gather(opts: &CheckOpts) -> Report {
    let kernel = datapath::kernel_release();
    let mut items = feature_items(&preflight::probe_all());
    let probe = super::probe::detect_both();
    let bypass = match &probe {
        Ok((p, allowed)) => bypass_item(
            p.refusal.as_deref(),
            allowed.as_deref(),
            opts.allow_unguarded,
        ),
        Err(e) => item(BYPASS, Level::Fail, e.to_string()),
    };
    let probe = probe.map(|(p, _)| p);
    items.push(match &probe {
        Ok(p) if p.read_guard => item(
            "read guard",
            Level::Ok,
            "splice and zero-copy receive of bypassed sockets are guarded",
        ),
        Ok(_) => item(
            "read guard",
            Level::Warn,
            "none: the kernel refuses BPF trampoline programs, so `run` does not bypass \
             without --allow-unguarded (see `bypass-agent probe`)",
        ),
        Err(e) => item("read guard", Level::Fail, e.to_string()),
    });
    if let Ok(p) = &probe {
        items.extend(check_items(&p.kernel_checks, &p.fionread_compensation));
    }
    let cgroup = match &opts.host_cgroupfs {
        Some(dir) => datapath::find_host_cgroup2(dir),
        None => datapath::find_cgroup2_mount(),
    };
    items.push(match cgroup {
        Ok(p) => item(
            "cgroup2",
            Level::Ok,
            format!("sock_ops would attach to {}", p.display()),
        ),
        Err(e) => item("cgroup2", Level::Fail, e.to_string()),
    });
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    items.push(bpffs_item(
        shared_mount(&mountinfo, &opts.bpffs),
        &opts.bpffs,
    ));
    let others = crate::other_programs::list();
    items.push(if others.is_empty() {
        item("other sockmap owners", Level::Ok, "none")
    } else {
        item(
            "other sockmap owners",
            Level::Warn,
            format!(
                "{}: sockets their sockmap holds cannot join ours",
                others
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        )
    });
    for addr in metrics::metrics_addrs(None, &opts.metrics_ip, opts.metrics_port, true) {
        let free = std::net::TcpListener::bind(addr)
            .map(drop)
            .map_err(|e| e.to_string());
        items.push(metrics_item(addr, free));
    }
    if let Some(ns) = &opts.namespace {
        items.push(pod_security_item(
            ns,
            namespace_enforce(ns, opts.kubeconfig.as_deref()),
        ));
    }
    let runs = verdict(&items);
    let bypasses = runs && bypass.level != Level::Fail;
    items.push(bypass);
    Report {
        kernel,
        items,
        runs,
        bypasses,
    }
}

/// The `pod-security.kubernetes.io/enforce` label of `namespace`: `None` if it cannot
/// be read, `Some(None)` if it has none.
fn namespace_enforce(namespace: &str, kubeconfig: Option<&Path>) -> Option<Option<String>> {
    let rt = crate::runtime::current_thread().ok()?;
    rt.block_on(async {
        let client = crate::k8s::client::connect(kubeconfig).await.ok()?;
        let api: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client);
        let ns = tokio::time::timeout(std::time::Duration::from_secs(5), api.get(namespace))
            .await
            .ok()?
            .ok()?;
        Some(
            ns.metadata
                .labels
                .and_then(|l| l.get("pod-security.kubernetes.io/enforce").cloned()),
        )
    })
}

/// The default bpffs mount point.
pub fn default_bpffs() -> PathBuf {
    PathBuf::from("/sys/fs/bpf")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_that_will_not_bypass_fails_the_check_with_the_reason() {
        let ok = bypass_item(None, None, false);
        assert_eq!(ok.level, Level::Ok);
        // No read guard: refused by default, bypassed with --allow-unguarded.
        let no_guard = bypass_item(Some("no read guard"), None, false);
        assert_eq!(no_guard.level, Level::Fail);
        assert!(
            no_guard.detail.contains("no read guard"),
            "{}",
            no_guard.detail
        );
        assert!(
            no_guard.detail.contains("allowUnguarded=true"),
            "{}",
            no_guard.detail
        );
        let allowed = bypass_item(Some("no read guard"), None, true);
        assert_eq!(allowed.level, Level::Warn);
        // A failure --allow-unguarded does not cover fails either way.
        let eof = bypass_item(Some("eof"), Some("eof"), true);
        assert_eq!(eof.level, Level::Fail);
        assert!(eof.detail.contains("with or without"), "{}", eof.detail);
    }

    const MOUNTINFO: &str = "\
24 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
40 24 0:35 / /sys/fs/bpf rw,nosuid shared:17 - bpf bpf rw,mode=700
41 24 0:36 / /mnt/private rw - bpf bpf rw
42 24 0:35 / /host/bpf rw master:17 - bpf bpf rw
";

    #[test]
    fn bpffs_propagation_is_read_from_mountinfo() {
        let p = Path::new("/sys/fs/bpf");
        assert_eq!(shared_mount(MOUNTINFO, p), Some(("bpf".into(), true)));
        assert_eq!(
            shared_mount(MOUNTINFO, Path::new("/mnt/private")),
            Some(("bpf".into(), false))
        );
        assert_eq!(shared_mount(MOUNTINFO, Path::new("/nope")), None);
        // A container's HostToContainer view of the host's shared mount.
        assert_eq!(
            shared_mount(MOUNTINFO, Path::new("/host/bpf")),
            Some(("bpf".into(), true))
        );
        assert_eq!(bpffs_item(shared_mount(MOUNTINFO, p), p).level, Level::Ok);
        let private = bpffs_item(Some(("bpf".into(), false)), p);
        assert!(private.level == Level::Warn && private.detail.contains("--make-shared"));
        assert_eq!(
            bpffs_item(Some(("tmpfs".into(), true)), p).level,
            Level::Fail
        );
    }

    #[test]
    fn ipv6_metrics_and_a_taken_port() {
        let v6: SocketAddr = "[fd00::10]:19464".parse().unwrap();
        let ok = metrics_item(v6, Ok(()));
        assert!(
            ok.level == Level::Ok && ok.detail.contains("IPv6"),
            "{ok:?}"
        );
        let taken = metrics_item(v6, Err("Address in use".into()));
        assert_eq!(
            taken.level,
            Level::Warn,
            "a taken port does not stop the agent"
        );
    }

    #[test]
    fn pod_security_levels() {
        assert_eq!(
            pod_security_item("ns", Some(Some("privileged".into()))).level,
            Level::Ok
        );
        let base = pod_security_item("ns", Some(Some("baseline".into())));
        assert!(base.level == Level::Fail && base.detail.contains("enforce=privileged"));
        assert_eq!(pod_security_item("ns", Some(None)).level, Level::Fail);
        assert_eq!(pod_security_item("ns", None).level, Level::Warn);
    }

    #[test]
    fn a_missing_feature_fails_an_unknown_one_warns() {
        let need = preflight::NEEDS[8];
        let items = feature_items(&[
            (need, preflight::Found::No),
            (
                preflight::NEEDS[0],
                preflight::Found::Unknown("EPERM".into()),
            ),
        ]);
        assert_eq!(items[0].level, Level::Fail);
        assert_eq!(items[1].level, Level::Warn);
        assert!(!verdict(&items));
        assert!(verdict(&items[1..]));
    }
}
