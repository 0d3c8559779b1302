//! The kernel side as the agent sees it: load the embedded object, pin its maps,
//! attach and detach, and typed views over the maps. Nothing here decides *what* goes
//! into the maps; callers do.

mod fs;
mod lock;
mod maps;
mod object;
mod pins;

use std::{fs::File, path::PathBuf};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Map, MapData, SockHash},
    programs::{CgroupAttachMode, SkMsg, SockOps, links::{FdLink, PinnedLink}},
};
use bypass_common::{
    SockKey,
    names::{
        MAP_CONTROL, MAP_POD_ADDRS, MAP_POD_CIDRS, MAP_SOCKETS, MAP_STATS, PIN_LINK_SOCKOPS,
        PROG_SKMSG, PROG_SOCKOPS,
    },
};
pub use fs::find_cgroup2_mount;
pub use maps::{Counters, PinnedView, PodMaps, count_keys as count_sockets};
pub use pins::{PinLayout, uninstall};
use tracing::{info, warn};

use crate::error::{AgentError, chain};

/// What to load and where.
#[derive(Debug, Clone)]
pub struct Config {
    /// bpffs directory for the pins.
    pub pin_dir: PathBuf,
    /// cgroup v2 directory for sock_ops.
    pub cgroup: PathBuf,
    /// SockHash capacity.
    pub max_sockets: u32,
}

/// A loaded, pinned datapath. Dropping it detaches and removes every pin it made.
pub struct Datapath {
    // Field order is drop order: unpin before the object goes.
    sockops_link: Option<PinnedLink>,
    pod_maps: PodMaps,
    control: maps::Control,
    stats: maps::Stats,
    sockets: SockHash<MapData, SockKey>,
    pins: PinLayout,
    cgroup: File,
    cgroup_path: PathBuf,
    ebpf: Ebpf,
    _lock: lock::PinDirLock,
}

impl Datapath {
    /// Checks the environment, loads the programs, attaches sk_msg to the SockHash and
    /// pins the maps. sock_ops is not attached yet: see [`Datapath::attach`].
    pub fn load(config: &Config) -> Result<Self, AgentError> {
        let cgroup = fs::open_cgroup2_dir(&config.cgroup)?;
        fs::ensure_bpffs(&config.pin_dir)?;
        let pins = PinLayout::new(&config.pin_dir);
        let lock = lock::PinDirLock::acquire(&config.pin_dir)?;
        let stale = pins::remove_stale(&pins)?;
        if !stale.is_empty() {
            warn!(pin_dir = %config.pin_dir.display(), removed = stale.len(),
                "removed pins left by an agent that did not exit cleanly");
        }
        raise_memlock();

        let mut ebpf = EbpfLoader::new()
            .map_max_entries(MAP_SOCKETS, config.max_sockets)
            .load(object::BYTES)
            .map_err(|e| classify_load_error(&e))?;

        // From here on, failure unwinds through `PinGuard`.
        let guard = pins::PinGuard::new(pins.clone());
        pins.create_dirs()?;
        let sockets: SockHash<MapData, SockKey> =
            SockHash::try_from(take_pinned(&mut ebpf, &pins, MAP_SOCKETS)?)
                .map_err(|e| AgentError::bpf("open the SockHash", &e))?;
        let cidrs = take_pinned(&mut ebpf, &pins, MAP_POD_CIDRS)?;
        let addrs = take_pinned(&mut ebpf, &pins, MAP_POD_ADDRS)?;
        let pod_maps = PodMaps::new(cidrs, addrs)?;
        let stats = maps::Stats::new(take_pinned(&mut ebpf, &pins, MAP_STATS)?)?;
        let mut control = maps::Control::new(take_pinned(&mut ebpf, &pins, MAP_CONTROL)?)?;
        control.set_enabled(false)?;

        let skmsg: &mut SkMsg = program(&mut ebpf, PROG_SKMSG)?;
        skmsg
            .load()
            .map_err(|e| AgentError::bpf(format!("load {PROG_SKMSG}"), &e))?;
        skmsg
            .attach(sockets.fd())
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
        guard.disarm();
        info!(pin_dir = %config.pin_dir.display(), max_sockets = config.max_sockets, "datapath loaded");
        Ok(Self {
            sockops_link: None,
            pod_maps,
            control,
            stats,
            sockets,
            pins,
            cgroup,
            cgroup_path: config.cgroup.clone(),
            ebpf,
            _lock: lock,
        })
    }

    /// Turns the bypass on: redirects allowed, then sock_ops attached to the cgroup (in
    /// that order, so no socket is inserted while redirects are still off).
    pub fn attach(&mut self) -> Result<(), AgentError> {
        if self.sockops_link.is_some() {
            return Ok(());
        }
        self.control.set_enabled(true)?;
        let cgroup = &self.cgroup_path;
        let prog: &mut SockOps = program(&mut self.ebpf, PROG_SOCKOPS)?;
        // On kernels >= 5.7 this is a bpf_link, which the kernel always attaches in
        // multi mode (kernel/bpf/cgroup.c), so other sock_ops programs keep running.
        let id = prog
            .attach(&self.cgroup, CgroupAttachMode::Single)
            .map_err(|e| AgentError::bpf(format!("attach {PROG_SOCKOPS} to cgroup {}", cgroup.display()), &e))?;
        let link = prog
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

    /// Whether sock_ops is attached.
    pub fn is_attached(&self) -> bool {
        self.sockops_link.is_some()
    }

    /// The address maps, to fill.
    pub fn pod_maps(&mut self) -> &mut PodMaps {
        &mut self.pod_maps
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
        if let Err(e) = self.detach() {
            warn!(error = %e, "detach on shutdown");
        }
        match pins::remove_all(&self.pins) {
            Ok(removed) => info!(pins = removed.len(), "removed pins"),
            Err(e) => warn!(error = %e, "removing pins on shutdown"),
        }
    }
}

/// Takes a map out of the object and pins it.
fn take_pinned(ebpf: &mut Ebpf, pins: &PinLayout, name: &str) -> Result<Map, AgentError> {
    let map = ebpf.take_map(name).ok_or_else(|| AgentError::Bpf {
        action: format!("find map {name}"),
        detail: "not in the embedded object (build mismatch: rebuild with `cargo xtask build`)".into(),
    })?;
    map.pin(pins.map(name))
        .map_err(|e| AgentError::bpf(format!("pin map {name} at {}", pins.map(name).display()), &e))?;
    Ok(map)
}

/// A program of the object, by name and type.
fn program<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T, AgentError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    let prog = ebpf.program_mut(name).ok_or_else(|| AgentError::Bpf {
        action: format!("find program {name}"),
        detail: "not in the embedded object (build mismatch: rebuild with `cargo xtask build`)".into(),
    })?;
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
    if text.contains("SOCKHASH") || text.contains(MAP_SOCKETS) && text.contains("Invalid argument") {
        return AgentError::KernelSupport {
            what: "create a SockHash map",
            detail: text,
        };
    }
    AgentError::Bpf {
        action: "load the eBPF object".into(),
        detail: text,
    }
}
