//! The peer's command line (`bypass-test-tool peer`): options parsed
//! by clap, then the client or server run and its report printed.

use std::{net::SocketAddr, path::PathBuf, process::ExitCode, time::Duration};

use clap::{Parser, Subcommand};

use super::{client, server};

/// A TCP client and server that move a checked byte pattern each way (or ping-pong and
/// time small messages) and print one JSON report.
#[derive(Debug, Parser)]
#[command(name = "peer")]
pub struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Accept connections and serve what each client's header asks for.
    Server {
        /// Address to listen on; `[::]:PORT` takes IPv4 and IPv6.
        #[arg(long, value_name = "ADDR:PORT")]
        listen: SocketAddr,
        /// Exit after this many connections with one report; 0 serves forever and
        /// prints a report per connection.
        #[arg(long, default_value_t = 0)]
        connections: u64,
        /// File to create once listening (holds the bound address).
        #[arg(long, value_name = "PATH")]
        ready_file: Option<PathBuf>,
        /// Fail a connection that makes no progress for this many seconds; 0 waits
        /// forever.
        #[arg(long, default_value_t = 60)]
        idle_timeout: u64,
        /// Wait this many milliseconds after a client's header before answering
        /// (its read waits meanwhile).
        #[arg(long, default_value_t = 0)]
        reply_delay_ms: u64,
        /// In stream mode, read nothing after a client's header until this file exists.
        #[arg(long, value_name = "PATH")]
        go_file: Option<PathBuf>,
    },
    /// Connect, send the header and pattern at once, verify what comes back.
    Client {
        /// Server address.
        #[arg(long, value_name = "ADDR:PORT")]
        connect: SocketAddr,
        #[command(flatten)]
        args: client::ClientArgs,
    },
}

/// Runs the client or the server the command line names and prints its report; exits
/// 0 only when every byte was right (`bypass-test-tool peer` calls it once parsed).
pub fn run(cli: Cli) -> ExitCode {
    let report = match cli.command {
        Cmd::Server {
            listen,
            connections,
            ready_file,
            idle_timeout,
            reply_delay_ms,
            go_file,
        } => {
            let opts = server::ServerOpts {
                listen,
                connections,
                ready_file,
                idle_timeout: Duration::from_secs(idle_timeout),
                reply_delay: Duration::from_millis(reply_delay_ms),
                go_file,
            };
            match server::run(&opts) {
                Ok(Some(r)) => r,
                Ok(None) => return ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("bypass-test-tool peer: error: cannot listen on {listen}: {e}");
                    return ExitCode::from(2);
                }
            }
        }
        Cmd::Client { connect, args } => client::run(connect, &args),
    };
    server::print_report(&report);
    if report.ok {
        ExitCode::SUCCESS
    } else {
        for f in &report.failures {
            eprintln!(
                "bypass-test-tool peer: stream {} {} {}: {}",
                f.stream, f.direction, f.kind, f.detail
            );
        }
        ExitCode::FAILURE
    }
}
