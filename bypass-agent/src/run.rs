//! `run` in standalone mode: pod addresses from flags, datapath attached until a
//! signal, then detached and unpinned.

use crate::{
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
    for cidr in &opts.pod_cidrs {
        dp.pod_maps().insert_cidr(cidr)?;
    }
    for ip in &opts.pod_ips {
        dp.pod_maps().insert_addr(*ip)?;
    }
    dp.attach()?;
    tracing::info!(
        pod_cidrs = ?opts.pod_cidrs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        pod_ips = ?opts.pod_ips,
        cgroup = %config.cgroup.display(),
        pin_dir = %dp.pins().root().display(),
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
    dp.detach()?;
    drop(dp);
    Ok(())
}
