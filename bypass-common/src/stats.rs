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
    /// Times a socket's sends moved back from the TCP path to redirects, its peer having
    /// read everything sent by TCP.
    Resumed = 8,
}

/// Number of slots; the array is created with this many entries.
pub const STAT_SLOTS: u32 = 9;

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
        Stat::Resumed,
    ];

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
            Stat::Resumed => "resumed",
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
