//! nginx: a 64 MiB random file downloaded by curl over HTTP and over HTTPS (a
//! self-signed certificate the client verifies), each compared with the file by
//! SHA-256; ab by request count with keep-alive and with a connection per request,
//! every request complete.

use anyhow::{Result, ensure};
use testbed::apps::{
    http::{Ab, curl_get},
    nginx::{self, Nginx},
    payload::{first_difference, random_bytes, sha256_hex},
};

use super::support::{Bed, app_test};

const HTTP_PORT: u16 = 8080;
const HTTPS_PORT: u16 = 8443;
/// The large file.
const BIG: &str = "big.bin";
const BIG_BYTES: usize = 64 << 20;
/// The small file ab asks for.
const SMALL: &str = "small.bin";
const SMALL_BYTES: usize = 16 << 10;
/// ab with keep-alive: requests, and connections at once.
const KEEP_ALIVE_REQUESTS: u32 = 5_000;
/// ab with a connection per request.
const CLOSE_REQUESTS: u32 = 1_000;
const AB_CONCURRENCY: u32 = 4;
/// The net for each client run (see `testbed::steps::NET`): a hang, never a pace.
const CLIENT_TIMEOUT: std::time::Duration = testbed::steps::NET;

fn start(bed: &Bed, files: &[(&str, &[u8])]) -> Result<Nginx> {
    Nginx::start(
        bed.b(),
        bed.pods.b.v4_addr(HTTP_PORT),
        bed.pods.b.v4_addr(HTTPS_PORT),
        files,
    )
}

/// curl downloads the big file over HTTP or HTTPS; the body must be the file.
fn download(tls: bool) -> Result<()> {
    let bed = Bed::new()?;
    let file = random_bytes(20, BIG_BYTES);
    let mut nginx = start(&bed, &[(BIG, &file)])?;
    let (url, ca) = if tls {
        (nginx.https_url(BIG), Some(nginx.cert()))
    } else {
        (nginx.url(BIG), None)
    };
    let mark = bed.mark()?;
    let body = curl_get(bed.a(), &url, ca.as_deref(), CLIENT_TIMEOUT)?;
    let delta = bed.since(&mark)?;
    nginx.server().ensure_running()?;
    let (got, want) = (sha256_hex(&body), sha256_hex(&file));
    ensure!(
        got == want,
        "{url}: {} B with SHA-256 {got}, the file is {} B with {want}; first difference at \
         byte {:?} ({})",
        body.len(),
        file.len(),
        first_difference(&body, &file),
        delta.summary()
    );
    eprintln!("{url}: {} B, SHA-256 {got}, exact", body.len());
    // The response goes socket to socket: nginx answers once paired.
    delta.expect_bypassed(&url, 1, BIG_BYTES as u64)
}

#[test]
fn download_64mib_exact() -> Result<()> {
    app_test!(nginx::NEEDS);
    download(false)
}

#[test]
fn https_download_64mib_exact() -> Result<()> {
    app_test!(nginx::NEEDS);
    download(true)
}

/// ab asks `requests` times for the small file.
fn ab(keep_alive: bool, requests: u32) -> Result<()> {
    let bed = Bed::new()?;
    let small = random_bytes(21, SMALL_BYTES);
    let mut nginx = start(&bed, &[(SMALL, &small)])?;
    let ab = Ab {
        requests,
        concurrency: AB_CONCURRENCY,
        keep_alive,
    };
    let mark = bed.mark()?;
    let r = ab.run(bed.a(), &nginx.url(SMALL), CLIENT_TIMEOUT)?;
    let delta = bed.since(&mark)?;
    nginx.server().ensure_running()?;
    let requests = u64::from(requests);
    let body = requests * SMALL_BYTES as u64;
    let kept = if keep_alive { requests } else { 0 };
    ensure!(
        r.complete == requests
            && r.failed == 0
            && r.non_2xx == 0
            && r.keep_alive == kept
            && r.body_bytes == body,
        "ab (keep-alive {keep_alive}): {r:?}, want {requests} complete, none failed, {kept} \
         kept alive, {body} body bytes ({})",
        delta.summary()
    );
    eprintln!("ab (keep-alive {keep_alive}): {r:?}");
    // Every connection paired (ab's keep-alive opens one per concurrent request), and
    // every response body went socket to socket.
    let connections = if keep_alive {
        u64::from(AB_CONCURRENCY)
    } else {
        requests
    };
    delta.expect_bypassed("ab", connections, body)
}

#[test]
fn keep_alive_requests_complete() -> Result<()> {
    app_test!(nginx::NEEDS);
    ab(true, KEEP_ALIVE_REQUESTS)
}

#[test]
fn connection_per_request_complete() -> Result<()> {
    app_test!(nginx::NEEDS);
    ab(false, CLOSE_REQUESTS)
}
