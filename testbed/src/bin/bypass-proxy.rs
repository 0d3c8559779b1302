//! `bypass-proxy`: a sidecar-like TCP proxy, the stand-in for Envoy in the mesh tests
//! (`tests/mesh.rs`) and in `cargo xtask bench --scenario mesh`.
//!
//! ```text
//! bypass-proxy --listen ADDR:PORT --upstream ADDR:PORT
//!              [--mark N] [--upstream-bind ADDR:PORT] [--buffer BYTES]
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
//! Once listening it prints exactly one line on stdout, `bypass-proxy listening on
//! ADDR:PORT upstream ADDR:PORT`, and flushes it; errors go to stderr. It runs until
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
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    process::ExitCode,
    sync::Arc,
};

use anyhow::{Context as _, Result};
use clap::Parser;
use testbed::peer::parse_size;

#[derive(Debug, Parser)]
#[command(
    name = "bypass-proxy",
    about = "A sidecar-like TCP proxy for the mesh tests"
)]
struct Cli {
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bypass-proxy: error: {e:#}");
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
        writeln!(
            out,
            "bypass-proxy listening on {bound} upstream {}",
            up.addr
        )?;
        out.flush()?;
    }
    loop {
        let (client, from) = match listener.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => {
                // EMFILE and friends: say so, back off, keep serving.
                eprintln!("bypass-proxy: accept: {e}");
                std::thread::sleep(std::time::Duration::from_millis(10));
                continue;
            }
        };
        let up = Arc::clone(&up);
        std::thread::spawn(move || {
            if let Err(e) = serve(client, &up) {
                eprintln!("bypass-proxy: connection from {from}: {e:#}");
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

/// Blocks until `s` is readable (or has an error or hang-up to report).
fn wait_readable(s: &TcpStream) {
    let mut pfd = libc::pollfd {
        fd: s.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    unsafe { libc::poll(&mut pfd, 1, 1000) };
}

/// A connected upstream socket with the mark and local address asked for.
fn connect_upstream(up: &Upstream) -> Result<TcpStream> {
    let domain = match up.addr {
        SocketAddr::V4(_) => libc::AF_INET,
        SocketAddr::V6(_) => libc::AF_INET6,
    };
    // SAFETY: plain syscall; the fd is owned below.
    let fd = unsafe { libc::socket(domain, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("socket");
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    if up.mark != 0 {
        setsockopt_u32(&fd, libc::SO_MARK, up.mark).context("SO_MARK (needs CAP_NET_ADMIN)")?;
    }
    if let Some(local) = up.bind {
        setsockopt_u32(&fd, libc::SO_REUSEADDR, 1).context("SO_REUSEADDR")?;
        sys_addr(&fd, local, libc::bind).with_context(|| format!("bind {local}"))?;
    }
    sys_addr(&fd, up.addr, libc::connect).with_context(|| format!("connect {}", up.addr))?;
    Ok(TcpStream::from(fd))
}

fn setsockopt_u32(fd: &OwnedFd, opt: libc::c_int, value: u32) -> std::io::Result<()> {
    // SAFETY: a valid fd and a 4-byte option value that outlives the call.
    let ret = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            (&raw const value).cast(),
            size_of::<u32>() as libc::socklen_t,
        )
    };
    if ret != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

type AddrCall = unsafe extern "C" fn(libc::c_int, *const libc::sockaddr, libc::socklen_t) -> i32;

/// `bind` or `connect` with `addr` as a `sockaddr_in`/`sockaddr_in6`.
fn sys_addr(fd: &OwnedFd, addr: SocketAddr, call: AddrCall) -> Result<()> {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write((&raw mut ss).cast(), sin) };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { std::ptr::write((&raw mut ss).cast(), sin6) };
            size_of::<libc::sockaddr_in6>()
        }
    };
    // SAFETY: `ss` holds a sockaddr of `len` bytes for the family of `fd`.
    let ret = unsafe {
        call(
            fd.as_raw_fd(),
            (&raw const ss).cast(),
            len as libc::socklen_t,
        )
    };
    if ret != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(())
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
