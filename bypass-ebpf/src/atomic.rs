//! Atomic read-modify-writes on map and storage values, for the fields two programs on
//! two CPUs update or check against each other (`bypass_common::state`, "Who writes
//! what"). Each returns the old value so the compiler emits the fetching form
//! (`BPF_ATOMIC | BPF_FETCH`, which needs `alu32`: see build.rs): the fetching forms
//! are fully ordered on every architecture the kernel JITs for
//! (Documentation/bpf/standardization/instruction-set.rst), so a write before one is
//! seen by anyone who sees it, and a read after one sees what was there first.

use core::intrinsics::{AtomicOrdering, atomic_or, atomic_xadd, atomic_xsub};

/// `*p += v`, returning the old value.
///
/// # Safety
/// `p` points into a live map or storage value.
#[inline(always)]
pub(crate) unsafe fn add_u64(p: *mut u64, v: u64) -> u64 {
    // SAFETY: see above.
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::SeqCst }>(p, v) }
}

/// `*p -= v`, returning the old value.
///
/// # Safety
/// `p` points into a live map or storage value.
#[inline(always)]
pub(crate) unsafe fn sub_u64(p: *mut u64, v: u64) -> u64 {
    // SAFETY: see above.
    unsafe { atomic_xsub::<u64, u64, { AtomicOrdering::SeqCst }>(p, v) }
}

/// `*p |= v`, returning the old value.
///
/// # Safety
/// `p` points into a live map or storage value.
#[inline(always)]
pub(crate) unsafe fn or_u32(p: *mut u32, v: u32) -> u32 {
    // SAFETY: see above.
    unsafe { atomic_or::<u32, u32, { AtomicOrdering::SeqCst }>(p, v) }
}
