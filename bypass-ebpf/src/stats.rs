//! Per-CPU counters.

use bypass_common::Stat;

use crate::maps::BYPASS_STATS;

/// Adds `n` to this CPU's slot of `stat`. Programs run with migration disabled, so a
/// plain add on the per-CPU slot is not torn.
#[inline(always)]
pub(crate) fn add(stat: Stat, n: u64) {
    if let Some(slot) = BYPASS_STATS.get_ptr_mut(stat.index()) {
        // SAFETY: the pointer is this CPU's slot of a live array entry.
        unsafe { *slot += n };
    }
}
