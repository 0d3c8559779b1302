//! The datapath's counters, listed once: the slots of the per-CPU counter array
//! [`crate::names::MAP_STATS`] ([`Stat`], which the kernel programs add to) and, with the
//! `report` feature, their sums as the agent reports them (`Counters`, whose fields are
//! the counters' names in `status --json` and `/metrics`). A counter added to the one
//! list below exists everywhere.

use crate::state::Hop;

/// Declares [`Stat`], [`STAT_SLOTS`] and [`Counters`] from one list of
/// `doc Variant = index, snake_name, "metrics help";`.
macro_rules! counters {
    ($( $(#[doc = $doc:expr])* $variant:ident = $index:literal, $field:ident, $help:literal; )*) => {
        /// One counter slot. The discriminant is the array index.
        #[repr(u32)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Stat {
            $( $(#[doc = $doc])* $variant = $index, )*
        }

        /// Number of slots; the array is created with this many entries.
        pub const STAT_SLOTS: u32 = [$($index),*].len() as u32;

        impl Stat {
            /// Every slot, in index order.
            pub const ALL: [Stat; STAT_SLOTS as usize] = [$(Stat::$variant),*];

            /// One line of help for metrics.
            pub const fn help(self) -> &'static str {
                match self {
                    $( Stat::$variant => $help, )*
                }
            }

            /// A stable snake_case name, used in status output and metrics.
            pub const fn name(self) -> &'static str {
                match self {
                    $( Stat::$variant => stringify!($field), )*
                }
            }
        }

        /// Counter values summed over CPUs, one field per [`Stat`] under its name.
        #[cfg(feature = "report")]
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
        pub struct Counters {
            $(
                $(#[doc = $doc])*
                #[serde(default)]
                pub $field: u64,
            )*
        }

        #[cfg(feature = "report")]
        impl Counters {
            /// Its keys, a counter each with its help, in [`Stat`] order.
            pub const KEYS: &'static [crate::status::Key] = &[$(
                crate::status::Key {
                    name: stringify!($field),
                    doc: &[$help],
                    flatten: false,
                    keys: &[],
                    each: false,
                },
            )*];

            /// Sets one counter.
            pub fn set(&mut self, stat: Stat, v: u64) {
                match stat {
                    $( Stat::$variant => self.$field = v, )*
                }
            }

            /// The value of one counter.
            pub fn get(&self, stat: Stat) -> u64 {
                match stat {
                    $( Stat::$variant => self.$field, )*
                }
            }
        }
    };
}

counters! {
    /// Sockets inserted into the SockHash.
    SocketsInserted = 0, sockets_inserted, "Sockets inserted into the SockHash";
    /// Inserts that failed (map full, or the kernel refused the socket).
    InsertFailures = 1, insert_failures, "SockHash inserts that failed (map full, or refused)";
    /// Messages redirected to the peer socket.
    RedirectedMessages = 2, redirected_messages, "Messages redirected socket to socket";
    /// Bytes in redirected messages.
    RedirectedBytes = 3, redirected_bytes, "Bytes redirected socket to socket";
    /// Messages that took the normal TCP path.
    PassedMessages = 4, passed_messages, "Messages that took the TCP path";
    /// Bytes in messages that took the normal TCP path.
    PassedBytes = 5, passed_bytes, "Bytes that took the TCP path";
    /// Established sockets skipped because an end is not a pod address.
    SocketsSkipped = 6, sockets_skipped, "Established sockets that were not pod-to-pod";
    /// Times a socket's sends moved to the TCP path because what waits for its peer
    /// would have passed its bound ([`crate::control::SLOT_MAX_QUEUED`]).
    QueueLimited = 7, queue_limited, "Times sends moved to TCP because the peer's queue was at its bound";
    /// Connections whose connecting socket sent before it was paired (the send raced
    /// the end of the handshake, or its peer is not on this node): that direction
    /// takes TCP until the peer has read those bytes.
    UnpairedSends = 8, unpaired_sends, "Connections whose client sent before being paired";
    /// Connections paired pod address to pod address (counted once, on the accepting
    /// side).
    PairedPod = 9, paired_pod, "Connections paired pod address to pod address";
    /// Connections paired over loopback inside a pod.
    PairedLoopback = 10, paired_loopback, "Connections paired over loopback inside a pod";
    /// Connections paired across an address translation (REDIRECT, DNAT).
    PairedTranslated = 11, paired_translated, "Connections paired across a REDIRECT or DNAT";
    /// Bytes redirected on pod-to-pod connections ([`crate::state::Hop::Pod`]).
    RedirectedBytesPod = 12, redirected_bytes_pod, "Bytes redirected on pod-to-pod connections";
    /// Bytes redirected on loopback connections ([`crate::state::Hop::Loopback`]).
    RedirectedBytesLoopback = 13, redirected_bytes_loopback, "Bytes redirected on loopback connections";
    /// Bytes redirected on translated connections ([`crate::state::Hop::Translated`]).
    RedirectedBytesTranslated = 14, redirected_bytes_translated, "Bytes redirected on translated connections";
    /// Accepting sockets that found a connecting socket on their client's address and
    /// port whose sequence numbers did not match (another connection from the same
    /// source, or a source NAT): left on the normal path.
    PairRejected = 15, pair_rejected, "Accepted sockets whose client's sequence numbers did not match (left on TCP)";
    /// Established sockets left alone because a port is in the skip list.
    SkippedPorts = 16, skipped_ports, "Sockets left alone for a port in the skip list";
    /// `setsockopt(TCP_ULP)` calls refused (EPERM) on an inserted socket: an upper-layer
    /// protocol (kTLS) would see its bytes redirected around it.
    UlpRefused = 17, ulp_refused, "TCP_ULP (kTLS) refused on bypassed sockets";
    /// Established sockets left alone because an upper-layer protocol is attached
    /// (an MPTCP subflow).
    UlpSkipped = 18, ulp_skipped, "Sockets left alone for an upper-layer protocol (MPTCP subflow)";
    /// Connections that started to leave the SockHash as a small-message stream
    /// ([`crate::state::small_stream_step`]).
    SmallStreams = 19, small_streams, "Connections that left the SockHash as a stream of small messages";
    /// Times a direction went back from the TCP path to redirects, its peer having read
    /// every byte sent by TCP.
    Resumed = 20, resumed, "Times a direction went back from TCP to redirects";
    /// `splice(2)` calls from, or `mmap` calls of, a bypassed socket refused (EINVAL,
    /// ENODEV) because bytes redirected to it were still unread: those calls read only
    /// the TCP receive queue. The application reads them with `read`/`recv` instead.
    ReadsRefused = 21, reads_refused, "splice/mmap of bypassed sockets refused while redirected bytes were unread";
    /// Sockets that were seen reading with `splice(2)` or zero-copy receive: their
    /// peers send to them by TCP, and their connections leave the SockHash.
    TcpOnlyReaders = 22, tcp_only_readers, "Bypassed sockets seen reading with splice or zero-copy receive";
    /// Connections that started to leave the SockHash (any reason).
    LeaveRequests = 23, leave_requests, "Connections that started to leave the SockHash";
    /// Connections cut by the agent (an opted-out pod, a pod whose network went away)
    /// that their sockets saw.
    CutSeen = 24, cut_seen, "Connections cut by the agent, as their sockets saw it";
    /// Connections the agent took out of the SockHash once each side had read what was
    /// redirected to it: they run as plain TCP from then on. Only the agent adds to
    /// this slot.
    Left = 25, left, "Connections taken out of the SockHash (plain TCP from then on)";
    /// `setsockopt(SO_ZEROCOPY)` calls refused (EPERM) on a socket that was ever
    /// inserted: a socket in a sockmap gives MSG_ZEROCOPY no completion notifications.
    ZerocopyRefused = 26, zerocopy_refused, "SO_ZEROCOPY refused on bypassed sockets";
    /// Sockets left on the normal path because their local pod address is not owned
    /// by their network namespace ([`crate::names::MAP_NETNS_OWNERS`]): another
    /// namespace posing as a pod, or a pod the agent has not observed yet.
    ForeignNetns = 27, foreign_netns, "Sockets left on TCP: their pod address belongs to another network namespace";
    /// `setsockopt(SO_PEEK_OFF)` calls refused (EPERM) while bytes redirected to the
    /// socket waited unread: the ingress queue peeks from its head whatever the offset.
    PeekOffRefused = 28, peek_off_refused, "SO_PEEK_OFF refused while redirected bytes were unread";
    /// Accepted sockets not paired with their client: the client dialled another
    /// address, and this server's is no backend of it on this node (a pod posing as the
    /// server of a connection its packets could never reach).
    PairUnreachable = 29, pair_unreachable, "Accepted sockets not paired: the server is no backend of the address its client dialled";
    /// Connecting sockets that can no longer be paired: the first accepting socket that
    /// could have been their server (every other check passed) claimed them and failed
    /// the sequence-number check ([`crate::state::Pairing::Spend`]), so no later one is
    /// compared. Each such socket also counts as [`Stat::PairRejected`], as does every
    /// later socket refused for it.
    PairSpent = 30, pair_spent, "Clients no longer paired: an accepted socket that could reach them failed the sequence-number check first";
    /// Sends that took TCP because the node's TCP memory was near `tcp_mem`'s first
    /// threshold ([`crate::control::SLOT_TCP_MEM_TIGHT`]): there the kernel may refuse
    /// a redirect memory and fail the send with `ENOMEM`, where TCP makes it wait.
    MemoryTight = 31, memory_tight, "Sends that took TCP because the node's TCP memory was near tcp_mem's first threshold";
    /// Closed sockets whose counts could not be added to their pod's entry
    /// ([`crate::names::MAP_POD_COUNTS`] full): those bytes and that connection are
    /// missing from the per-pod counters (not from the node's).
    PodCountsLost = 32, pod_counts_lost, "Closed sockets whose bytes could not be added to their pod's counters (per-pod map full)";
    /// Leave requests whose event the ring buffer ([`crate::names::MAP_EVENTS`]) could
    /// not hold (the agent behind on reading it): the connection still leaves, the
    /// agent finding it by a scan of the links when this counter moves.
    LeaveEventsLost = 33, leave_events_lost, "Leave events the ring buffer could not hold (the agent then scans the links for leaving connections)";
}

/// The counter of each [`crate::state::Hop`] kind in a family of counters kept per kind
/// ([`Stat::BY_HOP`]).
pub type PerHop = fn(crate::state::Hop) -> Stat;

impl Stat {
    /// The counters kept per [`crate::state::Hop`] kind, by family: its name and the
    /// counter of each kind. A counter named as the family ([`Stat::RedirectedBytes`])
    /// is the sum of its kinds.
    pub const BY_HOP: [(&str, PerHop); 2] = [
        ("paired", Stat::paired),
        ("redirected_bytes", Stat::redirected_bytes),
    ];

    /// The family and [`crate::state::Hop`] kind of a counter kept per kind
    /// ([`Stat::BY_HOP`]).
    pub fn hop_family(self) -> Option<(&'static str, Hop)> {
        Self::BY_HOP.iter().find_map(|&(family, of)| {
            Hop::ALL
                .into_iter()
                .find(|&hop| of(hop) == self)
                .map(|hop| (family, hop))
        })
    }

    /// The paired-connections counter of a [`crate::state::Hop`] kind.
    #[inline(always)]
    pub const fn paired(hop: Hop) -> Stat {
        match hop {
            Hop::Pod => Stat::PairedPod,
            Hop::Loopback => Stat::PairedLoopback,
            Hop::Translated => Stat::PairedTranslated,
        }
    }

    /// The redirected-bytes counter of a [`crate::state::Hop`] kind.
    #[inline(always)]
    pub const fn redirected_bytes(hop: Hop) -> Stat {
        match hop {
            Hop::Pod => Stat::RedirectedBytesPod,
            Hop::Loopback => Stat::RedirectedBytesLoopback,
            Hop::Translated => Stat::RedirectedBytesTranslated,
        }
    }

    /// The array index.
    pub const fn index(self) -> u32 {
        self as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_are_dense_and_ordered() {
        for (i, s) in Stat::ALL.iter().enumerate() {
            assert_eq!(s.index() as usize, i);
        }
    }

    #[test]
    fn names_are_unique_snake_case() {
        for (i, a) in Stat::ALL.iter().enumerate() {
            assert!(
                a.name()
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b == b'_')
            );
            assert!(!a.help().is_empty());
            for b in &Stat::ALL[i + 1..] {
                assert_ne!(a.name(), b.name());
            }
        }
    }

    #[test]
    fn per_kind_counters_are_named_family_then_kind() {
        for (family, of) in Stat::BY_HOP {
            for kind in Hop::ALL {
                let stat = of(kind);
                let label = kind.label();
                assert_eq!(stat.hop_family(), Some((family, kind)));
                // Its own name in `status` is `<family>_<kind>`.
                let base = stat
                    .name()
                    .strip_suffix(label)
                    .and_then(|b| b.strip_suffix('_'));
                assert_eq!(base, Some(family));
            }
        }
        assert_eq!(Stat::RedirectedBytes.hop_family(), None);
        assert_eq!(Stat::PassedBytes.hop_family(), None);
    }

    #[cfg(feature = "report")]
    #[test]
    fn counters_fields_follow_the_catalogue() {
        let mut c = Counters::default();
        for s in Stat::ALL {
            c.set(s, u64::from(s.index()) + 1);
        }
        for s in Stat::ALL {
            assert_eq!(c.get(s), u64::from(s.index()) + 1);
        }
    }
}
