//! The kernel self-test (`bypass_common::checks`): before the datapath bypasses
//! anything, and at every start (adopting too), a load of the agent's own object, apart
//! from the pinned one (its own maps, nothing pinned), runs each behaviour the
//! guarantees rely on between sockets on loopback in a private network namespace, and
//! compares what the kernel answers with what TCP answers.
//!
//! The checks run on a thread of the agent that enters a network namespace of its own
//! (only that thread: `unshare(CLONE_NEWNET)`), so its sockets belong to the agent's
//! cgroup, to which the checks' sock_ops and setsockopt programs are attached while
//! they run (the agent's sockets in the host's namespace are never looked at; the
//! checks' tracing programs act only on sockets of their own maps). The loopback
//! connections are bypassed as inside a pod: the namespace is recorded as a pod's.
//!
//! Where FIONREAD fails, the checks run again with the FIONREAD compensation
//! (bypass-ebpf/src/fionread.rs) loaded for the part the kernel missed; if it passes
//! then, the datapath is loaded with it. What still fails turns off what needs it
//! ([`bypass_common::checks::Needed`]); [`Verdict::refusal`] says so in one line.

mod scenarios;

use std::{net::IpAddr, path::Path};

use aya::{
    Ebpf,
    maps::{Array, HashMap, Map},
    programs::{CgroupAttachMode, CgroupSockopt, SockOps},
};
use bypass_common::{
    Counters, IpKey,
    checks::{self, CHECKS, Needed, Outcome, Results},
    control, ip_key,
    layout::features,
    names::{
        FIONREAD_HOOKS, Hook, HookKind, MAP_CONTROL, MAP_NETNS_OWNERS, MAP_POD_ADDRS,
        MAP_POD_NETNS, MAP_STATS, PROG_SOCKOPS, PROG_SOCKOPT,
    },
};
use tracing::{info, warn};

use super::{HostFacts, ReadGuard, btf, fs, host, load};
use crate::error::AgentError;

/// The pod address the checks' namespace is recorded as (TEST-NET-1: never a node's
/// pod; only the checks' own maps hold it).
const POD: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 1));

/// SockHash capacity of the checks' datapath.
const SOCKETS: u32 = 64;

/// What the self-test found, and what the datapath is loaded with because of it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Every check's outcome.
    pub results: Results,
    /// The feature bits it adds to the load: the FIONREAD compensation's
    /// ([`features::FIONREAD_ADD_TCP`], [`features::FIONREAD_ADD_INGRESS`]), or
    /// [`features::FIONREAD_WRONG`] where FIONREAD fails and no compensation could run;
    /// and how the read guard's checks run ([`features::GUARD_ATTACH`]), where one does.
    pub features: u32,
    /// What each failed check saw (catalogue index, what was seen).
    pub failures: Vec<(usize, String)>,
}

impl Verdict {
    /// Why the node is not bypassed because of the self-test, in one line naming the
    /// kernel and every failed behaviour, if it is not: a check whose failure turns the
    /// bypass off, or one the agent gives up only with `--allow-unguarded` without it.
    pub fn refusal(&self, release: &str, allow_unguarded: bool) -> Option<String> {
        let blocking: Vec<&(usize, String)> = self
            .failures
            .iter()
            .filter(|(i, _)| CHECKS[*i].needed == Needed::Bypass || !allow_unguarded)
            .collect();
        if blocking.is_empty() {
            return None;
        }
        let what = blocking
            .iter()
            .map(|(i, seen)| format!("{} ({seen})", CHECKS[*i].name))
            .collect::<Vec<_>>()
            .join("; ");
        let allowable = blocking
            .iter()
            .all(|(i, _)| CHECKS[*i].needed == Needed::Guarded);
        Some(format!(
            "kernel {release} fails the self-test: {what}{}",
            if allowable {
                "; pass --allow-unguarded to bypass anyway, where no workload relies on it"
            } else {
                "; run the agent on another kernel, or keep it off this node"
            }
        ))
    }

    /// A self-test that could not run: every check failed with `why`.
    fn could_not_run(why: &str) -> Self {
        let mut v = Self::default();
        for (i, _) in CHECKS.iter().enumerate() {
            v.results = v.results.with(i, Outcome::Failed);
            v.failures
                .push((i, format!("the self-test could not run: {why}")));
        }
        v
    }

    fn from_observed(o: scenarios::Observed) -> Self {
        let mut v = Self::default();
        for (i, seen) in o.0.into_iter().enumerate() {
            let outcome = match seen {
                None => Outcome::NotRun,
                Some(Ok(())) => Outcome::Passed,
                Some(Err(e)) => {
                    v.failures.push((i, e));
                    Outcome::Failed
                }
            };
            v.results = v.results.with(i, outcome);
        }
        v
    }

    fn failed(&self, i: usize) -> bool {
        self.results.get(i) == Outcome::Failed
    }
}

/// Where an agent keeps this boot's self-test result: every agent started in the same
/// boot of the same build on the same host facts reuses it (the kernel does not change
/// under a running system; a test suite starts hundreds of agents, each would otherwise
/// load the object twice). `/run` is a tmpfs, gone with the boot; the chart mounts the
/// host's `/run/bypass` there, so a restarted container reuses it rather than attach the
/// self-test's tracing programs again beside a running datapath's.
pub const CACHE: &str = "/run/bypass/kernel-checks.json";

/// One boot's self-test result, as [`CACHE`] holds it.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Cached {
    /// `/proc/sys/kernel/random/boot_id`.
    boot: String,
    /// The object's fingerprint and the host facts' digest it ran with.
    build: u64,
    facts: u64,
    /// Catalogue size, so a cache of another catalogue is never read as this one's.
    checks: usize,
    results: u32,
    features: u32,
    failures: Vec<(usize, String)>,
}

/// [`run`], or this boot's result of it for this build and these facts ([`CACHE`]);
/// a result that cannot be read or written is run again or not kept, never an error.
pub fn run_once_per_boot(facts: &HostFacts, fallback: &Path) -> Verdict {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|b| b.trim().to_owned())
        .unwrap_or_default();
    let key = (
        boot,
        super::object::fingerprint(),
        facts.digest(),
        CHECKS.len(),
    );
    let cached = std::fs::read(CACHE)
        .ok()
        .and_then(|b| serde_json::from_slice::<Cached>(&b).ok())
        .filter(|c| !key.0.is_empty() && (c.boot.clone(), c.build, c.facts, c.checks) == key);
    if let Some(c) = cached {
        info!(
            cache = CACHE,
            failed = c.failures.len(),
            "kernel self-test: this boot's result for this build, reused"
        );
        for (i, seen) in &c.failures {
            warn!(check = CHECKS[*i].name, what = CHECKS[*i].what, seen = %seen,
                "kernel self-test: this kernel does not answer as TCP does");
        }
        return Verdict {
            results: Results(c.results),
            features: c.features,
            failures: c.failures,
        };
    }
    let verdict = run(facts, fallback);
    let c = Cached {
        boot: key.0,
        build: key.1,
        facts: key.2,
        checks: key.3,
        results: verdict.results.0,
        features: verdict.features,
        failures: verdict.failures.clone(),
    };
    if let Err(e) = store(&c) {
        info!(cache = CACHE, error = %e, "kernel self-test result not kept: the next start runs it again");
    }
    verdict
}

/// The verdict the self-test of the pinned datapath's load recorded in its control map
/// (`control`), if that datapath has this build's layout (whose checks the recorded bits
/// name) and a self-test ran: a datapath pinned is this boot's (bpffs goes with the
/// boot), so its verdict is this kernel's. A start that adopts or upgrades it reuses the
/// verdict rather than attach the self-test's tracing programs beside the datapath's,
/// whose reads in flight would lose their return programs (docs/limitations.md).
pub fn recorded(control: &super::maps::Control) -> Option<Verdict> {
    if control.layout().ok()? != bypass_common::layout::LAYOUT_VERSION {
        return None;
    }
    let results = control.checks().ok()?;
    if !results.ran() {
        return None;
    }
    let kept = features::FIONREAD_ADD_TCP
        | features::FIONREAD_ADD_INGRESS
        | features::FIONREAD_WRONG
        | features::GUARD_ATTACH;
    let failures = (0..CHECKS.len())
        .filter(|&i| results.get(i) == Outcome::Failed)
        .map(|i| {
            (
                i,
                "as the pinned datapath's self-test found it, this boot".to_owned(),
            )
        })
        .collect();
    Some(Verdict {
        results,
        features: control.features().ok()? & kept,
        failures,
    })
}

/// Writes `c` to [`CACHE`] whole (a temporary file renamed over it).
fn store(c: &Cached) -> std::io::Result<()> {
    let path = Path::new(CACHE);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("{}.tmp", std::process::id()));
    std::fs::write(&tmp, serde_json::to_vec(c).map_err(std::io::Error::other)?)?;
    std::fs::rename(&tmp, path)
}

/// Runs the self-test on this kernel with `facts` (the programs as the datapath loads
/// them), the checks' programs attached to the agent's own cgroup (or `fallback`, an
/// ancestor of it, where its own is not mounted). Logs what failed.
pub fn run(facts: &HostFacts, fallback: &Path) -> Verdict {
    let started = std::time::Instant::now();
    let verdict = std::thread::scope(|s| {
        s.spawn(|| in_private_netns(facts, fallback))
            .join()
            .unwrap_or_else(|_| Verdict::could_not_run("its thread panicked"))
    });
    for (i, seen) in &verdict.failures {
        warn!(check = CHECKS[*i].name, what = CHECKS[*i].what, seen = %seen,
            "kernel self-test: this kernel does not answer as TCP does");
    }
    info!(
        passed = CHECKS
            .iter()
            .enumerate()
            .filter(|(i, _)| verdict.results.get(*i) == Outcome::Passed)
            .count(),
        failed = verdict.failures.len(),
        fionread_compensation = fionread_mode_name(verdict.features),
        millis = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        "kernel self-test done"
    );
    verdict
}

/// How FIONREAD is answered, by the verdict's feature bits.
pub fn fionread_mode_name(bits: u32) -> &'static str {
    match (
        bits & features::FIONREAD_ADD_TCP != 0,
        bits & features::FIONREAD_ADD_INGRESS != 0,
        bits & features::FIONREAD_WRONG != 0,
    ) {
        (_, _, true) => "needed, unavailable",
        (true, true, _) => "adds TCP and redirected bytes",
        (true, false, _) => "adds TCP bytes",
        (false, true, _) => "adds redirected bytes",
        (false, false, _) => "not needed",
    }
}

/// The self-test, on the calling thread, which it moves into a new network namespace.
fn in_private_netns(facts: &HostFacts, fallback: &Path) -> Verdict {
    if let Err(e) = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET) {
        return Verdict::could_not_run(&format!("unshare(CLONE_NEWNET): {e}"));
    }
    if let Err(e) = scenarios::loopback_up() {
        return Verdict::could_not_run(&e);
    }
    let cgroup = fs::own_cgroup2_dir().unwrap_or_else(|_| fallback.to_path_buf());
    let (facts, first) = match guard_round(facts, &cgroup) {
        Ok(chosen) => chosen,
        Err(e) => return Verdict::could_not_run(&e),
    };
    let mut v = with_fionread(&facts, first, &cgroup);
    v.features |= facts.features & features::GUARD_ATTACH;
    v
}

/// The first round of checks, with the read guard's checks as BPF LSM programs where
/// the facts say to try them, and again as fmod_ret if they did not load or did not
/// refuse (a kernel whose BPF LSM is not active: booted without `bpf` in `lsm=`): the
/// facts the round that answered ran with, and its verdict.
fn guard_round(facts: &HostFacts, cgroup: &Path) -> Result<(HostFacts, Verdict), String> {
    let lsm = round(facts, 0, cgroup);
    if facts.features & features::GUARD_LSM == 0 {
        return lsm.map(|v| (*facts, v));
    }
    let why = match &lsm {
        Ok(v) if !checks::READ_GUARD.iter().any(|&i| v.failed(i)) => {
            info!("the read guard's checks run as BPF LSM programs");
            return lsm.map(|v| (*facts, v));
        }
        Ok(v) => v
            .failures
            .iter()
            .filter(|(i, _)| checks::READ_GUARD.contains(i))
            .map(|(i, s)| format!("{}: {s}", CHECKS[*i].name))
            .collect::<Vec<_>>()
            .join("; "),
        // One line: a verifier's log ends with what it refused.
        Err(e) => e.lines().rev().take(6).collect::<Vec<_>>().join(" | "),
    };
    let mut fmod_ret = *facts;
    fmod_ret.features = (facts.features & !features::GUARD_ATTACH) | features::GUARD_FMOD_RET;
    let second =
        round(&fmod_ret, 0, cgroup).map_err(|e| format!("{e} (as BPF LSM programs: {why})"))?;
    warn!(why = %why,
        "the read guard's checks do not run as BPF LSM programs on this kernel: they run \
         as fmod_ret programs, which a preemptible kernel can skip for a splice \
         (docs/limitations.md#guard-programs-the-kernel-skips)");
    Ok((fmod_ret, second))
}

/// The verdict of the first round, `first`, and where FIONREAD failed in it, of a round
/// with the FIONREAD compensation.
fn with_fionread(facts: &HostFacts, first: Verdict, cgroup: &Path) -> Verdict {
    let mode = fionread_mode(&first);
    if mode == 0 {
        return first;
    }
    // FIONREAD failed: again with the compensation for what the kernel missed, where
    // it can load (BPF trampolines, bpf_probe_write_user: no lockdown).
    let why_not = if !facts.layout.fionread_fields() {
        Some("the kernel's BTF lacks a field it reads".to_owned())
    } else if facts.hooks.guard != ReadGuard::Guard {
        Some("it needs BPF trampolines, which this kernel refuses".to_owned())
    } else {
        match round(facts, mode, cgroup) {
            Ok(second) if !checks::FIONREAD.iter().any(|&i| second.failed(i)) => {
                return Verdict {
                    features: mode,
                    ..second
                };
            }
            Ok(second) => Some(format!(
                "FIONREAD still fails with it: {}",
                second
                    .failures
                    .iter()
                    .filter(|(i, _)| checks::FIONREAD.contains(i))
                    .map(|(_, s)| s.as_str())
                    .collect::<Vec<_>>()
                    .join("; ")
            )),
            Err(e) => Some(e),
        }
    };
    let why_not = why_not.unwrap_or_default();
    warn!(compensation = fionread_mode_name(mode), why_not = %why_not,
        "FIONREAD is wrong on this kernel and the FIONREAD compensation cannot run");
    let mut v = first;
    for (i, seen) in &mut v.failures {
        if checks::FIONREAD.contains(i) {
            *seen = format!("{seen}; no compensation: {why_not}");
        }
    }
    v.features = features::FIONREAD_WRONG;
    v
}

/// The compensation's bits for what the first round's FIONREAD checks missed.
fn fionread_mode(v: &Verdict) -> u32 {
    let mut mode = 0;
    if v.failed(checks::FIONREAD_TCP) || v.failed(checks::FIONREAD_MIXED) {
        mode |= features::FIONREAD_ADD_TCP;
    }
    if v.failed(checks::FIONREAD_REDIRECTED) {
        mode |= features::FIONREAD_ADD_INGRESS;
        // Missing redirected bytes in the mixed case is this, not the TCP part.
        if !v.failed(checks::FIONREAD_TCP) {
            mode &= !features::FIONREAD_ADD_TCP;
        }
    }
    mode
}

/// One round of checks with the datapath loaded with `mode` more (FIONREAD
/// compensation bits), its sock_ops and setsockopt attached to `cgroup`. `Err`: the
/// round could not run.
fn round(facts: &HostFacts, mode: u32, cgroup: &Path) -> Result<Verdict, String> {
    let mut facts = *facts;
    facts.features |= mode;
    let text = |e: AgentError| crate::error::chain(&e);
    let mut ebpf = load::load_object(SOCKETS, &facts).map_err(text)?;
    configure(&mut ebpf).map_err(text)?;
    load::attach_skmsg(&mut ebpf).map_err(text)?;
    let cgroup_dir = fs::open_cgroup2_dir(cgroup).map_err(text)?;
    let sockops: &mut SockOps = program(&mut ebpf, PROG_SOCKOPS)?;
    sockops
        .load()
        .map_err(|e| format!("load {PROG_SOCKOPS}: {e}"))?;
    sockops
        .attach(&cgroup_dir, CgroupAttachMode::Single)
        .map_err(|e| format!("attach {PROG_SOCKOPS} to {}: {e}", cgroup.display()))?;
    let sockopt: &mut CgroupSockopt = program(&mut ebpf, PROG_SOCKOPT)?;
    sockopt
        .load()
        .map_err(|e| format!("load {PROG_SOCKOPT}: {e}"))?;
    sockopt
        .attach(&cgroup_dir, CgroupAttachMode::Single)
        .map_err(|e| format!("attach {PROG_SOCKOPT} to {}: {e}", cgroup.display()))?;
    // The FIONREAD compensation's hook is found (one BTF parse) before the BTF is read
    // for every hook (another), so the two are never held at once.
    let compensation = match mode {
        0 => None,
        _ => Some(fionread_hook().ok_or("the kernel has neither sk_ioctl nor tcp_ioctl")?),
    };
    // The splice watch (a syscall tracepoint) is not the checks' business.
    let hooks: Vec<&Hook> = facts
        .hooks
        .all()
        .filter(|h| h.kind != HookKind::Syscall)
        .collect();
    let btfs = load::Btfs::read(hooks.iter().copied().chain(compensation), facts.features)
        .map_err(text)?;
    // Held until the round ends: dropped, they detach.
    let mut links = Vec::new();
    for hook in hooks {
        links.push(load::attach_hook(&mut ebpf, &btfs, *hook, facts.features).map_err(text)?);
    }
    if let Some(hook) = compensation {
        links.push(
            load::attach_hook(&mut ebpf, &btfs, *hook, facts.features)
                .map_err(|e| format!("the FIONREAD compensation does not load: {}", text(e)))?,
        );
    }
    drop(btfs);
    let stats = StatsView(&ebpf);
    let observed = scenarios::run(&stats, facts.hooks.guard == ReadGuard::Guard);
    drop(links);
    Ok(Verdict::from_observed(observed))
}

/// The checks' datapath's counters.
struct StatsView<'a>(&'a Ebpf);

impl scenarios::Counted for StatsView<'_> {
    fn counters(&self) -> Result<Counters, String> {
        let map = self.0.map(MAP_STATS).ok_or("no stats map")?;
        let stats = aya::maps::PerCpuArray::<_, u64>::try_from(map).map_err(|e| e.to_string())?;
        let mut c = Counters::default();
        for stat in bypass_common::Stat::ALL {
            let per_cpu = stats.get(&stat.index(), 0).map_err(|e| e.to_string())?;
            c.set(stat, per_cpu.iter().copied().fold(0u64, u64::wrapping_add));
        }
        Ok(c)
    }
}

/// The checks' datapath's control words and maps: redirects on, a heartbeat an hour
/// ahead, the checks' bound, no small-stream rule, no leaving, and this thread's
/// namespace recorded as the pod's and as the only owner of its address.
fn configure(ebpf: &mut Ebpf) -> Result<(), AgentError> {
    let netns = host::netns_cookie()?;
    let err = |e| AgentError::map(MAP_CONTROL, "write the self-test's settings", e);
    let mut control: Array<&mut aya::maps::MapData, u32> =
        Array::try_from(map_mut(ebpf, MAP_CONTROL)?).map_err(err)?;
    let now = clock_monotonic_ns();
    for (slot, value) in [
        (control::SLOT_ENABLED, control::ENABLED),
        (control::SLOT_MAX_QUEUED, scenarios::BOUND),
        (control::SLOT_SMALL_STREAM, 0),
        (control::SLOT_LEAVE_AFTER, 0),
        (control::SLOT_OWNERS_OFF, 0),
        (control::SLOT_HOOKS_OWNER, load::build_id()),
        (
            control::SLOT_HEARTBEAT,
            control::heartbeat_deadline(now, 3600),
        ),
    ] {
        control.set(slot, value, 0).map_err(err)?;
    }
    let pod: IpKey = ip_key(POD);
    insert(ebpf, MAP_POD_ADDRS, pod, 1u8)?;
    insert(ebpf, MAP_POD_NETNS, netns, pod)?;
    // The pod address is owned by this thread's namespace alone: another namespace in
    // the agent's cgroup (a standalone agent in the cgroup root, where pods' namespaces
    // live too) that uses it is refused, so none is taken for the checks' pod.
    insert(ebpf, MAP_NETNS_OWNERS, pod, netns)
}

/// Inserts `key` → `value` into the hash map `map` of `ebpf`.
fn insert<K: aya::Pod, V: aya::Pod>(
    ebpf: &mut Ebpf,
    map: &str,
    key: K,
    value: V,
) -> Result<(), AgentError> {
    let err = |e| AgentError::map(map, "write the self-test's entry", e);
    HashMap::<_, K, V>::try_from(map_mut(ebpf, map)?)
        .map_err(err)?
        .insert(key, value, 0)
        .map_err(err)
}

/// `CLOCK_MONOTONIC` in nanoseconds, what `bpf_ktime_get_ns` reads.
fn clock_monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| {
            u64::try_from(t.tv_sec()).unwrap_or(0) * control::NSEC_PER_SEC
                + u64::try_from(t.tv_nsec()).unwrap_or(0)
        })
        .unwrap_or(0)
}

fn map_mut<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut Map, AgentError> {
    ebpf.map_mut(name)
        .ok_or_else(|| AgentError::missing("map", name))
}

fn program<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T, String>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or_else(|| format!("no program {name} in the object"))?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| format!("program {name}: {e}"))
}

/// The FIONREAD compensation's hook on this kernel: the return of `sk_ioctl` where it
/// exists (Linux >= 6.5), else of `tcp_ioctl`.
pub fn fionread_hook() -> Option<&'static Hook> {
    let b = btf::Btf::vmlinux().ok()?;
    FIONREAD_HOOKS
        .iter()
        .find(|h| b.type_id(btf::KIND_FUNC, h.target).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(failed: &[usize]) -> Verdict {
        let mut v = Verdict::default();
        for (i, _) in CHECKS.iter().enumerate() {
            let o = if failed.contains(&i) {
                v.failures.push((i, "seen".into()));
                Outcome::Failed
            } else {
                Outcome::Passed
            };
            v.results = v.results.with(i, o);
        }
        v
    }

    #[test]
    fn what_fails_turns_off_what_needs_it() {
        assert_eq!(verdict(&[]).refusal("6.18", false), None);
        let fionread = verdict(&[checks::FIONREAD_TCP, checks::FIONREAD_MIXED]);
        let line = fionread.refusal("6.18.44", false).unwrap();
        assert!(
            line.starts_with(
                "kernel 6.18.44 fails the self-test: fionread_tcp (seen); fionread_mixed"
            ) && line.contains("--allow-unguarded")
                && !line.contains('\n'),
            "{line}"
        );
        assert_eq!(fionread.refusal("6.18.44", true), None, "allowed");
        let epoll = verdict(&[checks::EPOLL_EDGE, checks::FIONREAD_TCP]);
        let line = epoll.refusal("7.3", true).unwrap();
        assert!(
            line.contains("epoll_edge") && !line.contains("fionread") && !line.contains("--allow"),
            "{line}"
        );
        assert!(Verdict::could_not_run("x").refusal("1", true).is_some());
    }

    #[test]
    fn the_compensation_adds_what_the_kernel_missed() {
        // This host's 6.18.44: FIONREAD misses the TCP queue.
        let v = verdict(&[checks::FIONREAD_TCP, checks::FIONREAD_MIXED]);
        assert_eq!(fionread_mode(&v), features::FIONREAD_ADD_TCP);
        // 6.1: FIONREAD misses the ingress queue.
        let v = verdict(&[checks::FIONREAD_REDIRECTED, checks::FIONREAD_MIXED]);
        assert_eq!(fionread_mode(&v), features::FIONREAD_ADD_INGRESS);
        // Both missing (a kernel answering 0).
        let v = verdict(&checks::FIONREAD);
        assert_eq!(
            fionread_mode(&v),
            features::FIONREAD_ADD_TCP | features::FIONREAD_ADD_INGRESS
        );
        assert_eq!(fionread_mode(&verdict(&[checks::POLL])), 0);
    }
}
