//! Pinned BPF maps read (and a control slot written) straight from the kernel
//! (`BPF_OBJ_GET`, then `BPF_MAP_GET_NEXT_KEY` / `LOOKUP_ELEM` / `UPDATE_ELEM`), so a
//! test can see what the SockHash holds without trusting the agent's own report. Values are not read: a SockHash lookup from user space
//! answers with a socket cookie only for 8-byte values.

use std::{
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    path::Path,
};

use anyhow::{Context as _, Result, bail};

const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
const BPF_OBJ_GET: libc::c_long = 7;

/// At most this many keys are read (a map changing under the walk could go on).
pub const MAX_KEYS: usize = 1 << 20;

/// The `map_elem` member of `union bpf_attr` (include/uapi/linux/bpf.h), `next_key`
/// in place of `value`.
#[repr(C)]
struct MapNextKey {
    map_fd: u32,
    _pad: u32,
    key: u64,
    next_key: u64,
    flags: u64,
}

/// The `map_elem` member of `union bpf_attr` (include/uapi/linux/bpf.h).
#[repr(C)]
struct MapElem {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// The `obj` member of `union bpf_attr`.
#[repr(C)]
struct ObjGet {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
    path_fd: i32,
    _pad: u32,
}

fn bpf(cmd: libc::c_long, attr: *mut libc::c_void, size: usize) -> std::io::Result<i64> {
    // SAFETY: `attr` points to a live, zero-padded bpf_attr prefix of `size` bytes.
    let ret = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr, size as u32) };
    if ret < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(ret)
}

fn open_pinned(pin: &Path) -> Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt as _;
    let path = std::ffi::CString::new(pin.as_os_str().as_bytes())?;
    let mut attr = ObjGet {
        pathname: path.as_ptr() as u64,
        bpf_fd: 0,
        file_flags: 0,
        path_fd: 0,
        _pad: 0,
    };
    let fd = bpf(BPF_OBJ_GET, (&raw mut attr).cast(), size_of::<ObjGet>())
        .with_context(|| format!("BPF_OBJ_GET {}", pin.display()))?;
    // SAFETY: the kernel just returned this fd to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// The keys of the map pinned at `pin`, each `key_size` bytes (the map's key size),
/// each once; a key added or removed during the walk may be missed.
pub fn pinned_map_keys(pin: &Path, key_size: usize) -> Result<Vec<Vec<u8>>> {
    let fd = open_pinned(pin)?;
    let mut keys = Vec::new();
    let mut next = vec![0u8; key_size];
    let mut prev: Option<Vec<u8>> = None;
    let mut seen = std::collections::HashSet::new();
    loop {
        let mut attr = MapNextKey {
            map_fd: fd.as_raw_fd() as u32,
            _pad: 0,
            key: prev.as_ref().map_or(0, |k| k.as_ptr() as u64),
            next_key: next.as_mut_ptr() as u64,
            flags: 0,
        };
        match bpf(
            BPF_MAP_GET_NEXT_KEY,
            (&raw mut attr).cast(),
            size_of::<MapNextKey>(),
        ) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(keys),
            Err(e) => {
                return Err(e).with_context(|| format!("walk the keys of {}", pin.display()));
            }
        }
        // A key deleted under the walk restarts it from the first key: stop at a repeat.
        if !seen.insert(next.clone()) {
            return Ok(keys);
        }
        keys.push(next.clone());
        if keys.len() >= MAX_KEYS {
            bail!("{} has more than {MAX_KEYS} keys", pin.display());
        }
        prev = Some(next.clone());
    }
}

/// One `BPF_MAP_{LOOKUP,UPDATE}_ELEM` on slot `key` of the `Array<u32>` pinned at `pin`,
/// the value read into or written from `value`.
fn slot_elem(pin: &Path, cmd: libc::c_long, key: u32, value: *mut u32) -> std::io::Result<()> {
    let fd = open_pinned(pin).map_err(std::io::Error::other)?;
    let mut attr = MapElem {
        map_fd: fd.as_raw_fd() as u32,
        _pad: 0,
        key: (&raw const key) as u64,
        value: value as u64,
        flags: 0,
    };
    bpf(cmd, (&raw mut attr).cast(), size_of::<MapElem>()).map(drop)
}

/// Reads slot `key` of a pinned `Array<u32>`.
pub fn pinned_u32(pin: &Path, key: u32) -> Result<u32> {
    let mut value = 0u32;
    slot_elem(pin, BPF_MAP_LOOKUP_ELEM, key, &raw mut value)
        .with_context(|| format!("read slot {key} of {}", pin.display()))?;
    Ok(value)
}

/// Writes slot `key` of a pinned `Array<u32>`.
pub fn set_pinned_u32(pin: &Path, key: u32, mut value: u32) -> Result<()> {
    slot_elem(pin, BPF_MAP_UPDATE_ELEM, key, &raw mut value)
        .with_context(|| format!("write slot {key} of {}", pin.display()))
}
