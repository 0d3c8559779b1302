//! Asking the kernel what is attached to a cgroup (`BPF_PROG_QUERY`), so a test can
//! check that an agent left nothing behind without trusting the agent's own report; and
//! a bpf file system of a test's own, apart from the real one.

use std::{
    fs::File,
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};
use nix::mount::{MntFlags, MsFlags, mount, umount2};

/// A fresh bpf file system mounted at a new directory, for a test that must not risk
/// the real /sys/fs/bpf; unmounted (with whatever is pinned in it) and the directory
/// removed on drop.
#[derive(Debug)]
pub struct TempBpffs {
    dir: PathBuf,
}

impl TempBpffs {
    /// Creates `dir` (it must not exist) and mounts a new bpffs there.
    pub fn mount(dir: &Path) -> Result<Self> {
        std::fs::create_dir(dir).with_context(|| format!("create {}", dir.display()))?;
        if let Err(e) = mount(
            Some("bpf"),
            dir,
            Some("bpf"),
            MsFlags::empty(),
            None::<&str>,
        ) {
            let _ = std::fs::remove_dir(dir);
            return Err(e).with_context(|| format!("mount bpffs at {}", dir.display()));
        }
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.dir
    }
}

impl Drop for TempBpffs {
    fn drop(&mut self) {
        // Detached: a process still holding a pin open cannot keep it mounted.
        if let Err(e) = umount2(&self.dir, MntFlags::MNT_DETACH) {
            eprintln!("testbed: cleanup: umount {}: {e}", self.dir.display());
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

const BPF_PROG_QUERY: libc::c_long = 16;
const BPF_CGROUP_SOCK_OPS: u32 = 3;
const BPF_CGROUP_SETSOCKOPT: u32 = 22;

/// The `query` member of `union bpf_attr` (include/uapi/linux/bpf.h), up to `revision`.
#[repr(C)]
#[derive(Default)]
struct ProgQuery {
    target_fd: u32,
    attach_type: u32,
    query_flags: u32,
    attach_flags: u32,
    prog_ids: u64,
    prog_cnt: u32,
    _pad: u32,
    prog_attach_flags: u64,
    link_ids: u64,
    link_attach_flags: u64,
    revision: u64,
}

/// Number of sock_ops programs attached directly to the cgroup at `path` (not those
/// inherited from its ancestors).
pub fn sockops_attached(path: &Path) -> Result<u32> {
    attached(path, BPF_CGROUP_SOCK_OPS, "sock_ops")
}

/// Number of setsockopt programs attached directly to the cgroup at `path`.
pub fn sockopt_attached(path: &Path) -> Result<u32> {
    attached(path, BPF_CGROUP_SETSOCKOPT, "setsockopt")
}

fn attached(path: &Path, attach_type: u32, what: &str) -> Result<u32> {
    let dir = File::open(path).with_context(|| format!("open cgroup {}", path.display()))?;
    let mut attr = ProgQuery {
        target_fd: dir.as_raw_fd() as u32,
        attach_type,
        ..Default::default()
    };
    // Raw bpf(2) BPF_PROG_QUERY: nix has no bpf(2) wrapper, and aya 0.14 queries only
    // cgroup_device, lirc_mode2 and tcx attachments (`CgroupDevice::query`, ...).
    // SAFETY: `attr` is a valid, zero-padded bpf_attr prefix of the size passed; with
    // `prog_ids` 0 the kernel only writes `prog_cnt`, `attach_flags` and `revision`.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_QUERY,
            &mut attr as *mut ProgQuery,
            std::mem::size_of::<ProgQuery>() as u32,
        )
    };
    if ret != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("BPF_PROG_QUERY {what} on {}", path.display()));
    }
    Ok(attr.prog_cnt)
}

/// The program each link pinned under `dir` runs, by the link's pin name.
pub fn pinned_link_programs(dir: &Path) -> Result<std::collections::BTreeMap<String, u32>> {
    let mut programs = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("read {}", dir.display()))? {
        let path = entry?.path();
        let link: aya::programs::links::FdLink = aya::programs::links::PinnedLink::from_pin(&path)
            .with_context(|| format!("open the link pinned at {}", path.display()))?
            .into();
        let id = link
            .info()
            .with_context(|| format!("the link pinned at {}", path.display()))?
            .program_id();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        programs.insert(name.into_owned(), id);
    }
    Ok(programs)
}

/// `BPF_PROG_TYPE_TRACING` and `BPF_PROG_TYPE_LSM` (include/uapi/linux/bpf.h).
pub const PROG_TYPE_TRACING: u32 = 26;
pub const PROG_TYPE_LSM: u32 = 29;

/// The type (`bpf_prog_type`) of the loaded program with id `id`.
pub fn program_type(id: u32) -> Result<u32> {
    for info in aya::programs::loaded_programs() {
        let info = info.context("list the loaded BPF programs")?;
        if info.id() == id {
            return Ok(info.program_type() as u32);
        }
    }
    anyhow::bail!("no loaded BPF program has id {id}")
}

/// Whether the kernel's BPF LSM is active, as the kernel lists its active LSMs
/// (securityfs' `lsm`, mounted here for the read if it is not).
pub fn bpf_lsm_active() -> Result<bool> {
    let list = Path::new("/sys/kernel/security/lsm");
    if !list.exists() {
        mount(
            Some("securityfs"),
            "/sys/kernel/security",
            Some("securityfs"),
            MsFlags::empty(),
            None::<&str>,
        )
        .context("mount securityfs at /sys/kernel/security to read the active LSMs")?;
    }
    let active =
        std::fs::read_to_string(list).with_context(|| format!("read {}", list.display()))?;
    Ok(active.trim().split(',').any(|l| l == "bpf"))
}
