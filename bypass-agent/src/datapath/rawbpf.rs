//! bpf(2) itself (include/uapi/linux/bpf.h), for the calls aya 0.14 does not make
//! ([`super::rawlink`], [`super::fmodret`]): the commands, the attribute buffer and the
//! call, a tracing program's load attributes and an object's pin. Raw libc: nix has no
//! bpf(2) wrapper.

use std::{
    ffi::{CStr, CString},
    os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
    path::Path,
};

/// `BPF_PROG_LOAD`.
pub const BPF_PROG_LOAD: libc::c_long = 5;
/// `BPF_OBJ_PIN`.
const BPF_OBJ_PIN: libc::c_long = 6;
/// `BPF_RAW_TRACEPOINT_OPEN`: attaches a tracing program through a link.
pub const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;
/// `BPF_LINK_CREATE`.
pub const BPF_LINK_CREATE: libc::c_long = 28;
/// `BPF_PROG_TYPE_TRACING`.
const BPF_PROG_TYPE_TRACING: u32 = 26;
/// Size of the `union bpf_attr` passed (zero-filled beyond the fields set; the kernel
/// accepts any size up to its own as long as the tail is zero).
const ATTR_SIZE: usize = 128;

/// A `union bpf_attr`: zero but for the fields set, each at its offset.
pub struct Attr([u8; ATTR_SIZE]);

impl Attr {
    /// All zero.
    pub fn zeroed() -> Self {
        Self([0; ATTR_SIZE])
    }

    /// Sets the `u32` at byte `at`.
    pub fn u32(&mut self, at: usize, v: u32) -> &mut Self {
        self.bytes(at, &v.to_ne_bytes())
    }

    /// Sets the `u64` (or pointer) at byte `at`.
    pub fn u64(&mut self, at: usize, v: u64) -> &mut Self {
        self.bytes(at, &v.to_ne_bytes())
    }

    /// Sets the bytes from byte `at`.
    pub fn bytes(&mut self, at: usize, v: &[u8]) -> &mut Self {
        self.0[at..at + v.len()].copy_from_slice(v);
        self
    }
}

/// bpf(2) command `cmd` on `attr`, whose pointers must all outlive the call.
pub fn bpf(cmd: libc::c_long, attr: &mut Attr) -> std::io::Result<libc::c_long> {
    // SAFETY: bpf(2) with a zero-filled attribute buffer of the stated size; every
    // pointer in it outlives the call.
    let ret = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.0.as_mut_ptr(), ATTR_SIZE) };
    if ret < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(ret)
}

/// [`bpf`] for a command that returns a new file descriptor.
pub fn bpf_fd(cmd: libc::c_long, attr: &mut Attr) -> std::io::Result<OwnedFd> {
    let fd = bpf(cmd, attr)?;
    // SAFETY: the command returned a new file descriptor we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// The `BPF_PROG_LOAD` attributes of a `BPF_PROG_TYPE_TRACING` program of `insns` (each
/// an 8-byte `struct bpf_insn`) under `license`, attached as `attach_type` to the
/// kernel function whose BTF id is `btf_id`. Both slices must outlive the load.
pub fn tracing_prog<I>(insns: &[I], license: &CStr, attach_type: u32, btf_id: u32) -> Attr {
    btf_prog(BPF_PROG_TYPE_TRACING, insns, license, attach_type, btf_id)
}

/// [`tracing_prog`] for a program of type `prog_type` (`BPF_PROG_TYPE_LSM`: attached as
/// `BPF_LSM_MAC` to the kernel's `bpf_lsm_<hook>` whose BTF id is `btf_id`).
pub fn btf_prog<I>(
    prog_type: u32,
    insns: &[I],
    license: &CStr,
    attach_type: u32,
    btf_id: u32,
) -> Attr {
    const { assert!(size_of::<I>() == 8, "a BPF instruction is 8 bytes") };
    let mut attr = Attr::zeroed();
    // prog_load: prog_type (0), insn_cnt (4), insns (8), license (16), ...,
    // expected_attach_type (68), attach_btf_id (108).
    attr.u32(0, prog_type)
        .u32(4, insns.len() as u32)
        .u64(8, insns.as_ptr() as u64)
        .u64(16, license.as_ptr() as u64)
        .u32(68, attach_type)
        .u32(108, btf_id);
    attr
}

/// Pins the BPF object `fd` (a program, map or link) at `path` on a bpffs.
pub fn obj_pin(fd: BorrowedFd<'_>, path: &Path) -> std::io::Result<()> {
    let c_path = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // obj_pin: pathname (0), bpf_fd (8).
    let mut attr = Attr::zeroed();
    attr.u64(0, c_path.as_ptr() as u64)
        .u32(8, fd.as_raw_fd() as u32);
    bpf(BPF_OBJ_PIN, &mut attr).map(drop)
}

/// `BPF_OBJ_GET`.
const BPF_OBJ_GET: libc::c_long = 7;
/// `BPF_LINK_UPDATE`.
const BPF_LINK_UPDATE: libc::c_long = 29;
/// Opens the BPF object pinned at `path`.
pub fn obj_get(path: &Path) -> std::io::Result<OwnedFd> {
    let c_path = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // obj_get: pathname (0), bpf_fd (8, 0), file_flags (12, 0: read and write).
    let mut attr = Attr::zeroed();
    attr.u64(0, c_path.as_ptr() as u64);
    bpf_fd(BPF_OBJ_GET, &mut attr)
}

/// Makes `link` run program `new` in place of the one it runs, atomically (a cgroup
/// link: no event runs without a program, none runs both).
pub fn link_update(link: BorrowedFd<'_>, new: BorrowedFd<'_>) -> std::io::Result<()> {
    // link_update: link_fd (0), new_prog_fd (4), flags (8: none, so whatever program the
    // link runs is replaced).
    let mut attr = Attr::zeroed();
    attr.u32(0, link.as_raw_fd() as u32)
        .u32(4, new.as_raw_fd() as u32);
    bpf(BPF_LINK_UPDATE, &mut attr).map(drop)
}

/// `BPF_PROG_GET_FD_BY_ID`.
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
/// `BPF_OBJ_GET_INFO_BY_FD`.
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;

/// Fills `info` (a `struct bpf_link_info` or `struct bpf_prog_info`, or its head: the
/// kernel writes what fits) with what the kernel says of the object `fd`.
fn obj_info(fd: BorrowedFd<'_>, info: &mut [u8]) -> std::io::Result<()> {
    // info: bpf_fd (0), info_len (4), info (8).
    let mut attr = Attr::zeroed();
    attr.u32(0, fd.as_raw_fd() as u32)
        .u32(4, info.len() as u32)
        .u64(8, info.as_mut_ptr() as u64);
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr).map(drop)
}

/// How many runs of the program the link pinned at `path` runs the kernel skipped
/// because that program was already running on the CPU (`bpf_prog_info`'s
/// `recursion_misses`, Linux 5.12: a task preempted inside a tracing program, or an
/// interrupt that reaches it again).
pub fn skipped_runs(path: &Path) -> std::io::Result<u64> {
    let link = obj_get(path)?;
    // bpf_link_info: type (0), id (4), prog_id (8).
    let mut head = [0u8; 12];
    obj_info(link.as_fd(), &mut head)?;
    let prog_id = u32::from_ne_bytes([head[8], head[9], head[10], head[11]]);
    let mut attr = Attr::zeroed();
    attr.u32(0, prog_id);
    let prog = bpf_fd(BPF_PROG_GET_FD_BY_ID, &mut attr)?;
    let at = std::mem::offset_of!(aya_obj::generated::bpf_prog_info, recursion_misses);
    let mut info = [0u8; size_of::<aya_obj::generated::bpf_prog_info>()];
    obj_info(prog.as_fd(), &mut info)?;
    let mut word = [0u8; 8];
    word.copy_from_slice(&info[at..at + 8]);
    Ok(u64::from_ne_bytes(word))
}
