//! `bypass-test-tool proxy`: a sidecar-like TCP proxy, the stand-in for Envoy in the mesh
//! tests (`tests/mesh/`) and in `cargo xtask bench --scenario mesh`.
//!
//! ```text
//! bypass-test-tool proxy --listen ADDR:PORT --upstream ADDR:PORT
//!                        [--mark N] [--upstream-bind ADDR:PORT] [--buffer BYTES]
//! ```
//!
//! | option            | meaning                                                                  |
//! | ----------------- | ------------------------------------------------------------------------ |
//! | `--listen`        | where to accept (`0.0.0.0:15001`, `[::]:15006`: dual-stack)              |
//! | `--upstream`      | where every accepted connection is forwarded                             |
//! | `--mark`          | `SO_MARK` on upstream sockets (decimal or `0x…`), so an iptables rule     |
//! |                   | can exempt the proxy's own traffic, as Istio does by uid or mark         |
//! | `--upstream-bind` | local address (and port, if not 0) of upstream sockets, `SO_REUSEADDR`   |
//! | `--buffer`        | bytes per read, each direction of each connection [default: 256K]         |
//!
//! Once listening it prints exactly one line on stdout, `bypass-test-tool proxy listening
//! on ADDR:PORT upstream ADDR:PORT` ([`LISTENING`], what `testbed::Proxy` waits for), and
//! flushes it; errors go to stderr. It runs until
//! killed. Each accepted connection gets one upstream connection and two threads, one
//! per direction, copying with plain `read`/`write`: `splice(2)` from a socket misses
//! bytes that sk_msg redirected to its ingress queue (they are not on the TCP receive
//! queue splice reads, net/ipv4/tcp.c `tcp_splice_read`), so a proxy that splices would
//! lose them. An end of stream on one side is forwarded as `shutdown(SHUT_WR)` on the
//! other (half-close); an error closes both. Both sockets have `TCP_NODELAY`, as Envoy's.
//!
//! A blocking read on a socket in a SockHash can return `EAGAIN` without a timeout
//! (net/ipv4/tcp_bpf.c, `tcp_bpf_recvmsg`): the copier polls and reads again.

use std::{
    io::{ErrorKind, Read, Write},
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    os::fd::AsFd as _,
    process::ExitCode,
    sync::Arc,
};

use anyhow::{Context as _, Result};
use clap::Args;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use socket2::{Domain, SockAddr, Socket, Type};
use testbed::{peer::parse_size, proxy::LISTENING};

/// A sidecar-like TCP proxy for the mesh tests.
#[derive(Debug, Args)]
pub struct Cli {
    /// Address to accept on.
    #[arg(long, value_name = "ADDR:PORT")]
    listen: SocketAddr,
    /// Address every accepted connection is forwarded to.
    #[arg(long, value_name = "ADDR:PORT")]
    upstream: SocketAddr,
    /// SO_MARK of upstream sockets (decimal or 0x hex); 0 sets none.
    #[arg(long, default_value = "0", value_parser = parse_mark)]
    mark: u32,
    /// Local address of upstream sockets (port 0: any port).
    #[arg(long, value_name = "ADDR:PORT")]
    upstream_bind: Option<SocketAddr>,
    /// Bytes per read (K, M suffixes).
    #[arg(long, default_value = "256K", value_parser = parse_size)]
    buffer: u64,
}

/// What every connection needs to reach its upstream.
#[derive(Debug)]
struct Upstream {
    addr: SocketAddr,
    mark: u32,
    bind: Option<SocketAddr>,
    buffer: usize,
}

fn parse_mark(s: &str) -> Result<u32, String> {
    let t = s.trim();
    let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => t.parse(),
    };
    parsed.map_err(|_| format!("'{s}' is not a mark: write a number such as 1337 or 0x539"))
}

/// Proxies until killed; exits 2 if it cannot start.
pub fn main(cli: Cli) -> ExitCode {
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bypass-test-tool proxy: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: &Cli) -> Result<()> {
    let listener =
        TcpListener::bind(cli.listen).with_context(|| format!("listen on {}", cli.listen))?;
    let bound = listener.local_addr().context("getsockname")?;
    let up = Arc::new(Upstream {
        addr: cli.upstream,
        mark: cli.mark,
        bind: cli.upstream_bind,
        buffer: usize::try_from(cli.buffer.clamp(1, 64 << 20)).unwrap_or(256 << 10),
    });
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{LISTENING} {bound} upstream {}", up.addr)?;
        out.flush()?;
    }
    loop {
        let (client, from) = match listener.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => {
                // EMFILE and friends: say so, back off, keep serving.
                eprintln!("bypass-test-tool proxy: accept: {e}");
                std::thread::sleep(std::time::Duration::from_millis(10));
                continue;
            }
        };
        let up = Arc::clone(&up);
        std::thread::spawn(move || {
            if let Err(e) = serve(client, &up) {
                eprintln!("bypass-test-tool proxy: connection from {from}: {e:#}");
            }
        });
    }
}

/// Forwards one accepted connection until both directions are done.
fn serve(client: TcpStream, up: &Upstream) -> Result<()> {
    let upstream = connect_upstream(up)?;
    client.set_nodelay(true).context("TCP_NODELAY")?;
    upstream.set_nodelay(true).context("TCP_NODELAY")?;
    let (c2, u2) = (
        client.try_clone().context("dup")?,
        upstream.try_clone().context("dup")?,
    );
    let buffer = up.buffer;
    let back = std::thread::spawn(move || copy(&u2, &c2, buffer));
    let forth = copy(&client, &upstream, buffer);
    let back = back
        .join()
        .unwrap_or_else(|_| Err(anyhow::anyhow!("copier panicked")));
    forth.context("client to upstream")?;
    back.context("upstream to client")
}

/// Copies `from` to `to` until end of stream (then half-closes `to`) or an error (then
/// shuts both down, so the other direction ends too).
fn copy(from: &TcpStream, to: &TcpStream, buffer: usize) -> Result<()> {
    let mut buf = vec![0u8; buffer];
    let fail = |e: std::io::Error, what: &str| {
        let _ = from.shutdown(Shutdown::Both);
        let _ = to.shutdown(Shutdown::Both);
        anyhow::Error::new(e).context(what.to_owned())
    };
    loop {
        let n = match (&*from).read(&mut buf) {
            Ok(0) => {
                // The peer may already be gone (ENOTCONN): nothing left to tell it.
                let _ = to.shutdown(Shutdown::Write);
                return Ok(());
            }
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                wait_readable(from);
                continue;
            }
            Err(e) => return Err(fail(e, "read")),
        };
        if let Err(e) = (&*to).write_all(&buf[..n]) {
            return Err(fail(e, "write"));
        }
    }
}

/// Blocks until `s` is readable (or has an error or hang-up to report), 1 s at most.
fn wait_readable(s: &TcpStream) {
    let mut pfd = [PollFd::new(s.as_fd(), PollFlags::POLLIN)];
    let _ = poll(&mut pfd, PollTimeout::from(1000u16));
}

/// A connected upstream socket with the mark and local address asked for.
fn connect_upstream(up: &Upstream) -> Result<TcpStream> {
    let s = Socket::new(Domain::for_address(up.addr), Type::STREAM, None).context("socket")?;
    if up.mark != 0 {
        s.set_mark(up.mark)
            .context("SO_MARK (needs CAP_NET_ADMIN)")?;
    }
    if let Some(local) = up.bind {
        s.set_reuse_address(true).context("SO_REUSEADDR")?;
        s.bind(&SockAddr::from(local))
            .with_context(|| format!("bind {local}"))?;
    }
    s.connect(&SockAddr::from(up.addr))
        .with_context(|| format!("connect {}", up.addr))?;
    Ok(s.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks() {
        assert_eq!(parse_mark("1337"), Ok(1337));
        assert_eq!(parse_mark("0x539"), Ok(0x539));
        assert!(parse_mark("x").is_err());
    }
}
