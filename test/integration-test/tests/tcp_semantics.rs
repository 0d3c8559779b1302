//! The TCP semantics matrix: each behaviour an application can observe, run once on the
//! normal path and once bypassed, between the same two pods, with the same
//! `bypass-test-tool probe` case; the observations must be the same. Where this kernel's
//! sockmap differs and the datapath cannot avoid it, the test pins the documented
//! difference (named `..._known_difference`), so a kernel that fixes it shows up as a
//! failure to update docs/limitations.md.

use crate::support::privileged;

// The cases by topic, one file each under tests/tcp_semantics/; the tests below name
// them, so every test keeps its name in the harness (filters, `--skip`, the kernel
// table).
pub mod closing;
pub mod protocols;
pub mod reading;
pub mod scale;
pub mod sending;
pub mod support;

use anyhow::Result;

// -------------------------------------------------------------------------------------
// Closing (tests/tcp_semantics/closing.rs).

#[test]
fn half_close_both_ways_with_data_flowing_back() -> Result<()> {
    privileged!();
    closing::half_close_both_ways_with_data_flowing_back()
}

#[test]
fn linger_zero_reset_mid_stream() -> Result<()> {
    privileged!();
    closing::linger_zero_reset_mid_stream()
}

#[test]
fn reset_peer_keeps_redirected_bytes_readable() -> Result<()> {
    privileged!();
    closing::reset_peer_keeps_redirected_bytes_readable()
}

// -------------------------------------------------------------------------------------
// Reading (tests/tcp_semantics/reading.rs).

#[test]
fn peek_off_after_bytes_arrived_is_honoured_or_refused() -> Result<()> {
    privileged!();
    reading::peek_off_after_bytes_arrived_is_honoured_or_refused()
}

#[test]
fn msg_peek_then_read() -> Result<()> {
    privileged!();
    reading::msg_peek_then_read()
}

#[test]
fn mixed_reader_sees_what_tcp_shows() -> Result<()> {
    privileged!();
    reading::mixed_reader_sees_what_tcp_shows()
}

#[test]
fn fionread_after_urgent_bytes() -> Result<()> {
    privileged!();
    reading::fionread_after_urgent_bytes()
}

#[test]
fn fionread_counts_queued_bytes() -> Result<()> {
    privileged!();
    reading::fionread_counts_queued_bytes()
}

#[test]
fn so_rcvlowat_is_honoured() -> Result<()> {
    privileged!();
    reading::so_rcvlowat_is_honoured()
}

#[test]
fn so_rcvtimeo_times_out() -> Result<()> {
    privileged!();
    reading::so_rcvtimeo_times_out()
}

#[test]
fn epoll_readiness() -> Result<()> {
    privileged!();
    reading::epoll_readiness()
}

#[test]
fn msg_waitall_returns_what_is_queued_known_difference() -> Result<()> {
    privileged!();
    reading::msg_waitall_returns_what_is_queued_known_difference()
}

#[test]
fn splice_refused_however_busy_the_cpu() -> Result<()> {
    privileged!();
    reading::splice_refused_however_busy_the_cpu()
}

#[test]
fn splice_read_guarded_or_known_difference() -> Result<()> {
    privileged!();
    reading::splice_read_guarded_or_known_difference()
}

#[test]
fn splice_after_close_guarded_or_known_difference() -> Result<()> {
    privileged!();
    reading::splice_after_close_guarded_or_known_difference()
}

#[test]
fn splice_refused_then_one_read_takes_all() -> Result<()> {
    privileged!();
    reading::splice_refused_then_one_read_takes_all()
}

#[test]
fn msg_oob_is_not_urgent_known_difference() -> Result<()> {
    privileged!();
    reading::msg_oob_is_not_urgent_known_difference()
}

// -------------------------------------------------------------------------------------
// Sending (tests/tcp_semantics/sending.rs).

#[test]
fn blocking_reader_and_writer_threads_on_one_socket() -> Result<()> {
    privileged!();
    sending::blocking_reader_and_writer_threads_on_one_socket()
}

#[test]
fn sendfile_on_the_sender() -> Result<()> {
    privileged!();
    sending::sendfile_on_the_sender()
}

#[test]
fn splice_on_the_sender() -> Result<()> {
    privileged!();
    sending::splice_on_the_sender()
}

#[test]
fn msg_zerocopy_sender_gets_every_completion() -> Result<()> {
    privileged!();
    sending::msg_zerocopy_sender_gets_every_completion()
}

#[test]
fn one_gib_in_one_stream() -> Result<()> {
    privileged!();
    sending::one_gib_in_one_stream()
}

#[test]
fn write_blocked_while_connecting_stays_in_order() -> Result<()> {
    privileged!(testbed::require::preflight_iptables);
    sending::write_blocked_while_connecting_stays_in_order()
}

// -------------------------------------------------------------------------------------
// Many connections (tests/tcp_semantics/scale.rs).

#[test]
fn thousand_concurrent_streams() -> Result<()> {
    privileged!();
    scale::thousand_concurrent_streams()
}

#[test]
fn ten_thousand_connections_writing_at_once_both_ways() -> Result<()> {
    privileged!();
    scale::ten_thousand_connections_writing_at_once_both_ways()
}

// -------------------------------------------------------------------------------------
// Socket options and upper-layer protocols (tests/tcp_semantics/protocols.rs).

#[test]
fn ulp_refused_on_bypassed_socket() -> Result<()> {
    privileged!();
    protocols::ulp_refused_on_bypassed_socket()
}

#[test]
fn ulp_refused_after_disconnect() -> Result<()> {
    privileged!();
    protocols::ulp_refused_after_disconnect()
}

#[test]
fn setsockopt_answers_unchanged() -> Result<()> {
    privileged!();
    protocols::setsockopt_answers_unchanged()
}

#[test]
fn tcp_fast_open_stays_on_tcp_byte_exact() -> Result<()> {
    privileged!();
    protocols::tcp_fast_open_stays_on_tcp_byte_exact()
}

#[test]
fn mptcp_subflows_never_inserted() -> Result<()> {
    privileged!();
    protocols::mptcp_subflows_never_inserted()
}
