//! What a load fixes in the programs' read-only globals, found on this host: kernel
//! field offsets from BTF, the host namespace, and which optional parts are on.

use bypass_common::{
    KernelLayout,
    layout::{self, features},
    names::{GUARD_HOOKS, Hook, READ_HOOKS, READ_TRAMPOLINE_HOOKS, WATCH_HOOKS},
};

use super::{btf, host, rawlink};
use crate::error::AgentError;

/// How readers that cannot see the ingress queue (`splice(2)`, zero-copy receive) are
/// kept from missing a redirected byte on this kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadGuard {
    /// The read guard: programs on the kernel's security functions (BPF LSM programs,
    /// or fmod_ret where the BPF LSM does not run) refuse a splice or a mapping of a
    /// bypassed socket while bytes redirected to it are unread (kernels that run BPF
    /// trampolines).
    Guard,
    /// No guard can run (the kernel refuses BPF trampolines): a process seen splicing
    /// gets no redirected bytes from its next read on, but a socket that splices while
    /// redirected bytes wait for it (from its start, or after reading with recv) can
    /// miss them: the agent bypasses such a kernel only with `--allow-unguarded`.
    Watch,
}

/// Which tracing programs a load attaches, found on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hooks {
    /// Publishing reads: `tcp_bpf_recvmsg`'s entry and return where trampolines run,
    /// else the `sock_recv_length` tracepoint.
    pub read: &'static [Hook],
    /// The read guard, or the splice watch.
    pub guard: ReadGuard,
    /// The FIONREAD compensation, where the kernel self-test found it needed and
    /// working.
    pub fionread: Option<&'static Hook>,
}

impl Hooks {
    /// Every hook, in attach order.
    pub fn all(&self) -> impl Iterator<Item = &'static Hook> + Clone {
        let guard: &'static [Hook] = match self.guard {
            ReadGuard::Guard => &GUARD_HOOKS,
            ReadGuard::Watch => &WATCH_HOOKS,
        };
        self.read.iter().chain(guard.iter()).chain(self.fionread)
    }
}

/// Whether this kernel honours `SO_PEEK_OFF` on a TCP socket (Linux ≥ 6.9; before, it
/// refuses it with `EOPNOTSUPP`).
fn tcp_peek_off() -> bool {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socket};
    let Ok(fd) = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    ) else {
        return false;
    };
    let zero: libc::c_int = 0;
    // SAFETY: a valid socket and an int option of the right size.
    let rc = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            libc::SOL_SOCKET,
            libc::SO_PEEK_OFF,
            std::ptr::from_ref(&zero).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    rc == 0
}

/// What a load takes from this host, found on it: what it fixes in the programs'
/// read-only globals, and which tracing programs it attaches. Its [`HostFacts::digest`]
/// is part of the identity a pinned datapath is adopted by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostFacts {
    /// Kernel field offsets, from BTF.
    pub layout: KernelLayout,
    /// [`features`] bits: what the programs do, and why an optional part is off.
    pub features: u32,
    /// The host's network namespace cookie.
    pub host_netns: u64,
    /// The tracing programs to attach.
    pub hooks: Hooks,
}

impl HostFacts {
    /// Reads this host: BTF offsets (those every load needs must be there), the host
    /// namespace, which hooks run. What the kernel self-test finds comes on top
    /// ([`HostFacts::with_checks`]).
    pub fn detect() -> Result<Self, AgentError> {
        let layout = kernel_layout()?;
        let host_netns = host::netns_cookie()?;
        let hooks = detect_hooks()?;
        let mut f = 0;
        f |= match hooks.guard {
            // Tried first; the kernel self-test falls back to fmod_ret where no BPF LSM
            // program runs (kernel_check).
            ReadGuard::Guard => features::GUARD_LSM,
            ReadGuard::Watch => features::NO_READ_GUARD,
        };
        if tcp_peek_off() {
            f |= features::TCP_PEEK_OFF;
        }
        Ok(Self {
            layout,
            features: f,
            host_netns,
            hooks,
        })
    }

    /// These facts with what the kernel self-test found: its feature bits (how the read
    /// guard's checks run among them), and the FIONREAD compensation's hook where it
    /// runs.
    pub fn with_checks(mut self, verdict: &super::kernel_check::Verdict) -> Self {
        if verdict.features & features::GUARD_ATTACH != 0 {
            // How the read guard's checks run, as the self-test found they refuse.
            self.features &= !features::GUARD_ATTACH;
        }
        self.features |= verdict.features;
        let compensated =
            verdict.features & (features::FIONREAD_ADD_TCP | features::FIONREAD_ADD_INGRESS) != 0;
        self.hooks.fionread = if compensated {
            super::kernel_check::fionread_hook()
        } else {
            None
        };
        self
    }

    /// Digest of what the programs were loaded with.
    pub fn digest(&self) -> u64 {
        layout::digest(&self.layout, self.features, self.host_netns)
    }
}

/// The parameter counts of a `tcp_bpf_recvmsg` that takes its flags fourth, which the
/// return program reads (its return value comes from `bpf_get_func_ret`, whatever the
/// count): `(sk, msg, len, flags, addr_len)` from Linux 5.19, and `(sk, msg, len,
/// flags)` once `struct proto`'s `recvmsg` lost `addr_len` (include/net/sock.h; Debian's
/// 7.2 and 7.3 kernels, not 6.12). Before 5.19 it took `nonblock` fourth, six in all.
const TCP_BPF_RECVMSG_PARAMS: [u32; 2] = [4, 5];

/// Whether the kernel has the `sock_recv_length` tracepoint (Linux >= 6.4).
fn has_read_tracepoint(b: &btf::Btf) -> bool {
    b.type_id(btf::KIND_TYPEDEF, "btf_trace_sock_recv_length")
        .is_some()
}

/// Whether this kernel's BTF offers a way to see a bypassed socket's reads: a
/// `tcp_bpf_recvmsg` the return program can read (trampolines), or the tracepoint
/// (the preflight's [`bypass_common::kernel::Probe::ReadHook`]; whether trampolines
/// load is [`detect_hooks`]'s to find).
pub(super) fn read_hook_in_btf(b: &btf::Btf) -> bool {
    has_read_tracepoint(b)
        || b.func_params("tcp_bpf_recvmsg")
            .is_some_and(|n| TCP_BPF_RECVMSG_PARAMS.contains(&n))
}

/// Which tracing programs this kernel runs: where BPF trampolines load, the entry and
/// return of `tcp_bpf_recvmsg` and the read guard (BPF LSM programs, or fmod_ret on
/// `security_*` functions where the BPF LSM does not run); elsewhere the
/// `sock_recv_length` tracepoint and the splice watch.
fn detect_hooks() -> Result<Hooks, AgentError> {
    let b = btf::Btf::vmlinux().map_err(|e| AgentError::KernelSupport {
        what: "describe its functions for the tracing programs (BTF)",
        source: Box::new(e),
    })?;
    let has_tracepoint = has_read_tracepoint(&b);
    let trampolines = match b.type_id(btf::KIND_FUNC, "tcp_recvmsg") {
        Some(id) => rawlink::trampolines_load_retried(id).unwrap_or_else(|e| {
            tracing::warn!(
                error = %e,
                "loading a test fentry program failed, and not as a refusal (EPERM): \
                 taken as a kernel without BPF trampolines"
            );
            false
        }),
        None => false,
    };
    if trampolines
        && !b
            .func_params("tcp_bpf_recvmsg")
            .is_some_and(|n| TCP_BPF_RECVMSG_PARAMS.contains(&n))
    {
        return Err(AgentError::KernelSupport {
            what: "count a bypassed socket's reads (tcp_bpf_recvmsg takes its flags \
                   fourth since Linux 5.19; this kernel's is older)",
            source: "tcp_bpf_recvmsg takes neither (sk, msg, len, flags, addr_len) nor \
                     (sk, msg, len, flags)"
                .into(),
        });
    }
    let read: &'static [Hook] = match (trampolines, has_tracepoint) {
        (true, _) => &READ_TRAMPOLINE_HOOKS,
        (false, true) => &READ_HOOKS,
        (false, false) => {
            return Err(AgentError::KernelSupport {
                what: "publish a bypassed socket's reads (no sock_recv_length tracepoint, \
                       Linux >= 6.4, and no BPF trampolines for tcp_bpf_recvmsg)",
                source: "neither is available".into(),
            });
        }
    };
    let guard = if trampolines {
        ReadGuard::Guard
    } else {
        tracing::warn!(
            "no read guard on this kernel (it refuses BPF trampoline programs): a socket \
             that splices while redirected bytes wait for it could miss them"
        );
        ReadGuard::Watch
    };
    Ok(Hooks {
        read,
        guard,
        fionread: None,
    })
}

/// The running kernel's layout of the fields the programs read. Those every load needs
/// must be there; the others turn off what needs them.
fn kernel_layout() -> Result<KernelLayout, AgentError> {
    let b = btf::Btf::vmlinux().map_err(|e| AgentError::KernelSupport {
        what: "describe its structures",
        source: Box::new(e),
    })?;
    let (layout, missing) = b.kernel_layout();
    if !layout.has_required() {
        return Err(AgentError::KernelSupport {
            what: "show the socket fields the datapath checks at insertion",
            source: Box::new(btf::MissingFields(missing)),
        });
    }
    // What is missing turns off an optional guarantee, reported once by the caller.
    for e in &missing {
        tracing::debug!(error = %e, "kernel field not found in BTF");
    }
    Ok(layout)
}
