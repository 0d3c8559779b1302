//! `run` in standalone mode: pod addresses from flags, datapath attached until a
//! signal, then detached and unpinned.

use std::{collections::BTreeSet, net::IpAddr};

use crate::{
    cidr::PodCidr,
    cli::RunOpts,
    datapath::{self, Datapath},
    error::AgentError,
};

/// Runs until SIGINT or SIGTERM.
pub fn run(opts: RunOpts) -> Result<(), AgentError> {
    if opts.pod_cidrs.is_empty() && opts.pod_ips.is_empty() {
        return Err(AgentError::NoPodAddresses);
    }
    let cgroup = match opts.cgroup {
        Some(path) => path,
        None => datapath::find_cgroup2_mount()?,
    };
    let config = datapath::Config {
        pin_dir: opts.pins.pin_dir,
        cgroup,
        max_sockets: opts.max_sockets,
        reset: opts.reset,
        detach_on_exit: opts.detach_on_exit,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| AgentError::Io {
            action: "start the runtime",
            path: "/".into(),
            source,
        })?;
    // Signal handlers first, so a signal during loading still unwinds cleanly.
    let mut term = runtime
        .block_on(async { tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) })
        .map_err(|source| AgentError::Io {
            action: "install SIGTERM handler",
            path: "/".into(),
            source,
        })?;
    let mut dp = Datapath::load(&config)?;
    // An adopted datapath may hold another run's addresses: make the maps match the flags.
    let want_cidrs: BTreeSet<PodCidr> = opts.pod_cidrs.iter().copied().collect();
    let want_ips: BTreeSet<IpAddr> = opts.pod_ips.iter().copied().collect();
    let maps = dp.pod_maps();
    let (have_cidrs, have_ips) = (maps.cidrs(), maps.addrs());
    for cidr in have_cidrs.difference(&want_cidrs) {
        maps.remove_cidr(cidr)?;
    }
    for cidr in want_cidrs.difference(&have_cidrs) {
        maps.insert_cidr(cidr)?;
    }
    for ip in have_ips.difference(&want_ips) {
        maps.remove_addr(*ip)?;
    }
    for ip in want_ips.difference(&have_ips) {
        maps.insert_addr(*ip)?;
    }
    dp.attach()?;
    tracing::info!(
        pod_cidrs = ?opts.pod_cidrs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        pod_ips = ?opts.pod_ips,
        cgroup = %config.cgroup.display(),
        pin_dir = %dp.pins().root().display(),
        origin = ?dp.origin(),
        "running; SIGINT or SIGTERM detaches"
    );
    let signal = runtime.block_on(async {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => "SIGINT",
            _ = term.recv() => "SIGTERM",
        }
    });
    let counters = dp.counters()?;
    tracing::info!(signal, sockets = dp.socket_count(), ?counters, "stopping");
    drop(dp);
    Ok(())
}
