//! `bypass-peer`: a TCP client and server that move a deterministic byte pattern each
//! way and verify every byte in order (or ping-pong small messages and time them), then
//! print one JSON report. Exits 1 on any lost, duplicated, reordered or extra byte.
//! Options: `bypass-peer server --help`, `bypass-peer client --help`.

use std::process::ExitCode;

fn main() -> ExitCode {
    testbed::peer::cli::main_from(std::env::args_os())
}
