//! The kernel side as the agent sees it: load the embedded object or adopt a pinned
//! one, attach and detach, and typed views over the maps. Nothing here decides *what*
//! goes into the address maps; callers do.

mod adopt;
mod btf;
mod fmodret;
mod fs;
mod heartbeat;
mod host;
pub mod kernel_check;
mod leaver;
mod load;
mod lock;
mod maps;
mod object;
mod pins;
mod plan;
pub mod preflight;
mod pressure;

/// When the full-map warning is logged (`insert_failures` polled every `POLL`, at most
/// one warning per `WARN_EVERY`), for the tests that watch it.
pub mod insert_failure_warning {
    pub use super::pressure::{POLL, WARN_EVERY};
}
mod rawbpf;
mod rawlink;
mod tcp_mem;
mod worker;

use std::{
    collections::{BTreeMap, BTreeSet},
    fs::File,
    net::IpAddr,
    os::{fd::AsFd as _, unix::fs::MetadataExt as _},
    path::PathBuf,
};

use aya::{
    Ebpf,
    maps::{MapData, SockHash},
    programs::{
        CgroupAttachMode, CgroupSockopt, SockOps,
        links::{FdLink, PinnedLink},
    },
};
pub use bypass_common::Counters;
use bypass_common::{
    IpKey, SockKey,
    names::{
        MAP_CONNECTORS, MAP_CONTROL, MAP_CUT, MAP_EXCLUDED_ADDRS, MAP_LINKS, MAP_NETNS_OWNERS,
        MAP_POD_ADDRS, MAP_POD_CIDRS, MAP_POD_COUNTS, MAP_POD_NETNS, MAP_SERVICE_BACKENDS,
        MAP_SERVICE_CIDRS, MAP_SKIP_PORTS, MAP_SOCKETS, MAP_STATS, PIN_LINK_SOCKOPS,
        PIN_LINK_SOCKOPT, PROG_SOCKOPS, PROG_SOCKOPT,
    },
};
pub use fs::{
    ensure_bpffs, ensure_pin_dir_not_mount_root, find_cgroup2_mount, find_host_cgroup2, find_mount,
};
pub use heartbeat::{DEFAULT_TTL_SECS as DEFAULT_HEARTBEAT_SECS, remaining as heartbeat_remaining};
pub use host::{kernel_release, netns_cookie, tcp_rmem_max};
pub use maps::{Identity, Pairings, PinnedView, PodMaps, count_keys as count_sockets};
pub use pins::PinLayout;
pub use plan::{HostFacts, ReadGuard};
use tracing::{info, warn};

use crate::error::AgentError;

/// What to load and where.
#[derive(Debug, Clone)]
pub struct Config {
    /// bpffs directory for the pins.
    pub pin_dir: PathBuf,
    /// cgroup v2 directory for sock_ops.
    pub cgroup: PathBuf,
    /// SockHash capacity (the socket address map gets the same).
    pub max_sockets: u32,
    /// Bound on a peer's ingress queue (bytes redirected to it and not read yet) past
    /// which sends take the TCP path until the peer has read everything; 0: no bound.
    pub max_queued_bytes: u32,
    /// Size under which a stream of sends takes the TCP path; 0: never.
    pub small_stream_bytes: u32,
    /// Reload even when the pinned datapath is this build (drops nothing: sockets in
    /// the old map keep it until they close).
    pub reset: bool,
    /// Bypass even where no read guard can run ([`plan::ReadGuard::Watch`]).
    pub allow_unguarded: bool,
    /// On drop, detach and remove the pins. Off, the datapath stays pinned and
    /// attached for the next agent to adopt.
    pub detach_on_exit: bool,
    /// Ports whose connections are left alone.
    pub skip_ports: std::collections::BTreeSet<u16>,
    /// Seconds the heartbeat runs ahead: that long after the agent stops beating,
    /// sock_ops inserts nothing new.
    pub heartbeat_secs: u32,
    /// Whether a pod address may be used only by the network namespace that owns it
    /// (`--netns-owners=observe`); off, by any namespace but the node's.
    pub netns_owners: bool,
}

/// How the running datapath came to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Loaded now; nothing was pinned.
    Fresh,
    /// The pinned datapath of this same build was adopted: maps, counters and the
    /// attachment carried over, no connection noticed.
    Adopted,
    /// A pinned datapath of another build with the same layout had its programs
    /// replaced by this build's in place: maps, counters, the attachment and every
    /// connection carried over, bypassed.
    Upgraded,
    /// A pinned datapath of another layout (or cgroup, or `--reset`) was released and
    /// this build loaded. Its sockets keep the old programs until they close, and send by
    /// TCP.
    Replaced,
}

/// A pinned datapath. Dropping it detaches and removes the pins when
/// [`Config::detach_on_exit`] is set.
pub struct Datapath {
    // Field order is drop order.
    sockops_link: Option<PinnedLink>,
    sockopt_link: Option<PinnedLink>,
    _heartbeat: heartbeat::Beater,
    _pressure: Option<pressure::Watcher>,
    _leaver: leaver::Leaver,
    pairings: Pairings,
    pod_maps: PodMaps,
    owners: maps::OwnerMap,
    pod_counts: maps::PodCountsMap,
    control: maps::Control,
    stats: maps::Stats,
    sockets: SockHash<MapData, SockKey>,
    sockops: SockOps,
    sockopt: CgroupSockopt,
    pins: PinLayout,
    cgroup: File,
    cgroup_path: PathBuf,
    origin: Origin,
    detach_on_exit: bool,
    netns_owners: bool,
    /// Cuts the cut map could not hold, made as cuts of everything, not yet taken.
    cuts_of_everything: u64,
    /// The namespaces that owned an address until the owners map gave it to another
    /// or to none, kept until a cut of the address holds: that cut finds their loopback
    /// links though neither the owners map nor the datapath's record of pod namespaces
    /// (`BYPASS_POD_NETNS`, an LRU) names them any more.
    former_owners: BTreeMap<IpAddr, BTreeSet<u64>>,
    /// Why the bypass is refused on this host, if it is.
    refused: Option<Refusal>,
    /// What the kernel self-test found at this start.
    checks: kernel_check::Verdict,
    // Keeps the sk_msg attachment of a fresh load owned (dropping it detaches).
    _ebpf: Option<Ebpf>,
    _lock: lock::PinDirLock,
}

impl Datapath {
    /// Checks the environment, then adopts the pinned datapath if it is this build on
    /// this cgroup, or loads the embedded object and pins it. A fresh load is not
    /// attached yet: see [`Datapath::attach`]; an adopted one keeps its state.
    pub fn load(config: &Config) -> Result<Self, AgentError> {
        let (cgroup, pins, lock) = prepare(config)?;
        let facts = HostFacts::detect()?;
        // Before anything is adopted or loaded: what this kernel does decides how the
        // datapath is loaded (a pinned one loaded otherwise is replaced). A pinned
        // datapath of this layout recorded this boot's verdict: reused, no tracing program
        // is attached beside its own.
        let recorded = (!config.reset && pins::complete(&pins))
            .then(|| {
                maps::open_pinned(&pins, MAP_CONTROL)
                    .and_then(maps::Control::new)
                    .ok()
            })
            .flatten()
            .and_then(|control| kernel_check::recorded(&control));
        let checks = match recorded {
            Some(verdict) => {
                info!(
                    failed = verdict.failures.len(),
                    "kernel self-test: this boot's result, as the pinned datapath recorded it, reused"
                );
                verdict
            }
            None => kernel_check::run_once_per_boot(&facts, &config.cgroup),
        };
        let facts = facts.with_checks(&checks);
        let identity = identity(config, &cgroup, &facts)?;

        let mut origin = adopt::adopt_or_release(&pins, config, identity)?;
        let ebpf = match origin {
            Origin::Adopted => None,
            Origin::Upgraded => match load::load_in_place(&pins, config, identity, facts) {
                Ok(ebpf) => Some(ebpf),
                Err(e) => {
                    warn!(error = %e, "replacing the pinned datapath's programs in place \
                        failed: releasing it (its connections finish on the TCP path)");
                    origin = adopt::release(&pins, config, true)?;
                    Some(load::load_fresh(&pins, config, identity, facts)?)
                }
            },
            Origin::Fresh | Origin::Replaced => {
                Some(load::load_fresh(&pins, config, identity, facts)?)
            }
        };
        // Whether the pinned state (entries, counters, attachment) carried over.
        let adopt = matches!(origin, Origin::Adopted | Origin::Upgraded);
        load::release_freed_heap();
        let guard = pins::PinGuard::new(pins.clone(), !adopt);
        let sockets: SockHash<MapData, SockKey> = maps::open_pinned(&pins, MAP_SOCKETS)?;
        let pod_maps = open_pod_maps(&pins)?;
        // Every start (adopting too) writes the skip list asked for.
        maps::SkipPorts::new(maps::open_pinned(&pins, MAP_SKIP_PORTS)?)?.set(&config.skip_ports)?;
        let stats = maps::Stats::new(maps::open_pinned(&pins, MAP_STATS)?)?;
        let pressure = watch_pressure(&pins, config.max_sockets)?;
        let mut control = maps::Control::new(maps::open_pinned(&pins, MAP_CONTROL)?)?;
        let pairings = open_pairings(&pins)?;
        write_limits(&mut control, config)?;
        write_owner_rule(&mut control, &pins, config, adopt)?;
        let owners = maps::OwnerMap::new(maps::open_pinned(&pins, MAP_NETNS_OWNERS)?)?;
        let pod_counts = maps::PodCountsMap::new(maps::open_pinned(&pins, MAP_POD_COUNTS)?)?;
        let refused = write_refusal(&mut control, config, &checks)?;
        let leaver = leaver::Leaver::start(&pins)?;
        let (sockops, sockopt) = open_programs(&pins)?;
        let (sockops_link, sockopt_link) = if adopt {
            pinned_links(&pins)
        } else {
            (None, None)
        };
        // Before anything is attached: sock_ops inserts only under a live heartbeat.
        let beater = heartbeat::Beater::start(
            maps::Control::new(maps::open_pinned(&pins, MAP_CONTROL)?)?,
            config.heartbeat_secs,
        )?;
        guard.disarm();
        info!(pin_dir = %config.pin_dir.display(), ?origin, attached = sockops_link.is_some(),
            max_sockets = config.max_sockets, max_queued_bytes = config.max_queued_bytes,
            small_stream_bytes = config.small_stream_bytes,
            kernel = %host::kernel_release(), "datapath ready");
        Ok(Self {
            sockops_link,
            sockopt_link,
            _heartbeat: beater,
            _pressure: pressure,
            _leaver: leaver,
            pairings,
            pod_maps,
            owners,
            pod_counts,
            control,
            stats,
            sockets,
            sockops,
            sockopt,
            pins,
            cgroup,
            cgroup_path: config.cgroup.clone(),
            origin,
            detach_on_exit: config.detach_on_exit,
            netns_owners: config.netns_owners,
            cuts_of_everything: 0,
            former_owners: BTreeMap::new(),
            refused,
            checks,
            _ebpf: ebpf,
            _lock: lock,
        })
    }

    /// Turns the bypass on: entries of sockets that closed while sock_ops was detached
    /// swept, the setsockopt hook attached (before any socket can be inserted), redirects
    /// allowed, then sock_ops attached to the cgroup (in that order, so no socket is
    /// inserted while redirects are still off).
    pub fn attach(&mut self) -> Result<(), AgentError> {
        if let Some(refusal) = self.refused.clone() {
            if self.sockops_link.is_some() {
                // Adopted from an agent that allowed it: this one does not.
                self.detach()?;
            }
            tracing::error!(reason = refusal.why, "not bypassing this node");
            return Ok(());
        }
        if self.sockops_link.is_some() {
            return self.control.set_enabled(true);
        }
        // Sockets that closed while sock_ops was detached left their pairing entries.
        let swept = self.pairings.sweep(&self.sockets, &mut self.pod_counts)?;
        if swept > 0 {
            info!(
                swept,
                "removed pairing entries of sockets that closed while detached"
            );
        }
        if self.sockopt_link.is_none() {
            let prog = self
                .sockopt
                .fd()
                .map_err(|e| AgentError::load(PROG_SOCKOPT, e))?;
            self.sockopt_link = Some(rawlink::create_pinned(
                prog.as_fd(),
                self.cgroup.as_fd(),
                rawlink::BPF_CGROUP_SETSOCKOPT,
                &self.pins.link(PIN_LINK_SOCKOPT),
            )?);
        }
        self.control.set_enabled(true)?;
        // On kernels >= 5.7 this is a bpf_link, which the kernel always attaches in
        // multi mode (kernel/bpf/cgroup.c), so other sock_ops programs keep running.
        let id = self
            .sockops
            .attach(&self.cgroup, CgroupAttachMode::Single)
            .map_err(|e| self.attach_err(PROG_SOCKOPS, e))?;
        let link = self
            .sockops
            .take_link(id)
            .map_err(|e| AgentError::link(PROG_SOCKOPS, e))?;
        let link: FdLink = link
            .try_into()
            .map_err(|e: aya::programs::links::LinkError| AgentError::link(PROG_SOCKOPS, e))?;
        self.sockops_link = Some(pin_link(link, &self.pins.link(PIN_LINK_SOCKOPS))?);
        info!(cgroup = %self.cgroup_path.display(), "bypass attached");
        Ok(())
    }

    fn attach_err(&self, prog: &str, e: impl Into<crate::error::BoxError>) -> AgentError {
        AgentError::attach(
            prog,
            format_args!("cgroup {}", self.cgroup_path.display()),
            e,
        )
    }

    /// Turns the bypass off without losing a byte: every send takes the TCP path from
    /// now on (a peer reads what was already redirected to it first), and no new socket
    /// is inserted. Sockets already in the map stay until they close, and so does the
    /// setsockopt hook that keeps upper-layer protocols off them.
    /// The log line says how many bytes were redirected in all, read once redirects are
    /// off (`redirected_bytes`): what a sender sends from then on goes by TCP.
    pub fn detach(&mut self) -> Result<(), AgentError> {
        self.control.set_enabled(false)?;
        if let Some(link) = self.sockops_link.take() {
            let link = link.unpin().map_err(|e| AgentError::Io {
                action: "unpin",
                path: self.pins.link(PIN_LINK_SOCKOPS),
                source: e,
            })?;
            drop(link);
            let redirected = self.counters().map(|c| c.redirected_bytes).ok();
            info!(
                cgroup = %self.cgroup_path.display(),
                redirected_bytes = redirected,
                "bypass detached"
            );
        }
        Ok(())
    }

    /// The guarantees the loaded programs give on this kernel.
    pub fn features(&self) -> bypass_common::status::Features {
        let bits = self.control.features().unwrap_or(0);
        bypass_common::status::Features::from_checks(
            self.checks.results,
            self.sockopt_link.is_some(),
            bits & bypass_common::layout::features::GUARD_ATTACH != 0,
            bits,
            self.control.max_queued().unwrap_or(0),
        )
    }

    /// On drop, detach and remove the pins whatever `--detach-on-exit` said (the
    /// agent's DaemonSet is gone: nothing will adopt them).
    pub fn remove_on_exit(&mut self) {
        self.detach_on_exit = true;
    }

    /// Why this agent does not bypass the node at all (a kernel without a read guard or
    /// failing its self-test, no `--allow-unguarded`), if it does not.
    pub fn refused(&self) -> Option<&Refusal> {
        self.refused.as_ref()
    }

    /// What the kernel self-test found at this start.
    pub fn kernel_checks(&self) -> &kernel_check::Verdict {
        &self.checks
    }

    /// Whether sock_ops is attached and redirects are allowed.
    pub fn is_attached(&self) -> bool {
        self.sockops_link.is_some() && self.control.enabled().unwrap_or(false)
    }

    /// How this datapath came to be.
    pub fn origin(&self) -> Origin {
        self.origin
    }

    /// The address maps, to fill.
    pub fn pod_maps(&mut self) -> &mut PodMaps {
        &mut self.pod_maps
    }

    /// Cuts the connections that touch `excluded` addresses (see [`Pairings::cut`]):
    /// newly opted-out pods' established connections take TCP at their next send and
    /// leave the SockHash. Where the cut map cannot hold the cut (full), every
    /// connection is cut instead (counted, [`Datapath::take_cuts_of_everything`]):
    /// a cut never fails because of what other pods' connections hold. Returns how many
    /// connections the cut matched (0 for a cut of everything).
    ///
    /// A pod's namespace is found by its address in the owners map, in the datapath's
    /// record, or among the namespaces that owned the address before (kept until this
    /// cut holds).
    pub fn cut_links(&mut self, excluded: &BTreeSet<IpAddr>) -> Result<usize, AgentError> {
        if excluded.is_empty() {
            return Ok(0);
        }
        // What the caller took from the pods (owners, pod addresses) is written before
        // the walk below reads the links: sock_ops, having inserted a link the walk does
        // not see, reads that state again after its own fence and cuts the link itself.
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        let pod_netns: aya::maps::HashMap<MapData, u64, IpKey> =
            maps::open_pinned(&self.pins, MAP_POD_NETNS)?;
        let owners: Vec<(IpAddr, u64)> = self
            .owners
            .list()
            .into_iter()
            .chain(excluded.iter().flat_map(|ip| {
                self.former_owners
                    .get(ip)
                    .into_iter()
                    .flatten()
                    .map(|netns| (*ip, *netns))
            }))
            .collect();
        let generations = self.control.cut_generations()?;
        let cut = self
            .pairings
            .cut(excluded, &pod_netns, &owners, generations)?;
        let cut = self.hold_cut(cut, &format!("{excluded:?}"))?;
        // The former owners' links are cut (or everything is): they are no longer
        // needed. Kept when the cut fails, for its retry.
        self.former_owners.retain(|ip, _| !excluded.contains(ip));
        Ok(cut)
    }

    /// Cuts every link not cut already one of whose sides no longer stands where
    /// sock_ops paired it, whatever the history: what an earlier agent wrote into the
    /// maps and had not cut when it stopped (killed, upgraded in place, its cut failing
    /// until then) is cut all the same. With the ownership check on
    /// (`--netns-owners=observe`), [`maps::side_stands`]: `is_pod`, the pod maps'
    /// judgement now, the owners map, the datapath's record of pod namespaces; with it
    /// off, [`maps::side_is_pod`]: `is_pod` and that record alone. As
    /// [`Datapath::cut_links`], a full cut map cuts everything. Returns how many
    /// connections it cut.
    pub fn cut_links_astray(
        &mut self,
        is_pod: &dyn Fn(IpAddr) -> bool,
    ) -> Result<usize, AgentError> {
        let pod_netns: aya::maps::HashMap<MapData, u64, IpKey> =
            maps::open_pinned(&self.pins, MAP_POD_NETNS)?;
        let learned: std::collections::HashMap<u64, IpAddr> = pod_netns
            .iter()
            .filter_map(Result::ok)
            .map(|(netns, ip)| (netns, bypass_common::addr::ip_from_key(ip).to_canonical()))
            .collect();
        let generations = self.control.cut_generations()?;
        let cut = if self.netns_owners {
            let owners = self.owners.list();
            let owning = maps::owning_namespaces(&owners, is_pod);
            self.pairings.cut_astray(
                |side| maps::side_stands(side, is_pod, &owners, &learned, &owning),
                generations,
            )?
        } else {
            self.pairings.cut_astray(
                |side| maps::side_is_pod(side, is_pod, &learned),
                generations,
            )?
        };
        self.hold_cut(cut, "links astray")
    }

    /// Makes a cut the pairing maps took hold: the cut generation moves (nothing
    /// matched: nothing to do); a full cut map cuts everything instead, counted and
    /// logged with `what` was cut.
    fn hold_cut(&mut self, cut: maps::CutMap, what: &str) -> Result<usize, AgentError> {
        Ok(match cut {
            maps::CutMap::Held(0) => 0,
            maps::CutMap::Held(cut) => {
                self.control.bump_cut_generation()?;
                cut
            }
            maps::CutMap::Full(e) => {
                self.control.cut_everything()?;
                self.cuts_of_everything += 1;
                warn!(error = %e, cut = what,
                    "the cut map could not hold this cut: every bypassed connection on the node was cut instead (they continue on TCP)");
                0
            }
        })
    }

    /// Cuts of everything made since the last call (the cut map was full).
    pub fn take_cuts_of_everything(&mut self) -> u64 {
        std::mem::take(&mut self.cuts_of_everything)
    }

    /// Whether a pod address may be used only by the namespace that owns it.
    pub fn netns_owners(&self) -> bool {
        self.netns_owners
    }

    /// The owners of pod addresses recorded now.
    pub fn owners(&self) -> std::collections::BTreeMap<IpAddr, u64> {
        self.owners.list()
    }

    /// Removes the per-pod counts of network namespaces not in `keep` (those alive or
    /// owning a pod address now): their pods are gone. An entry a late close adds again
    /// for such a namespace goes at the next call.
    pub fn prune_pod_counts(&mut self, keep: &BTreeSet<u64>) -> Result<usize, AgentError> {
        self.pod_counts.prune(keep)
    }

    /// Writes `plan` into the owners map: every entry is tried; the first failure is
    /// returned after. The caller cuts the connections of the addresses it lost.
    ///
    /// A namespace that lost its address is remembered as its former owner until a cut
    /// of the address holds ([`Datapath::cut_links`]). (Its new loopback connections
    /// are not a pod's from the owners write on: the datapath bypasses loopback only in
    /// a namespace that owns the pod address it learned there.)
    pub fn write_owners(&mut self, plan: &crate::owners::OwnerPlan) -> Result<(), AgentError> {
        let mut first = None;
        for (ip, netns) in &plan.lost {
            self.former_owners.entry(*ip).or_default().insert(*netns);
        }
        for ip in &plan.remove {
            if let Err(e) = self.owners.remove(*ip) {
                first.get_or_insert(e);
            }
        }
        for (ip, netns) in &plan.set {
            if let Err(e) = self.owners.set(*ip, *netns) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// The agent's own state word (kept across restarts).
    pub fn agent_state(&self) -> Result<u32, AgentError> {
        self.control.agent_state()
    }

    /// Sets the agent's own state word.
    pub fn set_agent_state(&mut self, v: u32) -> Result<(), AgentError> {
        self.control.set_agent_state(v)
    }

    /// The fingerprint of the NetworkPolicies whose changes an agent has cut
    /// (`control::SLOT_POLICIES`; 0: none recorded).
    pub fn policies_record(&self) -> Result<u32, AgentError> {
        self.control.policies()
    }

    /// Records the fingerprint of the NetworkPolicies whose changes are cut.
    pub fn set_policies_record(&mut self, fingerprint: u32) -> Result<(), AgentError> {
        self.control.set_policies(fingerprint)
    }

    /// Counters summed over CPUs.
    pub fn counters(&self) -> Result<Counters, AgentError> {
        self.stats.read()
    }

    /// Sockets in the SockHash now.
    pub fn socket_count(&self) -> usize {
        maps::count_keys(&self.sockets)
    }

    /// Where the pins are.
    pub fn pins(&self) -> &PinLayout {
        &self.pins
    }
}

/// Why a kernel without a read guard is not bypassed unless allowed.
pub const REFUSED_UNGUARDED: &str = "no read guard on this kernel (it refuses BPF trampoline \
    programs): a program that reads a bypassed socket with splice(2) (Go's io.Copy between \
    connections, HAProxy's splice options) could miss redirected bytes; pass \
    --allow-unguarded to bypass anyway, where no workload splices";

/// Why a pinned datapath refuses to bypass, for a reader of its maps (`status`): the
/// checks its agent's self-test failed, else the missing read guard. The agent's own
/// line says what each failed check saw.
pub fn refusal_from_results(results: bypass_common::checks::Results) -> Refusal {
    let failed: Vec<&str> = results.failed().map(|c| c.name).collect();
    if failed.is_empty() {
        return Refusal::unguarded();
    }
    Refusal::new(
        RefusalKind::SelfTest,
        format!(
            "kernel {} fails the self-test: {} (the agent's log says what each saw; \
             `bypass-agent probe` runs it again)",
            host::kernel_release(),
            failed.join(", ")
        ),
    )
}

/// Why an agent refuses to bypass its node: its kind, which `bypass_refused{reason}`
/// counts, and the sentence the log and `/readyz` say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// What kind of refusal.
    pub kind: RefusalKind,
    /// What the operator reads: the cause and the fix.
    pub why: String,
}

impl Refusal {
    /// A refusal of `kind` for `why`.
    pub fn new(kind: RefusalKind, why: impl Into<String>) -> Self {
        let why = why.into();
        Self { kind, why }
    }

    /// The kernel has no read guard and `--allow-unguarded` was not given.
    pub fn unguarded() -> Self {
        Self::new(RefusalKind::NoReadGuard, REFUSED_UNGUARDED)
    }
}

/// The kinds of [`Refusal`], named as `bypass_refused`'s `reason` label names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefusalKind {
    /// The kernel lacks what the datapath needs: nothing is loaded.
    KernelFeatures,
    /// The kernel fails a check of the self-test.
    SelfTest,
    /// No read guard (the kernel refuses BPF trampolines), no `--allow-unguarded`.
    NoReadGuard,
}

impl RefusalKind {
    /// Every kind, in the order `/metrics` lists them.
    pub const ALL: [Self; 3] = [Self::KernelFeatures, Self::SelfTest, Self::NoReadGuard];

    /// Its `reason` label.
    pub const fn label(self) -> &'static str {
        match self {
            Self::KernelFeatures => "kernel_features",
            Self::SelfTest => "self_test",
            Self::NoReadGuard => "no_read_guard",
        }
    }
}

/// Step of [`Datapath::load`]: checks the kernel and the pin directory, opens the
/// cgroup, and takes the pin directory's lock.
fn prepare(config: &Config) -> Result<(File, PinLayout, lock::PinDirLock), AgentError> {
    fs::ensure_pin_dir_not_mount_root(&config.pin_dir)?;
    preflight::check(&host::kernel_release())?;
    let cgroup = fs::open_cgroup2_dir(&config.cgroup)?;
    fs::ensure_bpffs(&config.pin_dir)?;
    let pins = PinLayout::new(&config.pin_dir);
    let lock = lock::PinDirLock::acquire(&config.pin_dir)?;
    Ok((cgroup, pins, lock))
}

/// Step of [`Datapath::load`]: what a pinned datapath must match to be adopted, this
/// build loaded with this host's `facts` on this cgroup.
fn identity(config: &Config, cgroup: &File, facts: &HostFacts) -> Result<Identity, AgentError> {
    Ok(Identity {
        object: object::fingerprint() ^ facts.digest(),
        cgroup: cgroup
            .metadata()
            .map_err(|source| AgentError::Io {
                action: "stat",
                path: config.cgroup.clone(),
                source,
            })?
            .ino(),
    })
}

/// Step of [`Datapath::load`]: the pinned address maps.
fn open_pod_maps(pins: &PinLayout) -> Result<PodMaps, AgentError> {
    PodMaps::new(
        maps::open_pinned(pins, MAP_POD_CIDRS)?,
        maps::open_pinned(pins, MAP_POD_ADDRS)?,
        maps::open_pinned(pins, MAP_EXCLUDED_ADDRS)?,
        maps::open_pinned(pins, MAP_SERVICE_CIDRS)?,
        maps::open_pinned(pins, MAP_SERVICE_BACKENDS)?,
    )
}

/// Step of [`Datapath::load`]: the pinned pairing maps (connectors, links, cut).
fn open_pairings(pins: &PinLayout) -> Result<Pairings, AgentError> {
    Pairings::new(
        maps::open_pinned(pins, MAP_CONNECTORS)?,
        maps::open_pinned(pins, MAP_LINKS)?,
        maps::open_pinned(pins, MAP_CUT)?,
    )
}

/// Step of [`Datapath::load`]: the thread that warns of full maps, if it starts (a
/// failure to start it is logged, not returned).
fn watch_pressure(
    pins: &PinLayout,
    max_sockets: u32,
) -> Result<Option<pressure::Watcher>, AgentError> {
    // Full maps are only visible as a growing counter: a thread watches it.
    let map = maps::open_pinned(pins, MAP_STATS)?;
    Ok(maps::Stats::new(map)
        .and_then(|s| {
            pressure::Watcher::start(s, max_sockets).map_err(|source| AgentError::Io {
                action: "start the map pressure thread",
                path: pins.map(MAP_STATS),
                source,
            })
        })
        .inspect_err(|e| warn!(error = %e, "no warnings about full maps"))
        .ok())
}

/// Step of [`Datapath::load`]: the bound on queued bytes, the small-stream size, the
/// leave delay and the TCP memory threshold ([`tcp_mem`]) into the control map.
fn write_limits(control: &mut maps::Control, config: &Config) -> Result<(), AgentError> {
    // Every start (adopting too) writes the bound and the small-stream size asked
    // for.
    let max_queued = config.max_queued_bytes;
    if max_queued == 0 {
        warn!(
            "--max-queued-bytes 0: no bound on what waits for a reader; a peer that stops \
             reading lets its sender queue kernel memory (the kernel charges the ingress \
             queue to no socket buffer)"
        );
    }
    control.set_max_queued(max_queued)?;
    control.set_small_stream(config.small_stream_bytes)?;
    control.set_leave_after(bypass_common::names::DEFAULT_LEAVE_AFTER)?;
    if let Err(e) = tcp_mem::refresh(control) {
        warn!(
            error = %e,
            "sends redirect whatever the node's TCP memory: near tcp_mem's limit the \
             kernel may then fail a bypassed send with ENOMEM"
        );
    }
    Ok(())
}

/// Step of [`Datapath::load`]: whether a pod address may be used only by the namespace
/// that owns it, into the control map; switched on over an adopted datapath, it first
/// cuts every bypassed connection.
fn write_owner_rule(
    control: &mut maps::Control,
    pins: &PinLayout,
    config: &Config,
    adopt: bool,
) -> Result<(), AgentError> {
    // Connections paired while any namespace could use a pod address may have been
    // paired with one that does not own it: switching the rule on cuts them all
    // (they finish on TCP).
    let cut = adopt && config.netns_owners && control.owners_off()?;
    // The rule first: a socket inserted before the cut is paired under it, or cut.
    control.set_owners_off(!config.netns_owners)?;
    if cut {
        let (_, links) = open_pairings(pins)?.len();
        control.cut_everything()?;
        info!(
            connections = links,
            "--netns-owners=observe after any: every bypassed connection cut"
        );
    }
    Ok(())
}

/// Step of [`Datapath::load`]: why this agent refuses to bypass the node, if it does,
/// also written into the control map with the self-test's results.
fn write_refusal(
    control: &mut maps::Control,
    config: &Config,
    checks: &kernel_check::Verdict,
) -> Result<Option<Refusal>, AgentError> {
    // What the pinned programs were loaded with (an adopted datapath: the previous
    // agent's load, same build and same host, so the same facts).
    let unguarded = control.features()? & bypass_common::layout::features::NO_READ_GUARD != 0;
    let refused = checks
        .refusal(&host::kernel_release(), config.allow_unguarded)
        .map(|why| Refusal::new(RefusalKind::SelfTest, why))
        .or_else(|| (unguarded && !config.allow_unguarded).then(Refusal::unguarded));
    control.set_refused(refused.is_some())?;
    control.set_checks(checks.results)?;
    Ok(refused)
}

/// Step of [`Datapath::load`]: the pinned sock_ops and setsockopt programs.
fn open_programs(pins: &PinLayout) -> Result<(SockOps, CgroupSockopt), AgentError> {
    let err = |name: &str, e| AgentError::bpf(format!("open pinned program {name}"), e);
    let sockops = SockOps::from_pin(pins.prog(PROG_SOCKOPS)).map_err(|e| err(PROG_SOCKOPS, e))?;
    let sockopt = CgroupSockopt::from_pin(
        pins.prog(PROG_SOCKOPT),
        aya::programs::CgroupSockoptAttachType::Set,
    )
    .map_err(|e| err(PROG_SOCKOPT, e))?;
    Ok((sockops, sockopt))
}

/// Step of [`Datapath::load`] when adopting: the pinned sock_ops and setsockopt links,
/// those that are there.
fn pinned_links(pins: &PinLayout) -> (Option<PinnedLink>, Option<PinnedLink>) {
    (
        PinnedLink::from_pin(pins.link(PIN_LINK_SOCKOPS)).ok(),
        PinnedLink::from_pin(pins.link(PIN_LINK_SOCKOPT)).ok(),
    )
}

/// Pins `link` at `path`.
fn pin_link(link: FdLink, path: &std::path::Path) -> Result<PinnedLink, AgentError> {
    link.pin(path)
        .map_err(|e| AgentError::pin("the link", path, e))
}

impl Drop for Datapath {
    fn drop(&mut self) {
        if !self.detach_on_exit {
            // A fresh load's sk_msg attachment to the SockHash is owned by the loader
            // (aya detaches it when that is dropped): the next agent adopts the
            // datapath with it, so it is not dropped (the process exits next).
            std::mem::forget(self._ebpf.take());
            info!(pin_dir = %self.pins.root().display(),
                "leaving the datapath pinned and attached for the next agent");
            return;
        }
        if let Err(e) = self.detach() {
            warn!(error = %e, "detach on shutdown");
        }
        // Releasing a trampoline link (the read guard's) waits for an RCU tasks grace
        // period, one link after another (kernel/trace/ftrace.c, ftrace_shutdown under
        // direct_mutex): seconds on a busy node, so the line says how long it took.
        let started = std::time::Instant::now();
        match pins::remove_all(&self.pins) {
            Ok(removed) => info!(
                pins = removed.len(),
                millis = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                "removed pins"
            ),
            Err(e) => warn!(error = %e, "removing pins on shutdown"),
        }
    }
}

/// `bypass-agent uninstall`: turns redirects off (sockets already bypassed send by TCP
/// from now on, after what they queued, as on detach), then removes every pin under
/// `root`: the sock_ops link first, which detaches it, then programs and maps. Refuses
/// while an agent runs there, and at a mount's root (other tools' pins live there).
/// Returns what was removed.
pub fn uninstall(root: &std::path::Path) -> Result<Vec<PathBuf>, AgentError> {
    fs::ensure_pin_dir_not_mount_root(root)?;
    if !root.exists() {
        return Ok(Vec::new());
    }
    let lock = lock::PinDirLock::acquire(root)?;
    let layout = PinLayout::new(root);
    if layout.map(MAP_CONTROL).exists() {
        let mut control = maps::Control::new(maps::open_pinned(&layout, MAP_CONTROL)?)?;
        control.set_enabled(false)?;
        info!(pin_dir = %root.display(), "redirects off: bypassed sockets continue by TCP");
    }
    let removed = pins::remove_all(&layout)?;
    drop(lock);
    Ok(removed)
}
