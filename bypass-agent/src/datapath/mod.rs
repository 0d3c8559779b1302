//! The kernel side as the agent sees it: load the embedded object or adopt a pinned
//! one, attach and detach, and typed views over the maps. Nothing here decides *what*
//! goes into the address maps; callers do.

mod btf;
mod fs;
mod lock;
mod maps;
mod object;
mod pins;
mod pressure;

use std::{fs::File, os::unix::fs::MetadataExt as _, path::PathBuf};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Map, MapData, SockHash},
    programs::{
        CgroupAttachMode, SkMsg, SockOps,
        links::{FdLink, PinnedLink},
    },
};
use bypass_common::{
    KernelLayout, SockKey,
    names::{
        MAP_CONNECTORS, MAP_CONTROL, MAP_PAIRS, MAP_POD_ADDRS, MAP_POD_CIDRS, MAP_SERVICE_CIDRS,
        MAP_SKIP_PORTS, MAP_SOCK_ADDRS, MAP_SOCKETS, MAP_STATS, PIN_LINK_SOCKOPS, PINNED_MAPS,
        PROG_SKMSG, PROG_SOCKOPS,
    },
};
pub use fs::find_cgroup2_mount;
pub use maps::{Counters, Identity, PinnedView, PodMaps, SockAddrs, count_keys as count_sockets};
pub use pins::PinLayout;
use tracing::{info, warn};

use crate::error::{AgentError, chain};

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
    /// Reload even when the pinned datapath is this build (drops nothing: sockets in
    /// the old map keep it until they close).
    pub reset: bool,
    /// On drop, detach and remove the pins. Off, the datapath stays pinned and
    /// attached for the next agent to adopt.
    pub detach_on_exit: bool,
    /// Ports whose connections are left alone.
    pub skip_ports: std::collections::BTreeSet<u16>,
}

/// How the running datapath came to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Loaded now; nothing was pinned.
    Fresh,
    /// The pinned datapath of this same build was adopted: maps, counters and the
    /// attachment carried over, no connection noticed.
    Adopted,
    /// A pinned datapath of another build (or cgroup, or `--reset`) was released and
    /// this build loaded. Its sockets keep the old programs until they close.
    Replaced,
}

/// A pinned datapath. Dropping it detaches and removes the pins when
/// [`Config::detach_on_exit`] is set.
pub struct Datapath {
    // Field order is drop order.
    sockops_link: Option<PinnedLink>,
    _pressure: Option<pressure::Watcher>,
    addrs: Option<SockAddrs>,
    pod_maps: PodMaps,
    control: maps::Control,
    stats: maps::Stats,
    sockets: SockHash<MapData, SockKey>,
    sockops: SockOps,
    pins: PinLayout,
    cgroup: File,
    cgroup_path: PathBuf,
    origin: Origin,
    detach_on_exit: bool,
    // Keeps the sk_msg attachment of a fresh load owned (dropping it detaches).
    _ebpf: Option<Ebpf>,
    _lock: lock::PinDirLock,
}

impl Datapath {
    /// Checks the environment, then adopts the pinned datapath if it is this build on
    /// this cgroup, or loads the embedded object and pins it. A fresh load is not
    /// attached yet: see [`Datapath::attach`]; an adopted one keeps its state.
    pub fn load(config: &Config) -> Result<Self, AgentError> {
        let cgroup = fs::open_cgroup2_dir(&config.cgroup)?;
        let identity = Identity {
            object: object::fingerprint(),
            cgroup: cgroup
                .metadata()
                .map_err(|source| AgentError::Io {
                    action: "stat",
                    path: config.cgroup.clone(),
                    source,
                })?
                .ino(),
        };
        fs::ensure_bpffs(&config.pin_dir)?;
        let pins = PinLayout::new(&config.pin_dir);
        let lock = lock::PinDirLock::acquire(&config.pin_dir)?;

        let pinned = pins::complete(&pins);
        let adopt = pinned && !config.reset && pinned_identity(&pins) == Some(identity);
        let origin = if adopt {
            Origin::Adopted
        } else {
            let stale = pins::remove_stale(&pins)?;
            if !stale.is_empty() {
                info!(pin_dir = %config.pin_dir.display(), removed = stale.len(), reset = config.reset,
                    "released a pinned datapath of another build, cgroup or an interrupted start; \
                     its connections keep it until they close");
            }
            if pinned {
                Origin::Replaced
            } else {
                Origin::Fresh
            }
        };

        let ebpf = if adopt {
            None
        } else {
            Some(load_fresh(&pins, config, identity)?)
        };
        let guard = pins::PinGuard::new(pins.clone(), !adopt);
        let sockets: SockHash<MapData, SockKey> =
            SockHash::try_from(maps::open_pinned(&pins, MAP_SOCKETS)?)
                .map_err(|e| AgentError::bpf(format!("open map {MAP_SOCKETS}"), &e))?;
        let pod_maps = PodMaps::new(
            maps::open_pinned(&pins, MAP_POD_CIDRS)?,
            maps::open_pinned(&pins, MAP_POD_ADDRS)?,
            maps::open_pinned(&pins, MAP_SERVICE_CIDRS)?,
        )?;
        // Every start (adopting too) writes the skip list asked for.
        maps::SkipPorts::new(maps::open_pinned(&pins, MAP_SKIP_PORTS)?)?.set(&config.skip_ports)?;
        let stats = maps::Stats::new(maps::open_pinned(&pins, MAP_STATS)?)?;
        // Full maps are only visible as a growing counter: a thread watches it.
        let pressure = maps::Stats::new(maps::open_pinned(&pins, MAP_STATS)?)
            .and_then(|s| {
                pressure::Watcher::start(s, config.max_sockets).map_err(|source| AgentError::Io {
                    action: "start the map pressure thread",
                    path: pins.map(MAP_STATS),
                    source,
                })
            })
            .inspect_err(|e| warn!(error = %e, "no warnings about full maps"))
            .ok();
        let mut control = maps::Control::new(maps::open_pinned(&pins, MAP_CONTROL)?)?;
        let addrs = SockAddrs::new(maps::open_pinned(&pins, MAP_SOCK_ADDRS)?)?;
        // Every start (adopting too) writes this kernel's layout and the bound asked for.
        let layout = kernel_layout();
        control.set_layout(&layout)?;
        let max_queued = if layout.can_bound() {
            config.max_queued_bytes
        } else {
            if config.max_queued_bytes != 0 {
                warn!(
                    max_queued_bytes = config.max_queued_bytes,
                    "this kernel's sockmap does not expose its queue length (sk_psock.msg_tot_len): \
                     no bound on queued bytes; a peer that stops reading lets its sender queue memory"
                );
            }
            0
        };
        control.set_max_queued(max_queued)?;
        let sockops = SockOps::from_pin(pins.prog(PROG_SOCKOPS))
            .map_err(|e| AgentError::bpf(format!("open pinned program {PROG_SOCKOPS}"), &e))?;
        let sockops_link = if adopt {
            PinnedLink::from_pin(pins.link(PIN_LINK_SOCKOPS)).ok()
        } else {
            None
        };
        guard.disarm();
        info!(pin_dir = %config.pin_dir.display(), ?origin, attached = sockops_link.is_some(),
            max_sockets = config.max_sockets, max_queued_bytes = max_queued, "datapath ready");
        Ok(Self {
            sockops_link,
            _pressure: pressure,
            addrs: Some(addrs),
            pod_maps,
            control,
            stats,
            sockets,
            sockops,
            pins,
            cgroup,
            cgroup_path: config.cgroup.clone(),
            origin,
            detach_on_exit: config.detach_on_exit,
            _ebpf: ebpf,
            _lock: lock,
        })
    }

    /// Turns the bypass on: redirects allowed, then sock_ops attached to the cgroup (in
    /// that order, so no socket is inserted while redirects are still off).
    pub fn attach(&mut self) -> Result<(), AgentError> {
        self.control.set_enabled(true)?;
        if self.sockops_link.is_some() {
            return Ok(());
        }
        // Sockets that closed while sock_ops was detached left their address entries.
        if let Some(addrs) = &mut self.addrs {
            let swept = addrs.sweep(&self.sockets)?;
            if swept > 0 {
                info!(
                    swept,
                    "removed address entries of sockets that closed while detached"
                );
            }
        }
        let cgroup = &self.cgroup_path;
        // On kernels >= 5.7 this is a bpf_link, which the kernel always attaches in
        // multi mode (kernel/bpf/cgroup.c), so other sock_ops programs keep running.
        let id = self
            .sockops
            .attach(&self.cgroup, CgroupAttachMode::Single)
            .map_err(|e| {
                AgentError::bpf(
                    format!("attach {PROG_SOCKOPS} to cgroup {}", cgroup.display()),
                    &e,
                )
            })?;
        let link = self
            .sockops
            .take_link(id)
            .map_err(|e| AgentError::bpf("take the sock_ops link", &e))?;
        let link: FdLink = link
            .try_into()
            .map_err(|e: aya::programs::links::LinkError| AgentError::bpf("sock_ops link", &e))?;
        let pinned = link
            .pin(self.pins.link(PIN_LINK_SOCKOPS))
            .map_err(|e| AgentError::bpf("pin the sock_ops link", &e))?;
        self.sockops_link = Some(pinned);
        info!(cgroup = %cgroup.display(), "bypass attached");
        Ok(())
    }

    /// Turns the bypass off without losing a byte: every send takes the TCP path from
    /// now on (a peer reads what was already redirected to it first), and no new socket
    /// is inserted. Sockets already in the map stay until they close.
    pub fn detach(&mut self) -> Result<(), AgentError> {
        self.control.set_enabled(false)?;
        if let Some(link) = self.sockops_link.take() {
            let link = link.unpin().map_err(|e| AgentError::Io {
                action: "unpin",
                path: self.pins.link(PIN_LINK_SOCKOPS),
                source: e,
            })?;
            drop(link);
            info!(cgroup = %self.cgroup_path.display(), "bypass detached");
        }
        Ok(())
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

    /// The agent's own state word (kept across restarts).
    pub fn agent_state(&self) -> Result<u32, AgentError> {
        self.control.agent_state()
    }

    /// Sets the agent's own state word.
    pub fn set_agent_state(&mut self, v: u32) -> Result<(), AgentError> {
        self.control.set_agent_state(v)
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

impl Drop for Datapath {
    fn drop(&mut self) {
        if !self.detach_on_exit {
            info!(pin_dir = %self.pins.root().display(),
                "leaving the datapath pinned and attached for the next agent");
            return;
        }
        if let Err(e) = self.detach() {
            warn!(error = %e, "detach on shutdown");
        }
        match pins::remove_all(&self.pins) {
            Ok(removed) => info!(pins = removed.len(), "removed pins"),
            Err(e) => warn!(error = %e, "removing pins on shutdown"),
        }
    }
}

/// `bypass-agent uninstall`: turns redirects off (sockets already bypassed send by TCP
/// from now on, after what they queued, as on detach), then removes every pin under
/// `root`: the sock_ops link first, which detaches it, then programs and maps. Refuses
/// while an agent runs there. Returns what was removed.
pub fn uninstall(root: &std::path::Path) -> Result<Vec<PathBuf>, AgentError> {
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

/// The identity recorded in a pinned control map, if it can be read.
fn pinned_identity(pins: &PinLayout) -> Option<Identity> {
    let control = maps::Control::new(maps::open_pinned(pins, MAP_CONTROL).ok()?).ok()?;
    control.identity().ok()
}

/// Loads the embedded object, attaches sk_msg to the SockHash, pins maps and programs
/// and records the identity. Removes what it pinned if any step fails.
fn load_fresh(pins: &PinLayout, config: &Config, identity: Identity) -> Result<Ebpf, AgentError> {
    raise_memlock();
    let mut ebpf = EbpfLoader::new()
        .map_max_entries(MAP_SOCKETS, config.max_sockets)
        .map_max_entries(MAP_SOCK_ADDRS, config.max_sockets)
        .map_max_entries(MAP_CONNECTORS, config.max_sockets)
        .map_max_entries(MAP_PAIRS, config.max_sockets)
        .load(object::BYTES)
        .map_err(|e| classify_load_error(&e))?;
    let guard = pins::PinGuard::new(pins.clone(), true);
    pins.create_dirs()?;
    for name in PINNED_MAPS.iter().filter(|&&n| n != MAP_CONTROL) {
        pin_map(&ebpf, pins, name)?;
    }
    let mut control = maps::Control::new(take_map(&mut ebpf, MAP_CONTROL)?)?;
    control.set_enabled(false)?;
    control.set_identity(identity)?;

    let sockets: SockHash<&MapData, SockKey> = SockHash::try_from(
        ebpf.map(MAP_SOCKETS)
            .ok_or_else(|| missing("map", MAP_SOCKETS))?,
    )
    .map_err(|e| AgentError::bpf(format!("open map {MAP_SOCKETS}"), &e))?;
    let sockets_fd = sockets
        .fd()
        .try_clone()
        .map_err(|e| AgentError::bpf("dup the SockHash fd", &e))?;
    let skmsg: &mut SkMsg = program(&mut ebpf, PROG_SKMSG)?;
    skmsg
        .load()
        .map_err(|e| AgentError::bpf(format!("load {PROG_SKMSG}"), &e))?;
    skmsg
        .attach(&sockets_fd)
        .map_err(|e| AgentError::bpf(format!("attach {PROG_SKMSG} to {MAP_SOCKETS}"), &e))?;
    skmsg
        .pin(pins.prog(PROG_SKMSG))
        .map_err(|e| AgentError::bpf(format!("pin {PROG_SKMSG}"), &e))?;
    let sockops: &mut SockOps = program(&mut ebpf, PROG_SOCKOPS)?;
    sockops
        .load()
        .map_err(|e| AgentError::bpf(format!("load {PROG_SOCKOPS}"), &e))?;
    sockops
        .pin(pins.prog(PROG_SOCKOPS))
        .map_err(|e| AgentError::bpf(format!("pin {PROG_SOCKOPS}"), &e))?;
    // The control map is pinned last: its pin marks a complete datapath.
    let path = pins.map(MAP_CONTROL);
    control
        .pin(path.as_path())
        .map_err(|e| AgentError::bpf(format!("pin map {MAP_CONTROL} at {}", path.display()), &e))?;
    guard.disarm();
    Ok(ebpf)
}

/// The running kernel's layout of the fields sk_msg reads; what cannot be found stays
/// unknown (0) and turns off what needs it, with a warning.
fn kernel_layout() -> KernelLayout {
    let parsed = std::fs::read(btf::VMLINUX_BTF)
        .map_err(|e| e.to_string())
        .and_then(|bytes| btf::Btf::parse(&bytes).map_err(|e| e.to_string()));
    match parsed {
        Ok(b) => {
            let (layout, missing) = b.kernel_layout();
            for e in &missing {
                warn!(error = %e, "kernel field not found in BTF");
            }
            layout
        }
        Err(e) => {
            warn!(error = %e, path = btf::VMLINUX_BTF,
                "no kernel BTF: no bound on queued bytes, and a socket that once took the TCP path stays there");
            KernelLayout::default()
        }
    }
}

fn missing(kind: &str, name: &str) -> AgentError {
    AgentError::Bpf {
        action: format!("find {kind} {name}"),
        detail: "not in the embedded object (build mismatch: rebuild with `cargo xtask build`)"
            .into(),
    }
}

fn take_map(ebpf: &mut Ebpf, name: &str) -> Result<Map, AgentError> {
    ebpf.take_map(name).ok_or_else(|| missing("map", name))
}

fn pin_map(ebpf: &Ebpf, pins: &PinLayout, name: &str) -> Result<(), AgentError> {
    let path = pins.map(name);
    ebpf.map(name)
        .ok_or_else(|| missing("map", name))?
        .pin(&path)
        .map_err(|e| AgentError::bpf(format!("pin map {name} at {}", path.display()), &e))
}

/// A program of the object, by name and type.
fn program<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T, AgentError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    let prog = ebpf
        .program_mut(name)
        .ok_or_else(|| missing("program", name))?;
    prog.try_into()
        .map_err(|e: aya::programs::ProgramError| AgentError::bpf(format!("program {name}"), &e))
}

/// Kernels >= 5.11 charge BPF memory to the cgroup; older ones need RLIMIT_MEMLOCK.
/// Raising it may be refused (no CAP_SYS_RESOURCE); that is only a warning.
fn raise_memlock() {
    let rlim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: plain syscall with a valid pointer.
    let ret = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &rlim) };
    if ret != 0 {
        warn!(error = %std::io::Error::last_os_error(),
            "could not raise RLIMIT_MEMLOCK; fine on kernels >= 5.11, which charge BPF memory to the cgroup");
    }
}

fn classify_load_error(err: &aya::EbpfError) -> AgentError {
    let text = chain(err);
    if text.contains("EPERM") || text.contains("Operation not permitted") {
        return AgentError::Permission {
            action: "loading the eBPF object".into(),
            source: std::io::Error::from_raw_os_error(libc::EPERM),
        };
    }
    if text.contains(MAP_SOCKETS) {
        return AgentError::KernelSupport {
            what: "create the SockHash map",
            detail: text,
        };
    }
    AgentError::Bpf {
        action: "load the eBPF object".into(),
        detail: text,
    }
}
