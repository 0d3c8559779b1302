//! Language runtimes' own socket loops: a Java NIO echo server (Selector, non-blocking
//! channels), and Node.js piping sockets (`net`, `stream.pipe`) as a proxy in front of
//! a Node.js echo; four 8 MiB streams each, every byte checked.

use anyhow::Result;
use testbed::apps::{go::StreamCheck, java, node};

use super::{
    go::stream_exact,
    support::{Bed, app_test},
};

const ECHO_PORT: u16 = 7201;
const PROXY_PORT: u16 = 7202;
const STREAMS: u32 = 4;
const STREAM_BYTES: u64 = 8 << 20;

#[test]
fn java_nio_echo_exact() -> Result<()> {
    app_test!(java::NEEDS);
    let bed = Bed::new()?;
    let mut server = java::nio_echo(bed.b(), bed.pods.b.v4_addr(ECHO_PORT))?;
    let check = StreamCheck::echo(server.addr(), STREAMS, STREAM_BYTES);
    let streams = u64::from(STREAMS);
    let (report, delta) = stream_exact(&bed, &check, streams, &mut [&mut server], "java NIO echo")?;
    // Paired before the first byte: both directions socket to socket.
    delta.expect_bypassed("java NIO echo", streams, 2 * report.bytes_sent)
}

#[test]
fn nodejs_pipe_proxy_echo_exact() -> Result<()> {
    app_test!(node::NEEDS);
    let bed = Bed::new()?;
    let mut echo = node::echo(bed.a(), bed.pods.a.v4_addr(ECHO_PORT))?;
    let mut proxy = node::proxy(bed.b(), bed.pods.b.v4_addr(PROXY_PORT), echo.addr())?;
    let check = StreamCheck::echo(proxy.addr(), STREAMS, STREAM_BYTES);
    // Each client's connection and the proxy's to the echo (made on accept).
    let hops = 2 * u64::from(STREAMS);
    let what = "node pipe proxy to a node echo";
    let (report, delta) = stream_exact(&bed, &check, hops, &mut [&mut proxy, &mut echo], what)?;
    // Four directions (to the proxy, to the echo, and back), each the payload.
    delta.expect_bypassed("node pipe proxy", hops, 4 * report.bytes_sent)
}
