//! PostgreSQL: a private cluster made by Debian's `initdb` as the `postgres` user in a
//! work directory, its `postgres` run in a pod listening on the pod's address (trust
//! authentication, durability off: the tests measure the network, not the disk), and
//! `pgbench` against it.

use std::{net::SocketAddr, path::Path, process::Command, time::Duration};

use anyhow::{Context as _, Result, bail};
use nix::unistd::{User, chown};

use super::{
    READY_TIMEOUT,
    bins::{self, Needs},
    client::{self, On},
    server::Listening,
    workdir::WorkDir,
};

/// What the PostgreSQL workloads run.
pub const NEEDS: Needs = Needs {
    system: &["initdb", "postgres", "pgbench", "setpriv"],
    built: &[],
};

/// The database role and database the workloads use.
pub const USER: &str = "postgres";

/// Makes a cluster and starts its `postgres` on `on`, listening on `listen` only; ready
/// once its pid file says it accepts connections.
pub fn start(on: On<'_>, listen: SocketAddr) -> Result<Listening> {
    let dir = WorkDir::new("postgres")?;
    let user = User::from_name(USER)
        .context("look up the postgres user")?
        .context("no postgres user (install postgresql: cargo xtask setup)")?;
    let (data, sock) = (dir.join("data"), dir.join("sock"));
    for d in [&data, &sock] {
        std::fs::create_dir(d).with_context(|| format!("create {}", d.display()))?;
        chown(d, Some(user.uid), Some(user.gid))
            .with_context(|| format!("chown {} to postgres", d.display()))?;
    }
    let mut initdb = as_postgres()?;
    initdb
        .arg(bins::postgres("initdb")?)
        .arg("-D")
        .arg(&data)
        .args(["--auth=trust", "--username", USER, "--no-sync"])
        .args(["--encoding=UTF8", "--locale=C"]);
    client::run_here(initdb, "initdb", READY_TIMEOUT)?;
    // Any address may connect: the pods' network is the test's own.
    std::fs::write(
        data.join("pg_hba.conf"),
        "local all all trust\nhost all all 0.0.0.0/0 trust\nhost all all ::/0 trust\n",
    )
    .context("write pg_hba.conf")?;
    let mut cmd = as_postgres()?;
    cmd.arg(bins::postgres("postgres")?)
        .arg("-D")
        .arg(&data)
        .args(["-p", &listen.port().to_string()])
        .args(["-c", &format!("listen_addresses={}", listen.ip())])
        .arg("-c")
        .arg(format!("unix_socket_directories={}", sock.display()))
        .args(["-c", "fsync=off", "-c", "synchronous_commit=off"])
        .args(["-c", "full_page_writes=off", "-c", "max_connections=100"]);
    let pid_file = data.join("postmaster.pid");
    Listening::start_until(on, cmd, dir, "postgres", listen, |s| {
        s.wait_until("accepting connections", READY_TIMEOUT, || {
            Ok(accepting(&pid_file))
        })?
        .wait_listening(listen, READY_TIMEOUT)
    })
}

/// `setpriv` as the postgres user (initdb and postgres refuse root). It runs as root
/// until it execs, so the pod's cgroup and namespace are entered first.
fn as_postgres() -> Result<Command> {
    let mut cmd = Command::new(bins::system("setpriv")?);
    cmd.args([
        &format!("--reuid={USER}"),
        &format!("--regid={USER}"),
        "--init-groups",
        "--",
    ]);
    Ok(cmd)
}

/// Whether the postmaster's pid file says it accepts connections: its eighth line is
/// the status, `ready` once it does (src/include/utils/pidfile.h, PM_STATUS_READY).
fn accepting(pid_file: &Path) -> bool {
    std::fs::read_to_string(pid_file)
        .is_ok_and(|t| t.lines().nth(7).is_some_and(|s| s.trim() == "ready"))
}

/// `pgbench -i`: creates and fills the tables at `scale` (100,000 accounts each).
pub fn pgbench_init(on: On<'_>, server: SocketAddr, scale: u32, timeout: Duration) -> Result<()> {
    let mut cmd = pgbench(server)?;
    cmd.args(["-i", "-q", "-s", &scale.to_string()]).arg(USER);
    client::run_ok(on, cmd, "pgbench -i", timeout)?;
    Ok(())
}

fn pgbench(server: SocketAddr) -> Result<Command> {
    let mut cmd = Command::new(bins::postgres("pgbench")?);
    cmd.args(["-h", &server.ip().to_string()])
        .args(["-p", &server.port().to_string()])
        .args(["-U", USER]);
    Ok(cmd)
}

/// A `pgbench` run, by transaction count.
#[derive(Clone, Debug)]
pub struct Pgbench {
    /// Clients (`-c`), each its own connection.
    pub clients: u32,
    /// Threads (`-j`).
    pub threads: u32,
    /// Transactions per client (`-t`).
    pub transactions: u32,
    /// A new connection for every transaction (`-C`).
    pub connect_per_transaction: bool,
    /// The select-only script (`-S`) instead of TPC-B.
    pub select_only: bool,
}

/// What `pgbench` printed.
#[derive(Clone, Debug, PartialEq)]
pub struct PgbenchReport {
    /// Transactions processed.
    pub processed: u64,
    /// Transactions asked for.
    pub expected: u64,
    /// Failed transactions.
    pub failed: u64,
    /// Transactions per second.
    pub tps: f64,
    /// "latency average", milliseconds.
    pub latency_ms: Option<f64>,
}

impl Pgbench {
    /// Runs it on `on`; fails unless it exits 0 and prints its summary.
    pub fn run(&self, on: On<'_>, server: SocketAddr, timeout: Duration) -> Result<PgbenchReport> {
        let mut cmd = pgbench(server)?;
        cmd.args(["-c", &self.clients.to_string()])
            .args(["-j", &self.threads.to_string()])
            .args(["-t", &self.transactions.to_string()]);
        if self.connect_per_transaction {
            cmd.arg("-C");
        }
        if self.select_only {
            cmd.arg("-S");
        }
        cmd.arg(USER);
        let out = client::run_ok(on, cmd, "pgbench", timeout)?;
        parse_pgbench(&out).with_context(|| format!("pgbench's output: {out}"))
    }
}

/// The summary lines of `pgbench` (PostgreSQL 15): processed/expected, failed, latency
/// average, tps.
pub fn parse_pgbench(text: &str) -> Result<PgbenchReport> {
    let after = |prefix: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(prefix).map(str::trim))
    };
    let Some((processed, expected)) =
        after("number of transactions actually processed:").and_then(|v| v.split_once('/'))
    else {
        bail!("no \"number of transactions actually processed\"");
    };
    let failed = after("number of failed transactions:")
        .and_then(|v| v.split_whitespace().next())
        .context("no \"number of failed transactions\"")?;
    let tps = after("tps =")
        .and_then(|v| v.split_whitespace().next())
        .context("no \"tps =\"")?;
    Ok(PgbenchReport {
        processed: processed.trim().parse()?,
        expected: expected.trim().parse()?,
        failed: failed.parse()?,
        tps: tps.parse()?,
        latency_ms: after("latency average =")
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pgbench_summary() {
        let text = "transaction type: <builtin: TPC-B (sort of)>\nnumber of transactions per client: 250\nnumber of transactions actually processed: 1000/1000\nnumber of failed transactions: 0 (0.000%)\nlatency average = 3.1 ms\ntps = 1290.676 (without initial connection time)\n";
        let r = parse_pgbench(text).unwrap();
        assert_eq!((r.processed, r.expected, r.failed), (1000, 1000, 0));
        assert!((r.tps - 1290.676).abs() < 1e-9);
        assert_eq!(r.latency_ms, Some(3.1));
        assert!(parse_pgbench("tps = 1").is_err());
    }
}
