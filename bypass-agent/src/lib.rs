//! The agent as a library: the pure cores (which addresses belong in the maps, what the
//! node label means, what to change), the datapath (load, pin, attach, typed map views),
//! the Kubernetes watchers that feed them, metrics and the subcommands. `main.rs` only
//! parses options, starts logging and calls [`execute`]; the fuzz targets and the
//! testbed use the modules directly.

mod apply;
pub mod backend;
pub mod check;
pub mod cidr;
pub mod cli;
pub mod datapath;
pub mod error;
pub mod k8s;
mod metrics;
pub mod nodes;
mod other_programs;
pub mod owners;
pub mod prepare;
pub mod probe;
pub mod run;
pub(crate) mod runtime;
pub mod status;
pub mod sync;
pub mod toggle;
pub mod uninstall;

pub use error::AgentError;
/// How many connections each metrics address serves at once.
pub use metrics::MAX_CONNECTIONS as MAX_METRICS_CONNECTIONS;

/// Runs one subcommand to its end.
pub fn execute(command: cli::Command) -> Result<(), AgentError> {
    match command {
        cli::Command::Run(opts) => run::run(*opts),
        cli::Command::Status(opts) => status::status(opts),
        cli::Command::Uninstall(opts) => uninstall::uninstall(&opts),
        cli::Command::Probe(opts) => probe::probe(&opts),
        cli::Command::Check(opts) => check::check(&opts),
        cli::Command::Nodes(opts) => nodes::nodes(&opts),
        cli::Command::PrepareNode(opts) => prepare::node(&opts),
        cli::Command::PrepareNamespace(opts) => prepare::namespace(&opts),
    }
}

/// Prints `value` as pretty JSON (the `--json` output of a subcommand that reports);
/// `what` names it in the error.
pub(crate) fn print_json(value: &impl serde::Serialize, what: &str) -> Result<(), AgentError> {
    let text = serde_json::to_string_pretty(value).map_err(|source| AgentError::Encode {
        what: what.to_owned(),
        source,
    })?;
    println!("{text}");
    Ok(())
}
