//! `bypass-test-tool`: the tools the privileged tests, the bench and the kernel VMs run,
//! one binary with a subcommand each; what follows the subcommand is that tool's own
//! command line.
//!
//! | subcommand | what it is                                                    |
//! | ---------- | ------------------------------------------------------------- |
//! | `peer`     | a TCP client and server moving a checked pattern              |
//! | `probe`    | one TCP behaviour at a time, seen by the application          |
//! | `proxy`    | a sidecar-like proxy for the mesh tests and the mesh bench    |
//! | `smoke`    | the agent's smoke test on a bare machine (a foreign VM's run) |
//!
//! The tests find it with `testbed::tools` (`$BYPASS_TEST_TOOL_BIN`, else beside their
//! own executable); the cluster's test image carries it at
//! `/usr/local/bin/bypass-test-tool`.

mod probe;
mod proxy;
mod smoke;

use std::process::ExitCode;

use clap::Parser;

/// The testbed's tools, one binary: the peer, the probe, the proxy and the smoke test.
#[derive(Debug, Parser)]
#[command(name = "bypass-test-tool")]
enum Tool {
    // The peer is a library (`testbed::peer`), its parser and run used as they are.
    Peer(testbed::peer::cli::Cli),
    Probe(probe::Cli),
    Proxy(proxy::Cli),
    Smoke(smoke::Cli),
}

fn main() -> ExitCode {
    match Tool::parse() {
        Tool::Peer(cli) => testbed::peer::cli::run(cli),
        Tool::Probe(cli) => probe::main(cli),
        Tool::Proxy(cli) => proxy::main(cli),
        Tool::Smoke(cli) => smoke::main(cli),
    }
}
