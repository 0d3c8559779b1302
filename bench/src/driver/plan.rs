//! Pure: what a run measures where: the placements that fit on this machine, the order
//! of the paths in each block group, and each server's ports by CPU.

use anyhow::{Result, bail};

use crate::{
    model::{Path, Placement},
    scenario,
};

/// First qperf listen port; the server pinned to CPU n listens on this + n.
const QPERF_PORT: u16 = 19765;
/// First sockperf port; the server pinned to CPU n listens on this + n.
const SOCKPERF_PORT: u16 = 11111;

/// Keeps the placements whose CPUs exist, with a warning for each one left out; fails
/// when none is left.
pub(crate) fn fit_placements(
    placements: &mut Vec<Placement>,
    cpus: usize,
    warnings: &mut Vec<String>,
) -> Result<()> {
    placements.retain(|p| {
        let ok = p.client_cpu < cpus && p.server_cpu < cpus;
        if !ok {
            warnings.push(format!(
                "placement {} skipped: only {cpus} CPUs",
                p.describe()
            ));
        }
        ok
    });
    if placements.is_empty() {
        bail!("no placement fits on {cpus} CPUs");
    }
    Ok(())
}

/// The measured paths of the first block group: bypass, default[, minimal]. A sweep
/// rotates it by one after each group so that every path comes first, second, ...
/// equally often: bypass, default[, minimal] | default[, minimal], bypass | ...
pub(crate) fn paths_of(minimal: bool) -> Vec<Path> {
    let mut paths = vec![Path::Bypass, Path::Default];
    if minimal {
        paths.push(Path::Minimal);
    }
    paths
}

pub(crate) fn qperf_port(cpu: usize) -> u16 {
    QPERF_PORT + cpu as u16
}

/// qperf's data port for the server on `cpu`, when a scenario fixes it.
pub(super) fn qperf_data_port(cpu: usize) -> u16 {
    scenario::QPERF_DATA_PORT + cpu as u16
}

pub(super) fn sockperf_port(cpu: usize) -> u16 {
    SOCKPERF_PORT + cpu as u16
}
