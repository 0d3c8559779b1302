//! Slots of the per-CPU counter array [`crate::names::MAP_STATS`].

/// One counter slot. The discriminant is the array index.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stat {
    /// Sockets inserted into the SockHash.
    SocketsInserted = 0,
    /// Inserts that failed (map full, or the kernel refused the socket).
    InsertFailures = 1,
    /// Messages redirected to the peer socket.
    RedirectedMessages = 2,
    /// Bytes in redirected messages.
    RedirectedBytes = 3,
    /// Messages that took the normal TCP path.
    PassedMessages = 4,
    /// Bytes in messages that took the normal TCP path.
    PassedBytes = 5,
    /// Established sockets skipped because an end is not a pod address.
    SocketsSkipped = 6,
    /// Times a socket's sends moved to the TCP path because its peer's ingress queue
    /// would have passed [`crate::control::SLOT_MAX_QUEUED`].
    QueueLimited = 7,
    /// Connections whose connecting socket sent before it was paired (the send raced
    /// the end of the handshake, or its peer is not on this node): that direction keeps
    /// the TCP path.
    UnpairedSends = 8,
    /// Connections paired pod address to pod address (counted once, on the accepting
    /// side).
    PairedPod = 9,
    /// Connections paired over loopback inside a pod.
    PairedLoopback = 10,
    /// Connections paired across an address translation (REDIRECT, DNAT).
    PairedTranslated = 11,
    /// Bytes redirected on pod-to-pod connections ([`crate::state::hop::POD`]).
    RedirectedBytesPod = 12,
    /// Bytes redirected on loopback connections ([`crate::state::hop::LOOPBACK`]).
    RedirectedBytesLoopback = 13,
    /// Bytes redirected on translated connections ([`crate::state::hop::TRANSLATED`]).
    RedirectedBytesTranslated = 14,
    /// Accepting sockets that found a connecting socket on their client's address and
    /// port whose sequence numbers did not match (another connection from the same
    /// source, or a source NAT): left on the normal path.
    PairRejected = 15,
    /// Established sockets left alone because a port is in the skip list.
    SkippedPorts = 16,
    /// `setsockopt(TCP_ULP)` calls refused (EPERM) on an inserted socket: an upper-layer
    /// protocol (kTLS) would see its bytes redirected around it.
    UlpRefused = 17,
    /// Established sockets left alone because an upper-layer protocol is attached
    /// (an MPTCP subflow).
    UlpSkipped = 18,
    /// Times a socket's sends moved to the TCP path as a small-message stream
    /// ([`crate::state::small_stream_step`]).
    SmallStreams = 19,
}

/// Number of slots; the array is created with this many entries.
pub const STAT_SLOTS: u32 = 20;

impl Stat {
    /// Every slot, in index order.
    pub const ALL: [Stat; STAT_SLOTS as usize] = [
        Stat::SocketsInserted,
        Stat::InsertFailures,
        Stat::RedirectedMessages,
        Stat::RedirectedBytes,
        Stat::PassedMessages,
        Stat::PassedBytes,
        Stat::SocketsSkipped,
        Stat::QueueLimited,
        Stat::UnpairedSends,
        Stat::PairedPod,
        Stat::PairedLoopback,
        Stat::PairedTranslated,
        Stat::RedirectedBytesPod,
        Stat::RedirectedBytesLoopback,
        Stat::RedirectedBytesTranslated,
        Stat::PairRejected,
        Stat::SkippedPorts,
        Stat::UlpRefused,
        Stat::UlpSkipped,
        Stat::SmallStreams,
    ];

    /// One line of help for metrics.
    pub const fn help(self) -> &'static str {
        match self {
            Stat::SocketsInserted => "Sockets inserted into the SockHash",
            Stat::InsertFailures => "SockHash inserts that failed (map full, or refused)",
            Stat::RedirectedMessages => "Messages redirected socket to socket",
            Stat::RedirectedBytes => "Bytes redirected socket to socket",
            Stat::PassedMessages => "Messages that took the TCP path",
            Stat::PassedBytes => "Bytes that took the TCP path",
            Stat::SocketsSkipped => "Established sockets that were not pod-to-pod",
            Stat::QueueLimited => "Times sends moved to TCP because the peer's queue was full",
            Stat::UnpairedSends => {
                "Connections whose client sent before being paired (that direction stays on TCP)"
            }
            Stat::PairedPod => "Connections paired pod address to pod address",
            Stat::PairedLoopback => "Connections paired over loopback inside a pod",
            Stat::PairedTranslated => "Connections paired across a REDIRECT or DNAT",
            Stat::RedirectedBytesPod => "Bytes redirected on pod-to-pod connections",
            Stat::RedirectedBytesLoopback => "Bytes redirected on loopback connections",
            Stat::RedirectedBytesTranslated => "Bytes redirected on translated connections",
            Stat::PairRejected => {
                "Accepted sockets whose client's sequence numbers did not match (left on TCP)"
            }
            Stat::SkippedPorts => "Sockets left alone for a port in the skip list",
            Stat::UlpRefused => "TCP_ULP (kTLS) refused on bypassed sockets",
            Stat::UlpSkipped => "Sockets left alone for an upper-layer protocol (MPTCP subflow)",
            Stat::SmallStreams => "Times sends moved to TCP as a stream of small messages",
        }
    }

    /// The paired-connections counter of a [`crate::state::hop`] kind.
    #[inline(always)]
    pub const fn paired(hop: u32) -> Option<Stat> {
        match hop {
            crate::state::hop::POD => Some(Stat::PairedPod),
            crate::state::hop::LOOPBACK => Some(Stat::PairedLoopback),
            crate::state::hop::TRANSLATED => Some(Stat::PairedTranslated),
            _ => None,
        }
    }

    /// The redirected-bytes counter of a [`crate::state::hop`] kind.
    #[inline(always)]
    pub const fn redirected_bytes(hop: u32) -> Option<Stat> {
        match hop {
            crate::state::hop::POD => Some(Stat::RedirectedBytesPod),
            crate::state::hop::LOOPBACK => Some(Stat::RedirectedBytesLoopback),
            crate::state::hop::TRANSLATED => Some(Stat::RedirectedBytesTranslated),
            _ => None,
        }
    }

    /// The array index.
    pub const fn index(self) -> u32 {
        self as u32
    }

    /// A stable snake_case name, used in status output and metrics.
    pub const fn name(self) -> &'static str {
        match self {
            Stat::SocketsInserted => "sockets_inserted",
            Stat::InsertFailures => "insert_failures",
            Stat::RedirectedMessages => "redirected_messages",
            Stat::RedirectedBytes => "redirected_bytes",
            Stat::PassedMessages => "passed_messages",
            Stat::PassedBytes => "passed_bytes",
            Stat::SocketsSkipped => "sockets_skipped",
            Stat::QueueLimited => "queue_limited",
            Stat::UnpairedSends => "unpaired_sends",
            Stat::PairedPod => "paired_pod",
            Stat::PairedLoopback => "paired_loopback",
            Stat::PairedTranslated => "paired_translated",
            Stat::RedirectedBytesPod => "redirected_bytes_pod",
            Stat::RedirectedBytesLoopback => "redirected_bytes_loopback",
            Stat::RedirectedBytesTranslated => "redirected_bytes_translated",
            Stat::PairRejected => "pair_rejected",
            Stat::SkippedPorts => "skipped_ports",
            Stat::UlpRefused => "ulp_refused",
            Stat::UlpSkipped => "ulp_skipped",
            Stat::SmallStreams => "small_streams",
        }
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
}
