//! `probe`: what this kernel gives the datapath, found as `run` finds it, printed
//! without attaching anything.

use bypass_common::names::READ_HOOKS;
/// What `probe` prints.
pub use bypass_common::status::KernelProbe as Probe;

use crate::{
    cli::ProbeOpts,
    datapath::{self, HostFacts, ReadGuard, kernel_check},
    error::AgentError,
};

/// Detects this kernel's support as `run` does, and runs the kernel self-test.
pub fn detect() -> Result<Probe, AgentError> {
    let facts = HostFacts::detect()?;
    let checks = kernel_check::run(&facts, &datapath::find_cgroup2_mount()?);
    Ok(from_facts(&facts, &checks))
}

fn from_facts(facts: &HostFacts, checks: &kernel_check::Verdict) -> Probe {
    let read_guard = facts.hooks.guard == ReadGuard::Guard;
    let refusal = checks
        .refusal(&datapath::kernel_release(), false)
        .or_else(|| (!read_guard).then(|| datapath::REFUSED_UNGUARDED.to_owned()));
    Probe {
        read_guard,
        read_hook: if facts.hooks.read == READ_HOOKS.as_slice() {
            "tracepoint"
        } else {
            "trampolines"
        }
        .to_owned(),
        bypass_by_default: refusal.is_none(),
        kernel_checks: bypass_common::status::KernelCheck::list(checks.results),
        fionread_compensation: kernel_check::fionread_mode_name(checks.features).to_owned(),
        refusal,
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
    println!("FIONREAD compensation: {}", found.fionread_compensation);
    for c in &found.kernel_checks {
        println!("kernel check {:<20} {}", c.name, c.outcome);
    }
    match &found.refusal {
        None => println!("bypass by default: yes"),
        Some(why) => println!("bypass by default: no: {why}"),
    }
    Ok(())
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}
