//! `probe`: what this kernel gives the datapath, found as `run` finds it, printed
//! without attaching anything.

use bypass_common::names::READ_HOOKS;
/// What `probe` prints.
pub use bypass_common::status::KernelProbe as Probe;

use crate::{
    cli::ProbeOpts,
    datapath::{HostFacts, ReadGuard},
    error::AgentError,
};

/// Detects this kernel's support as `run` does.
pub fn detect() -> Result<Probe, AgentError> {
    Ok(from_facts(&HostFacts::detect()?))
}

fn from_facts(facts: &HostFacts) -> Probe {
    let read_guard = facts.hooks.guard == ReadGuard::Guard;
    Probe {
        read_guard,
        read_hook: if facts.hooks.read == READ_HOOKS.as_slice() {
            "tracepoint"
        } else {
            "trampolines"
        }
        .to_owned(),
        bypass_by_default: read_guard,
    }
}

/// Detects the kernel's support as `run` does and prints it.
pub fn probe(opts: &ProbeOpts) -> Result<(), AgentError> {
    let found = detect()?;
    if opts.json {
        return crate::print_json(&found, "the probe");
    }
    println!("read guard:        {}", yes_no(found.read_guard));
    println!("reads seen by:     {}", found.read_hook);
    println!(
        "bypass by default: {}",
        if found.bypass_by_default {
            "yes"
        } else {
            "no (the kernel refuses BPF trampolines: `run --allow-unguarded` to bypass \
             workloads that never splice or map their sockets)"
        }
    );
    Ok(())
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}
