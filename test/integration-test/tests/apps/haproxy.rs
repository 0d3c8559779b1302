//! HAProxy in TCP mode in front of an echo server (the suite's Go echo, plain
//! Read/Write), six 8 MiB streams echoed through it, each checked byte for byte: with
//! splicing as HAProxy decides (`option splice-auto`), forced both ways, and off.
//!
//! With splicing HAProxy reads its sockets with splice(2), which sees only the TCP
//! receive queue; these assert every byte back and every connection paired, not that
//! every byte was redirected.

use anyhow::Result;
use testbed::apps::{
    go::{self, Relay, StreamCheck},
    haproxy::{self, Splice},
};

use super::{
    go::stream_exact,
    support::{Bed, app_test},
};

const ECHO_PORT: u16 = 7101;
const PROXY_PORT: u16 = 7102;
const STREAMS: u32 = 6;
const STREAM_BYTES: u64 = 8 << 20;

fn echo_through(splice: Splice) -> Result<()> {
    // Splicing: the agent as users start it (see `Bed::as_users_run`).
    let bed = match splice {
        Splice::Off => Bed::new()?,
        Splice::Auto | Splice::Forced => Bed::as_users_run()?,
    };
    let mut echo = go::echo(bed.a(), bed.pods.a.v4_addr(ECHO_PORT), Relay::ReadWrite)?;
    let mut proxy = haproxy::start(bed.b(), bed.pods.b.v4_addr(PROXY_PORT), echo.addr(), splice)?;
    let check = StreamCheck::echo(proxy.addr(), STREAMS, STREAM_BYTES);
    // Each client's connection and HAProxy's to the echo server (made on accept).
    let hops = 2 * u64::from(STREAMS);
    let what = format!("haproxy (splice {splice:?})");
    let (report, delta) = stream_exact(&bed, &check, hops, &mut [&mut proxy, &mut echo], &what)?;
    if splice == Splice::Off {
        // Through HAProxy's buffers: four directions, each the payload.
        return delta.expect_bypassed(&what, hops, 4 * report.bytes_sent);
    }
    if splice == Splice::Forced {
        return delta.expect_spliced_to_tcp(&what, hops);
    }
    // HAProxy's heuristic may or may not splice these streams.
    eprintln!("{what}: {}", delta.summary());
    delta.expect_paired(&what, hops)
}

#[test]
fn splice_auto_echo_exact() -> Result<()> {
    app_test!(haproxy::NEEDS);
    echo_through(Splice::Auto)
}

#[test]
fn splice_forced_echo_exact() -> Result<()> {
    app_test!(haproxy::NEEDS);
    echo_through(Splice::Forced)
}

#[test]
fn no_splice_echo_exact() -> Result<()> {
    app_test!(haproxy::NEEDS);
    echo_through(Splice::Off)
}
