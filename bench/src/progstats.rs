//! The programs' own cost, from the kernel's `bpf_stats` (run count and run time per
//! program, kept while the enabling fd is open): read at the start and end of a block,
//! the difference over runs is nanoseconds per run.

use std::{os::fd::OwnedFd, path::Path};

use anyhow::{Context as _, Result};
use aya::programs::{ProgramInfo, loaded_programs};

/// Keeps `bpf_stats` on while alive.
pub struct Enabled(#[allow(dead_code)] OwnedFd);

/// Turns run-time statistics on (BPF_ENABLE_STATS).
pub fn enable() -> Result<Enabled> {
    let fd = aya::sys::enable_stats(aya::sys::Stats::RunTime)
        .context("enable bpf_stats (BPF_ENABLE_STATS; needs CAP_SYS_ADMIN)")?;
    Ok(Enabled(fd))
}

/// Runs and nanoseconds of one program so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Runs.
    pub runs: u64,
    /// Nanoseconds spent in the program.
    pub ns: u64,
}

impl Counts {
    fn of(info: &ProgramInfo) -> Self {
        Self {
            runs: info.run_count(),
            ns: u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX),
        }
    }

    /// Growth since `earlier`.
    pub fn since(self, earlier: Self) -> Self {
        Self {
            runs: self.runs.saturating_sub(earlier.runs),
            ns: self.ns.saturating_sub(earlier.ns),
        }
    }
}

/// The counts of the program pinned at `path`.
pub fn pinned(path: &Path) -> Result<Counts> {
    let info = ProgramInfo::from_pin(path)
        .with_context(|| format!("read the program pinned at {}", path.display()))?;
    Ok(Counts::of(&info))
}

/// The counts of the loaded program with kernel id `id`.
pub fn by_id(id: u32) -> Result<Counts> {
    for info in loaded_programs() {
        let info = info.context("list loaded BPF programs")?;
        if info.id() == id {
            return Ok(Counts::of(&info));
        }
    }
    anyhow::bail!("no loaded BPF program with id {id}")
}
