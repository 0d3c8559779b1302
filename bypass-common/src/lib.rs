//! Everything the kernel programs and the agent must agree on, defined once: map and
//! program names, pin sub-paths, the socket key layout, address encoding, stats slots,
//! the control words and the globals fixed at load.
//!
//! `no_std` so the eBPF crate can use it; the `std` feature adds pure std helpers,
//! `report` adds those and the agent's reports as serde types ([`status`]), and `user`
//! adds those and the `aya::Pod` impls.
#![no_std]

pub mod addr;
pub mod checks;
pub mod kernel;
pub mod key;
pub mod layout;
#[cfg(feature = "std")]
pub mod mountinfo;
pub mod names;
pub mod size;
pub mod state;
pub mod stats;
#[cfg(feature = "report")]
pub mod status;

pub use addr::{IpKey, ip_key, mapped_v4};
pub use kernel::{KernelVersion, MIN_KERNEL};
pub use key::{Endpoint, SockKey};
pub use layout::KernelLayout;
pub use state::{Connector, Link, PodCounts, SockState};
#[cfg(feature = "report")]
pub use stats::Counters;
pub use stats::Stat;

/// Kinds of refusal counted per pod address ([`names::MAP_REFUSALS`]), indexes of its
/// value.
pub mod refusal {
    /// A socket in a network namespace other than the one owning the address used it
    /// as its local address ([`crate::names::MAP_NETNS_OWNERS`]).
    pub const FOREIGN: usize = 0;
    /// Pairing refused: an accepted socket found a client on the address whose
    /// initial sequence numbers did not cross with its own
    /// ([`crate::Stat::PairRejected`]), or an accepted socket on the address is no
    /// backend of what its client dialled ([`crate::Stat::PairUnreachable`]).
    pub const PAIRING: usize = 1;
    /// Number of kinds.
    pub const KINDS: usize = 2;
    /// Their names, as `status` and the metrics' `kind` label show them.
    pub const NAMES: [&str; KINDS] = ["foreign_namespace", "pairing"];
}

/// Slots of the control array [`names::MAP_CONTROL`] (`Array<u32>`).
pub mod control {
    /// Redirect switch: [`ENABLED`] or [`DISABLED`]. The sk_msg program redirects only
    /// while it is [`ENABLED`]; otherwise every message takes the normal TCP path, which
    /// is how the agent detaches without losing bytes already queued on a peer.
    pub const SLOT_ENABLED: u32 = 0;
    /// Low and high words of the loaded object's fingerprint (FNV-1a of the ELF), so a
    /// restarted agent knows whether the pinned programs are its own build.
    pub const SLOT_OBJECT_LO: u32 = 1;
    /// See [`SLOT_OBJECT_LO`].
    pub const SLOT_OBJECT_HI: u32 = 2;
    /// Low and high words of the id (inode) of the cgroup sock_ops is attached to.
    pub const SLOT_CGROUP_LO: u32 = 3;
    /// See [`SLOT_CGROUP_LO`].
    pub const SLOT_CGROUP_HI: u32 = 4;
    /// Free for the agent's own state (e.g. why the bypass is on or off).
    pub const SLOT_AGENT_STATE: u32 = 5;
    /// Bound, in bytes, on what may wait for a reader that did not fix its receive
    /// buffer (see [`crate::state::receive_bound`]): redirected bytes it has not read,
    /// each message also charged for the kernel memory it holds
    /// ([`crate::state::charge`]). A send past it takes the TCP path (and TCP's
    /// backpressure) until the reader has caught up. The kernel charges that queue to
    /// no socket buffer limit (net/ipv4/tcp_bpf.c, bpf_tcp_ingress), so without a
    /// bound a reader that stops reading lets its peer queue memory without limit.
    /// 0: no bound.
    pub const SLOT_MAX_QUEUED: u32 = 6;
    /// The [`crate::layout::features`] bits the programs were loaded with, for `status`
    /// (the programs read their own copy, a read-only global).
    pub const SLOT_FEATURES: u32 = 7;
    /// Sends smaller than this many bytes, made while the peer still has unread bytes
    /// redirected to it [`crate::state::SMALL_STREAM_RUN`] times in a row (a larger
    /// send in between restarts the count), are a small-message stream: the connection
    /// leaves the SockHash and runs as plain TCP, which coalesces small writes
    /// (autocork) where the SockHash sends each as its own message. 0: never.
    pub const SLOT_SMALL_STREAM: u32 = 8;
    /// Bumped by the agent each time it adds connections to the cut map
    /// ([`crate::names::MAP_CUT`]); a socket that sees a generation it has not checked
    /// looks its connection up there.
    pub const SLOT_CUT_GEN: u32 = 9;
    /// Non-zero while the agent refuses to bypass because no read guard runs on this
    /// kernel and `--allow-unguarded` was not given (for `status`).
    pub const SLOT_REFUSED: u32 = 10;
    /// Bytes a direction may send by TCP while it waits to come back to redirects
    /// ([`crate::state::PassReason::lingers`]) before its connection leaves the SockHash
    /// and runs as plain TCP; 0: never. The agent writes
    /// [`crate::names::DEFAULT_LEAVE_AFTER`].
    pub const SLOT_LEAVE_AFTER: u32 = 11;
    /// Heartbeat: the second of `CLOCK_MONOTONIC` (what `bpf_ktime_get_ns` reads,
    /// kernel/bpf/helpers.c) until which sock_ops may insert new sockets. The agent
    /// moves it forward while it runs; once it passes (the agent is gone, stuck, or its
    /// DaemonSet removed without a clean-up), new connections take the normal TCP path
    /// and established ones carry on under the ordering rule, so a datapath never keeps
    /// bypassing on maps no agent tends. 0, as a fresh load leaves it: expired. See
    /// [`heartbeat_alive`].
    pub const SLOT_HEARTBEAT: u32 = 12;
    /// 0, as a fresh load leaves it: a socket whose local address is a pod address is
    /// inserted only in the network namespace that owns the address
    /// ([`crate::names::MAP_NETNS_OWNERS`]); an address with no owner there is no
    /// pod's. Non-zero (`--netns-owners=any`): any namespace but the node's own may use
    /// a pod address.
    pub const SLOT_OWNERS_OFF: u32 = 13;
    /// Pages of TCP memory on the node (`tcp_memory_allocated`) from which sends take
    /// the TCP path ([`memory_tight`]); 0, as a fresh load leaves it: never. A redirect
    /// charges the receiving socket (net/ipv4/tcp_bpf.c, bpf_tcp_ingress); above
    /// `tcp_mem`'s first threshold, under memory pressure (the node's or the socket's
    /// memory cgroup's), that charge can be refused, and the kernel then fails the
    /// *sender's* `send` with `ENOMEM` where TCP would make it wait. The agent writes
    /// [`tcp_mem_tight`] of that threshold, and again at each heartbeat.
    pub const SLOT_TCP_MEM_TIGHT: u32 = 14;
    /// The kernel self-test's results ([`crate::checks::Results`]), written by the
    /// agent for `status`; 0: none ran.
    pub const SLOT_CHECKS: u32 = 15;
    /// The layout of the pinned maps ([`crate::layout::LAYOUT_VERSION`]) the datapath was
    /// loaded with: another build of the same layout adopts them (0: before layouts were
    /// numbered, v0.1.0, whose control array had 16 slots).
    pub const SLOT_LAYOUT: u32 = 16;
    /// The build whose tracing programs act (its `BYPASS_BUILD` global,
    /// [`crate::layout::globals::BUILD`]): a fresh load writes its own before it attaches
    /// them; an upgrade in place keeps the tracing programs and this slot, so only the
    /// build that loaded the datapath reads, guards and counts on its maps.
    pub const SLOT_HOOKS_OWNER: u32 = 17;
    /// The cut generation ([`SLOT_CUT_GEN`]) at which the agent cut every connection
    /// because the cut map ([`crate::names::MAP_CUT`]) could not hold a cut (full: a
    /// tenant's idle connections can hold its entries): a cut degrades to cutting
    /// everything, never to cutting nothing. A socket that last checked an older
    /// generation leaves ([`cut_everything_since`]). 0, as a fresh load leaves it: never.
    pub const SLOT_CUT_ALL: u32 = 18;
    /// The fingerprint of the cluster's NetworkPolicies whose changes the agent has cut
    /// (FNV-1a of each policy's namespace, name, uid and generation, folded to 32 bits),
    /// written by the agent in Kubernetes mode once every
    /// change it saw is cut; 0, as a fresh load leaves it: none. The next agent compares
    /// its first listing with it, so a change made while no agent ran is cut too.
    pub const SLOT_POLICIES: u32 = 19;
    /// Number of slots: room for later slots without changing the map's size, which
    /// would make it another layout.
    pub const SLOTS: u32 = 32;

    /// Nanoseconds per second of the heartbeat.
    pub const NSEC_PER_SEC: u64 = 1_000_000_000;

    /// Whether sock_ops may insert at `now_ns` (`CLOCK_MONOTONIC`) under the heartbeat
    /// `deadline` ([`SLOT_HEARTBEAT`]).
    #[inline(always)]
    pub const fn heartbeat_alive(deadline: u32, now_ns: u64) -> bool {
        now_ns / NSEC_PER_SEC < deadline as u64
    }

    /// Whether a socket that last checked cut generation `seen` and now sees
    /// `generation` was cut by the cut of everything made at generation `all`
    /// ([`SLOT_CUT_ALL`]; 0: none): `all` comes after `seen`, up to `generation`
    /// (in wrapping order).
    #[inline(always)]
    pub const fn cut_everything_since(seen: u32, generation: u32, all: u32) -> bool {
        all != 0 && generation.wrapping_sub(all) < generation.wrapping_sub(seen)
    }

    /// The cut generation after `g`: never 0, which [`SLOT_CUT_ALL`] reads as none.
    pub const fn next_cut_generation(g: u32) -> u32 {
        match g.wrapping_add(1) {
            0 => 1,
            n => n,
        }
    }

    /// Seconds left until the heartbeat `deadline` at `now_ns`; 0 once it has passed.
    pub const fn heartbeat_remaining(deadline: u32, now_ns: u64) -> u64 {
        (deadline as u64).saturating_sub(now_ns / NSEC_PER_SEC)
    }

    /// The heartbeat deadline `ttl_secs` after `now_ns`, saturating.
    pub const fn heartbeat_deadline(now_ns: u64, ttl_secs: u32) -> u32 {
        let d = now_ns / NSEC_PER_SEC + ttl_secs as u64;
        if d > u32::MAX as u64 {
            u32::MAX
        } else {
            d as u32
        }
    }

    /// Default pages of TCP memory each CPU may hold without counting them in the
    /// node's total (`SK_MEMORY_PCPU_RESERVE`, 1 MiB, net/core/sock.c, Linux ≥ 6.0; the
    /// default of `net.core.mem_pcpu_rsv` since 6.9).
    pub const PCPU_RESERVE_PAGES: u64 = 256;

    /// Pages one redirected message may be charged: up to `MAX_MSG_FRAGS` (17)
    /// scatterlist pieces of up to 32 KiB each (include/linux/skmsg.h).
    pub const MSG_MAX_PAGES: u64 = 17 * 8;

    /// [`SLOT_TCP_MEM_TIGHT`] for `tcp_mem`'s first threshold `low` (pages, the first
    /// number of `/proc/sys/net/ipv4/tcp_mem`) on a node of `cpus` CPUs, each of which
    /// may hold `pcpu_reserve` pages uncounted: below it by an eighth, or by what the
    /// CPUs may hold uncounted and fold in at once with a message each, if that is more
    /// (the kernel compares the folded total, net/core/sock.c,
    /// `__sk_mem_raise_allocated`). At least 1 page, at most `u32::MAX`.
    pub const fn tcp_mem_tight(low: u64, cpus: u64, pcpu_reserve: u64) -> u32 {
        let hidden = cpus.saturating_mul(pcpu_reserve.saturating_add(MSG_MAX_PAGES));
        let margin = if low / 8 > hidden { low / 8 } else { hidden };
        let t = low.saturating_sub(margin);
        if t == 0 {
            1
        } else if t > u32::MAX as u64 {
            u32::MAX
        } else {
            t as u32
        }
    }

    /// Whether a send with `allocated` pages of TCP memory on the node takes the TCP
    /// path under `threshold` ([`SLOT_TCP_MEM_TIGHT`]; 0: never).
    #[inline(always)]
    pub const fn memory_tight(allocated: i64, threshold: u32) -> bool {
        threshold != 0 && allocated >= threshold as i64
    }

    /// Value of [`SLOT_ENABLED`]: redirects allowed.
    pub const ENABLED: u32 = 1;
    /// Value of [`SLOT_ENABLED`]: every send takes the TCP path.
    pub const DISABLED: u32 = 0;
}

#[cfg(test)]
mod control_tests {
    use super::control::*;

    #[test]
    fn a_cut_of_everything_cuts_sockets_that_checked_before_it_only() {
        // Seen 5; everything cut at 6; now 6 or later: cut.
        assert!(cut_everything_since(5, 6, 6));
        assert!(cut_everything_since(5, 9, 6));
        // Checked at or after the cut of everything (inserted later): not cut by it.
        assert!(!cut_everything_since(6, 9, 6));
        assert!(!cut_everything_since(7, 9, 6));
        // Written before the generation moved to it: not yet.
        assert!(!cut_everything_since(5, 5, 6));
        // Never.
        assert!(!cut_everything_since(0, 9, 0));
        // Across the wrap.
        let g = next_cut_generation(u32::MAX);
        assert_eq!(g, 1);
        assert!(cut_everything_since(u32::MAX - 1, g, g));
        assert!(cut_everything_since(u32::MAX - 1, 3, u32::MAX));
        assert!(!cut_everything_since(2, 3, u32::MAX));
    }

    #[test]
    fn heartbeat_expires_at_its_deadline() {
        let now = 100 * NSEC_PER_SEC + 5;
        let d = heartbeat_deadline(now, 60);
        assert_eq!(d, 160);
        assert!(heartbeat_alive(d, now));
        assert!(heartbeat_alive(d, 159 * NSEC_PER_SEC + 999_999_999));
        assert!(!heartbeat_alive(d, 160 * NSEC_PER_SEC));
        assert_eq!(heartbeat_remaining(d, now), 60);
        assert_eq!(heartbeat_remaining(d, 500 * NSEC_PER_SEC), 0);
        // A fresh load leaves 0: nothing is inserted before the agent beats.
        assert!(!heartbeat_alive(0, 0));
        assert_eq!(heartbeat_deadline(u64::MAX, 60), u32::MAX);
    }

    #[test]
    fn memory_is_tight_below_tcp_mems_first_threshold() {
        // This host's tcp_mem: 287901 383868 575802, 2 CPUs: an eighth below.
        let t = tcp_mem_tight(287_901, 2, PCPU_RESERVE_PAGES);
        assert_eq!(t, 287_901 - 35_987);
        assert!(!memory_tight(i64::from(t) - 1, t));
        assert!(memory_tight(i64::from(t), t));
        // What the CPUs may hold uncounted, where that is more than an eighth.
        assert_eq!(tcp_mem_tight(4096, 2, 256), 4096 - 2 * (256 + 136));
        assert_eq!(tcp_mem_tight(287_901, 256, 256), 287_901 - 256 * 392);
        assert_eq!(tcp_mem_tight(287_901, 2, 100_000), 287_901 - 2 * 100_136);
        // 0 in the slot (a fresh load, or no threshold read): never tight.
        assert!(!memory_tight(i64::MAX, 0));
        // A threshold at or below the margin still leaves a page; a huge one saturates.
        assert_eq!(tcp_mem_tight(0, 2, 256), 1);
        assert_eq!(tcp_mem_tight(1, 2, 256), 1);
        assert_eq!(tcp_mem_tight(u64::MAX, 1, 256), u32::MAX);
        assert_eq!(tcp_mem_tight(1 << 20, u64::MAX, 256), 1);
        assert!(!memory_tight(-5, 1));
    }
}

/// A socket's last send decision, kept in socket-local storage by the sk_msg program
/// for the counters (the decision itself is made afresh on every send).
///
/// A direction of a connection may move from redirects to the TCP path at any time:
/// the peer reads its queued redirected bytes before anything that arrives by TCP
/// (net/ipv4/tcp_bpf.c, tcp_bpf_recvmsg, reads the ingress queue first and falls back to
/// tcp_recvmsg only once it is empty). It moves back only once the peer has read every
/// byte sent by TCP with no reader of it still inside `tcp_bpf_recvmsg`
/// ([`crate::state::caught_up`]): a reader may be blocked inside plain tcp_recvmsg
/// (MSG_WAITALL) with every TCP byte copied, and redirected bytes sent then would wait
/// unseen behind a read that only a later TCP byte completes.
pub mod tx_mode {
    /// No message sent yet.
    pub const UNDECIDED: u32 = 0;
    /// The last message was redirected to the peer socket.
    pub const REDIRECT: u32 = 1;
    /// The last message took the TCP path.
    pub const TCP: u32 = 2;
}
