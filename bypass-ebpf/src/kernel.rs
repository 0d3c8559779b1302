//! The few kernel fields the sk_msg program reads, through `bpf_probe_read_kernel` at
//! offsets the agent took from the running kernel's BTF and wrote into control slots
//! (`bypass_common::KernelLayout`). A probe read never faults: a bad address yields an
//! error, which every caller treats as "take the TCP path".

use aya_ebpf::helpers::bpf_probe_read_kernel;
use bypass_common::{KernelLayout, control, state::psock_of};

use crate::maps::BYPASS_CONTROL;

#[inline(always)]
fn slot(i: u32) -> u32 {
    BYPASS_CONTROL.get(i).copied().unwrap_or(0)
}

/// The offsets in the control slots (0: unknown).
#[inline(always)]
pub(crate) fn layout() -> KernelLayout {
    KernelLayout {
        sk_user_data: slot(control::SLOT_OFF_SK_USER_DATA),
        sk_write_pending: slot(control::SLOT_OFF_SK_WRITE_PENDING),
        psock_msg_tot_len: slot(control::SLOT_OFF_PSOCK_MSG_TOT_LEN),
        tcp_copied_seq: slot(control::SLOT_OFF_TCP_COPIED_SEQ),
        tcp_write_seq: slot(control::SLOT_OFF_TCP_WRITE_SEQ),
        sk_rcvlowat: slot(control::SLOT_OFF_SK_RCVLOWAT),
        sk_peek_off: slot(control::SLOT_OFF_SK_PEEK_OFF),
    }
}

#[inline(always)]
fn read_u32(addr: u64) -> Option<u32> {
    // SAFETY: a probe read copies or fails; it never dereferences in BPF.
    unsafe { bpf_probe_read_kernel(addr as *const u32) }.ok()
}

#[inline(always)]
fn read_u64(addr: u64) -> Option<u64> {
    // SAFETY: as above.
    unsafe { bpf_probe_read_kernel(addr as *const u64) }.ok()
}

/// Bytes waiting in the ingress queue of the socket at `sk` (`psock->msg_tot_len`).
#[inline(always)]
pub(crate) fn queued(sk: u64, l: &KernelLayout) -> Option<u32> {
    let psock = psock_of(read_u64(sk + u64::from(l.sk_user_data))?)?;
    read_u32(psock + u64::from(l.psock_msg_tot_len))
}

/// `write_seq` of the TCP socket at `sk`.
#[inline(always)]
pub(crate) fn write_seq(sk: u64, l: &KernelLayout) -> Option<u32> {
    read_u32(sk + u64::from(l.tcp_write_seq))
}

/// `sk_write_pending` of the socket at `sk`.
#[inline(always)]
pub(crate) fn write_pending(sk: u64, l: &KernelLayout) -> Option<u32> {
    read_u32(sk + u64::from(l.sk_write_pending))
}

/// `sk_rcvlowat` and `sk_peek_off` of the socket at `sk`.
#[inline(always)]
pub(crate) fn receive_options(sk: u64, l: &KernelLayout) -> Option<(i32, i32)> {
    let lowat = read_u32(sk + u64::from(l.sk_rcvlowat))?;
    let peek_off = read_u32(sk + u64::from(l.sk_peek_off))?;
    Some((lowat as i32, peek_off as i32))
}

/// `copied_seq` of the TCP socket at `sk`.
#[inline(always)]
pub(crate) fn copied_seq(sk: u64, l: &KernelLayout) -> Option<u32> {
    read_u32(sk + u64::from(l.tcp_copied_seq))
}
