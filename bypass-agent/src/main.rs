//! `bypass-agent`: parse options, start logging, run the chosen command.

use std::process::ExitCode;

use bypass_agent::cli;
use clap::Parser as _;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if cli.log_json {
        builder.json().init();
    } else {
        builder.init();
    }
    match bypass_agent::execute(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // One line that names the problem and the fix; details are in the log.
            eprintln!("bypass-agent: error: {err}");
            ExitCode::FAILURE
        }
    }
}
