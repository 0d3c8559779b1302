//! Go programs: an `io.Copy(conn, conn)` echo and an L4 proxy doing `io.Copy` both ways
//! (Go's standard patterns, which read with splice(2)), their plain Read/Write
//! counterparts, an `httputil.ReverseProxy` in front of a Go HTTP server, and a gRPC
//! bidirectional stream.
//!
//! splice(2) reads only a socket's TCP receive queue (`tcp_splice_read`), not the
//! sockmap's ingress queue the bypass redirects into; the splice workloads assert that
//! every byte arrives and that their connections were paired, not that every byte was
//! redirected: a datapath may carry them either way, as long as none is lost.

use anyhow::{Result, bail, ensure};
use testbed::apps::{
    Gate, Listening,
    go::{self, GrpcCheck, HttpCheck, Relay, StreamCheck, StreamReport},
};

use super::support::{Bed, Delta, app_test};

const ECHO_PORT: u16 = 7001;
const PROXY_PORT: u16 = 7002;
const SINK_PORT: u16 = 7003;
const HTTP_PORT: u16 = 7004;
const GRPC_PORT: u16 = 7005;
/// The echo: one connection of this many bytes.
const ECHO_BYTES: u64 = 4 << 20;
/// The L4 proxy: connections, and bytes on each.
const PROXY_CONNECTIONS: u32 = 20;
const PROXY_BYTES: u64 = 1 << 20;
/// The reverse proxy: GET+POST rounds, body sizes cycled.
const HTTP_ROUNDS: u32 = 40;
const HTTP_SIZES: [u64; 5] = [0, 1000, 65_537, 1 << 20, 4 << 20];
/// The gRPC stream: messages, sizes cycled.
const GRPC_MESSAGES: u32 = 200;
const GRPC_SIZES: [u64; 4] = [1, 100, 10_000, 1 << 20];

/// `check` from pod a, its connections let go once `hops` connections are paired; then
/// `servers` still running and every stream exact (`what` names it, the counters' delta
/// quoted on failure). The report and that delta.
pub fn stream_exact(
    bed: &Bed,
    check: &StreamCheck,
    hops: u64,
    servers: &mut [&mut Listening],
    what: &str,
) -> Result<(StreamReport, Delta)> {
    let gate = Gate::new()?;
    let mark = bed.mark()?;
    let report = check.run_gated(bed.a(), &gate, || bed.wait_paired(&mark, hops))?;
    let delta = bed.since(&mark)?;
    for s in servers.iter_mut() {
        s.server().ensure_running()?;
    }
    if let Err(e) = ensure_exact(what, &report, check.bytes, &delta) {
        let logs: Vec<String> = servers.iter_mut().map(|s| s.server().described()).collect();
        bail!("{e:#}\n{}", logs.join("\n"));
    }
    Ok((report, delta))
}

/// `streamcheck` report: every connection exact; `delta` is quoted on failure.
fn ensure_exact(what: &str, r: &StreamReport, bytes: u64, delta: &Delta) -> Result<()> {
    ensure!(
        r.failures.is_empty() && r.exact == r.connections,
        "{what}: {} of {} connections exact, {} of {} B back ({}): {:#?}",
        r.exact,
        r.connections,
        r.bytes_back,
        r.bytes_sent,
        delta.summary(),
        r.failures
    );
    ensure!(
        r.bytes_sent == u64::from(r.connections) * bytes && r.bytes_back == r.bytes_sent,
        "{what}: sent {} B, {} B back, want {} each way",
        r.bytes_sent,
        r.bytes_back,
        u64::from(r.connections) * bytes
    );
    eprintln!(
        "{what}: {} connections, {} B sent, all back or vouched for, {:.2} s",
        r.connections, r.bytes_sent, r.secs
    );
    Ok(())
}

/// A splicing relay runs under the agent as users start it: refused where the kernel
/// has no read guard, guarded where it has one.
fn bed_for(relay: Relay) -> Result<Bed> {
    match relay {
        Relay::Copy => Bed::as_users_run(),
        Relay::ReadWrite => Bed::new(),
    }
}

/// A Go echo in pod b, one gated connection from pod a.
fn echo(relay: Relay) -> Result<()> {
    let bed = bed_for(relay)?;
    let mut server = go::echo(bed.b(), bed.pods.b.v4_addr(ECHO_PORT), relay)?;
    let check = StreamCheck::echo(server.addr(), 1, ECHO_BYTES);
    let what = format!("go echo ({relay:?})");
    let (_, delta) = stream_exact(&bed, &check, 1, &mut [&mut server], &what)?;
    match relay {
        Relay::Copy => delta.expect_spliced_to_tcp(&what, 1),
        Relay::ReadWrite => delta.expect_bypassed(&what, 1, 2 * ECHO_BYTES),
    }
}

#[test]
fn io_copy_echo_exact() -> Result<()> {
    app_test!(go::ALL);
    echo(Relay::Copy)
}

#[test]
fn read_write_echo_exact() -> Result<()> {
    app_test!(go::ALL);
    echo(Relay::ReadWrite)
}

/// Pod a's clients → the proxy in pod b → the sink in pod a; each connection's bytes
/// vouched for by the sink's SHA-256.
fn l4_proxy(relay: Relay) -> Result<()> {
    let bed = bed_for(relay)?;
    let mut sink = go::sink(bed.a(), bed.pods.a.v4_addr(SINK_PORT))?;
    let mut proxy = go::l4proxy(bed.b(), bed.pods.b.v4_addr(PROXY_PORT), sink.addr(), relay)?;
    let check = StreamCheck {
        expect: testbed::apps::go::Expect::Digest,
        ..StreamCheck::echo(proxy.addr(), PROXY_CONNECTIONS, PROXY_BYTES)
    };
    // Each client's connection and the proxy's to the sink.
    let hops = 2 * u64::from(PROXY_CONNECTIONS);
    let what = format!("go L4 proxy ({relay:?}) to a digest sink");
    let (report, delta) = stream_exact(&bed, &check, hops, &mut [&mut proxy, &mut sink], &what)?;
    match relay {
        Relay::Copy => delta.expect_spliced_to_tcp(&what, hops),
        // Both hops carry the bytes.
        Relay::ReadWrite => delta.expect_bypassed(&what, hops, 2 * report.bytes_sent),
    }
}

#[test]
fn l4_proxy_io_copy_exact() -> Result<()> {
    app_test!(go::ALL);
    l4_proxy(Relay::Copy)
}

#[test]
fn l4_proxy_read_write_exact() -> Result<()> {
    app_test!(go::ALL);
    l4_proxy(Relay::ReadWrite)
}

/// `httpcheck` in pod a → `httputil.ReverseProxy` in pod b → the HTTP server in pod a,
/// keep-alive on both hops.
#[test]
fn http_reverse_proxy_exact() -> Result<()> {
    app_test!(go::ALL);
    let bed = Bed::new()?;
    let mut origin = go::http_server(bed.a(), bed.pods.a.v4_addr(HTTP_PORT))?;
    let mut proxy = go::reverse_proxy(bed.b(), bed.pods.b.v4_addr(PROXY_PORT), origin.addr())?;
    let check = HttpCheck {
        connect: proxy.addr(),
        rounds: HTTP_ROUNDS,
        sizes: HTTP_SIZES.to_vec(),
        keep_alive: true,
    };
    let mark = bed.mark()?;
    let r = check.run(bed.a())?;
    let delta = bed.since(&mark)?;
    proxy.server().ensure_running()?;
    origin.server().ensure_running()?;
    ensure!(
        r.failures.is_empty() && r.exact == r.requests && r.requests == 2 * HTTP_ROUNDS,
        "{} of {} requests exact: {:#?}",
        r.exact,
        r.requests,
        r.failures
    );
    eprintln!(
        "go reverse proxy: {} requests exact ({} B got, {} B posted) on {} connection(s), {:.2} s",
        r.requests, r.bytes_got, r.bytes_posted, r.new_connections, r.secs
    );
    // Responses go socket to socket on both hops (the server and the proxy answer
    // once paired); requests leave as soon as a connection is up, so their direction
    // may keep TCP.
    delta.expect_bypassed("go reverse proxy", 2, 2 * r.bytes_got)
}

/// One gRPC bidirectional stream, every message echoed.
#[test]
fn grpc_bidi_stream_exact() -> Result<()> {
    app_test!(go::ALL);
    let bed = Bed::new()?;
    let mut server = go::grpc_server(bed.b(), bed.pods.b.v4_addr(GRPC_PORT))?;
    let check = GrpcCheck {
        connect: server.addr(),
        messages: GRPC_MESSAGES,
        sizes: GRPC_SIZES.to_vec(),
    };
    let mark = bed.mark()?;
    let r = check.run(bed.a())?;
    let delta = bed.since(&mark)?;
    server.server().ensure_running()?;
    ensure!(
        r.failures.is_empty() && r.exact == r.messages && r.sha256_sent == r.sha256_back,
        "{} of {} messages exact, stream SHA-256 sent {} back {}: {:#?}",
        r.exact,
        r.messages,
        r.sha256_sent,
        r.sha256_back,
        r.failures
    );
    eprintln!(
        "grpc: {} messages, {} B each way, stream SHA-256 {} both ways, {:.2} s",
        r.messages, r.bytes_sent, r.sha256_back, r.secs
    );
    // The echoes go socket to socket (the server answers once paired).
    delta.expect_bypassed("grpc", 1, r.bytes_back)
}
