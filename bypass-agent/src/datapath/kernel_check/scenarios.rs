//! The kernel self-test's socket work: pairs of loopback sockets in the calling thread's
//! network namespace, and what each check observes of them against what TCP answers.
//! Every wait is for something observed (an arrival, an acknowledgement), with
//! [`NET`] as a net against a hang, never a pace.

use std::{
    io::{Read as _, Write as _},
    net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream},
    os::fd::{AsFd as _, AsRawFd as _, OwnedFd},
    time::{Duration, Instant},
};

use bypass_common::{Counters, checks};
use nix::{
    errno::Errno,
    poll::{PollFd, PollFlags, PollTimeout, poll},
    sys::{
        epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout},
        socket::{MsgFlags, recv, setsockopt, sockopt},
    },
};

/// How long a wait may see nothing happen before the check fails as hung. The answers
/// come at once on loopback; this only keeps a kernel that never answers from holding
/// the agent's start.
pub const NET: Duration = Duration::from_secs(30);

/// The bound on what may wait for a reader that the checks' datapath is loaded with
/// (`control::SLOT_MAX_QUEUED`): a 4 KiB message fits, two do not (each is also charged
/// its `struct sk_msg` and a page), so a stream of 4 KiB writes falls back to TCP on its
/// second and comes back once its reader has read everything.
pub const BOUND: u32 = 16 << 10;

/// The outcome of one check: `Err` says what was seen instead.
pub type Seen = Result<(), String>;

/// The counters of the checks' datapath, read between steps.
pub trait Counted {
    /// The counters now.
    fn counters(&self) -> Result<Counters, String>;
}

/// What every check saw, by catalogue index (`checks::CHECKS`); `None`: not run.
pub struct Observed(pub [Option<Seen>; checks::CHECKS.len()]);

/// Runs every check on loopback in this thread's network namespace, the read guard's
/// only where `guard` is on.
pub fn run(counted: &dyn Counted, guard: bool) -> Observed {
    let mut seen: [Option<Seen>; checks::CHECKS.len()] = Default::default();
    let listener = match TcpListener::bind((Ipv4Addr::LOCALHOST, 0)) {
        Ok(l) => l,
        Err(e) => {
            for s in &mut seen {
                *s = Some(Err(format!("listen on loopback: {e}")));
            }
            return Observed(seen);
        }
    };
    let ctx = Ctx {
        listener,
        counted,
        pattern: 0,
    };
    let mut ctx = ctx;
    seen[checks::FIONREAD_REDIRECTED] = Some(ctx.fionread_redirected());
    seen[checks::FIONREAD_TCP] = Some(ctx.fionread_tcp());
    seen[checks::FIONREAD_MIXED] = Some(ctx.fionread_mixed());
    let (poll, epoll) = ctx.fallback_and_back();
    seen[checks::POLL] = Some(poll);
    seen[checks::EPOLL_EDGE] = Some(epoll);
    seen[checks::MSG_PEEK] = Some(ctx.msg_peek());
    seen[checks::SO_RCVLOWAT] = Some(ctx.so_rcvlowat());
    seen[checks::EOF] = Some(ctx.eof());
    seen[checks::RESET] = Some(ctx.reset());
    if guard {
        seen[checks::SPLICE_REFUSED] = Some(ctx.splice_refused());
        seen[checks::MMAP_REFUSED] = Some(ctx.mmap_refused());
        seen[checks::RECV_OOB] = Some(ctx.recv_oob());
        seen[checks::RECV_TRUNC] = Some(ctx.recv_trunc());
    }
    seen[checks::REDIRECTS] = Some(ctx.redirects());
    Observed(seen)
}

/// Two connected sockets of the checks.
struct Pair {
    client: TcpStream,
    server: TcpStream,
}

struct Ctx<'a> {
    listener: TcpListener,
    counted: &'a dyn Counted,
    /// Where the next payload starts in the byte pattern, so no two look alike.
    pattern: u8,
}

/// A payload of `n` bytes starting at `start` in a pattern that tells offsets apart.
fn payload(start: u8, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| start.wrapping_add((i % 251) as u8).wrapping_mul(7))
        .collect()
}

fn err(what: &str, e: impl std::fmt::Display) -> String {
    format!("{what}: {e}")
}

impl Ctx<'_> {
    /// A new connection, greeted both ways so both of its sockets are established,
    /// inserted and paired before a check sends (a client that sends first races its
    /// server's pairing and takes TCP).
    fn pair(&mut self) -> Result<Pair, String> {
        let addr: SocketAddr = self.listener.local_addr().map_err(|e| err("address", e))?;
        let mut client = TcpStream::connect(addr).map_err(|e| err("connect", e))?;
        let (mut server, _) = self.listener.accept().map_err(|e| err("accept", e))?;
        for s in [&client, &server] {
            s.set_read_timeout(Some(NET))
                .map_err(|e| err("SO_RCVTIMEO", e))?;
            s.set_nodelay(true).map_err(|e| err("TCP_NODELAY", e))?;
        }
        let mut one = [0u8; 1];
        server.write_all(b"G").map_err(|e| err("greet", e))?;
        client
            .read_exact(&mut one)
            .map_err(|e| err("read the greeting", e))?;
        client.write_all(b"g").map_err(|e| err("greet back", e))?;
        server
            .read_exact(&mut one)
            .map_err(|e| err("read the greeting", e))?;
        Ok(Pair { client, server })
    }

    fn next_payload(&mut self, n: usize) -> Vec<u8> {
        self.pattern = self.pattern.wrapping_add(37);
        payload(self.pattern, n)
    }

    fn counters(&self) -> Result<Counters, String> {
        self.counted.counters()
    }

    /// Sends `data` from the client and says how it went: `true` redirected, `false`
    /// by TCP (each byte one way: a check that needs one way fails otherwise).
    fn send(&self, p: &mut Pair, data: &[u8]) -> Result<bool, String> {
        let before = self.counters()?;
        p.client.write_all(data).map_err(|e| err("send", e))?;
        let after = self.counters()?;
        let redirected = after.redirected_bytes - before.redirected_bytes;
        let passed = after.passed_bytes - before.passed_bytes;
        let n = data.len() as u64;
        match (redirected, passed) {
            (r, 0) if r == n => Ok(true),
            (0, t) if t >= n => Ok(false),
            (r, t) => Err(format!(
                "{n} bytes sent: {r} redirected and {t} by TCP, not all one way"
            )),
        }
    }

    /// Sends `data`, which must be redirected.
    fn send_redirected(&self, p: &mut Pair, data: &[u8]) -> Seen {
        match self.send(p, data)? {
            true => Ok(()),
            false => Err(format!(
                "{} bytes went by TCP where the checks needed them redirected",
                data.len()
            )),
        }
    }

    /// Sends `data`, which must go by TCP, and waits until the server's kernel has
    /// acknowledged it (so it waits in the server's TCP receive queue).
    fn send_tcp(&self, p: &mut Pair, data: &[u8]) -> Seen {
        if self.send(p, data)? {
            return Err(format!(
                "{} bytes were redirected where the checks needed them by TCP",
                data.len()
            ));
        }
        acked(&p.client)
    }

    /// The server's receive option that moves its peer's sends to TCP
    /// (`SO_RCVLOWAT` above 1, recorded by the setsockopt hook), set back to 1 so its
    /// readiness is TCP's usual.
    fn peer_to_tcp(p: &Pair) -> Seen {
        rcvlowat(&p.server, 2)?;
        rcvlowat(&p.server, 1)
    }

    fn fionread_redirected(&mut self) -> Seen {
        let mut p = self.pair()?;
        let data = self.next_payload(3000);
        self.send_redirected(&mut p, &data)?;
        expect_fionread(&p.server, 3000, "3000 bytes redirected and not read")
    }

    fn fionread_tcp(&mut self) -> Seen {
        let mut p = self.pair()?;
        Self::peer_to_tcp(&p)?;
        let data = self.next_payload(3000);
        self.send_tcp(&mut p, &data)?;
        expect_fionread(
            &p.server,
            3000,
            "3000 bytes that came by TCP and were not read",
        )
    }

    fn fionread_mixed(&mut self) -> Seen {
        let mut p = self.pair()?;
        let first = self.next_payload(2000);
        self.send_redirected(&mut p, &first)?;
        Self::peer_to_tcp(&p)?;
        let second = self.next_payload(1000);
        self.send_tcp(&mut p, &second)?;
        expect_fionread(
            &p.server,
            3000,
            "2000 bytes redirected, then 1000 by TCP, none read",
        )?;
        let got = read_n(&mut p.server, 3000)?;
        if got[..2000] != first[..] || got[2000..] != second[..] {
            return Err("the 3000 bytes read back are not the ones sent, in order".into());
        }
        Ok(())
    }

    /// A direction redirected, past its bound by TCP, then redirected again once its
    /// reader has read everything: `poll` and edge-triggered `epoll` must report each
    /// arrival, and neither may report what is not there.
    fn fallback_and_back(&mut self) -> (Seen, Seen) {
        let mut poll_seen = Ok(());
        let mut epoll_seen = Ok(());
        let run = (|| -> Result<(), String> {
            let mut p = self.pair()?;
            p.server
                .set_nonblocking(true)
                .map_err(|e| err("O_NONBLOCK", e))?;
            let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(|e| err("epoll", e))?;
            epoll
                .add(
                    &p.server,
                    EpollEvent::new(EpollFlags::EPOLLIN | EpollFlags::EPOLLET, 1),
                )
                .map_err(|e| err("EPOLL_CTL_ADD", e))?;
            // Nothing yet: neither may report the socket readable.
            if readable_now(&p.server)? {
                poll_seen = Err("poll reported readable before anything was sent".into());
            }
            if epoll_events(&epoll, EpollTimeout::ZERO)? != 0 {
                epoll_seen = Err("epoll reported an event before anything was sent".into());
            }
            // 1: redirected.
            let one = self.next_payload(4096);
            self.send_redirected(&mut p, &one)?;
            observe(
                &p.server,
                &epoll,
                "4096 redirected bytes",
                &mut poll_seen,
                &mut epoll_seen,
            )?;
            drain_expect(&mut p.server, &epoll, &one)?;
            // 2: 64 KiB in 4 KiB writes, past the bound: the first redirected, the rest by
            // TCP.
            let two = self.next_payload(64 << 10);
            let before = self.counters()?;
            for chunk in two.chunks(4096) {
                p.client.write_all(chunk).map_err(|e| err("send", e))?;
            }
            let after = self.counters()?;
            if after.passed_bytes - before.passed_bytes == 0 {
                return Err("64 KiB past the bound did not fall back to TCP".into());
            }
            acked(&p.client)?;
            observe(
                &p.server,
                &epoll,
                "bytes past the bound, by TCP",
                &mut poll_seen,
                &mut epoll_seen,
            )?;
            drain_expect(&mut p.server, &epoll, &two)?;
            // 3: back to redirects, now that every TCP byte was read.
            let three = self.next_payload(4096);
            self.send(&mut p, &three).and_then(|redirected| {
                redirected.then_some(()).ok_or_else(|| {
                    "the direction did not come back to redirects after its reader read \
                     every TCP byte"
                        .to_owned()
                })
            })?;
            observe(
                &p.server,
                &epoll,
                "redirected bytes after the fallback",
                &mut poll_seen,
                &mut epoll_seen,
            )?;
            drain_expect(&mut p.server, &epoll, &three)
        })();
        if let Err(e) = run {
            // A step the checks could not take fails both, with what it was.
            if poll_seen.is_ok() {
                poll_seen = Err(e.clone());
            }
            if epoll_seen.is_ok() {
                epoll_seen = Err(e);
            }
        }
        (poll_seen, epoll_seen)
    }

    fn msg_peek(&mut self) -> Seen {
        let mut p = self.pair()?;
        let data = self.next_payload(1000);
        self.send_redirected(&mut p, &data)?;
        let mut buf = vec![0u8; 1000];
        let n = recv(p.server.as_raw_fd(), &mut buf, MsgFlags::MSG_PEEK)
            .map_err(|e| err("recv(MSG_PEEK)", e))?;
        if buf[..n] != data[..n] || n == 0 {
            return Err(format!(
                "MSG_PEEK returned {n} bytes, not the first ones sent"
            ));
        }
        let got = read_n(&mut p.server, 1000)?;
        if got != data {
            return Err("the read after MSG_PEEK did not return the peeked bytes".into());
        }
        expect_fionread(&p.server, 0, "everything read")
    }

    fn so_rcvlowat(&mut self) -> Seen {
        let mut p = self.pair()?;
        rcvlowat(&p.server, 1000)?;
        let first = self.next_payload(500);
        self.send_tcp(&mut p, &first)?;
        if readable_now(&p.server)? {
            return Err("readable with 500 bytes under SO_RCVLOWAT 1000".into());
        }
        let second = self.next_payload(500);
        self.send_tcp(&mut p, &second)?;
        if !readable_now(&p.server)? {
            return Err("not readable with 1000 bytes at SO_RCVLOWAT 1000".into());
        }
        let got = read_n(&mut p.server, 1000)?;
        if got[..500] != first[..] || got[500..] != second[..] {
            return Err("the 1000 bytes read are not the ones sent, in order".into());
        }
        Ok(())
    }

    fn eof(&mut self) -> Seen {
        let mut p = self.pair()?;
        let data = self.next_payload(2000);
        self.send_redirected(&mut p, &data)?;
        p.client
            .shutdown(Shutdown::Write)
            .map_err(|e| err("shutdown", e))?;
        let mut got = Vec::new();
        p.server
            .read_to_end(&mut got)
            .map_err(|e| err("read to the end", e))?;
        if got != data {
            return Err(format!(
                "read {} bytes before end of stream where 2000 were sent",
                got.len()
            ));
        }
        Ok(())
    }

    fn reset(&mut self) -> Seen {
        let mut p = self.pair()?;
        let data = self.next_payload(100);
        self.send_redirected(&mut p, &data)?;
        read_n(&mut p.server, 100)?;
        setsockopt(
            &p.client,
            sockopt::Linger,
            &libc::linger {
                l_onoff: 1,
                l_linger: 0,
            },
        )
        .map_err(|e| err("SO_LINGER 0", e))?;
        drop(p.client);
        wait_readable(&p.server, "the reset")?;
        let mut buf = [0u8; 16];
        match p.server.read(&mut buf) {
            Err(e) if e.raw_os_error() == Some(libc::ECONNRESET) => Ok(()),
            other => Err(format!(
                "a read after the peer's abortive close returned {other:?}, not ECONNRESET"
            )),
        }
    }

    fn splice_refused(&mut self) -> Seen {
        let mut p = self.pair()?;
        let data = self.next_payload(1000);
        self.send_redirected(&mut p, &data)?;
        let (r, w) = nix::unistd::pipe().map_err(|e| err("pipe", e))?;
        // SAFETY: valid descriptors; no offsets.
        let n = unsafe {
            libc::splice(
                p.server.as_raw_fd(),
                std::ptr::null_mut(),
                w.as_raw_fd(),
                std::ptr::null_mut(),
                1000,
                libc::SPLICE_F_NONBLOCK,
            )
        };
        let errno = Errno::last();
        drop((r, w));
        if n != -1 || errno != Errno::EINVAL {
            return Err(format!(
                "splice with 1000 redirected bytes waiting returned {n} ({errno}), not EINVAL"
            ));
        }
        let got = read_n(&mut p.server, 1000)?;
        (got == data)
            .then_some(())
            .ok_or_else(|| "the read after the refused splice got other bytes".into())
    }

    fn mmap_refused(&mut self) -> Seen {
        let mut p = self.pair()?;
        let data = self.next_payload(1000);
        self.send_redirected(&mut p, &data)?;
        // SAFETY: a read-only shared mapping of a socket, unmapped below if made.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_SHARED,
                p.server.as_raw_fd(),
                0,
            )
        };
        let errno = Errno::last();
        if at != libc::MAP_FAILED {
            // SAFETY: the mapping just made.
            unsafe { libc::munmap(at, 4096) };
            return Err("mmap with 1000 redirected bytes waiting succeeded".into());
        }
        if errno != Errno::ENODEV {
            return Err(format!(
                "mmap with redirected bytes waiting failed with {errno}, not ENODEV"
            ));
        }
        let got = read_n(&mut p.server, 1000)?;
        (got == data)
            .then_some(())
            .ok_or_else(|| "the read after the refused mmap got other bytes".into())
    }

    fn recv_oob(&mut self) -> Seen {
        let mut p = self.pair()?;
        let data = self.next_payload(1000);
        self.send_redirected(&mut p, &data)?;
        let mut buf = [0u8; 4];
        match recv(
            p.server.as_raw_fd(),
            &mut buf,
            MsgFlags::MSG_OOB | MsgFlags::MSG_DONTWAIT,
        ) {
            Err(Errno::EINVAL) => {}
            other => {
                return Err(format!(
                    "recv(MSG_OOB) with no urgent byte and 1000 redirected bytes waiting \
                     returned {other:?}, not EINVAL"
                ));
            }
        }
        let got = read_n(&mut p.server, 1000)?;
        (got == data)
            .then_some(())
            .ok_or_else(|| "recv(MSG_OOB) consumed redirected bytes".into())
    }

    fn recv_trunc(&mut self) -> Seen {
        let mut p = self.pair()?;
        let data = self.next_payload(1000);
        self.send_redirected(&mut p, &data)?;
        // SAFETY: a null buffer with MSG_TRUNC: TCP discards without writing.
        let n = unsafe {
            libc::recv(
                p.server.as_raw_fd(),
                std::ptr::null_mut(),
                100,
                libc::MSG_TRUNC | libc::MSG_DONTWAIT,
            )
        };
        let errno = Errno::last();
        if n != -1 || errno != Errno::EOPNOTSUPP {
            return Err(format!(
                "recv(MSG_TRUNC) with 1000 redirected bytes waiting returned {n} ({errno}), \
                 not EOPNOTSUPP"
            ));
        }
        let got = read_n(&mut p.server, 1000)?;
        (got == data)
            .then_some(())
            .ok_or_else(|| "recv(MSG_TRUNC) consumed redirected bytes".into())
    }

    /// The checks' bytes were redirected and a direction came back from TCP.
    fn redirects(&mut self) -> Seen {
        let c = self.counters()?;
        if c.redirected_bytes == 0 || c.resumed == 0 || c.sockets_inserted == 0 {
            return Err(format!(
                "the datapath did not bypass the checks' sockets: {} inserted, {} bytes \
                 redirected, {} directions resumed",
                c.sockets_inserted, c.redirected_bytes, c.resumed
            ));
        }
        Ok(())
    }
}

/// `setsockopt(SO_RCVLOWAT, mark)` on `s`.
fn rcvlowat(s: &TcpStream, mark: libc::c_int) -> Seen {
    // SAFETY: an int option of the right size on a valid socket.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            std::ptr::from_ref(&mark).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(err(
            &format!("SO_RCVLOWAT {mark}"),
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// FIONREAD of `s` must be `want`.
fn expect_fionread(s: &TcpStream, want: i32, what: &str) -> Seen {
    let mut n: libc::c_int = -1;
    // SAFETY: FIONREAD writes one int through the pointer.
    if unsafe { libc::ioctl(s.as_raw_fd(), libc::FIONREAD, &mut n) } != 0 {
        return Err(err("ioctl(FIONREAD)", std::io::Error::last_os_error()));
    }
    if n != want {
        return Err(format!("FIONREAD answered {n} with {what} (TCP: {want})"));
    }
    Ok(())
}

/// Waits until everything `s` sent was acknowledged (`SIOCOUTQ` 0): it is in its peer's
/// TCP receive queue.
fn acked(s: &TcpStream) -> Seen {
    let start = Instant::now();
    loop {
        let mut n: libc::c_int = -1;
        // SAFETY: SIOCOUTQ writes one int through the pointer.
        if unsafe { libc::ioctl(s.as_raw_fd(), libc::TIOCOUTQ, &mut n) } != 0 {
            return Err(err("ioctl(SIOCOUTQ)", std::io::Error::last_os_error()));
        }
        if n == 0 {
            return Ok(());
        }
        if start.elapsed() > NET {
            return Err(format!("{n} bytes sent by TCP not acknowledged in {NET:?}"));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Whether `poll` reports `s` readable now.
fn readable_now(s: &TcpStream) -> Result<bool, String> {
    let mut fds = [PollFd::new(s.as_fd(), PollFlags::POLLIN)];
    let n = poll(&mut fds, PollTimeout::ZERO).map_err(|e| err("poll", e))?;
    Ok(n > 0
        && fds[0]
            .revents()
            .is_some_and(|r| r.contains(PollFlags::POLLIN)))
}

/// Waits until `poll` reports `s` readable or in error, for `what`.
fn wait_readable(s: &TcpStream, what: &str) -> Seen {
    let mut fds = [PollFd::new(
        s.as_fd(),
        PollFlags::POLLIN | PollFlags::POLLERR | PollFlags::POLLHUP,
    )];
    let timeout = PollTimeout::try_from(NET).unwrap_or(PollTimeout::MAX);
    match poll(&mut fds, timeout).map_err(|e| err("poll", e))? {
        0 => Err(format!("nothing came of {what} in {NET:?}")),
        _ => Ok(()),
    }
}

/// How many events `epoll` has within `timeout`.
fn epoll_events(epoll: &Epoll, timeout: EpollTimeout) -> Result<usize, String> {
    let mut events = [EpollEvent::empty(); 4];
    epoll
        .wait(&mut events, timeout)
        .map_err(|e| err("epoll_wait", e))
}

/// After `what` arrived at `s`: `poll` must report it readable at once, and the
/// edge-triggered `epoll` must have an event for it.
fn observe(
    s: &TcpStream,
    epoll: &Epoll,
    what: &str,
    poll_seen: &mut Seen,
    epoll_seen: &mut Seen,
) -> Seen {
    if !readable_now(s)? && poll_seen.is_ok() {
        *poll_seen = Err(format!("poll did not report {what} readable"));
    }
    let timeout = EpollTimeout::try_from(NET).unwrap_or(EpollTimeout::NONE);
    if epoll_events(epoll, timeout)? == 0 && epoll_seen.is_ok() {
        *epoll_seen = Err(format!(
            "edge-triggered epoll had no event for {what} in {NET:?}"
        ));
    }
    Ok(())
}

/// Reads everything `want` holds from the non-blocking `s`, waiting on the
/// edge-triggered `epoll` each time a read finds nothing yet (every later arrival is a
/// new edge).
fn drain_expect(s: &mut TcpStream, epoll: &Epoll, want: &[u8]) -> Seen {
    let mut got = Vec::with_capacity(want.len());
    let mut buf = vec![0u8; 64 << 10];
    while got.len() < want.len() {
        match s.read(&mut buf) {
            Ok(0) => return Err("end of stream before every byte was read".into()),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let timeout = EpollTimeout::try_from(NET).unwrap_or(EpollTimeout::NONE);
                if epoll_events(epoll, timeout)? == 0 {
                    return Err(format!(
                        "{} of {} bytes read, then no epoll event for the rest in {NET:?}",
                        got.len(),
                        want.len()
                    ));
                }
            }
            Err(e) => return Err(err("read", e)),
        }
    }
    if got != want {
        return Err(format!(
            "the {} bytes read are not the ones sent, in order",
            want.len()
        ));
    }
    Ok(())
}

/// Reads exactly `n` bytes from the blocking `s`.
fn read_n(s: &mut TcpStream, n: usize) -> Result<Vec<u8>, String> {
    let mut buf = vec![0u8; n];
    s.read_exact(&mut buf).map_err(|e| err("read", e))?;
    Ok(buf)
}

/// Brings up `lo` in this thread's new network namespace.
pub fn loopback_up() -> Result<(), String> {
    let sock: OwnedFd = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Datagram,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| err("socket", e))?;
    // SAFETY: an ifreq named "lo", read then written back by the two ioctls.
    unsafe {
        let mut req: libc::ifreq = std::mem::zeroed();
        for (d, s) in req.ifr_name.iter_mut().zip(b"lo\0") {
            *d = *s as libc::c_char;
        }
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) != 0 {
            return Err(err("SIOCGIFFLAGS lo", std::io::Error::last_os_error()));
        }
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) != 0 {
            return Err(err("SIOCSIFFLAGS lo up", std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_tell_offsets_and_starts_apart() {
        let a = payload(1, 600);
        assert_ne!(a[..100], a[1..101], "a shift by one byte shows");
        assert_ne!(payload(1, 100), payload(38, 100));
    }
}
