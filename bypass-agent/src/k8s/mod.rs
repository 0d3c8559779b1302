//! `run --node-name`: the agent as a Kubernetes node agent. Pod CIDRs come from the
//! Node, pod addresses from the Pods scheduled on it, the on/off switch from a Node
//! label; the watchers only feed the pure core (`sync`, `toggle`).

pub mod client;
mod controller;

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use tracing::{info, warn};

use crate::{
    datapath::{self, Datapath, PinLayout},
    error::AgentError,
    metrics::{self, Telemetry},
    runtime,
    sync::Statics,
};

/// What the Kubernetes agent needs besides the datapath configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    /// This node's name.
    pub node: String,
    /// A kubeconfig file; `None` means the pod's service account (in-cluster).
    pub kubeconfig: Option<PathBuf>,
    /// Node label key that turns the bypass on (`true`) and off (`false`).
    pub node_label: String,
    /// What an absent label means.
    pub default_enabled: bool,
    /// Pod annotation key that opts a pod out (`"true"`).
    pub exclude_annotation: String,
    /// Namespace label key that opts a namespace's pods out (`"true"`).
    pub exclude_namespace_label: String,
    /// Namespace label key that, when given, is the only way in (`"true"`).
    pub include_namespace_label: Option<String>,
    /// Address for `/metrics`, `/healthz`, `/readyz`.
    pub metrics_addr: SocketAddr,
    /// Period of the full reconcile pass that repairs drift.
    pub resync: Duration,
}

/// Runs the Kubernetes agent until SIGINT or SIGTERM.
pub fn run(
    settings: Settings,
    config: datapath::Config,
    statics: Statics,
) -> Result<(), AgentError> {
    runtime::current_thread()?.block_on(run_async(settings, config, statics))
}

async fn run_async(
    settings: Settings,
    config: datapath::Config,
    statics: Statics,
) -> Result<(), AgentError> {
    let shutdown = runtime::signals().await?;
    futures::pin_mut!(shutdown);
    // Configuration problems first: they need a person, not a retry.
    let client = client::connect(settings.kubeconfig.as_deref()).await?;
    let telemetry = Arc::new(Telemetry::new(PinLayout::new(&config.pin_dir)));
    metrics::serve(settings.metrics_addr, telemetry.clone()).await;

    let mut attempt = 0;
    loop {
        match client::preflight(&client, &settings.node).await? {
            client::Preflight::Ok => break,
            client::Preflight::Retry(why) => {
                let delay = controller::retry_delay(attempt);
                warn!(error = %why, retry_in = ?delay, "the API server does not answer; retrying");
                attempt += 1;
                tokio::select! {
                    signal = &mut shutdown => {
                        info!(signal, "stopping before the datapath was loaded");
                        return Ok(());
                    }
                    () = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
    info!(node = %settings.node, "node found; get, list and watch allowed");

    let mut dp = Datapath::load(&config)?;
    telemetry.health.set_settled(false);
    let signal = controller::run(
        client,
        &settings,
        statics,
        &mut dp,
        telemetry,
        &mut shutdown,
    )
    .await?;
    match dp.counters() {
        Ok(counters) => info!(signal, sockets = dp.socket_count(), ?counters, "stopping"),
        Err(e) => warn!(signal, error = %e, "stopping"),
    }
    drop(dp);
    Ok(())
}
