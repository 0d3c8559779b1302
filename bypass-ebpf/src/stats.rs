//! Per-CPU counters.

use bypass_common::Stat;

use crate::{atomic, maps::BYPASS_STATS};

/// Adds `n` to this CPU's slot of `stat`. Programs run with migration disabled but may
/// be preempted (and a program in softirq may run between another's load and store on
/// the same CPU), so the add is one atomic instruction: a plain load, add and store lost
/// updates under load (kernel 7.3: the node's redirected_bytes short of what the per-pod
/// counts, added atomically, summed).
#[inline(always)]
pub(crate) fn add(stat: Stat, n: u64) {
    if let Some(slot) = BYPASS_STATS.get_ptr_mut(stat.index()) {
        // SAFETY: the pointer is this CPU's slot of a live array entry.
        unsafe { atomic::add_u64(slot, n) };
    }
}
