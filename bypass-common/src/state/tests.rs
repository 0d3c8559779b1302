//! Unit tests of the pure decisions.

use super::*;

extern crate std;
use std::vec::Vec;

fn key(lp: u32, rp: u32, netns: u64) -> SockKey {
    SockKey::new(
        [0, 0, 0xffff_u32.to_be(), lp],
        [0, 0, 0xffff_u32.to_be(), rp],
        lp,
        rp,
        netns,
    )
}

fn pair() -> (SockState, SockState, Link) {
    let client = SockState {
        key: key(1, 2, 10),
        link: key(1, 2, 10),
        side: side::CLIENT,
        cookie: 7,
        ..SockState::default()
    };
    let server = SockState {
        key: key(2, 1, 20),
        link: key(1, 2, 10),
        side: side::SERVER,
        cookie: 8,
        ..SockState::default()
    };
    let link = Link {
        server: server.key,
        cookie: [7, 8],
        ..Link::default()
    };
    (client, server, link)
}

#[test]
fn small_stream_rule() {
    const SMALL: u64 = 256;
    // Request/response: every send finds the queue read.
    let mut run = 0;
    for _ in 0..100 {
        let (r, tcp) = small_stream_step(run, 0, 0, SMALL);
        assert!(!tcp);
        run = r;
    }
    // A stream: the reader falls behind on 1-byte messages; TCP at the
    // SMALL_STREAM_RUN-th send.
    for i in 1..=SMALL_STREAM_RUN {
        let (r, tcp) = small_stream_step(run, 5, 5, SMALL);
        assert_eq!((r, tcp), (i, i == SMALL_STREAM_RUN));
        run = r;
    }
    // A burst shorter than the run, then the reader catches up: the run restarts.
    let (r, _) = small_stream_step(3, 7, 7, SMALL);
    assert_eq!(small_stream_step(r, 0, 0, SMALL), (0, false));
}

#[test]
fn small_sends_behind_large_messages_are_not_a_stream() {
    const SMALL: u64 = 256;
    // An echo of bulk data: short sends while two 64 KiB answers wait unread (the
    // message count an upper bound, up to twice the truth) never count.
    let mut run = 0;
    for _ in 0..100 {
        let (r, tcp) = small_stream_step(run, 128 << 10, 4, SMALL);
        assert_eq!((r, tcp), (0, false));
        run = r;
    }
    // One large message among many small ones: small on average, it counts.
    assert_eq!(small_stream_step(0, 4096 + 99, 100, SMALL), (1, false));
    // At the size exactly: not under it.
    assert_eq!(small_stream_step(5, 10 * SMALL, 10, SMALL), (0, false));
    assert_eq!(small_stream_step(5, 10 * SMALL - 1, 10, SMALL), (6, false));
    // Bytes waiting with no message counted (never from sk_msg): one message.
    assert_eq!(small_stream_step(0, 100, 0, SMALL), (1, false));
    assert_eq!(small_stream_step(0, SMALL, 0, SMALL), (0, false));
    // Extremes do not overflow.
    assert_eq!(
        small_stream_step(0, 1 << 62, u64::MAX, u64::MAX),
        (1, false)
    );
    assert_eq!(
        small_stream_step(0, u64::MAX, u64::MAX, u64::MAX),
        (0, false)
    );
    assert_eq!(small_stream_step(0, u64::MAX, 1, u64::MAX), (0, false));
}

#[test]
fn pairing_needs_crossed_sequence_numbers() {
    let c = Connector {
        snd_nxt: 1001,
        rcv_nxt: 5001,
        ..Connector::default()
    };
    assert!(is_other_end(&c, 5001, 1001));
    assert!(!is_other_end(&c, 1001, 5001), "not crossed");
    assert!(
        !is_other_end(&c, 5001, 1002),
        "another client on the same end"
    );
}

#[test]
fn one_wrong_guess_spends_the_connector() {
    let c = Connector {
        snd_nxt: 1001,
        rcv_nxt: 5001,
        ..Connector::default()
    };
    assert_eq!(pairing(false, &c, 5001, 1001), Pairing::Pair);
    assert_eq!(pairing(false, &c, 5002, 1001), Pairing::Spend);
    assert_eq!(
        pairing(true, &c, 5001, 1001),
        Pairing::Spent,
        "the exact numbers after another claim"
    );
    assert_eq!(pairing(true, &c, 5002, 1001), Pairing::Spent);
}

#[test]
fn the_spent_bit_is_spent_in_the_word() {
    // The word at rx_limit, as the kernel's atomic or sees it, read back as the struct.
    let mut c = Connector {
        rx_limit: 0x1234_5678,
        ..Connector::default()
    };
    let off = core::mem::offset_of!(Connector, rx_limit);
    // SAFETY: `off` is 8-aligned and in bounds (the const assertions beside Connector).
    let word = unsafe {
        &mut *(core::ptr::addr_of_mut!(c)
            .cast::<u8>()
            .add(off)
            .cast::<u64>())
    };
    *word |= SPENT_IN_WORD;
    assert_eq!((c.rx_limit, c.spent), (0x1234_5678, 1));
}

#[test]
fn hop_kinds() {
    let client = key(1, 2, 10);
    let server = key(2, 1, 20);
    assert_eq!(Hop::of(&client, &server), Hop::Pod);
    let redirected = SockKey {
        local_port: 15006,
        ..server
    };
    assert_eq!(Hop::of(&client, &redirected), Hop::Translated);
    let lo = [0, 0, 0xffff_u32.to_be(), u32::from_ne_bytes([127, 0, 0, 1])];
    let c = SockKey::new(lo, lo, 1, 2, 5);
    let s = SockKey::new(lo, lo, 2, 1, 5);
    assert_eq!(Hop::of(&c, &s), Hop::Loopback);
    // What a link holds: each kind's `u32`, and 0 before it is paired.
    for kind in Hop::ALL {
        assert_eq!(Hop::from_raw(kind as u32), Some(kind));
    }
    assert_eq!(Hop::from_raw(0), None);
}

#[test]
fn links_are_used_only_by_their_two_sockets() {
    let (client, server, link) = pair();
    assert!(link.is_of(&client) && link.is_of(&server));
    let elsewhere = Link {
        server: key(2, 3, 20),
        ..link
    };
    assert!(
        !elsewhere.is_of(&client),
        "a server whose remote end is not this client's local end"
    );
    let stale = Link {
        cookie: [6, 8],
        ..link
    };
    assert!(
        !stale.is_of(&client) && stale.is_of(&server),
        "a link an earlier client left under the same key"
    );
    let reused = Link {
        cookie: [7, 9],
        ..link
    };
    assert!(!reused.is_of(&server), "another server with the same key");
    let uncookied = SockState {
        cookie: 0,
        ..client
    };
    assert!(
        !Link {
            cookie: [0, 8],
            ..link
        }
        .is_of(&uncookied)
    );
    assert_eq!(link.target(&client), server.key);
    assert_eq!(link.target(&server), client.key);
    let older_server = SockState {
        key: key(2, 1, 21),
        ..server
    };
    assert!(!link.is_of(&older_server), "a later connection's link");
    let outsider = SockState {
        side: side::NONE,
        ..client
    };
    assert!(!link.is_of(&outsider));
}

#[test]
fn a_reader_that_reads_tcp_only_gets_its_waiting_bytes_redirected_first() {
    let (client, server, link) = pair();
    // The server (index 1) splices: its guard set its bit and asked the connection to
    // leave, with 100 of the client's 300 redirected bytes still unread.
    let splicing = Link {
        state: link_state::LEAVING,
        rx_flags: [0, rx::SPLICE],
        tx_redir: [300, 0],
        rx_read: [0, 200],
        ..link
    };
    for reason in [PassReason::Leaving, PassReason::PeerReadsTcp] {
        assert!(drains_first(reason, &splicing, &client), "{reason:?}");
    }
    assert!(
        !drains_first(PassReason::Leaving, &splicing, &server),
        "the client reads by recv: the server's sends leave at once"
    );
    let read_all = Link {
        rx_read: [0, 300],
        ..splicing
    };
    assert!(
        !drains_first(PassReason::Leaving, &read_all, &client),
        "everything read: TCP from now on"
    );
    for other in [
        Link {
            state: link_state::LEAVING,
            rx_flags: [0, 0],
            ..splicing
        },
        Link {
            rx_flags: [0, rx::SPLICE | rx::OPTION],
            ..splicing
        },
        Link {
            state: link_state::LEAVING | link_state::CLOSED_SERVER,
            ..splicing
        },
    ] {
        assert!(
            !drains_first(PassReason::Leaving, &other, &client),
            "a leave of another cause, a receive option, a closed peer: {other:?}"
        );
    }
    for reason in [
        PassReason::Disabled,
        PassReason::PeerClosed,
        PassReason::PeerOptions,
        PassReason::Unpaired,
    ] {
        assert!(!drains_first(reason, &splicing, &client), "{reason:?}");
    }
    // At the claim, on the link itself.
    assert!(drains_after_claim(rx::SPLICE, 300, 200));
    assert!(drains_after_claim(rx::ZEROCOPY | rx::TRUNC, 300, 299));
    assert!(
        !drains_after_claim(rx::SPLICE, 300, 300),
        "the guard may have let a splice through"
    );
    assert!(!drains_after_claim(0, 300, 200), "a leave of another cause");
    assert!(
        !drains_after_claim(rx::SPLICE | rx::DRAINED, 300, 200),
        "the guard let a splice through: no drain into it again"
    );
    let cut = Link {
        state: link_state::LEAVING | link_state::CUT,
        ..splicing
    };
    assert!(
        !drains_first(PassReason::Leaving, &cut, &client),
        "a cut connection never redirects, even to drain"
    );
    assert!(!drains_after_claim(rx::SPLICE | rx::OPTION, 300, 200));
}

#[test]
fn precheck_order() {
    let (client, server, link) = pair();
    assert_eq!(
        precheck(false, Some(&link), &client),
        Some(PassReason::Disabled)
    );
    assert_eq!(precheck(true, None, &client), Some(PassReason::Unpaired));
    assert_eq!(precheck(true, Some(&link), &client), None);
    let leaving = Link {
        state: link_state::LEAVING,
        rx_flags: [rx::OPTION, rx::OPTION],
        ..link
    };
    assert_eq!(
        precheck(true, Some(&leaving), &client),
        Some(PassReason::Leaving)
    );
    let server_closed = Link {
        state: link_state::CLOSED_SERVER,
        ..link
    };
    assert_eq!(
        precheck(true, Some(&server_closed), &client),
        Some(PassReason::PeerClosed)
    );
    assert_eq!(
        precheck(true, Some(&server_closed), &server),
        None,
        "a socket's own close is not its peer's"
    );
    let picky = Link {
        rx_flags: [0, rx::OPTION],
        ..link
    };
    assert_eq!(
        precheck(true, Some(&picky), &client),
        Some(PassReason::PeerOptions)
    );
    assert_eq!(
        precheck(true, Some(&picky), &server),
        None,
        "a socket's own receive options do not stop its sends"
    );
    let splicing = Link {
        rx_flags: [rx::SPLICE | rx::OPTION, 0],
        ..link
    };
    assert_eq!(
        precheck(true, Some(&splicing), &server),
        Some(PassReason::PeerReadsTcp)
    );
    let mapped = Link {
        rx_flags: [rx::ZEROCOPY, 0],
        ..link
    };
    assert_eq!(
        precheck(true, Some(&mapped), &server),
        Some(PassReason::PeerReadsTcp)
    );
}

#[test]
fn ingress_reads_are_total_reads_less_tcp_reads() {
    assert_eq!(ingress_read(100, 0), 100, "nothing by TCP");
    assert_eq!(ingress_read(100, 30), 70);
    assert_eq!(
        ingress_read(10, 30),
        0,
        "a TCP read not yet counted in the total: never negative"
    );
    // Past 4 GiB read by TCP, the total keeps counting in 64 bits.
    assert_eq!(ingress_read((5 << 30) + 7, 5 << 30), 7);
}

#[test]
fn a_closed_socket_is_drained_when_it_read_what_was_due() {
    assert!(closed_drained(0, 0, 0), "nothing was ever redirected to it");
    assert!(
        closed_drained(1000, 1500, 500),
        "1000 from the ingress queue, 500 by TCP"
    );
    assert!(
        !closed_drained(1000, 1400, 500),
        "100 redirected bytes still queued: the guard keeps refusing"
    );
    assert!(
        !closed_drained(1000, 400, 500),
        "a TCP read counted before its bytes: not drained, never early"
    );
    assert!(
        closed_drained(0, 4096, 0),
        "never paired, read past a count that lags: nothing was due"
    );
}

#[test]
fn tcp_read_steps_wrap_and_never_go_back() {
    assert_eq!(tcp_read_step(1030, 1000), 30);
    assert_eq!(tcp_read_step(10, u32::MAX - 19), 30, "sequence wrap");
    assert_eq!(tcp_read_step(1000, 1000), 0);
    assert_eq!(
        tcp_read_step(990, 1000),
        0,
        "an older copied_seq than the last published: no step"
    );
    // Steps summed over a stream longer than 4 GiB: the 64-bit total is exact.
    let (mut last, mut total) = (u32::MAX - 100, 0u64);
    for _ in 0..3_000 {
        let next = last.wrapping_add(2 << 20);
        total += tcp_read_step(next, last);
        last = next;
    }
    assert_eq!(total, 3_000 * (2 << 20));
}

#[test]
fn leaving_reasons() {
    assert!(PassReason::SmallStream.leaves());
    assert!(PassReason::PeerReadsTcp.leaves());
    for r in [
        PassReason::Behind,
        PassReason::QueueFull,
        PassReason::Disabled,
        PassReason::PeerOptions,
        PassReason::Unpaired,
    ] {
        assert!(!r.leaves(), "{r:?} comes back to redirects");
    }
}

#[test]
fn a_direction_stuck_on_tcp_leaves() {
    assert!(PassReason::Behind.lingers() && PassReason::QueueFull.lingers());
    assert!(
        !PassReason::Disabled.lingers(),
        "detached: nothing to leave for"
    );
    assert!(!PassReason::Unpaired.lingers(), "no link to leave by");
    assert_eq!(tcp_run_step(0, 100, 1000), (100, false));
    assert_eq!(tcp_run_step(900, 100, 1000), (1000, true));
    assert_eq!(tcp_run_step(5000, 100, 0), (5100, false), "0 is never");
}

#[test]
fn closed_bits_by_side() {
    assert_eq!(link_state::closed(side::CLIENT), link_state::CLOSED_CLIENT);
    assert_eq!(link_state::closed(side::SERVER), link_state::CLOSED_SERVER);
    assert_eq!(
        link_state::closed(side::CLIENT) | link_state::closed(side::SERVER),
        link_state::BOTH_CLOSED
    );
}

#[test]
fn pending_bytes() {
    assert_eq!(pending(100, 40), 60);
    assert_eq!(pending(100, 100), 0);
    assert_eq!(
        pending(100, 150),
        0,
        "a read counted before the send it read (never: but never negative)"
    );
}

#[test]
fn message_checkpoints_bound_what_waits() {
    // A model: messages of the given sizes, a reader that has read `rx_read` bytes.
    // Whatever the reader does, tx_msgs - done_msgs is never below the messages
    // not fully read.
    let sizes = [1u64, 1, 5000, 1, 1, 1, 70000, 3, 3, 3, 3, 1, 9000];
    for read_every in 1..sizes.len() {
        for read_len in [1u64, 2, 4000, 100_000] {
            let (mut cp_msgs, mut cp_redir, mut done) = (0, 0, 0);
            let (mut tx_msgs, mut tx_redir, mut rx_read) = (0u64, 0u64, 0u64);
            let mut ends = Vec::new();
            for (i, s) in sizes.iter().enumerate() {
                (cp_msgs, cp_redir, done) =
                    consumed_messages(cp_msgs, cp_redir, done, tx_msgs, tx_redir, rx_read);
                let waiting = ends.iter().filter(|&&e| e > rx_read).count() as u64;
                assert!(
                    tx_msgs - done >= waiting,
                    "bound {} below the {waiting} waiting (read_every {read_every})",
                    tx_msgs - done
                );
                tx_msgs += 1;
                tx_redir += s;
                ends.push(tx_redir);
                if i % read_every == 0 {
                    rx_read = (rx_read + read_len).min(tx_redir);
                }
            }
        }
    }
}

#[test]
fn message_checkpoints_follow_a_reader_that_keeps_up() {
    let (mut cp_msgs, mut cp_redir, mut done) = (0, 0, 0);
    let (mut tx_msgs, mut tx_redir) = (0u64, 0u64);
    for _ in 0..1000 {
        // The reader has read everything before each send.
        (cp_msgs, cp_redir, done) =
            consumed_messages(cp_msgs, cp_redir, done, tx_msgs, tx_redir, tx_redir);
        assert!(tx_msgs - done <= 1, "{} counted as waiting", tx_msgs - done);
        tx_msgs += 1;
        tx_redir += 64;
    }
}

#[test]
fn charges_count_messages_as_memory() {
    // 1-byte messages: each costs about a struct sk_msg, so a 6 MiB bound holds about
    // six thousand of them, not six million.
    let cost = 1024;
    let limit = 6 << 20;
    let mut waiting = 0u64;
    while within_limit(charge(waiting, waiting, 1, cost), limit) {
        waiting += 1;
    }
    assert!((6000..6200).contains(&waiting), "{waiting}");
    assert!(within_limit(u64::MAX, 0), "0 is no bound");
    assert_eq!(charge(u64::MAX, u64::MAX, 1, cost), u64::MAX, "no overflow");
    assert_eq!(charge(0, u64::MAX, 0, u64::MAX), (1 << 32) * (1 << 31));
    assert!(within_limit(charge(0, 0, 4096, 0), 4096));
    assert!(!within_limit(charge(1, 0, 4096, 0), 4096));
}

#[test]
fn receive_options() {
    assert!(!options_need_tcp(1, -1), "defaults");
    assert!(!options_need_tcp(0, -1), "SO_RCVLOWAT 0 reads as 1");
    assert!(options_need_tcp(1000, -1));
    assert!(options_need_tcp(1, 0));
    assert!(rcvlowat_needs_tcp(2));
    assert!(
        rcvlowat_needs_tcp(-1),
        "the kernel makes a negative value INT_MAX"
    );
    assert!(!rcvlowat_needs_tcp(1));
    assert!(!rcvlowat_needs_tcp(0), "0 means 1");
}

#[test]
fn receive_bound_follows_a_fixed_buffer_only() {
    assert_eq!(receive_bound(131_072, 0), 0, "autotuned: the global bound");
    assert_eq!(receive_bound(8192, SOCK_RCVBUF_LOCK), 8192);
    assert_eq!(receive_bound(8192, 1), 0, "only the send buffer is fixed");
}

#[test]
fn catching_up_is_equality() {
    assert!(caught_up(5, 5));
    assert!(!caught_up(4, 5));
    assert!(caught_up(u32::MAX, u32::MAX));
}

#[test]
fn an_urgent_byte_or_fin_stepped_over_is_no_byte_read() {
    const NO: (bool, u32) = (false, 0);
    let at = |seq: u32| (true, seq);
    // Five bytes and the urgent byte between them: six sequence numbers, five bytes.
    assert_eq!(skipped_seqs(1006, 1000, at(1002), NO), 1);
    // Inline (or none): the urgent byte was read as data.
    assert_eq!(skipped_seqs(1006, 1000, (false, 1002), NO), 0);
    // The urgent byte outside the step (read before, or not reached yet).
    assert_eq!(skipped_seqs(1006, 1000, at(999), NO), 0);
    assert_eq!(skipped_seqs(1006, 1000, at(1006), NO), 0);
    // The FIN, last of the step; with an urgent byte too.
    assert_eq!(skipped_seqs(1006, 1000, NO, at(1005)), 1);
    assert_eq!(skipped_seqs(1006, 1000, at(1001), at(1005)), 2);
    // Across the sequence wrap.
    assert_eq!(skipped_seqs(3, u32::MAX - 2, at(u32::MAX), at(2)), 2);
    // Never more than the step; no step, nothing.
    assert_eq!(skipped_seqs(1001, 1000, at(1000), at(1000)), 1);
    assert_eq!(skipped_seqs(1000, 1000, at(1000), at(1000)), 0);
    assert_eq!(skipped_seqs(990, 1000, at(995), NO), 0, "backwards");
}

#[test]
fn a_link_is_cut_by_a_cut_of_everything_made_after_it() {
    // A cut of everything at generation `all` moves the generation to `all`.
    let made_at = |g: u32| Link {
        paired_gen: g.wrapping_add(1),
        ..Link::default()
    };
    assert!(made_at(3).cut_by_all(6, 5));
    assert!(made_at(u32::MAX - 1).cut_by_all(2, 1), "in wrapping order");
    // Made at the cut's generation or later, or with no cut of everything: not cut.
    assert!(!made_at(5).cut_by_all(6, 5));
    assert!(!made_at(3).cut_by_all(6, 0));
    // A link that does not say when it was made is never taken for cut.
    let unrecorded = Link::default();
    assert!(!unrecorded.cut_by_all(6, 5) && !unrecorded.already_cut(6, 5));
    let seen = Link {
        state: link_state::CUT,
        ..Link::default()
    };
    assert!(seen.already_cut(6, 0) && made_at(3).already_cut(6, 5));
}
