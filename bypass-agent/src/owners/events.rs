//! Wakes the owners pass when the kernel reports a link or an address changing, so a
//! pod whose network goes down or away has its connections cut then, not at the next
//! poll ([`super::INTERVAL`], kept as the net for whatever no event reports).
//!
//! One `NETLINK_ROUTE` socket in the node's namespace, in the link and address groups
//! (`RTNLGRP_LINK`, `RTNLGRP_IPV4_IFADDR`, `RTNLGRP_IPV6_IFADDR`), with
//! `NETLINK_LISTEN_ALL_NSID`: it also hears every namespace the node's namespace has an
//! id for, which is every namespace a veth of the node's reaches (net/core/rtnetlink.c
//! `rtnl_fill_link_netnsid` gives the peer's namespace an id; net/netlink/af_netlink.c
//! `do_one_broadcast` delivers another namespace's events to such a socket, which needs
//! `CAP_NET_BROADCAST`). Without that right the node's own events still come: a pod's
//! `eth0` down takes the carrier of its veth's node end (`IFF_LOWER_UP`), a deleted veth
//! deletes both ends; an address removed inside a pod then waits for the poll.
//!
//! One socket rather than one per pod namespace: a socket holds its namespace alive
//! (net/core/sock.c `sk_alloc`), so per-namespace sockets would keep a pod's namespace,
//! and its veth, after the pod is gone until the next pass closed them.
//!
//! The messages are not read, only counted: any of them wakes the pass, which reads
//! every namespace itself. Whatever sent one (the kernel, or a process of a pod with
//! `CAP_NET_ADMIN` over its namespace sending into the groups, which this socket hears
//! too) only asks for the same paced pass, so each datagram counts. Events lost
//! (`ENOBUFS`: the socket's buffer overflowed) wake it too. The passes events ask for
//! are coalesced and paced by [`Wake`]: a pod flapping its own link, or sending
//! datagrams, costs the agent at most a fixed share of one core, and a victim's cut
//! comes no later than the next poll and one pass, however many events other pods make.
//!
//! The socket binds a random port id, not the one the kernel would pick (the agent's
//! process id, which a pod can read in its own namespace's `/proc/net/netlink` from the
//! agent's scan there): a request sent with `NLM_F_ECHO` from a socket bound to the same
//! id is left out of that broadcast, whatever namespace it comes from.

use std::{
    io,
    mem::size_of,
    os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd},
    sync::Arc,
    time::Instant,
};

use tokio::io::unix::AsyncFd;

use super::netlink::{nl_addr, random_u32, recv_from, route_socket};
use crate::metrics::AgentMetrics;
use tracing::{debug, info, warn};

/// `NETLINK_ADD_MEMBERSHIP` (include/uapi/linux/netlink.h).
const NETLINK_ADD_MEMBERSHIP: libc::c_int = 1;
/// `NETLINK_LISTEN_ALL_NSID` (include/uapi/linux/netlink.h).
const NETLINK_LISTEN_ALL_NSID: libc::c_int = 8;
/// The groups: links and IPv4 and IPv6 addresses (include/uapi/linux/rtnetlink.h).
const GROUPS: [libc::c_uint; 3] = [
    libc::RTNLGRP_LINK,
    libc::RTNLGRP_IPV4_IFADDR,
    libc::RTNLGRP_IPV6_IFADDR,
];
/// The most datagrams one drain reads: a flood cannot hold the agent's loop in it.
const MAX_READS: usize = 1024;
/// Bytes read of each datagram: none of it is looked at (the rest is discarded).
const READ_BYTES: usize = 64;
/// Read errors in a row after which the socket is given up (one error is the kernel
/// telling of a notification it could not build, `rtnl_set_sk_err`: a pass covers it).
const MAX_ERRORS: u32 = 64;
/// Tries at a random port id before the kernel's choice is taken.
const BIND_TRIES: u32 = 8;
/// A pass that events asked for waits, after the last pass, this many times as long as
/// that pass took: passes take at most 1/(QUIET+1) of one core however fast events come.
pub const QUIET: u32 = 4;

/// What one drain read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Drained {
    /// Datagrams read.
    pub messages: usize,
    /// Whether the kernel dropped some (`ENOBUFS`).
    pub lost: bool,
    /// Whether the socket is empty now (else [`MAX_READS`] stopped the drain).
    pub empty: bool,
}

/// The socket: nonblocking, in the link and address groups.
pub struct Socket {
    fd: OwnedFd,
    /// Whether it hears the namespaces the node's has an id for.
    pub all_namespaces: bool,
}

impl Socket {
    /// Opens one in the calling thread's network namespace.
    pub fn open() -> io::Result<Self> {
        let fd = route_socket(libc::SOCK_NONBLOCK)?;
        // Bound: an unbound socket's port is 0, the kernel's own, and a broadcast skips
        // the socket whose port is the sender's (net/netlink/af_netlink.c
        // `do_one_broadcast`). At a random port id (see the module's text), else at the
        // kernel's choice.
        let mut bound = false;
        for _ in 0..BIND_TRIES {
            match bind(&fd, random_port_id()?) {
                Ok(()) => {
                    bound = true;
                    break;
                }
                Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) => continue,
                Err(e) => return Err(e),
            }
        }
        if !bound {
            bind(&fd, 0)?;
        }
        for group in GROUPS {
            set_int(&fd, NETLINK_ADD_MEMBERSHIP, group as libc::c_int)?;
        }
        let all_namespaces = match set_int(&fd, NETLINK_LISTEN_ALL_NSID, 1) {
            Ok(()) => true,
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => false,
            Err(e) => return Err(e),
        };
        Ok(Self { fd, all_namespaces })
    }

    /// Reads what is queued, without waiting.
    pub fn drain(&self) -> io::Result<Drained> {
        let mut out = Drained::default();
        let mut buf = [0u8; READ_BYTES];
        for _ in 0..MAX_READS {
            match recv_from(&self.fd, &mut buf, libc::MSG_DONTWAIT) {
                Ok(_) => out.messages += 1,
                Err(e) => match e.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::ENOBUFS) => out.lost = true,
                    Some(libc::EAGAIN) => {
                        out.empty = true;
                        return Ok(out);
                    }
                    _ => return Err(e),
                },
            }
        }
        Ok(out)
    }
}

impl AsRawFd for Socket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsFd for Socket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// A random netlink port id, never 0 (the kernel's) nor one the kernel's own choices
/// take (the process id, then negative numbers): between 2^24, above any process id,
/// and 2^31, below the kernel's negative range.
fn random_port_id() -> io::Result<u32> {
    Ok(random_u32()? % ((1 << 31) - (1 << 24)) + (1 << 24))
}

/// Binds `fd` at port id `port` (0: the kernel's choice), in no group.
fn bind(fd: &OwnedFd, port: u32) -> io::Result<()> {
    let local = nl_addr(port);
    // SAFETY: a valid socket and an address of the right size.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            std::ptr::from_ref(&local).cast(),
            size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn set_int(fd: &OwnedFd, option: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: a valid socket and an int of the right size.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_NETLINK,
            option,
            std::ptr::from_ref(&value).cast(),
            size_of::<libc::c_int>() as u32,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// When a pass that events asked for may run (pure): at once after a quiet spell, else
/// [`QUIET`] times the last pass's length after it. Events while one is pending add
/// nothing: one pending pass covers them all.
#[derive(Debug, Clone, Copy)]
pub struct Wake {
    pending: bool,
    not_before: Option<Instant>,
}

impl Default for Wake {
    fn default() -> Self {
        Self::new()
    }
}

impl Wake {
    /// Nothing pending, nothing ran.
    pub const fn new() -> Self {
        Self {
            pending: false,
            not_before: None,
        }
    }

    /// An event came (or some were lost).
    pub fn note(&mut self) {
        self.pending = true;
    }

    /// When the pending pass is due, if one is; `now` when it may run at once.
    pub fn due(&self, now: Instant) -> Option<Instant> {
        self.pending
            .then(|| self.not_before.map_or(now, |t| t.max(now)))
    }

    /// A pass ran (whatever asked for it), from `started` to `ended`: it saw every
    /// change before `started`.
    pub fn ran(&mut self, started: Instant, ended: Instant) {
        self.pending = false;
        self.not_before = Some(ended + ended.saturating_duration_since(started) * QUIET);
    }
}

/// The events socket, read by the agent's loop, and when they next ask for a pass.
pub struct Events {
    socket: Option<AsyncFd<Socket>>,
    wake: Wake,
    lost: u64,
    /// Read errors in a row.
    errors: u32,
    /// Where the events heard and lost are counted, and whose are heard said.
    metrics: Option<Arc<AgentMetrics>>,
}

impl Events {
    /// Subscribes in the calling thread's namespace (the node's); from inside the
    /// runtime. Without a socket (logged), passes run on the poll alone. With `metrics`,
    /// counts what it hears and loses there and says whose events it hears.
    pub fn open(metrics: Option<Arc<AgentMetrics>>) -> Self {
        let socket = match Socket::open().and_then(|s| {
            // SAFETY: the socket owns its descriptor and never changes it.
            unsafe { AsyncFd::register(s) }.map_err(io::Error::from)
        }) {
            Ok(s) => {
                if !s.get_ref().all_namespaces {
                    info!(
                        "no CAP_NET_BROADCAST: only the node's own link events wake the owners pass (a pod's interface down or deleted); an address removed inside a pod waits for the poll"
                    );
                }
                Some(s)
            }
            Err(e) => {
                warn!(error = %e, "cannot subscribe to link and address events: a pod's network change is seen at the next poll only");
                None
            }
        };
        let events = Self {
            socket,
            wake: Wake::new(),
            lost: 0,
            errors: 0,
            metrics,
        };
        events.say_scope();
        events
    }

    /// Sets `bypass_link_event_scope` from the socket, if counted.
    fn say_scope(&self) {
        if let Some(m) = &self.metrics {
            m.link_event_scope(match &self.socket {
                Some(s) if s.get_ref().all_namespaces => "all_namespaces",
                Some(_) => "node",
                None => "none",
            });
        }
    }

    /// Resolves when a pass is due because of events. Cancel-safe: what it read stays
    /// noted.
    pub async fn due(&mut self) {
        loop {
            if let Some(at) = self.wake.due(Instant::now()) {
                tokio::time::sleep_until(at.into()).await;
                return;
            }
            let Some(socket) = &self.socket else {
                return futures::future::pending().await;
            };
            let mut guard = match socket.readable().await {
                Ok(g) => g,
                Err(e) => {
                    warn!(error = %e, "link and address events cannot be read any more: a pod's network change is seen at the next poll only");
                    self.socket = None;
                    self.say_scope();
                    continue;
                }
            };
            match guard.get_inner().drain() {
                Ok(d) => {
                    self.errors = 0;
                    if d.empty {
                        guard.clear_ready();
                    }
                    if let Some(m) = &self.metrics {
                        m.link_events.inc_by(d.messages as u64);
                        if d.lost {
                            m.link_events_lost.inc();
                        }
                    }
                    if d.lost {
                        self.lost += 1;
                        debug!(
                            times = self.lost,
                            "link and address events were lost (the socket's buffer overflowed): a pass reads everything"
                        );
                    }
                    if d.messages > 0 || d.lost {
                        self.wake.note();
                    }
                    if !d.empty {
                        // A drain cut short by MAX_READS: the runtime's other tasks
                        // first (readiness is not counted against a task's budget).
                        drop(guard);
                        tokio::task::yield_now().await;
                    }
                }
                Err(e) => {
                    // The kernel's one-off error for a notification it could not build:
                    // a pass covers what it missed. Only errors that keep coming give
                    // the socket up.
                    self.wake.note();
                    self.errors += 1;
                    if self.errors >= MAX_ERRORS {
                        warn!(error = %e, "link and address events cannot be read any more: a pod's network change is seen at the next poll only");
                        drop(guard);
                        self.socket = None;
                        self.say_scope();
                    } else {
                        debug!(error = %e, "reading link and address events failed: a pass reads everything");
                    }
                }
            }
        }
    }

    /// A pass ran from `started` to now.
    pub fn ran(&mut self, started: Instant) {
        self.wake.ran(started, Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_burst_is_one_pass_and_passes_are_paced_by_their_length() {
        let t0 = Instant::now();
        let mut w = Wake::new();
        assert_eq!(w.due(t0), None, "nothing noted");
        w.note();
        w.note();
        assert_eq!(w.due(t0), Some(t0), "the first pass runs at once");
        let took = Duration::from_millis(10);
        w.ran(t0, t0 + took);
        assert_eq!(w.due(t0 + took), None, "the pass covered the burst");
        w.note();
        assert_eq!(
            w.due(t0 + took),
            Some(t0 + took + took * QUIET),
            "the next waits QUIET times the last pass"
        );
        let later = t0 + Duration::from_secs(5);
        assert_eq!(w.due(later), Some(later), "after a quiet spell, at once");
    }
}
