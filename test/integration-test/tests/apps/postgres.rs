//! PostgreSQL: pgbench's TPC-B (sort of) on a private cluster, with persistent
//! connections and with a connection per transaction (`-C`); every transaction
//! processed and none failed.

use anyhow::{Result, ensure};
use testbed::apps::postgres::{self, Pgbench, pgbench_init};

use super::support::{Bed, app_test};

const PORT: u16 = 5432;
/// `pgbench -i -s`: 100,000 accounts.
const SCALE: u32 = 1;
const CLIENTS: u32 = 4;
const THREADS: u32 = 2;
/// Transactions per client, persistent connections.
const TRANSACTIONS: u32 = 250;
/// Transactions per client, a connection each.
const CONNECT_TRANSACTIONS: u32 = 100;
/// A lower bound on what the server sends per TPC-B transaction: seven statements, each
/// answered by at least CommandComplete and ReadyForQuery (19 B and more), one with a
/// row.
const REPLY_BYTES_PER_TRANSACTION: u64 = 100;
/// The net for each client run (see `testbed::steps::NET`): a hang, never a pace.
const CLIENT_TIMEOUT: std::time::Duration = testbed::steps::NET;

fn pgbench(connect_per_transaction: bool, transactions: u32) -> Result<()> {
    let bed = Bed::new()?;
    let mut pg = postgres::start(bed.b(), bed.pods.b.v4_addr(PORT))?;
    pgbench_init(bed.a(), pg.addr(), SCALE, CLIENT_TIMEOUT)?;
    let bench = Pgbench {
        clients: CLIENTS,
        threads: THREADS,
        transactions,
        connect_per_transaction,
        select_only: false,
    };
    let mark = bed.mark()?;
    let r = bench.run(bed.a(), pg.addr(), CLIENT_TIMEOUT)?;
    let delta = bed.since(&mark)?;
    pg.server().ensure_running()?;
    let expected = u64::from(CLIENTS) * u64::from(transactions);
    ensure!(
        r.processed == expected && r.expected == expected && r.failed == 0,
        "pgbench (-C {connect_per_transaction}): {r:?}, want {expected} of {expected} \
         processed and none failed ({})",
        delta.summary()
    );
    eprintln!("pgbench (-C {connect_per_transaction}): {r:?}");
    // Every connection paired; the server's answers go socket to socket (pgbench's
    // startup message leaves at once, so the requests' direction may keep TCP).
    let connections = if connect_per_transaction {
        expected
    } else {
        u64::from(CLIENTS)
    };
    delta.expect_bypassed(
        "pgbench",
        connections,
        expected * REPLY_BYTES_PER_TRANSACTION,
    )
}

#[test]
fn tpcb_all_transactions() -> Result<()> {
    app_test!(postgres::NEEDS);
    pgbench(false, TRANSACTIONS)
}

#[test]
fn connection_per_transaction_all_transactions() -> Result<()> {
    app_test!(postgres::NEEDS);
    pgbench(true, CONNECT_TRANSACTIONS)
}
