//! `bypass-test-tool probe`: one TCP behaviour at a time, observed from the application,
//! so a test can run the same case with and without the bypass and compare. A server and
//! a client agree on a case by name; each prints one JSON object of what it saw. Payload
//! bytes are the testbed's pattern (stream 0, or the connection's index), verified in
//! order by the reader. One file per case (or family of cases); this one parses the
//! command line and dispatches.

use std::{
    net::{SocketAddr, TcpListener},
    path::PathBuf,
    process::ExitCode,
};

use anyhow::{Context as _, Result, bail};
use clap::{Args, Subcommand, ValueEnum};
use nix::sys::socket::{Backlog, listen as listen_backlog};
use serde_json::Value;
use testbed::peer::{parse_size, pattern::Direction};

mod burst;
mod duplex;
mod epoll;
mod fionread;
mod flood;
mod forger;
mod halfclose;
mod handshake;
mod held;
mod leave;
mod mixed;
mod oob;
mod peek;
mod rcvlowat;
mod rcvtimeo;
mod reset;
mod sendfile;
mod slow;
mod sock;
mod splice;
mod trust;
mod urgent;
mod waitall;
mod zerocopy;

/// One TCP behaviour at a time, observed from the application: a server and a client
/// agree on a case; each prints one JSON object of what it saw.
#[derive(Debug, Args)]
pub struct Cli {
    #[command(subcommand)]
    role: Role,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Case {
    /// Client: non-blocking writes for --secs, counting what the kernel accepts.
    /// Server: reads nothing for --hold-ms, reports FIONREAD, then drains.
    Flood,
    /// Client: blocking writes of --bytes, pausing --pause-ms every --pause-every bytes.
    /// Server: reads --chunk bytes at a time, --delay-us apart.
    Slow,
    /// Each side half-closes (shutdown SHUT_WR) while the other still sends to it.
    Halfclose,
    /// The client closes with SO_LINGER 0 (RST) after sending; the server reads late.
    Reset,
    /// MSG_PEEK, then a read: the peeked bytes are read again.
    Peek,
    /// SO_PEEK_OFF set once 100 bytes are queued, then two peeks and a read. The
    /// client is as for peek.
    PeekOffLate,
    /// FIONREAD once everything sent has arrived.
    Fionread,
    /// Redirected and TCP bytes waiting at once, across a fallback to TCP and back:
    /// FIONREAD, poll and edge-triggered epoll at each step (see `mixed.rs`).
    Mixed,
    /// SO_RCVLOWAT 1000 with 500 bytes, then 600 more: readiness and the first read.
    Rcvlowat,
    /// recv(MSG_WAITALL) of 2000 bytes sent as 1000 + 1000, 100 ms apart.
    Waitall,
    /// SO_RCVTIMEO 200 ms and nothing sent: the read times out with EAGAIN.
    Rcvtimeo,
    /// epoll readiness: EPOLLIN before and after data, EPOLLRDHUP after the peer's FIN,
    /// EPOLLOUT on a fresh socket.
    Epoll,
    /// A blocking reader thread and a writer thread on one socket, both sides.
    Duplex,
    /// The client sends a file with sendfile(2).
    Sendfile,
    /// The client moves bytes from a pipe with splice(2).
    SpliceSend,
    /// The server reads with splice(2) into a pipe.
    SpliceRecv,
    /// The server half-closes, the client sends --bytes and closes, and the server,
    /// its socket closed with the bytes unread, reads with splice(2).
    SpliceAfterClose,
    /// The client sends --bytes and half-closes; the server, once they and the FIN are
    /// there, splices 20,000 times on CPU 0 beside three threads there reading
    /// /dev/zero, then reads everything with read(2).
    SpliceContended,
    /// Client: 16 KiB, --mark-file, once --go-file exists 32 KiB more and a half-close.
    /// Server: one splice once the 16 KiB are there, --go-file, one read once the FIN
    /// came, then the rest.
    SpliceSwitch,
    /// MSG_OOB: one urgent byte between normal data.
    Oob,
    /// Urgent bytes by TCP after redirected bytes were read: FIONREAD and SO_PEEK_OFF
    /// once every byte was read (see `urgent.rs`).
    Urgent,
    /// --connections connections, --concurrency at a time; both sides write --bytes
    /// right after connect/accept, then read the other's.
    Burst,
    /// Client: wait for --wait-file (if any), --bytes, --mark-file, wait for --go-file,
    /// --bytes more, half-close.
    /// Server: --mark-file once accepted, wait for --go-file, read and verify all.
    Hold,
    /// With the agent's bound at --bytes. Client: 1.25 x --bytes, --mark-file, wait for
    /// --go-file, 32 KiB, 2 x --bytes. Server: wait for --wait-file, read --bytes,
    /// --mark-file, one recv(MSG_WAITALL) for more than TCP holds, then the rest.
    WaitallAfterBound,
    /// Both sides: setsockopt(TCP_ULP, "tls") after connect/accept, then --bytes each way.
    Ulp,
    /// Client: connect(AF_UNSPEC) once connected, then setsockopt(TCP_ULP, "tls").
    /// Server: reads until the client is gone.
    UlpAfterDisconnect,
    /// Client: common setsockopts (and two longer than a page) on the connected socket
    /// and a fresh one; then --bytes.
    Sockopts,
    /// TCP Fast Open: --connections connections with data in the SYN.
    Tfo,
    /// An MPTCP connection: --bytes each way.
    Mptcp,
    /// Client: a thread's write of --bytes blocks while connecting (the test holds the
    /// handshake), --mark-file once it waits; --bytes more once it returned, then
    /// --go-file. Server: as hold.
    ConnectWrite,
    /// Client (the victim): reads its own sequence numbers through TCP_REPAIR into
    /// --mark-file, then reads and verifies --bytes. Server: sends --bytes.
    Forge,
    /// Client only (the attacker): a TCP_REPAIR socket from --bind to --connect with
    /// the sequence numbers in --go-file, --mark-file, then reads for 3 s.
    ForgeAttacker,
    /// Client only (the attacker): in a user and network namespace of its own, a
    /// socket bound to --bind with the initial sequence number of the victim in
    /// --go-file, connected to --connect and answered by a SYN-ACK it crafts;
    /// --mark-file, then reads until --wait-file exists.
    ForgeHandshake,
    /// Client only (the attacker, in a pod of its own): poses as the server of the
    /// victim client's connection. A socket bound to --bind with the victim server's
    /// initial sequence number (from --go-file), connected to --connect (the victim
    /// client's end, unreachable here), gets a crossed SYN and then an ACK crafted as
    /// the victim's: a simultaneous open. --mark-file, 4 KiB written, then reads until
    /// --wait-file exists.
    PoseServer,
    /// A small-message stream that leaves the SockHash (see `leave.rs`).
    SmallLeave,
    /// Client: SO_ZEROCOPY (before connecting, or after with --zerocopy-after) and
    /// MSG_ZEROCOPY writes of --bytes; reports the completions read back.
    Zerocopy,
    /// One connection held across agent versions (see `held.rs`): --steps exchanges of
    /// --bytes of random bytes, the client writing and reading back from two threads
    /// (with --write-first, reading only once the step is written), step k on <--go-file>.k, read back into <--mark-file>.k; the server echoes step
    /// k once <--wait-file>.k exists.
    HeldEcho,
}

#[derive(Debug, Args)]
struct Common {
    /// The case.
    #[arg(long, value_enum)]
    case: Case,
    /// Bytes per read or write.
    #[arg(long, default_value = "64K", value_parser = parse_size)]
    chunk: u64,
    /// flood: seconds of writing.
    #[arg(long, default_value_t = 2.0)]
    secs: f64,
    /// Bytes to write (slow, halfclose, duplex, sendfile, splice, burst).
    #[arg(long, default_value = "1M", value_parser = parse_size)]
    bytes: u64,
    /// slow: pause every this many bytes written (0: never).
    #[arg(long, default_value = "0", value_parser = parse_size)]
    pause_every: u64,
    /// slow: pause length.
    #[arg(long, default_value_t = 0)]
    pause_ms: u64,
    /// slow: at each pause the client also waits for the server to say (one byte back)
    /// that it has read everything written so far: a reader that has caught up, for
    /// certain, whatever the machine's speed.
    #[arg(long)]
    ack: bool,
    /// zerocopy: turn SO_ZEROCOPY on once connected instead of before.
    #[arg(long)]
    zerocopy_after: bool,
    /// flood: how long the server reads nothing.
    #[arg(long, default_value_t = 3000)]
    hold_ms: u64,
    /// slow: delay between the server's reads.
    #[arg(long, default_value_t = 0)]
    delay_us: u64,
    /// burst: connections in all.
    #[arg(long, default_value_t = 1)]
    connections: u64,
    /// burst: connections at once.
    #[arg(long, default_value_t = 1)]
    concurrency: u64,
    /// hold, waitall: wait until this file exists (see the case).
    #[arg(long)]
    go_file: Option<PathBuf>,
    /// hold, waitall: create this file at the case's point.
    #[arg(long)]
    mark_file: Option<PathBuf>,
    /// waitall: the server waits for this file before reading; forge-handshake: the
    /// attacker reads until it exists.
    #[arg(long)]
    wait_file: Option<PathBuf>,
    /// Client: bind to this address and port before connecting.
    #[arg(long)]
    bind: Option<SocketAddr>,
    /// held-echo: how many exchanges.
    #[arg(long, default_value_t = 1)]
    steps: u64,
    /// held-echo: the client writes the whole step before it reads any of it back (one
    /// thread's order), so the exchange needs the connection to hold a step in flight.
    #[arg(long)]
    write_first: bool,
}

impl Common {
    fn steps(&self) -> trust::Steps<'_> {
        trust::Steps {
            go: trust::path(&self.go_file),
            mark: trust::path(&self.mark_file),
            wait: trust::path(&self.wait_file),
            bytes: self.bytes,
        }
    }

    /// A buffer of --chunk bytes (at least one).
    fn chunk_buf(&self) -> Vec<u8> {
        vec![0u8; usize::try_from(self.chunk).unwrap_or(65536).max(1)]
    }
}

#[derive(Debug, Subcommand)]
enum Role {
    /// Accept connections and play the case's server side.
    Server {
        /// Address to listen on.
        #[arg(long)]
        listen: SocketAddr,
        /// File to create once listening.
        #[arg(long)]
        ready_file: Option<PathBuf>,
        #[command(flatten)]
        common: Common,
    },
    /// Connect and play the case's client side.
    Client {
        /// Server address.
        #[arg(long)]
        connect: SocketAddr,
        #[command(flatten)]
        common: Common,
    },
}

/// Runs the side the command line names and prints its report.
pub fn main(cli: Cli) -> ExitCode {
    let out = match cli.role {
        Role::Server {
            listen,
            ready_file,
            common,
        } => server(listen, ready_file, &common),
        Role::Client { connect, common } => client(connect, &common),
    };
    match out {
        Ok(v) => {
            println!("{v}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("bypass-test-tool probe: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------------------------
// Server side

fn server(listen: SocketAddr, ready: Option<PathBuf>, c: &Common) -> Result<Value> {
    if let Case::Tfo | Case::Mptcp = c.case {
        let mptcp = matches!(c.case, Case::Mptcp);
        let l = trust::special_listener(listen, mptcp, !mptcp)?;
        if let Some(f) = ready {
            std::fs::write(&f, listen.to_string()).with_context(|| format!("write {f:?}"))?;
        }
        return if mptcp {
            trust::mptcp_server(&l, c.bytes)
        } else {
            trust::tfo_server(&l, c.connections, c.hold_ms)
        };
    }
    let l = TcpListener::bind(listen).with_context(|| format!("listen on {listen}"))?;
    // std listens with a backlog of 128; bursts of connects need more, or the kernel
    // resets the ones that overflow the accept queue. listen() again raises it.
    listen_backlog(&l, Backlog::new(4096)?).context("listen backlog")?;
    if let Some(f) = ready {
        std::fs::write(&f, listen.to_string()).with_context(|| format!("write {f:?}"))?;
    }
    if let Case::Burst = c.case {
        return burst::server(&l, c);
    }
    let (s, _) = l.accept().context("accept")?;
    match c.case {
        Case::Flood => flood::server(s, c),
        Case::Slow => slow::server(s, c),
        Case::Halfclose => halfclose::server(s, c),
        Case::Reset => reset::server(s),
        Case::Peek => peek::server(s),
        Case::PeekOffLate => peek::late_offset_server(s),
        Case::Fionread => fionread::server(s),
        Case::Mixed => mixed::server(s, c),
        Case::Rcvlowat => rcvlowat::server(s),
        Case::Waitall => waitall::server(s),
        Case::Rcvtimeo => rcvtimeo::server(s),
        Case::Epoll => epoll::server(s),
        Case::Duplex => duplex::run(s, c, Direction::ServerToClient),
        Case::Sendfile => sendfile::server(s, c),
        Case::SpliceSend => splice::send_server(s, c),
        Case::Oob => oob::server(s),
        Case::Urgent => urgent::server(s),
        Case::SpliceRecv => splice::recv_server(s),
        Case::SpliceAfterClose => splice::recv_after_close_server(s),
        Case::SpliceContended => splice::contended_server(s),
        Case::SpliceSwitch => splice::switch_server(s, c),
        Case::Hold | Case::ConnectWrite => trust::hold_server(s, &c.steps()),
        Case::Forge => handshake::push_server(s, &c.steps()),
        Case::WaitallAfterBound => trust::waitall_server(s, &c.steps()),
        Case::Ulp => trust::ulp_server(s, &c.steps()),
        Case::UlpAfterDisconnect => trust::until_closed_server(s),
        Case::Sockopts => trust::drain_server(s),
        Case::SmallLeave => leave::server(s, &c.steps()),
        Case::Zerocopy => zerocopy::server(s, c),
        Case::HeldEcho => held::server(s, c.steps, c.bytes, c.chunk, c.wait_file.as_deref()),
        Case::Burst
        | Case::Tfo
        | Case::Mptcp
        | Case::ForgeAttacker
        | Case::ForgeHandshake
        | Case::PoseServer => unreachable_case(),
    }
}

fn unreachable_case() -> Result<Value> {
    bail!("burst is served before accept")
}

// ---------------------------------------------------------------------------------
// Client side

fn client(connect: SocketAddr, c: &Common) -> Result<Value> {
    match c.case {
        Case::Burst => return burst::client(connect, c),
        Case::Tfo => return trust::tfo_client(connect, c.connections, c.bytes),
        Case::Zerocopy => return zerocopy::client(connect, c),
        Case::Mptcp => return trust::mptcp_client(connect, c.bytes),
        Case::ConnectWrite => return handshake::connect_write_client(connect, &c.steps()),
        Case::ForgeAttacker => {
            let bind = c.bind.context("forge-attacker needs --bind")?;
            return handshake::forge_attacker(connect, bind, &c.steps());
        }
        Case::ForgeHandshake => {
            let bind = c.bind.context("forge-handshake needs --bind")?;
            return handshake::forge_handshake(connect, bind, &c.steps());
        }
        Case::PoseServer => {
            let bind = c.bind.context("pose-server needs --bind")?;
            return handshake::pose_server(connect, bind, &c.steps());
        }
        _ => {}
    }
    let s = trust::connect(connect, c.bind)?;
    match c.case {
        Case::Flood => flood::client(s, c),
        Case::Slow => slow::client(s, c),
        Case::Halfclose => halfclose::client(s, c),
        Case::Reset => reset::client(s),
        Case::Peek | Case::PeekOffLate => peek::client(s, c),
        Case::Fionread => fionread::client(s, c),
        Case::Mixed => mixed::client(s, c),
        Case::Rcvlowat => rcvlowat::client(s, c),
        Case::Waitall => waitall::client(s, c),
        Case::Rcvtimeo => rcvtimeo::client(s),
        Case::Epoll => epoll::client(s, c),
        Case::Duplex => duplex::run(s, c, Direction::ClientToServer),
        Case::Sendfile => sendfile::client(&s, c),
        Case::SpliceSend => splice::send_client(&s, c),
        Case::SpliceRecv | Case::SpliceContended => splice::recv_client(s, c),
        Case::SpliceAfterClose => splice::recv_after_close_client(s, c),
        Case::SpliceSwitch => splice::switch_client(s, c),
        Case::Oob => oob::client(s),
        Case::Urgent => urgent::client(s),
        Case::Hold => trust::hold_client(s, &c.steps()),
        Case::Forge => handshake::forge_victim(s, &c.steps()),
        Case::WaitallAfterBound => trust::waitall_client(s, &c.steps()),
        Case::Ulp => trust::ulp_client(s, &c.steps()),
        Case::UlpAfterDisconnect => trust::ulp_after_disconnect_client(s),
        Case::Sockopts => trust::sockopts_client(s, &c.steps()),
        Case::SmallLeave => leave::client(s, &c.steps()),
        Case::HeldEcho => {
            let go = c.go_file.as_deref().context("held-echo needs --go-file")?;
            let mark = c
                .mark_file
                .as_deref()
                .context("held-echo needs --mark-file")?;
            held::client(s, c.steps, c.bytes, c.chunk, c.write_first, go, mark)
        }
        Case::Burst
        | Case::Tfo
        | Case::Mptcp
        | Case::ConnectWrite
        | Case::ForgeAttacker
        | Case::ForgeHandshake
        | Case::PoseServer
        | Case::Zerocopy => unreachable_case(),
    }
}
