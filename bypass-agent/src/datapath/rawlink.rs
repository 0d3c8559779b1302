//! The two bpf(2) calls aya 0.14 does not make for us (include/uapi/linux/bpf.h):
//! - a cgroup link aya cannot pin: aya gives a setsockopt attachment no `FdLink`, so it
//!   would detach when the agent exits. The link is created with `BPF_LINK_CREATE` and
//!   pinned with `BPF_OBJ_PIN` here, then owned through aya's `PinnedLink` like the
//!   sock_ops one;
//! - whether the kernel loads BPF trampoline programs at all (fentry, fexit, LSM): some
//!   kernels refuse them whatever the privileges (sandboxes that forbid patching kernel
//!   text), and the read guard is built of them.

use std::{
    ffi::CString,
    os::fd::{AsFd, AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
    path::Path,
};

use aya::programs::links::PinnedLink;

use crate::error::AgentError;

/// `BPF_OBJ_PIN`.
const BPF_OBJ_PIN: libc::c_long = 6;
/// `BPF_LINK_CREATE`.
const BPF_LINK_CREATE: libc::c_long = 28;
/// `BPF_PROG_LOAD`.
const BPF_PROG_LOAD: libc::c_long = 5;
/// `BPF_PROG_TYPE_TRACING`.
const BPF_PROG_TYPE_TRACING: u32 = 26;
/// `BPF_TRACE_FENTRY`.
const BPF_TRACE_FENTRY: u32 = 24;
/// `BPF_CGROUP_SETSOCKOPT` (`enum bpf_attach_type`).
pub const BPF_CGROUP_SETSOCKOPT: u32 = 22;
/// Size of the `union bpf_attr` passed (zero-filled beyond the fields set; the kernel
/// accepts any size up to its own as long as the tail is zero).
const ATTR_SIZE: usize = 128;

/// Whether the kernel loads an fentry program on the function whose BTF id is
/// `btf_id`: `Ok(false)` when it refuses with EPERM (as root: the kernel forbids BPF
/// trampolines), `Err` for any other failure. The program (`r0 = 0; exit`) is closed at
/// once.
pub fn trampolines_load(btf_id: u32) -> std::io::Result<bool> {
    // mov r0, 0; exit.
    let insns: [u64; 2] = [0x0000_0000_0000_00b7, 0x0000_0000_0000_0095];
    let license = c"GPL";
    let mut attr = [0u8; ATTR_SIZE];
    // prog_load: prog_type, insn_cnt, insns, license, ..., expected_attach_type (68),
    // attach_btf_id (108).
    put_u32(&mut attr, 0, BPF_PROG_TYPE_TRACING);
    put_u32(&mut attr, 4, insns.len() as u32);
    attr[8..16].copy_from_slice(&(insns.as_ptr() as u64).to_ne_bytes());
    attr[16..24].copy_from_slice(&(license.as_ptr() as u64).to_ne_bytes());
    put_u32(&mut attr, 68, BPF_TRACE_FENTRY);
    put_u32(&mut attr, 108, btf_id);
    match bpf(BPF_PROG_LOAD, &mut attr) {
        Ok(fd) => {
            // SAFETY: BPF_PROG_LOAD returned a new file descriptor we now own.
            drop(unsafe { OwnedFd::from_raw_fd(fd as i32) });
            Ok(true)
        }
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => Ok(false),
        Err(e) => Err(e),
    }
}

fn bpf(cmd: libc::c_long, attr: &mut [u8; ATTR_SIZE]) -> std::io::Result<libc::c_long> {
    // Raw libc: nix has no bpf(2) wrapper, and aya 0.14 exposes neither command.
    // SAFETY: bpf(2) with a zero-filled attribute buffer of the stated size.
    let ret = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), ATTR_SIZE) };
    if ret < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn put_u32(attr: &mut [u8; ATTR_SIZE], at: usize, v: u32) {
    attr[at..at + 4].copy_from_slice(&v.to_ne_bytes());
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
    let mut attr = [0u8; ATTR_SIZE];
    // link_create: prog_fd, target_fd, attach_type, flags.
    put_u32(&mut attr, 0, prog.as_raw_fd() as u32);
    put_u32(&mut attr, 4, cgroup.as_raw_fd() as u32);
    put_u32(&mut attr, 8, attach_type);
    let fd = bpf(BPF_LINK_CREATE, &mut attr).map_err(|e| AgentError::bpf(what(), e))?;
    // SAFETY: BPF_LINK_CREATE returned a new file descriptor we now own.
    let link = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let c_path =
        CString::new(path.as_os_str().as_encoded_bytes()).map_err(|e| AgentError::Bpf {
            action: what(),
            source: Box::new(e),
        })?;
    let mut attr = [0u8; ATTR_SIZE];
    // obj_pin: pathname (u64 pointer), bpf_fd.
    attr[0..8].copy_from_slice(&(c_path.as_ptr() as u64).to_ne_bytes());
    put_u32(&mut attr, 8, link.as_fd().as_raw_fd() as u32);
    bpf(BPF_OBJ_PIN, &mut attr).map_err(|e| AgentError::bpf(what(), e))?;
    drop(link);
    PinnedLink::from_pin(path).map_err(|e| AgentError::bpf(what(), e))
}
