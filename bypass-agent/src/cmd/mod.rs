//! The subcommands, a file each: `run` (the agent), `status`, `check`, `probe`,
//! `nodes`, `prepare-node` and `prepare-namespace`, `uninstall`.

pub mod check;
pub mod nodes;
pub mod prepare;
pub mod probe;
pub mod run;
pub mod status;
pub mod uninstall;

use crate::{cli, error::AgentError};

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
