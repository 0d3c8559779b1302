//! The two bpf(2) calls aya 0.14 does not make for us (include/uapi/linux/bpf.h):
//! - a cgroup link aya cannot pin: aya gives a setsockopt attachment no `FdLink`, so it
//!   would detach when the agent exits. The link is created with `BPF_LINK_CREATE` and
//!   pinned with `BPF_OBJ_PIN` here, then owned through aya's `PinnedLink` like the
//!   sock_ops one;
//! - whether the kernel loads BPF trampoline programs at all (fentry, fexit, LSM): some
//!   kernels refuse them whatever the privileges (sandboxes that forbid patching kernel
//!   text), and the read guard is built of them.

use std::{
    os::fd::{AsFd as _, AsRawFd as _, BorrowedFd},
    path::Path,
};

use aya::programs::links::PinnedLink;

use super::rawbpf::{self, Attr, BPF_LINK_CREATE, BPF_PROG_LOAD, bpf_fd};
use crate::error::AgentError;

/// `BPF_TRACE_FENTRY`.
const BPF_TRACE_FENTRY: u32 = 24;
/// `BPF_CGROUP_SETSOCKOPT` (`enum bpf_attach_type`).
pub const BPF_CGROUP_SETSOCKOPT: u32 = 22;

/// Whether the kernel loads an fentry program on the function whose BTF id is
/// `btf_id`: `Ok(false)` when it refuses with EPERM (as root: the kernel forbids BPF
/// trampolines), `Err` for any other failure. The program (`r0 = 0; exit`) is closed at
/// once.
pub fn trampolines_load(btf_id: u32) -> std::io::Result<bool> {
    // mov r0, 0; exit.
    let insns: [u64; 2] = [0x0000_0000_0000_00b7, 0x0000_0000_0000_0095];
    let mut attr = rawbpf::tracing_prog(&insns, c"GPL", BPF_TRACE_FENTRY, btf_id);
    match bpf_fd(BPF_PROG_LOAD, &mut attr) {
        Ok(_prog) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => Ok(false),
        Err(e) => Err(e),
    }
}

/// How many times [`trampolines_load_retried`] tries a load that fails for a moment.
const PROBE_TRIES: usize = 5;

/// [`trampolines_load`], tried again while it fails for a moment (EAGAIN: the verifier
/// was interrupted, or a transient allocation failure; EINTR).
pub fn trampolines_load_retried(btf_id: u32) -> std::io::Result<bool> {
    retry_transient(PROBE_TRIES, || trampolines_load(btf_id))
}

/// Calls `f` until it answers other than EAGAIN or EINTR, at most `tries` times; its
/// last answer.
fn retry_transient<T>(
    tries: usize,
    mut f: impl FnMut() -> std::io::Result<T>,
) -> std::io::Result<T> {
    let mut last = f();
    for _ in 1..tries {
        match &last {
            Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EINTR)) => last = f(),
            _ => break,
        }
    }
    last
}

/// Attaches program `prog` to cgroup `cgroup` for `attach_type` as a bpf_link and pins
/// the link at `path`; the attachment lives as long as the pin (or an open fd).
pub fn create_pinned(
    prog: BorrowedFd<'_>,
    cgroup: BorrowedFd<'_>,
    attach_type: u32,
    path: &Path,
) -> Result<PinnedLink, AgentError> {
    let what = || format!("attach to cgroup and pin {}", path.display());
    let mut attr = Attr::zeroed();
    // link_create: prog_fd, target_fd, attach_type, flags.
    attr.u32(0, prog.as_raw_fd() as u32)
        .u32(4, cgroup.as_raw_fd() as u32)
        .u32(8, attach_type);
    let link = bpf_fd(BPF_LINK_CREATE, &mut attr).map_err(|e| AgentError::bpf(what(), e))?;
    rawbpf::obj_pin(link.as_fd(), path).map_err(|e| AgentError::bpf(what(), e))?;
    drop(link);
    PinnedLink::from_pin(path).map_err(|e| AgentError::bpf(what(), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `retry_transient(5, f)` where `f`'s n-th call fails with `errnos[n]` (the last
    /// one for later calls; 0: it succeeds): the answer's errno (0: success) and how
    /// many calls were made.
    fn run(errnos: &[i32]) -> (i32, usize) {
        let mut calls = 0;
        let r = retry_transient(5, || {
            let e = errnos[calls.min(errnos.len() - 1)];
            calls += 1;
            match e {
                0 => Ok(()),
                e => Err(std::io::Error::from_raw_os_error(e)),
            }
        });
        (r.err().and_then(|e| e.raw_os_error()).unwrap_or(0), calls)
    }

    #[test]
    fn transient_failures_are_tried_again_others_answer_at_once() {
        assert_eq!(
            run(&[libc::EAGAIN, libc::EAGAIN, 0]),
            (0, 3),
            "EAGAIN twice, then the answer"
        );
        assert_eq!(run(&[libc::EINVAL]), (libc::EINVAL, 1));
        assert_eq!(run(&[libc::EINTR]), (libc::EINTR, 5), "given up after 5");
        assert_eq!(run(&[0]), (0, 1));
    }
}
