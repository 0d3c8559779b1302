//! One `GET` with hyper's HTTP/1 client, plain or over TLS, for blocking callers: the
//! API server's `/readyz` as admin (`kube_testenv::KubeEnv::get`) and the agent's metrics
//! server (the tests). Each call runs on its own current-thread tokio runtime.

use std::{future::Future, net::SocketAddr, path::Path, sync::Arc, time::Duration};

use anyhow::{Context as _, Result};
use http_body_util::{BodyExt as _, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpStream,
};
use tokio_rustls::{
    TlsConnector,
    rustls::{
        ClientConfig, RootCertStore,
        crypto::ring,
        pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject as _},
    },
};

/// `GET path` on `http://addr`: status code and body. Fails past `timeout`.
pub fn get(addr: SocketAddr, path: &str, timeout: Duration) -> Result<(u16, String)> {
    block_on(addr, path, timeout, async {
        let tcp = TcpStream::connect(addr).await?;
        request(tcp, addr, path).await
    })
}

/// `GET path` on `https://addr` with `tls` (whom to trust, which certificate to show);
/// the server's certificate must name the IP address of `addr`. Status code and body;
/// fails past `timeout`.
pub fn get_tls(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
    tls: ClientConfig,
) -> Result<(u16, String)> {
    block_on(addr, path, timeout, async {
        let tcp = TcpStream::connect(addr).await?;
        let stream = TlsConnector::from(Arc::new(tls))
            .connect(ServerName::IpAddress(addr.ip().into()), tcp)
            .await
            .with_context(|| format!("TLS handshake with {addr}"))?;
        request(stream, addr, path).await
    })
}

/// A TLS client configuration (ring) that trusts the CA certificate `ca` and presents the
/// client certificate `cert` with its key `key` (PEM files).
pub fn client_tls(ca: &Path, cert: &Path, key: &Path) -> Result<ClientConfig> {
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).with_context(|| format!("read {}", ca.display()))? {
        roots.add(c.with_context(|| format!("parse {}", ca.display()))?)?;
    }
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(Iterator::collect)
        .with_context(|| format!("read {}", cert.display()))?;
    let key =
        PrivateKeyDer::from_pem_file(key).with_context(|| format!("read {}", key.display()))?;
    Ok(
        ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)?,
    )
}

/// Runs `exchange` to completion on a fresh runtime, or fails past `timeout`.
fn block_on(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
    exchange: impl Future<Output = Result<(u16, String)>>,
) -> Result<(u16, String)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .context("start a tokio runtime")?;
    rt.block_on(async {
        tokio::time::timeout(timeout, exchange)
            .await
            .with_context(|| format!("GET {path} on {addr}: no answer within {timeout:?}"))?
    })
}

/// The request on an open connection (`Host` is the address's IP) and the whole answer.
async fn request<S>(stream: S, addr: SocketAddr, path: &str) -> Result<(u16, String)>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    // The connection is driven beside the request; it ends with the runtime.
    tokio::spawn(conn);
    let req = hyper::Request::get(path)
        .header(hyper::header::HOST, host(addr))
        .header(hyper::header::CONNECTION, "close")
        .body(Empty::<Bytes>::new())?;
    let resp = sender.send_request(req).await?;
    let code = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((
        code,
        String::from_utf8(body.to_vec()).context("body is not UTF-8")?,
    ))
}

/// `addr`'s IP as a `Host` header value (an IPv6 address in brackets).
fn host(addr: SocketAddr) -> String {
    match addr {
        SocketAddr::V4(a) => a.ip().to_string(),
        SocketAddr::V6(a) => format!("[{}]", a.ip()),
    }
}

#[cfg(test)]
mod tests {
    use std::{
        io::{BufRead as _, BufReader, Write as _},
        net::{Ipv4Addr, TcpListener},
        thread,
    };

    use super::*;

    /// Answers one request with `answer`; returns the request's header lines.
    fn serve_once(answer: &'static str) -> (SocketAddr, thread::JoinHandle<Vec<String>>) {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let addr = listener.local_addr().unwrap();
        let server = thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream);
            let mut head = Vec::new();
            loop {
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                if line.trim_end().is_empty() {
                    break;
                }
                head.push(line.trim_end().to_owned());
            }
            reader.get_mut().write_all(answer.as_bytes()).unwrap();
            head
        });
        (addr, server)
    }

    #[test]
    fn get_gives_status_and_body_of_any_status() {
        let (addr, server) =
            serve_once("HTTP/1.1 503 Service Unavailable\r\ncontent-length: 9\r\n\r\nnot ready");
        let answer = get(addr, "/readyz", Duration::from_secs(5)).unwrap();
        assert_eq!(answer, (503, "not ready".to_owned()));
        let head = server.join().unwrap();
        assert_eq!(head[0], "GET /readyz HTTP/1.1");
        assert!(
            head.iter()
                .any(|h| h.eq_ignore_ascii_case("host: 127.0.0.1"))
        );
    }

    #[test]
    fn get_fails_past_its_timeout() {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let addr = listener.local_addr().unwrap();
        let err = get(addr, "/healthz", Duration::from_millis(200)).unwrap_err();
        assert!(format!("{err:#}").contains("no answer within"), "{err:#}");
    }

    #[test]
    fn host_brackets_ipv6() {
        assert_eq!(host("127.0.0.1:80".parse().unwrap()), "127.0.0.1");
        assert_eq!(host("[::1]:80".parse().unwrap()), "[::1]");
    }
}
