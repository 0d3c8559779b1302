//! Atomic read-modify-writes on map and storage values, for the fields two programs on
//! two CPUs update or check against each other (`bypass_common::state`, "Who writes
//! what"), on 64-bit words only: the 32-bit forms need LLVM's `alu32`, which this
//! crate is not built with (build.rs).
//!
//! [`or_u64`] returns the old value, so the compiler emits the fetching form
//! (`BPF_ATOMIC | BPF_FETCH`, Linux >= 5.12), which is fully ordered on every
//! architecture the kernel JITs for (Documentation/bpf/standardization/
//! instruction-set.rst): a write before one is seen by anyone who sees it, and a read
//! after one sees what was there first. [`add_u64`] and [`sub_u64`] return nothing: the
//! fetching add needs BPF ISA v3 code generation (jmp32), which brings `alu32` with it.
//! Where an add must be ordered or its result known, the caller follows it with
//! [`load_ordered`] of the same word.

use core::intrinsics::{AtomicOrdering, atomic_cxchg, atomic_or, atomic_xadd, atomic_xsub};

/// `*p += v` (not ordered: see [`load_ordered`]).
///
/// # Safety
/// `p` points into a live map or storage value.
#[inline(always)]
pub(crate) unsafe fn add_u64(p: *mut u64, v: u64) {
    // SAFETY: see above.
    let _ = unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::SeqCst }>(p, v) };
}

/// `*p -= v` (not ordered: see [`load_ordered`]).
///
/// # Safety
/// `p` points into a live map or storage value.
#[inline(always)]
pub(crate) unsafe fn sub_u64(p: *mut u64, v: u64) {
    // SAFETY: see above.
    let _ = unsafe { atomic_xsub::<u64, u64, { AtomicOrdering::SeqCst }>(p, v) };
}

/// `*p |= v`, returning the old value; fully ordered.
///
/// # Safety
/// `p` points into a live map or storage value.
#[inline(always)]
pub(crate) unsafe fn or_u64(p: *mut u64, v: u64) -> u64 {
    // SAFETY: see above.
    unsafe { atomic_or::<u64, u64, { AtomicOrdering::SeqCst }>(p, v) }
}

/// `*p`, read by a fully ordered atomic (an or of 0): after an [`add_u64`] of the same
/// word, the sum with that add in it (and any other made meanwhile), and a barrier
/// between the add and every read that follows.
///
/// # Safety
/// `p` points into a live map or storage value.
#[inline(always)]
pub(crate) unsafe fn load_ordered(p: *mut u64) -> u64 {
    // SAFETY: see above.
    unsafe { or_u64(p, 0) }
}

/// If `*p == old`, `*p = new`; whether it did (`BPF_CMPXCHG`, Linux >= 5.12). Fully
/// ordered when it succeeds; a failed one orders nothing (the kernel's
/// `atomic64_cmpxchg`, and arm64's JIT without LSE atomics branches past its barrier).
///
/// # Safety
/// `p` points into a live map or storage value.
#[inline(always)]
pub(crate) unsafe fn cmpxchg_u64(p: *mut u64, old: u64, new: u64) -> bool {
    // SAFETY: see above.
    unsafe {
        atomic_cxchg::<u64, { AtomicOrdering::SeqCst }, { AtomicOrdering::SeqCst }>(p, old, new).1
    }
}
