//! `zerocopy`. Client: turns SO_ZEROCOPY on before it connects (with
//! `--zerocopy-after`, once connected), writes --bytes in --chunk writes with
//! MSG_ZEROCOPY, each from its own buffer (a zero-copy write's pages are the kernel's
//! until it completes), then waits for the completion notifications of every write
//! from the socket's error queue. If the kernel refuses SO_ZEROCOPY it writes without
//! MSG_ZEROCOPY, as applications fall back. Server: reads and verifies.

use std::{
    net::{SocketAddr, TcpStream},
    os::fd::AsRawFd,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use nix::{
    errno::Errno,
    poll::{PollFd, PollFlags, PollTimeout, poll},
    sys::socket::{ControlMessageOwned, MsgFlags, recvmsg},
};
use serde_json::{Value, json};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use testbed::peer::pattern::{Direction, Pattern};

use super::{Common, sock::drain};

/// `SO_EE_ORIGIN_ZEROCOPY` (include/uapi/linux/errqueue.h).
const ORIGIN_ZEROCOPY: u8 = 5;
/// `SO_EE_CODE_ZEROCOPY_COPIED`: the kernel copied the bytes after all.
const CODE_COPIED: u8 = 1;
/// How long the client waits for the last completion: a net (they come as the peer
/// reads, at the machine's speed).
const COMPLETIONS_TIMEOUT: Duration = testbed::steps::NET;

pub fn server(mut s: TcpStream, c: &Common) -> Result<Value> {
    let r = drain(&mut s, c.chunk, 0, Direction::ClientToServer, 0)?;
    Ok(json!({"received": r.bytes, "ok": r.ok}))
}

pub fn client(connect: SocketAddr, c: &Common) -> Result<Value> {
    let s = Socket::new(
        Domain::for_address(connect),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    let mut refused = None;
    if !c.zerocopy_after {
        refused = zerocopy_on(&s)?;
    }
    s.connect(&SockAddr::from(connect))
        .with_context(|| format!("connect {connect}"))?;
    if c.zerocopy_after {
        refused = zerocopy_on(&s)?;
    }
    let flags = if refused.is_some() {
        0
    } else {
        libc::MSG_ZEROCOPY
    };
    let s: TcpStream = s.into();
    let mut p = Pattern::new(0, Direction::ClientToServer);
    let chunk = usize::try_from(c.chunk).unwrap_or(65536).max(1);
    let mut buffers = Vec::new();
    let mut done = Completions::default();
    let (mut sent, mut writes) = (0u64, 0u32);
    while sent < c.bytes {
        let n = (c.bytes - sent).min(chunk as u64) as usize;
        let mut buf = vec![0u8; n];
        p.fill(&mut buf);
        let mut off = 0;
        while off < n {
            // SAFETY: `buf` outlives the call (kept until every completion is in);
            // neither nix nor std names MSG_ZEROCOPY for send.
            let r =
                unsafe { libc::send(s.as_raw_fd(), buf[off..].as_ptr().cast(), n - off, flags) };
            if r < 0 {
                let e = Errno::last();
                if e == Errno::ENOBUFS {
                    // Too many zero-copy writes in flight (optmem): take completions.
                    done.wait_some(&s)?;
                    continue;
                }
                bail!("send MSG_ZEROCOPY: {e}");
            }
            off += r as usize;
            writes += 1;
        }
        sent += n as u64;
        buffers.push(buf);
    }
    let deadline = Instant::now() + COMPLETIONS_TIMEOUT;
    while refused.is_none() && done.count < u64::from(writes) && Instant::now() < deadline {
        done.wait_some(&s)?;
    }
    drop(buffers);
    s.shutdown(std::net::Shutdown::Write)?;
    Ok(json!({
        "sent": sent,
        "writes": writes,
        "completed": done.count,
        "contiguous": done.next == done.count,
        "copied": done.copied,
        "refused": refused.map(|e| e.desc()),
    }))
}

/// Turns SO_ZEROCOPY on; the errno when the kernel refuses (EPERM).
fn zerocopy_on(s: &Socket) -> Result<Option<Errno>> {
    // SO_ZEROCOPY through the raw call: socket2 has no setter for it.
    let one: libc::c_int = 1;
    // SAFETY: a valid fd and a four-byte option value.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ZEROCOPY,
            std::ptr::from_ref(&one).cast(),
            4,
        )
    };
    if r != 0 {
        let e = Errno::last();
        if e == Errno::EPERM {
            return Ok(Some(e));
        }
        bail!("setsockopt SO_ZEROCOPY: {e}");
    }
    Ok(None)
}

/// The completion notifications read so far.
#[derive(Default)]
struct Completions {
    /// Writes completed.
    count: u64,
    /// The id after the highest completed, when every id below came in order.
    next: u64,
    /// Whether the kernel copied any of them after all.
    copied: bool,
}

impl Completions {
    /// Waits (at most a second) for the error queue and reads what is there.
    fn wait_some(&mut self, s: &TcpStream) -> Result<()> {
        let mut fds = [PollFd::new(std::os::fd::AsFd::as_fd(s), PollFlags::empty())];
        poll(&mut fds, PollTimeout::from(1000u16)).context("poll the error queue")?;
        loop {
            let mut cmsg = nix::cmsg_space!(libc::sock_extended_err, libc::sockaddr_in6);
            let got = match recvmsg::<()>(
                s.as_raw_fd(),
                &mut [],
                Some(&mut cmsg),
                MsgFlags::MSG_ERRQUEUE | MsgFlags::MSG_DONTWAIT,
            ) {
                Ok(m) => m,
                Err(Errno::EAGAIN) => return Ok(()),
                Err(e) => bail!("recvmsg MSG_ERRQUEUE: {e}"),
            };
            for m in got.cmsgs().context("control messages")? {
                let err = match m {
                    ControlMessageOwned::Ipv4RecvErr(e, _)
                    | ControlMessageOwned::Ipv6RecvErr(e, _) => e,
                    _ => continue,
                };
                if err.ee_origin != ORIGIN_ZEROCOPY {
                    continue;
                }
                // ids ee_info..=ee_data completed.
                let (lo, hi) = (u64::from(err.ee_info), u64::from(err.ee_data));
                if lo == self.next {
                    self.next = hi + 1;
                }
                self.count += hi - lo + 1;
                self.copied |= err.ee_code & CODE_COPIED != 0;
            }
        }
    }
}
