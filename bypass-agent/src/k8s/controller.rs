//! The controller loop: the watches ([`super::watch`]) feed the reconciler
//! ([`super::reconcile`]). Every wake-up (a watch event, the resync tick, the tick of
//! the pod network namespace owners) is one full, level-triggered pass; a burst of
//! events is coalesced into one. While the API server is away the stores, and so the
//! datapath, stay as they were.

use std::{future::Future, sync::Arc};

use futures::{FutureExt as _, StreamExt as _};
use kube::Client;
use tracing::{info, warn};

use super::{
    Settings,
    reconcile::Reconciler,
    watch::{WatchState, Watches},
};
use crate::{
    datapath::Datapath,
    error::AgentError,
    metrics::{ErrorKind, Telemetry},
    sync::Statics,
    toggle::Recorded,
};

/// Runs until `shutdown` completes. Errors only when the datapath itself fails in a
/// way the loop cannot carry on from.
pub async fn run(
    client: Client,
    settings: &Settings,
    statics: Statics,
    dp: &mut Datapath,
    telemetry: Arc<Telemetry>,
    mut publisher: Option<&mut super::Publisher>,
    shutdown: impl Future<Output = &'static str>,
) -> Result<&'static str, AgentError> {
    let node = settings.node.clone();
    let Watches {
        stores,
        mut events,
        mut policies,
    } = Watches::new(&client, &node);
    let mut state = WatchState::new(telemetry.clone(), &statics);
    // An adopted datapath keeps what the previous agent decided until the first pass.
    let enabled_by = dp
        .agent_state()
        .ok()
        .and_then(Recorded::decode)
        .and_then(|r| r.enabled_by);
    let mut ctl = Reconciler::new(settings, statics, telemetry.clone(), enabled_by);
    // A periodic pass repairs drift (an entry removed behind the agent's back) and
    // retries failed map updates.
    let mut resync = tokio::time::interval(settings.resync);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The node's namespaces are read on every wake-up and at least this often: a pod's
    // address is its own once its namespace holds it, and its connections are cut once
    // its network is down or gone.
    let mut owners = crate::owners::Watcher::new(dp)?;
    let mut owners_tick = tokio::time::interval(crate::owners::INTERVAL);
    owners_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let shutdown = shutdown.fuse();
    futures::pin_mut!(shutdown);
    info!(node = %node, "watching the node, its pods, namespaces, ServiceCIDRs, Services and EndpointSlices");
    loop {
        tokio::select! {
            signal = &mut shutdown => return Ok(signal),
            item = events.next() => match item {
                Some(item) => state.note(item),
                None => {
                    return Err(AgentError::WatchEnded);
                }
            },
            _ = resync.tick() => {}
            _ = owners_tick.tick(), if owners.is_some() => {}
            Some(item) = policies.next() => state.note_policy(item),
        }
        while let Some(Some(item)) = policies.next().now_or_never() {
            state.note_policy(item);
        }
        // Coalesce a burst (a relist delivers every object) into one reconcile.
        while let Some(Some(item)) = events.next().now_or_never() {
            state.note(item);
        }
        // Every wake-up (event or resync tick) is a full, level-triggered pass.
        if state.listed.core() {
            if !telemetry.health.ready() {
                info!("node, pods and namespaces listed; reconciling");
            }
            telemetry.health.set_synced(true);
            telemetry.agent.synced.set(1);
            ctl.reconcile(&stores, &state.listed, dp);
            ctl.cut_policy_changes(&stores, &mut state.policy_changed, dp);
            if let Some(p) = publisher.as_deref_mut() {
                p.set_node_uid(
                    stores
                        .nodes
                        .state()
                        .first()
                        .and_then(|n| n.metadata.uid.clone()),
                );
                p.update(ctl.node_status(dp)).await;
            }
        }
        // After the reconcile, so a pod address added now is owned at once.
        if let Some(w) = owners.as_mut()
            && let Err(e) = w.pass(dp)
        {
            telemetry.agent.error(ErrorKind::MapUpdate);
            warn!(error = %e, "reading the pod network namespaces failed; retrying");
        }
        for _ in 0..dp.take_cuts_of_everything() {
            telemetry.agent.error(ErrorKind::CutMapFull);
        }
    }
}
