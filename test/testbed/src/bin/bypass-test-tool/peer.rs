//! `bypass-test-tool peer`: a TCP client and server that move a deterministic byte
//! pattern each way and verify every byte in order (or ping-pong small messages and time
//! them), then print one JSON report. Exits 1 on any lost, duplicated, reordered or extra
//! byte. Options: `bypass-test-tool peer server --help`, `bypass-test-tool peer client
//! --help`. The peer is a library (`testbed::peer`, which `bypass-demo` runs too); this
//! module only hands it the parsed command line.

use std::process::ExitCode;

pub use testbed::peer::cli::Cli;

/// Runs the client or the server the command line names.
pub fn main(cli: Cli) -> ExitCode {
    testbed::peer::cli::run(cli)
}
