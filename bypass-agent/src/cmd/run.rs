//! `run`: in standalone mode pod addresses come from flags and the datapath stays
//! attached until a signal; with a node name the Kubernetes agent (`k8s`) runs instead.

use std::{sync::Arc, time::Duration};

use crate::{
    apply,
    cli::RunOpts,
    datapath::{self, Datapath, PinLayout},
    error::AgentError,
    k8s,
    metrics::{self, Telemetry},
    owners, runtime,
    sync::{self, Statics},
};

/// Kubernetes mode's settings when a node name is given (`--node-name`/`NODE_NAME`).
fn kube_settings(opts: &RunOpts) -> Result<Option<k8s::Settings>, AgentError> {
    let k = &opts.kube;
    let node = match k.node_name.as_deref().map(str::trim) {
        Some("") => return Err(AgentError::MissingNodeName),
        Some(name) => name.to_owned(),
        None if k.kubeconfig.is_some() => return Err(AgentError::MissingNodeName),
        None => return Ok(None),
    };
    Ok(Some(k8s::Settings {
        node,
        kubeconfig: k.kubeconfig.clone().or_else(|| {
            std::env::var_os("KUBECONFIG")
                .filter(|v| !v.is_empty())
                .map(Into::into)
        }),
        node_label: k.node_label.clone(),
        default_enabled: k.default_enabled,
        exclude_annotation: k.exclude_annotation.clone(),
        exclude_namespace_label: k.exclude_namespace_label.clone(),
        include_namespace_label: k.include_namespace_label.clone(),
        metrics_addrs: metrics::metrics_addrs(k.metrics_addr, &k.metrics_ip, k.metrics_port, true),
        resync: Duration::from_secs(k.resync_seconds.max(1)),
        pod: match (&k.pod_name, &k.pod_namespace) {
            (Some(name), Some(namespace)) => Some(k8s::PodRef {
                name: name.clone(),
                namespace: namespace.clone(),
            }),
            _ => None,
        },
    }))
}

/// Runs until SIGINT or SIGTERM.
pub fn run(opts: RunOpts) -> Result<(), AgentError> {
    let settings = kube_settings(&opts)?;
    if settings.is_none() && opts.pod_cidrs.is_empty() && opts.pod_ips.is_empty() {
        return Err(AgentError::NoPodAddresses);
    }
    let cgroup = match opts.cgroup {
        Some(path) => path,
        None => match &opts.host_cgroupfs {
            Some(dir) => datapath::find_host_cgroup2(dir)?,
            None => datapath::find_cgroup2_mount()?,
        },
    };
    for other in crate::other_programs::list() {
        tracing::warn!(
            program = %other,
            "another program's {} program is loaded: sockets its sockmap holds cannot join ours (insert_failures, see status)",
            other.kind
        );
    }
    let config = datapath::Config {
        pin_dir: opts.pins.pin_dir,
        cgroup,
        max_sockets: opts.max_sockets,
        max_queued_bytes: opts.max_queued_bytes.resolve(datapath::tcp_rmem_max()),
        small_stream_bytes: opts.small_stream_bytes,
        reset: opts.reset,
        allow_unguarded: opts.allow_unguarded,
        detach_on_exit: opts.detach_on_exit,
        skip_ports: opts.skip_ports.0.clone(),
        heartbeat_secs: opts.heartbeat_seconds,
        netns_owners: opts.netns_owners == crate::cli::NetnsOwners::Observe,
    };
    let statics = Statics {
        cidrs: opts.pod_cidrs.iter().copied().collect(),
        addrs: opts.pod_ips.iter().copied().collect(),
        service_cidrs: opts.service_cidrs.iter().copied().collect(),
        service_backends: opts.service_backends.iter().copied().collect(),
    };
    if let Some(settings) = settings {
        return k8s::run(settings, config, statics);
    }
    let rt = runtime::current_thread()?;
    // Signal handlers first, so a signal during loading still unwinds cleanly.
    let shutdown = rt.block_on(runtime::signals())?;
    let k = &opts.kube;
    let addrs = metrics::metrics_addrs(k.metrics_addr, &k.metrics_ip, k.metrics_port, false);
    let telemetry = if addrs.is_empty() {
        None
    } else {
        let t = Arc::new(Telemetry::new(PinLayout::new(&config.pin_dir)));
        for addr in addrs {
            metrics::serve(addr, t.clone());
        }
        Some(t)
    };
    let mut dp = Datapath::load(&config)?;
    // Nothing from Kubernetes decides here: clear what a Kubernetes agent recorded.
    dp.set_agent_state(0)?;
    // An adopted datapath may hold another run's addresses: make the maps match the flags.
    let maps = dp.pod_maps();
    let plan = sync::plan(
        &apply::current(maps),
        &sync::Desired::from_statics(&statics),
    );
    let mut first = None;
    apply::apply(maps, &plan, |e| {
        first.get_or_insert(e);
    });
    if let Some(e) = first {
        return Err(e);
    }
    // The pods there are now own their addresses before anything is inserted.
    let mut owners = owners::Watcher::new(&dp)?;
    // Without the ownership check no pass runs: the links astray are cut here, once.
    if owners.is_none() {
        owners::cut_astray(&mut dp)?;
        count_cuts_of_everything(&mut dp, telemetry.as_deref());
    }
    let poll = owners::poll_interval()?;
    // Subscribed before the first pass, so no change after it goes unheard.
    let mut events = {
        let _rt = rt.enter();
        owners
            .is_some()
            .then(|| owners::Events::open(telemetry.as_ref().map(|t| t.agent.clone())))
    };
    if let Some(w) = owners.as_mut() {
        let r = w.pass(&mut dp)?;
        tracing::info!(
            owned = r.owned,
            namespaces = r.namespaces,
            "pod address owners observed"
        );
    }
    dp.attach()?;
    if let Some(t) = &telemetry {
        if let Some(refusal) = dp.refused() {
            t.refused(refusal);
        }
        t.health.set_synced(true);
        t.health.set_settled(true);
    }
    tracing::info!(
        pod_cidrs = ?opts.pod_cidrs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        pod_ips = ?opts.pod_ips,
        service_cidrs = ?opts.service_cidrs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        service_backends = ?opts.service_backends.iter().map(ToString::to_string).collect::<Vec<_>>(),
        skip_ports = ?opts.skip_ports.0,
        cgroup = %config.cgroup.display(),
        pin_dir = %dp.pins().root().display(),
        origin = ?dp.origin(),
        "running; SIGINT or SIGTERM detaches"
    );
    let signal = rt.block_on(async {
        futures::pin_mut!(shutdown);
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + poll, poll);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                signal = &mut shutdown => break signal,
                _ = tick.tick(), if owners.is_some() => {}
                () = async {
                    match events.as_mut() {
                        Some(e) => e.due().await,
                        None => futures::future::pending().await,
                    }
                } => {}
            }
            let started = std::time::Instant::now();
            if let Some(w) = owners.as_mut()
                && let Err(e) = w.pass(&mut dp)
            {
                tracing::warn!(error = %e, "reading the pod network namespaces failed; retrying");
            }
            if let Some(e) = events.as_mut() {
                e.ran(started);
            }
            count_cuts_of_everything(&mut dp, telemetry.as_deref());
        }
    });
    let counters = dp.counters()?;
    tracing::info!(signal, sockets = dp.socket_count(), ?counters, "stopping");
    drop(dp);
    Ok(())
}

/// Counts on `/metrics` the cuts of everything `dp` made since the last call.
fn count_cuts_of_everything(dp: &mut Datapath, telemetry: Option<&Telemetry>) {
    let everything = dp.take_cuts_of_everything();
    if let Some(t) = telemetry {
        for _ in 0..everything {
            t.agent.error(metrics::ErrorKind::CutMapFull);
        }
    }
}
