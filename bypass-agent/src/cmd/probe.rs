//! `probe`: what this kernel gives the datapath, found as `run` finds it, printed
//! without attaching anything.

/// What `probe` prints.
pub use bypass_common::status::KernelProbe as Probe;
use bypass_common::{layout::features, names::READ_HOOKS};

use crate::{
    cli::ProbeOpts,
    datapath::{self, HostFacts, ReadGuard, kernel_check},
    error::AgentError,
};

/// Detects this kernel's support as `run` does, and runs the kernel self-test.
pub fn detect() -> Result<Probe, AgentError> {
    detect_both().map(|(p, _)| p)
}

/// [`detect`], and why `run --allow-unguarded` would still not bypass this node, if it
/// would not.
pub fn detect_both() -> Result<(Probe, Option<String>), AgentError> {
    let facts = HostFacts::detect()?;
    let checks = kernel_check::run(&facts, &datapath::find_cgroup2_mount()?);
    let allowed = checks.refusal(&datapath::kernel_release(), true);
    Ok((from_facts(&facts, &checks), allowed))
}

fn from_facts(facts: &HostFacts, checks: &kernel_check::Verdict) -> Probe {
    let read_guard = facts.hooks.guard == ReadGuard::Guard;
    let refusal = checks
        .refusal(&datapath::kernel_release(), false)
        .or_else(|| (!read_guard).then(|| datapath::REFUSED_UNGUARDED.to_owned()));
    let bits = checks.features & features::GUARD_ATTACH;
    Probe {
        read_guard,
        read_guard_runs_as: match (read_guard, bits) {
            (false, _) => "none",
            (true, features::GUARD_LSM) => "lsm",
            (true, _) => "fmod_ret",
        }
        .to_owned(),
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
        return super::print_json(&found, "the probe");
    }
    println!("read guard:        {}", yes_no(found.read_guard));
    println!("read guard runs as: {}", found.read_guard_runs_as);
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
