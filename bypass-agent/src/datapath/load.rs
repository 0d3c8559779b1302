//! A fresh load of the embedded object: the globals set from the [`HostFacts`], maps
//! and programs pinned, sk_msg attached to the SockHash, the tracing programs attached
//! and their links pinned, the identity recorded.

use std::os::fd::AsFd as _;

use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{Map, MapData, SockHash},
    programs::{BtfTracePoint, FEntry, FExit, SkMsg, TracePoint, links::FdLink},
};
use bypass_common::{
    SockKey,
    layout::{features, globals},
    names::{
        Hook, HookKind, MAP_CONNECTORS, MAP_CONTROL, MAP_LINKS, MAP_SOCKETS, PIN_LINK_SOCKOPS,
        PIN_LINK_SOCKOPT, PINNED_MAPS, PROG_SKMSG, PROG_SOCKOPS, PROG_SOCKOPT,
    },
};
use tracing::warn;

use super::{Config, HostFacts, Identity, PinLayout, maps, object, pins, rawbpf};
use crate::error::AgentError;

/// Loads the embedded object, attaches sk_msg to the SockHash and the tracing programs
/// to their kernel functions, pins maps, programs and links and records the identity.
/// Removes what it pinned if any step fails.
pub(super) fn load_fresh(
    pins: &PinLayout,
    config: &Config,
    identity: Identity,
    facts: HostFacts,
) -> Result<Ebpf, AgentError> {
    raise_memlock();
    load_with(pins, config, identity, facts)
}

/// Gives the heap that starting freed back to the system. A start parses the kernel's
/// BTF (our reader for the host's facts and the tracing programs' attach points; aya in
/// `EbpfLoader::new` and for the tracing programs: a 5 MB file, each parse tens of MB
/// grown by doubling), all of it freed once loaded; glibc's allocator keeps freed heap
/// for reuse, which would leave the agent's resident memory at its start-up peak for
/// its whole life.
pub(super) fn release_freed_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free memory of the allocator's heap; no
    // pointer is invalidated.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// This build's number for the tracing programs' owner slot
/// ([`bypass_common::control::SLOT_HOOKS_OWNER`]), from the embedded object.
pub(super) fn build_id() -> u32 {
    bypass_common::layout::build_id(object::fingerprint())
}

/// The embedded object loaded with the globals this host's `facts` fix (kernel field
/// offsets, feature bits, the host's namespace) and the maps `--max-sockets` sizes
/// sized to `max_sockets`; nothing pinned, no program loaded yet.
pub(super) fn load_object(max_sockets: u32, facts: &HostFacts) -> Result<Ebpf, AgentError> {
    load_object_over(max_sockets, facts, None)
}

/// [`load_object`], with every pinned map of `over` taken as it is (its entries, its
/// sockets) instead of a new one: the programs are relocated against the maps another
/// build's programs run on.
fn load_object_over(
    max_sockets: u32,
    facts: &HostFacts,
    over: Option<&PinLayout>,
) -> Result<Ebpf, AgentError> {
    let l = &facts.layout;
    let program_features = facts.features & features::PROGRAM_BITS;
    let mut loader = EbpfLoader::new();
    loader
        .map_max_entries(MAP_SOCKETS, max_sockets)
        .map_max_entries(MAP_CONNECTORS, max_sockets)
        .map_max_entries(MAP_LINKS, max_sockets);
    if let Some(pins) = over {
        for name in PINNED_MAPS {
            loader.map_pin_path(name, pins.map(name));
        }
    }
    for (global, value) in l.globals() {
        loader.override_global(global, value, true);
    }
    let build = build_id();
    let ebpf = loader
        .override_global(globals::FEATURES, &program_features, true)
        .override_global(globals::HOST_NETNS, &facts.host_netns, true)
        .override_global(globals::BUILD, &build, true)
        .load(object::BYTES)
        .map_err(classify_load_error)?;
    // The loader holds the kernel's BTF that aya parsed in `EbpfLoader::new` (about
    // 17 MB of heap); the tracing programs parse it again, so it goes first.
    drop(loader);
    Ok(ebpf)
}

fn load_with(
    pins: &PinLayout,
    config: &Config,
    identity: Identity,
    facts: HostFacts,
) -> Result<Ebpf, AgentError> {
    let mut ebpf = load_object(config.max_sockets, &facts)?;
    let guard = pins::PinGuard::new(pins.clone(), true);
    pins.create_dirs()?;
    for name in PINNED_MAPS.iter().filter(|&&n| n != MAP_CONTROL) {
        pin_map(&ebpf, pins, name)?;
    }
    // Before the tracing programs are attached: they act only for the build named here.
    // Written through the loaded map, which stays in the object until they are: the read
    // guard's fmod_ret programs are relocated against the object's maps
    // (fmodret::relocated), the control map among them.
    {
        let map = ebpf
            .map_mut(MAP_CONTROL)
            .ok_or_else(|| AgentError::missing("map", MAP_CONTROL))?;
        let mut words: aya::maps::Array<&mut MapData, u32> =
            aya::maps::Array::try_from(map).map_err(|e| AgentError::open_map(MAP_CONTROL, e))?;
        words
            .set(bypass_common::control::SLOT_HOOKS_OWNER, build_id(), 0)
            .map_err(|e| AgentError::map(MAP_CONTROL, "write the tracing programs' build", e))?;
    }

    let (skmsg, _) = attach_skmsg(&mut ebpf)?;
    skmsg
        .pin(pins.prog(PROG_SKMSG))
        .map_err(|e| AgentError::pin(PROG_SKMSG, &pins.prog(PROG_SKMSG), e))?;
    for name in [PROG_SOCKOPS, PROG_SOCKOPT] {
        load_and_pin(&mut ebpf, pins, name)?;
    }
    // Attached now, before any socket can be inserted (sock_ops attaches later): they
    // act on inserted sockets only.
    let btfs = Btfs::read(facts.hooks.all(), facts.features)?;
    for hook in facts.hooks.all() {
        match attach_hook(&mut ebpf, &btfs, *hook, facts.features) {
            Ok(link) => link.pin(&pins.link(hook.program))?,
            // The splice watch (kernels without a read guard, `--allow-unguarded`) is a
            // best effort: without it, splicers are not learned, which is what
            // `--allow-unguarded` accepts.
            Err(e) if hook.kind == HookKind::Syscall => tracing::warn!(
                error = %e,
                "the splice watch is off (a syscall tracepoint needs tracefs: mount it at \
                 /sys/kernel/tracing, in a container the host's)"
            ),
            Err(e) => return Err(e),
        }
    }
    drop(btfs);
    let mut control = maps::Control::new(take_map(&mut ebpf, MAP_CONTROL)?)?;
    control.set_enabled(false)?;
    control.set_identity(identity)?;
    control.set_features(facts.features)?;
    control.set_layout(bypass_common::layout::LAYOUT_VERSION)?;
    // The control map is pinned last: its pin marks a complete datapath.
    let path = pins.map(MAP_CONTROL);
    control
        .pin(path.as_path())
        .map_err(|e| AgentError::pin(MAP_CONTROL, &path, e))?;
    guard.disarm();
    Ok(ebpf)
}

/// Replaces, in place, the programs of a pinned datapath of another build with the same
/// layout ([`bypass_common::layout::LAYOUT_VERSION`]) on this host: this build's programs
/// are loaded against the pinned maps, so every connection stays bypassed.
/// - sk_msg: attached to the same SockHash, it runs for sockets inserted from now on;
///   those inserted before keep the earlier build's until they close, on the same maps,
///   which mean the same to both (the layout).
/// - sock_ops and setsockopt: their cgroup links switch to this build's programs
///   atomically (`BPF_LINK_UPDATE`): no socket event runs without one, none runs both.
/// - the tracing programs (the read guard, the read counts, the FIONREAD compensation)
///   stay the earlier build's, attached: the kernel skips the return programs of calls in
///   flight whenever a trampoline changes (kernel/bpf/trampoline.c,
///   `bpf_tramp_image_put`), which would leave a blocked reader's count unfinished, and
///   two sets of hooks switched by one control word would each read the word at another
///   moment. They are part of the layout: a build that changes what they do changes it.
///
/// Each program is pinned beside its predecessor and renamed over it, so the pins always
/// name a complete datapath. The identity is cleared first (keeping the cgroup) and
/// recorded last: a start after a crash in between finds another build's datapath of
/// this layout and does this again (every step may run twice).
pub(super) fn load_in_place(
    pins: &PinLayout,
    config: &Config,
    identity: Identity,
    facts: HostFacts,
) -> Result<Ebpf, AgentError> {
    raise_memlock();
    check_pinned_shapes(pins)?;
    let mut control = maps::Control::new(maps::open_pinned(pins, MAP_CONTROL)?)?;
    let pinned = control.features()?;
    if pinned != facts.features {
        // Its tracing programs stay, and must agree with this build's.
        return Err(AgentError::PinnedDiffers {
            what: "the features its programs were loaded with".into(),
            pinned: format!("{pinned:#x}"),
            ours: format!("{:#x}", facts.features),
        });
    }
    let mut ebpf = load_object_over(config.max_sockets, &facts, Some(pins))?;
    control.set_identity(Identity {
        object: 0,
        cgroup: identity.cgroup,
    })?;
    let (skmsg, link) = attach_skmsg(&mut ebpf)?;
    // The SockHash holds the attachment whatever becomes of this load: dropped, the link
    // would detach sk_msg from the map that every later start of this build adopts.
    std::mem::forget(
        skmsg
            .take_link(link)
            .map_err(|e| AgentError::link(PROG_SKMSG, e))?,
    );
    let fd = skmsg.fd().map_err(|e| AgentError::load(PROG_SKMSG, e))?;
    repin_prog(pins, PROG_SKMSG, fd.as_fd())?;
    for (name, link) in [
        (PROG_SOCKOPS, PIN_LINK_SOCKOPS),
        (PROG_SOCKOPT, PIN_LINK_SOCKOPT),
    ] {
        replace_cgroup_program(&mut ebpf, pins, name, link)?;
    }
    control.set_layout(bypass_common::layout::LAYOUT_VERSION)?;
    control.set_identity(identity)?;
    tracing::info!(
        tracing_programs_of = format_args!("{:08x}", control.hooks_owner()?),
        build = format_args!("{:08x}", build_id()),
        "replaced the pinned datapath's sk_msg, sock_ops and setsockopt programs in place: \
         its connections stay bypassed"
    );
    Ok(ebpf)
}

/// Pins program `fd` as `name` in place of the program pinned there: beside it first
/// (as `<name>_next`: bpffs refuses a dot in a name), then renamed over it (bpffs renames
/// atomically), so a complete datapath is always pinned.
fn repin_prog(
    pins: &PinLayout,
    name: &str,
    fd: std::os::fd::BorrowedFd<'_>,
) -> Result<(), AgentError> {
    let to = pins.prog(name);
    let beside = pins.prog(&format!("{name}_next"));
    remove_pin(&beside)?;
    rawbpf::obj_pin(fd, &beside).map_err(|e| AgentError::pin(name, &beside, e))?;
    std::fs::rename(&beside, &to).map_err(|source| AgentError::Io {
        action: "rename a program pin",
        path: beside.clone(),
        source,
    })
}

/// Removes the pin at `path`, if there is one.
fn remove_pin(path: &std::path::Path) -> Result<(), AgentError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(AgentError::Io {
            action: "remove pin",
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Whether every pinned map has the type, key and value sizes, entries (but for those
/// `--max-sockets` sizes) and flags this build's object declares: the layout number says
/// so, this makes sure (a build that changed a map and
/// not the number is released, not adopted).
fn check_pinned_shapes(pins: &PinLayout) -> Result<(), AgentError> {
    let obj = aya_obj::Object::parse(object::BYTES)
        .map_err(|e| AgentError::bpf("parse the embedded object", e))?;
    for name in PINNED_MAPS {
        let ours = obj
            .maps
            .get(name)
            .ok_or_else(|| AgentError::missing("map", name))?;
        let err = |e| AgentError::open_map(name, e);
        let pinned = aya::maps::MapInfo::from_pin(pins.map(name)).map_err(err)?;
        let pinned_type = pinned.map_type().map_err(err)? as u32;
        // The maps `--max-sockets` sizes are compared with it before (adopt::same_sizes).
        let sized = [MAP_SOCKETS, MAP_CONNECTORS, MAP_LINKS].contains(&name);
        let entries = |n: u32| if sized { 0 } else { n };
        let (want, have) = (
            (
                ours.map_type(),
                ours.key_size(),
                ours.value_size(),
                entries(ours.max_entries()),
                ours.map_flags(),
            ),
            (
                pinned_type,
                pinned.key_size(),
                pinned.value_size(),
                entries(pinned.max_entries()),
                pinned.map_flags(),
            ),
        );
        if want != have {
            // The same layout number on maps of another shape.
            return Err(AgentError::PinnedDiffers {
                what: format!("map {name}'s (type, key size, value size, entries, flags)"),
                pinned: format!("{have:?}"),
                ours: format!("{want:?}"),
            });
        }
    }
    Ok(())
}

/// Loads the cgroup program `name` (sock_ops or setsockopt), makes the pinned cgroup
/// link `link` (if the earlier agent left one) run it in place of the program it runs,
/// and pins it in place of the one pinned as `name`.
fn replace_cgroup_program(
    ebpf: &mut Ebpf,
    pins: &PinLayout,
    name: &str,
    link: &str,
) -> Result<(), AgentError> {
    let load_err = |e| AgentError::load(name, e);
    let prog = ebpf
        .program_mut(name)
        .ok_or_else(|| AgentError::missing("program", name))?;
    let fd = match prog {
        aya::programs::Program::SockOps(p) => {
            p.load().map_err(load_err)?;
            p.fd().map_err(load_err)?
        }
        aya::programs::Program::CgroupSockopt(p) => {
            p.load().map_err(load_err)?;
            p.fd().map_err(load_err)?
        }
        _ => return Err(AgentError::missing("program", name)),
    };
    let link_path = pins.link(link);
    if link_path.exists() {
        rawbpf::obj_get(&link_path)
            .and_then(|pinned| rawbpf::link_update(pinned.as_fd(), fd.as_fd()))
            .map_err(|source| AgentError::Io {
                action: "switch the program of the pinned link",
                path: link_path.clone(),
                source,
            })?;
    }
    repin_prog(pins, name, fd.as_fd())
}

/// Loads sk_msg and attaches it to the SockHash of `ebpf` (the attachment lives as
/// long as `ebpf`, or its link, taken).
pub(super) fn attach_skmsg(
    ebpf: &mut Ebpf,
) -> Result<(&mut SkMsg, aya::programs::sk_msg::SkMsgLinkId), AgentError> {
    let sockets: SockHash<&MapData, SockKey> = SockHash::try_from(
        ebpf.map(MAP_SOCKETS)
            .ok_or_else(|| AgentError::missing("map", MAP_SOCKETS))?,
    )
    .map_err(|e| AgentError::open_map(MAP_SOCKETS, e))?;
    let sockets_fd = sockets
        .fd()
        .try_clone()
        .map_err(|e| AgentError::bpf("dup the SockHash fd", e))?;
    let skmsg: &mut SkMsg = program(ebpf, PROG_SKMSG)?;
    skmsg.load().map_err(|e| AgentError::load(PROG_SKMSG, e))?;
    let link = skmsg
        .attach(&sockets_fd)
        .map_err(|e| AgentError::attach(PROG_SKMSG, MAP_SOCKETS, e))?;
    Ok((skmsg, link))
}

/// What attaching `hooks` needs of the kernel's BTF: the read guard's attach points,
/// found by our reader, and aya's parse for the programs aya attaches (fentry, fexit,
/// tp_btf). Each parse of the 5 MB file takes tens of MB of heap; they are made one
/// after the other, our reader dropped before aya parses, and aya's only where a hook
/// needs it (held together, they were the agent's peak memory).
pub(super) struct Btfs {
    aya: Option<Btf>,
    /// `(function, BTF id)` of each read guard hook's target (`guard_target`).
    guard_ids: Vec<(String, u32)>,
}

impl Btfs {
    /// Reads `/sys/kernel/btf/vmlinux` for `hooks`, attached with the feature `bits`.
    pub(super) fn read<'h>(
        hooks: impl IntoIterator<Item = &'h Hook> + Clone,
        bits: u32,
    ) -> Result<Self, AgentError> {
        let err = |e: Box<dyn std::error::Error + Send + Sync>| AgentError::KernelSupport {
            what: "describe its functions for the tracing programs (BTF)",
            source: e,
        };
        let guards: Vec<String> = hooks
            .clone()
            .into_iter()
            .filter(|h| h.kind == HookKind::Guard)
            .map(|h| guard_target(h, bits).1)
            .collect();
        let mut guard_ids = Vec::with_capacity(guards.len());
        if !guards.is_empty() {
            let kernel = super::btf::Btf::vmlinux().map_err(|e| err(Box::new(e)))?;
            for target in guards {
                let id = kernel
                    .type_id(super::btf::KIND_FUNC, &target)
                    .ok_or_else(|| AgentError::KernelSupport {
                        what: "show its security functions in BTF for the read guard",
                        source: format!("no function {target} in the kernel's BTF").into(),
                    })?;
                guard_ids.push((target, id));
            }
        }
        let aya_attaches = hooks.into_iter().any(|h| {
            matches!(
                h.kind,
                HookKind::Entry | HookKind::Exit | HookKind::TracePoint
            )
        });
        let aya = if aya_attaches {
            Some(Btf::from_sys_fs().map_err(|e| err(Box::new(e)))?)
        } else {
            None
        };
        Ok(Self { aya, guard_ids })
    }

    fn aya(&self, hook: &Hook) -> Result<&Btf, AgentError> {
        self.aya.as_ref().ok_or_else(|| AgentError::KernelSupport {
            what: "describe its functions for the tracing programs (BTF)",
            source: format!(
                "{} was not among the hooks its BTF was read for",
                hook.program
            )
            .into(),
        })
    }

    fn guard_id(&self, target: &str) -> Result<u32, AgentError> {
        self.guard_ids
            .iter()
            .find(|(t, _)| t == target)
            .map(|&(_, id)| id)
            .ok_or_else(|| AgentError::KernelSupport {
                what: "show its security functions in BTF for the read guard",
                source: format!("{target} was not among the hooks its BTF was read for").into(),
            })
    }
}

/// How a read guard `hook` attaches with the feature `bits`, and to which function: as
/// a BPF LSM program on `bpf_lsm_<hook>` where the bits say the guard runs so
/// ([`features::GUARD_LSM`]), else as fmod_ret on its target.
fn guard_target(hook: &Hook, bits: u32) -> (super::fmodret::As, String) {
    if bits & features::GUARD_LSM != 0 {
        let hook_name = hook.target.strip_prefix("security_").unwrap_or(hook.target);
        (super::fmodret::As::Lsm, format!("bpf_lsm_{hook_name}"))
    } else {
        (super::fmodret::As::FmodRet, hook.target.to_owned())
    }
}

/// A tracing program's attachment: dropped, it detaches; pinned, it stays.
pub(super) enum HookLink {
    /// One aya made.
    Fd(FdLink),
    /// One made with bpf(2) (fmod_ret, which aya does not load).
    Raw(std::os::fd::OwnedFd),
}

impl HookLink {
    /// Pins it at `path` (the link keeps the program attached after the agent exits,
    /// for the next agent).
    pub(super) fn pin(self, path: &std::path::Path) -> Result<(), AgentError> {
        let err = |e: crate::error::BoxError| AgentError::pin("a link", path, e);
        match self {
            HookLink::Fd(link) => link.pin(path).map(drop).map_err(|e| err(e.into())),
            HookLink::Raw(fd) => {
                rawbpf::obj_pin(std::os::fd::AsFd::as_fd(&fd), path).map_err(|e| err(e.into()))
            }
        }
    }
}

/// Loads program `name` (sock_ops or setsockopt) and pins it.
fn load_and_pin(ebpf: &mut Ebpf, pins: &PinLayout, name: &str) -> Result<(), AgentError> {
    let prog = ebpf
        .program_mut(name)
        .ok_or_else(|| AgentError::missing("program", name))?;
    let load_err = |e| AgentError::load(name, e);
    let pin_err = |e| AgentError::pin(name, &pins.prog(name), e);
    match prog {
        aya::programs::Program::SockOps(p) => {
            p.load().map_err(load_err)?;
            p.pin(pins.prog(name)).map_err(pin_err)
        }
        aya::programs::Program::CgroupSockopt(p) => {
            p.load().map_err(load_err)?;
            p.pin(pins.prog(name)).map_err(pin_err)
        }
        _ => Err(AgentError::missing("program", name)),
    }
}

/// Loads the tracing program of `hook` and attaches it to its kernel function: a read
/// guard's check as a BPF LSM program where the feature `bits` say the guard runs so
/// ([`features::GUARD_LSM`]), else as fmod_ret.
pub(super) fn attach_hook(
    ebpf: &mut Ebpf,
    btfs: &Btfs,
    hook: Hook,
    bits: u32,
) -> Result<HookLink, AgentError> {
    let name = hook.program;
    let load_err = |e| AgentError::attach(name, format_args!("the kernel's {}", hook.target), e);
    let link: FdLink = match hook.kind {
        HookKind::Entry => {
            let p: &mut FEntry = program(ebpf, name)?;
            p.load(hook.target, btfs.aya(&hook)?).map_err(load_err)?;
            let id = p.attach().map_err(load_err)?;
            p.take_link(id).map_err(load_err)?.into()
        }
        HookKind::Exit => {
            let p: &mut FExit = program(ebpf, name)?;
            p.load(hook.target, btfs.aya(&hook)?).map_err(load_err)?;
            let id = p.attach().map_err(load_err)?;
            p.take_link(id).map_err(load_err)?.into()
        }
        HookKind::Guard => {
            let (how, target) = guard_target(&hook, bits);
            let id = btfs.guard_id(&target)?;
            return super::fmodret::attach(ebpf, name, &target, id, how).map(HookLink::Raw);
        }
        HookKind::TracePoint => {
            let p: &mut BtfTracePoint = program(ebpf, name)?;
            p.load(hook.target, btfs.aya(&hook)?).map_err(load_err)?;
            let id = p.attach().map_err(load_err)?;
            p.take_link(id).map_err(load_err)?.into()
        }
        HookKind::Syscall => {
            let p: &mut TracePoint = program(ebpf, name)?;
            p.load().map_err(load_err)?;
            let id = p
                .attach("syscalls", &format!("sys_enter_{}", hook.target))
                .map_err(load_err)?;
            let link = p.take_link(id).map_err(load_err)?;
            link.try_into()
                .map_err(|e: aya::programs::links::LinkError| AgentError::link(name, e))?
        }
    };
    Ok(HookLink::Fd(link))
}

fn take_map(ebpf: &mut Ebpf, name: &str) -> Result<Map, AgentError> {
    ebpf.take_map(name)
        .ok_or_else(|| AgentError::missing("map", name))
}

fn pin_map(ebpf: &Ebpf, pins: &PinLayout, name: &str) -> Result<(), AgentError> {
    let path = pins.map(name);
    ebpf.map(name)
        .ok_or_else(|| AgentError::missing("map", name))?
        .pin(&path)
        .map_err(|e| AgentError::pin(name, &path, e))
}

/// A program of the object, by name and type.
fn program<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T, AgentError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    let prog = ebpf
        .program_mut(name)
        .ok_or_else(|| AgentError::missing("program", name))?;
    prog.try_into()
        .map_err(|e: aya::programs::ProgramError| AgentError::bpf(format!("program {name}"), e))
}

/// Kernels >= 5.11 charge BPF memory to the cgroup; older ones need RLIMIT_MEMLOCK.
/// Raising it may be refused (no CAP_SYS_RESOURCE); that is only a warning.
fn raise_memlock() {
    use nix::sys::resource::{RLIM_INFINITY, Resource, setrlimit};
    if let Err(errno) = setrlimit(Resource::RLIMIT_MEMLOCK, RLIM_INFINITY, RLIM_INFINITY) {
        warn!(error = %errno,
            "could not raise RLIMIT_MEMLOCK; fine on kernels >= 5.11, which charge BPF memory to the cgroup");
    }
}

/// A failed load of the object: a SockHash the kernel will not create (but for EPERM)
/// is a kernel without it; the rest as any BPF failure ([`AgentError::bpf`]).
fn classify_load_error(err: aya::EbpfError) -> AgentError {
    if let aya::EbpfError::MapError(aya::maps::MapError::CreateError { name, io_error }) = &err
        && name == MAP_SOCKETS
        && io_error.raw_os_error() != Some(libc::EPERM)
    {
        return AgentError::KernelSupport {
            what: "create the SockHash map",
            source: Box::new(err),
        };
    }
    AgentError::bpf("load the eBPF object", err)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn create_failed(name: &str, errno: nix::errno::Errno) -> aya::EbpfError {
        aya::EbpfError::MapError(aya::maps::MapError::CreateError {
            name: name.to_owned(),
            io_error: std::io::Error::from_raw_os_error(errno as i32),
        })
    }

    #[test]
    fn a_load_error_is_told_by_its_errno_and_map_not_its_text() {
        use nix::errno::Errno;
        assert!(matches!(
            classify_load_error(create_failed("BYPASS_LINKS", Errno::EPERM)),
            AgentError::Permission { .. }
        ));
        assert!(matches!(
            classify_load_error(create_failed(MAP_SOCKETS, Errno::EPERM)),
            AgentError::Permission { .. }
        ));
        assert!(matches!(
            classify_load_error(create_failed(MAP_SOCKETS, Errno::EINVAL)),
            AgentError::KernelSupport { .. }
        ));
        assert!(matches!(
            classify_load_error(create_failed("BYPASS_LINKS", Errno::EINVAL)),
            AgentError::Bpf { .. }
        ));
    }
}
