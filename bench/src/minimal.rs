//! The minimal reference datapath (`Path::Minimal`, built from `bench/minimal-ebpf`):
//! loaded and attached to the pods' cgroup for a block, detached when dropped. Sockets
//! it inserted leave the SockHash with it (nothing is pinned), so connections opened in
//! a later block never see it.

use std::{fs::File, path::Path};

use anyhow::{Context as _, Result};
use aya::{
    Ebpf,
    maps::SockHash,
    programs::{CgroupAttachMode, SkMsg, SockOps},
};

/// The object `build.rs` built.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/bypass-minimal"));

/// Program names in the object (also how `bpf_stats` finds them).
pub const PROG_SOCKOPS: &str = "minimal_sockops";
/// See [`PROG_SOCKOPS`].
pub const PROG_SKMSG: &str = "minimal_skmsg";
const MAP_SOCKETS: &str = "MINIMAL_SOCKETS";

/// The 16-byte key of the minimal SockHash (`minimal-ebpf`'s `Tuple`).
type Tuple = [u32; 4];

/// The attached minimal datapath; dropping it detaches both programs and frees the map.
pub struct Minimal {
    ebpf: Ebpf,
}

impl Minimal {
    /// Loads the object and attaches sock_ops to `cgroup` and sk_msg to its SockHash.
    pub fn attach(cgroup: &Path) -> Result<Self> {
        let mut ebpf = Ebpf::load(OBJECT).context("load the minimal reference datapath")?;
        let fd = {
            let map: SockHash<_, Tuple> = SockHash::try_from(
                ebpf.map(MAP_SOCKETS)
                    .with_context(|| format!("no map {MAP_SOCKETS} in the minimal object"))?,
            )?;
            map.fd().try_clone()?
        };
        let skmsg: &mut SkMsg = ebpf
            .program_mut(PROG_SKMSG)
            .with_context(|| format!("no program {PROG_SKMSG}"))?
            .try_into()?;
        skmsg.load().context("load minimal_skmsg")?;
        skmsg.attach(&fd).context("attach minimal_skmsg")?;
        let dir = File::open(cgroup).with_context(|| format!("open {}", cgroup.display()))?;
        let sockops: &mut SockOps = ebpf
            .program_mut(PROG_SOCKOPS)
            .with_context(|| format!("no program {PROG_SOCKOPS}"))?
            .try_into()?;
        sockops.load().context("load minimal_sockops")?;
        sockops
            .attach(&dir, CgroupAttachMode::Single)
            .with_context(|| format!("attach minimal_sockops to {}", cgroup.display()))?;
        Ok(Self { ebpf })
    }

    /// The kernel ids of its (sock_ops, sk_msg) programs, for `bpf_stats`.
    pub fn program_ids(&self) -> Result<(u32, u32)> {
        let id = |name: &str| -> Result<u32> {
            let prog = self
                .ebpf
                .program(name)
                .with_context(|| format!("no program {name}"))?;
            let info = match prog {
                aya::programs::Program::SockOps(p) => p.info()?,
                aya::programs::Program::SkMsg(p) => p.info()?,
                _ => anyhow::bail!("{name} has an unexpected type"),
            };
            Ok(info.id())
        };
        Ok((id(PROG_SOCKOPS)?, id(PROG_SKMSG)?))
    }
}
