//! `bypass-agent`: parse options, start logging, run the chosen command.

mod apply;
mod cidr;
mod cli;
mod datapath;
mod error;
mod k8s;
mod metrics;
mod others;
#[cfg(test)]
mod props;
mod run;
mod status;
mod sync;
mod toggle;

use std::process::ExitCode;

use clap::Parser as _;
use tracing_subscriber::EnvFilter;

/// Blocks until SIGTERM or SIGINT (`uninstall --wait`).
fn wait_for_termination() {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGINT);
    if set.thread_block().is_ok() {
        let _ = std::io::Write::flush(&mut std::io::stdout());
        let _ = set.wait();
    }
}

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
    let result = match cli.command {
        cli::Command::Run(opts) => run::run(*opts),
        cli::Command::Status(opts) => status::status(opts),
        cli::Command::Uninstall(opts) => datapath::uninstall(&opts.pins.pin_dir).map(|removed| {
            for path in &removed {
                println!("removed {}", path.display());
            }
            if removed.is_empty() {
                println!("nothing pinned under {}", opts.pins.pin_dir.display());
            }
            if opts.wait {
                wait_for_termination();
            }
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // One line that names the problem and the fix; details are in the log.
            eprintln!("bypass-agent: error: {err}");
            ExitCode::FAILURE
        }
    }
}
