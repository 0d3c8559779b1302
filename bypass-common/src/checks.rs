//! The kernel self-test: each behaviour the guarantees rely on, checked on the running
//! kernel with the datapath's own programs on sockets of a private network namespace
//! before anything is bypassed (`bypass-agent`'s `kernel_check`). A kernel is judged by
//! what it does, not by which structures it has: sockmap's FIONREAD, for one, changed
//! meaning in stable updates that kept every field (the "Fix FIONREAD for sockmap"
//! series, Linux 6.19, backported to 6.6, 6.12 and 6.18).
//!
//! The catalogue [`CHECKS`] is listed once; `status`, `check`, `probe`, the metrics and
//! docs/cli.md are written from it. A result is kept in the control word
//! [`crate::control::SLOT_CHECKS`], two bits a check ([`Results`]).

/// What a failing check turns off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Needed {
    /// The bypass: the node is not bypassed while it fails.
    Bypass,
    /// Like the read guard, a guarantee the agent gives up only with
    /// `--allow-unguarded`: without it the node is not bypassed while it fails.
    Guarded,
}

/// One behaviour of the catalogue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Check {
    /// Its name, as `status`, the metrics' `check` label and the logs show it.
    pub name: &'static str,
    /// What is checked, as TCP answers it.
    pub what: &'static str,
    /// What a failure turns off.
    pub needed: Needed,
}

/// FIONREAD counts bytes redirected to the socket and not read yet.
pub const FIONREAD_REDIRECTED: usize = 0;
/// FIONREAD counts bytes that came by TCP to a socket in the SockHash.
pub const FIONREAD_TCP: usize = 1;
/// FIONREAD counts both at once.
pub const FIONREAD_MIXED: usize = 2;
/// poll reports readable across a fallback to TCP and back.
pub const POLL: usize = 3;
/// Edge-triggered epoll reports each arrival across a fallback to TCP and back.
pub const EPOLL_EDGE: usize = 4;
/// MSG_PEEK returns queued bytes without consuming them.
pub const MSG_PEEK: usize = 5;
/// A reader with SO_RCVLOWAT is readable only at its mark.
pub const SO_RCVLOWAT: usize = 6;
/// Every byte, then end of stream.
pub const EOF: usize = 7;
/// An abortive close reaches the peer as a reset.
pub const RESET: usize = 8;
/// The read guard refuses a splice while redirected bytes wait.
pub const SPLICE_REFUSED: usize = 9;
/// The read guard refuses a mapping while redirected bytes wait.
pub const MMAP_REFUSED: usize = 10;
/// The checks' own bytes were redirected (else nothing above was checked).
pub const REDIRECTS: usize = 11;
/// `recv(MSG_OOB)` with redirected bytes waiting answers as TCP does, consuming none.
pub const RECV_OOB: usize = 12;
/// `recv(MSG_TRUNC)` with redirected bytes waiting is refused before it consumes any.
pub const RECV_TRUNC: usize = 13;

/// Every check, in the order they run (a check's index is its place here).
pub const CHECKS: [Check; 14] = [
    Check {
        name: "fionread_redirected",
        what: "FIONREAD counts bytes redirected to a socket and not read yet",
        needed: Needed::Guarded,
    },
    Check {
        name: "fionread_tcp",
        what: "FIONREAD counts bytes that came by TCP to a socket in the SockHash",
        needed: Needed::Guarded,
    },
    Check {
        name: "fionread_mixed",
        what: "FIONREAD counts redirected and TCP bytes waiting together",
        needed: Needed::Guarded,
    },
    Check {
        name: "poll",
        what: "poll reports a socket readable for redirected bytes, for TCP bytes after a \
               fallback, and for redirected bytes again after it",
        needed: Needed::Bypass,
    },
    Check {
        name: "epoll_edge",
        what: "edge-triggered epoll reports each arrival across a fallback to TCP and back",
        needed: Needed::Bypass,
    },
    Check {
        name: "msg_peek",
        what: "MSG_PEEK returns the queued bytes and leaves them for the next read",
        needed: Needed::Bypass,
    },
    Check {
        name: "so_rcvlowat",
        what: "a reader with SO_RCVLOWAT is not readable below its mark, and is at it",
        needed: Needed::Bypass,
    },
    Check {
        name: "eof",
        what: "a reader gets every byte sent before a shutdown, then end of stream",
        needed: Needed::Bypass,
    },
    Check {
        name: "reset",
        what: "an abortive close (SO_LINGER 0) reaches the peer's read as ECONNRESET",
        needed: Needed::Bypass,
    },
    Check {
        name: "splice_refused",
        what: "the read guard fails splice(2) of a socket with EINVAL while redirected \
               bytes wait for it",
        needed: Needed::Guarded,
    },
    Check {
        name: "mmap_refused",
        what: "the read guard fails mmap(2) of a socket with ENODEV while redirected \
               bytes wait for it",
        needed: Needed::Guarded,
    },
    Check {
        name: "redirects",
        what: "the checks' bytes were redirected by the datapath, and a direction came \
               back from TCP",
        needed: Needed::Bypass,
    },
    Check {
        name: "recv_oob",
        what: "recv(MSG_OOB) with no urgent byte and redirected bytes waiting fails with \
               EINVAL, as TCP does, and consumes none of them",
        needed: Needed::Guarded,
    },
    Check {
        name: "recv_trunc",
        what: "recv(MSG_TRUNC) with redirected bytes waiting is refused (EOPNOTSUPP) \
               before it consumes any; they are then read as sent",
        needed: Needed::Guarded,
    },
];

/// The FIONREAD checks, which the FIONREAD compensation
/// ([`crate::layout::features::FIONREAD_ADD_TCP`] and `FIONREAD_ADD_INGRESS`) makes
/// pass where the kernel's own answer is wrong.
pub const FIONREAD: [usize; 3] = [FIONREAD_REDIRECTED, FIONREAD_TCP, FIONREAD_MIXED];

/// The read guard's checks: run only where the read guard is attached.
pub const READ_GUARD: [usize; 4] = [SPLICE_REFUSED, MMAP_REFUSED, RECV_OOB, RECV_TRUNC];

/// The check named `name`.
pub fn index(name: &str) -> Option<usize> {
    let mut i = 0;
    while i < CHECKS.len() {
        if str_eq(CHECKS[i].name, name) {
            return Some(i);
        }
        i += 1;
    }
    None
}

const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// What happened to one check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Not run (the read guard's checks where it is off; everything before a self-test).
    NotRun,
    /// As TCP answers it.
    Passed,
    /// Not as TCP answers it.
    Failed,
}

impl Outcome {
    /// Its name, as `status` shows it.
    pub const fn name(self) -> &'static str {
        match self {
            Outcome::NotRun => "not run",
            Outcome::Passed => "passed",
            Outcome::Failed => "failed",
        }
    }
}

/// Every check's outcome, two bits a check (bit `2i`: it ran; bit `2i + 1`: it passed),
/// the word [`crate::control::SLOT_CHECKS`] holds. 0: no self-test ran.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Results(pub u32);

const _: () = assert!(2 * CHECKS.len() <= 32);

impl Results {
    /// With check `i`'s outcome set to `o`.
    pub const fn with(self, i: usize, o: Outcome) -> Self {
        let mask = 0b11 << (2 * i);
        let bits = match o {
            Outcome::NotRun => 0,
            Outcome::Passed => 0b11,
            Outcome::Failed => 0b01,
        };
        Self((self.0 & !mask) | (bits << (2 * i)))
    }

    /// Check `i`'s outcome.
    pub const fn get(self, i: usize) -> Outcome {
        match (self.0 >> (2 * i)) & 0b11 {
            0b11 => Outcome::Passed,
            0b01 => Outcome::Failed,
            _ => Outcome::NotRun,
        }
    }

    /// Whether a self-test ran.
    pub const fn ran(self) -> bool {
        self.0 != 0
    }

    /// Whether every check in `set` passed or was not run, and at least one ran.
    pub fn all_passed(self, set: &[usize]) -> bool {
        set.iter().all(|&i| self.get(i) != Outcome::Failed)
            && set.iter().any(|&i| self.get(i) == Outcome::Passed)
    }

    /// The checks that failed, in catalogue order.
    pub fn failed(self) -> impl Iterator<Item = &'static Check> {
        CHECKS
            .iter()
            .enumerate()
            .filter(move |(i, _)| self.get(*i) == Outcome::Failed)
            .map(|(_, c)| c)
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use std::vec::Vec;

    use super::*;

    #[test]
    fn results_round_trip() {
        let r = Results::default()
            .with(FIONREAD_TCP, Outcome::Failed)
            .with(POLL, Outcome::Passed)
            .with(MMAP_REFUSED, Outcome::Passed)
            .with(POLL, Outcome::Failed);
        assert!(r.ran());
        assert_eq!(r.get(FIONREAD_TCP), Outcome::Failed);
        assert_eq!(r.get(POLL), Outcome::Failed);
        assert_eq!(r.get(MMAP_REFUSED), Outcome::Passed);
        assert_eq!(r.get(EOF), Outcome::NotRun);
        let failed: Vec<_> = r.failed().map(|c| c.name).collect();
        assert_eq!(failed, ["fionread_tcp", "poll"]);
        assert!(!r.all_passed(&FIONREAD));
        assert!(!Results::default().ran());
        assert!(!Results::default().all_passed(&READ_GUARD), "none ran");
    }

    #[test]
    fn names_are_unique_and_found() {
        for (i, c) in CHECKS.iter().enumerate() {
            assert_eq!(index(c.name), Some(i), "{}", c.name);
        }
        assert_eq!(index("nope"), None);
        let names = [
            (FIONREAD_REDIRECTED, "fionread_redirected"),
            (FIONREAD_TCP, "fionread_tcp"),
            (FIONREAD_MIXED, "fionread_mixed"),
            (POLL, "poll"),
            (EPOLL_EDGE, "epoll_edge"),
            (MSG_PEEK, "msg_peek"),
            (SO_RCVLOWAT, "so_rcvlowat"),
            (EOF, "eof"),
            (RESET, "reset"),
            (SPLICE_REFUSED, "splice_refused"),
            (MMAP_REFUSED, "mmap_refused"),
            (REDIRECTS, "redirects"),
            (RECV_OOB, "recv_oob"),
            (RECV_TRUNC, "recv_trunc"),
        ];
        for (i, n) in names {
            assert_eq!(CHECKS[i].name, n);
        }
    }
}
