//! Connections leaving the SockHash: once one is marked [`link_state::LEAVING`] neither
//! side redirects again, and the agent, told through the event ring buffer, deletes
//! both sockets from the SockHash when each side has read what was redirected to it.
//! The kernel then runs them as plain TCP (net/core/sock_map.c: the last map entry of a
//! socket gone, its psock is dropped and its original protocol restored).

use core::ptr::addr_of_mut;

use bypass_common::{
    Link, SockKey, SockState, Stat, control,
    state::{LeaveEvent, link_state},
};

use crate::{
    atomic,
    maps::{BYPASS_CONTROL, BYPASS_CUT, BYPASS_EVENTS},
    stats,
};

/// Marks the connection of the link at `ptr` (key `key`) as leaving; the first to do so
/// tells the agent.
#[inline(always)]
pub(crate) fn request(ptr: *mut Link, key: &SockKey) {
    mark(ptr, key, link_state::LEAVING);
}

/// Marks the connection of the link at `ptr` (key `key`) cut, as [`check_cut`] does
/// for a cut the agent made.
#[inline(always)]
pub(crate) fn cut(ptr: *mut Link, key: &SockKey) {
    stats::add(Stat::CutSeen, 1);
    mark(ptr, key, link_state::CUT);
}

/// Or-s `bits` (with [`link_state::LEAVING`]) into the state of the link at `ptr` (key
/// `key`); the first to mark it leaving tells the agent.
#[inline(always)]
fn mark(ptr: *mut Link, key: &SockKey, bits: u64) {
    // SAFETY: a live map value; the state word is only ever or-ed.
    let old = unsafe { atomic::or_u64(addr_of_mut!((*ptr).state), bits | link_state::LEAVING) };
    if old & link_state::LEAVING == 0 {
        stats::add(Stat::LeaveRequests, 1);
        // A full ring buffer loses the event, not the leave: counted, the agent then
        // scans the links for leaving ones (as when it starts), and the connection
        // stays correct (on TCP) in the SockHash meanwhile.
        if BYPASS_EVENTS.output(LeaveEvent { link: *key }, 0).is_err() {
            stats::add(Stat::LeaveEventsLost, 1);
        }
    }
}

/// Once per cut generation ([`control::SLOT_CUT_GEN`]), whether the agent cut this
/// socket's connection (in the cut map, or every connection since the socket last
/// checked, [`control::SLOT_CUT_ALL`]); a cut connection leaves. `ptr` must be this socket's link
/// (checked with `Link::is_of`). Returns whether it was cut now.
#[inline(always)]
pub(crate) fn check_cut(state: &mut SockState, ptr: *mut Link) -> bool {
    let generation = BYPASS_CONTROL
        .get(control::SLOT_CUT_GEN)
        .copied()
        .unwrap_or(0);
    if generation == state.cut_gen {
        return false;
    }
    let seen = state.cut_gen;
    state.cut_gen = generation;
    // The agent writes the cut (its map entries, or SLOT_CUT_ALL) before the
    // generation: a fully ordered atomic keeps the reads below after the generation's
    // on weakly ordered CPUs. Once per generation, not per send.
    // SAFETY: a live map value (`ptr` is this socket's link).
    unsafe { atomic::load_ordered(addr_of_mut!((*ptr).state)) };
    let all = BYPASS_CONTROL
        .get(control::SLOT_CUT_ALL)
        .copied()
        .unwrap_or(0);
    if !control::cut_everything_since(seen, generation, all)
        && BYPASS_CUT.get_ptr(&state.link).is_none()
    {
        return false;
    }
    // Marked cut as well as leaving: a sender draining a TCP-only reader stops too.
    cut(ptr, &state.link);
    true
}
