//! iperf3 by byte count: one bulk stream, 64-byte writes, four streams, and the server
//! sending (`-R`), each completing with the streams asked for and every byte sent
//! going socket to socket. Where the receiver ends the test (`-R`) its JSON report
//! shows every byte asked for received and at most the sender's last block unread; a
//! receiving server's count is only a prefix (see below).

use anyhow::{Result, ensure};
use testbed::apps::iperf::{self, Iperf};

use super::support::{Bed, app_test};

const PORT: u16 = 5201;
/// Bulk runs: bytes over all streams.
const BULK_BYTES: u64 = 256 << 20;
/// One bulk stream, the client sending; the other runs change a field or two of it.
const BULK: Iperf = Iperf {
    bytes: BULK_BYTES,
    streams: 1,
    write_size: None,
    reverse: false,
};
/// The small-write run: bytes, and bytes per write.
const SMALL_BYTES: u64 = 8 << 20;
const SMALL_WRITE: u32 = 64;
const STREAMS: u32 = 4;
/// iperf3's TCP block (`-l`) when none is given: 128 KiB.
const DEFAULT_BLOCK: u64 = 128 << 10;
/// The net for each client run (see `testbed::steps::NET`): a hang, never a pace.
const CLIENT_TIMEOUT: std::time::Duration = testbed::steps::NET;

fn iperf(run: &Iperf) -> Result<()> {
    let bed = Bed::new()?;
    let mut server = iperf::server(bed.b(), bed.pods.b.v4_addr(PORT))?;
    let mark = bed.mark()?;
    let r = run.run(bed.a(), server.addr(), CLIENT_TIMEOUT)?;
    let delta = bed.since(&mark)?;
    server.server().ensure_running()?;
    ensure!(
        r.sent >= run.bytes && r.streams == u64::from(run.streams),
        "iperf3 {run:?}: {r:?}: want at least {} B sent on {} streams ({})",
        run.bytes,
        run.streams,
        delta.summary()
    );
    if run.reverse {
        // The receiving client ends the test once it has received every byte asked
        // for. The sending server may have written one block more: in iperf3 3.12
        // `iperf_send`'s last multisend pass skips the `-n` check (src/iperf_api.c),
        // so a pass that reaches `-n` on its second-to-last write sends one block past
        // it, which nobody reads (plain TCP too). Anything more than that block unread
        // would be bytes lost.
        let block = run.write_size.map_or(DEFAULT_BLOCK, u64::from);
        ensure!(
            r.received >= run.bytes && r.received <= r.sent && r.sent - r.received <= block,
            "iperf3 {run:?}: {} B sent, {} B received: want at least {} B received and at \
             most one {block}-byte block of what was sent unread ({})",
            r.sent,
            r.received,
            run.bytes,
            delta.summary()
        );
    } else {
        // A receiving server stops counting when the control connection says the
        // sender is done, with the last bytes sent still unread (iperf3 3.12,
        // esnet/iperf#382; plain TCP too): its count is a prefix of what was sent.
        ensure!(
            r.received > 0 && r.received <= r.sent,
            "iperf3 {run:?}: {} B sent, {} B received ({})",
            r.sent,
            r.received,
            delta.summary()
        );
    }
    eprintln!(
        "iperf3 {run:?}: {} B sent, {} B counted received, {:.2} Gbit/s",
        r.sent,
        r.received,
        r.bits_per_second / 1e9
    );
    // The control connection and each data stream paired; every byte sent went socket
    // to socket.
    delta.expect_bypassed("iperf3", 1 + u64::from(run.streams), r.sent)
}

#[test]
fn bulk_one_stream() -> Result<()> {
    app_test!(iperf::NEEDS);
    iperf(&BULK)
}

#[test]
fn small_writes() -> Result<()> {
    app_test!(iperf::NEEDS);
    iperf(&Iperf {
        bytes: SMALL_BYTES,
        write_size: Some(SMALL_WRITE),
        ..BULK
    })
}

#[test]
fn four_streams() -> Result<()> {
    app_test!(iperf::NEEDS);
    iperf(&Iperf {
        streams: STREAMS,
        ..BULK
    })
}

#[test]
fn reverse() -> Result<()> {
    app_test!(iperf::NEEDS);
    iperf(&Iperf {
        reverse: true,
        ..BULK
    })
}
