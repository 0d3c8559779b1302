//! `bypass-agent`: parse options, start logging, run the chosen command.

use std::{io::IsTerminal as _, process::ExitCode};

use bypass_agent::cli;
use clap::Parser as _;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    tune_allocator();
    let cli = cli::Cli::parse();
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only on a terminal: a pod's log (`kubectl logs`, a collector) and a
    // test's capture get plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
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

/// Allocations of 128 KiB and more are mapped and unmapped on their own, at a fixed
/// threshold. glibc's default threshold rises after the first such free, and then
/// each later parse of the kernel's BTF at start (buffers grown by doubling to
/// megabytes, parsed several times: the self-test's rounds, the load) grows the heap
/// instead: that is the agent's peak resident memory (VmHWM, what the chart's memory
/// limit meets). Measured standalone on this repository's VM: 32.4 MB without, 28.8 MB
/// with.
///
/// And every thread allocates from one arena. With one arena per thread (glibc's
/// default), a parse on one tokio worker left its freed heap in that worker's arena
/// while the next parse, on another worker, grew a second one: the peak was then two
/// parses' worth of heap. Standalone on the same VM, four starts each: 28.6–31.6 MB
/// with an arena per thread, 28.5–28.8 MB with one. The agent's threads allocate
/// little once started, so they do not contend for it.
fn tune_allocator() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets parameters of the allocator; it runs before any
    // other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}
