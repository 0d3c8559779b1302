//! The controller loop: the watches ([`super::watch`]) feed the reconciler
//! ([`super::reconcile`]). A pass is full and level-triggered; [`super::pace`] says when
//! one runs: at once for a change to this node (its Node, its pods, a namespace), at
//! most once a [`super::pace::MIN_INTERVAL`] for the cluster's Services, EndpointSlices
//! and ServiceCIDRs and for the resync tick, so a burst of events is coalesced into one;
//! either way no sooner than [`super::pace::QUIET`] times the last pass's length after
//! it. A NetworkPolicy change makes a pass due at once, and the pass cuts its
//! namespace's connections. The pod network namespace owners are read after every pass
//! (counted in its length), on their own tick, and when link events wake them. While
//! the API server is away the stores, and so the datapath, stay as they were.

use std::{future::Future, sync::Arc, time::Instant};

use futures::{FutureExt as _, StreamExt as _};
use kube::Client;
use tracing::{info, warn};

use super::{
    Settings,
    pace::{self, Pace, Urgency},
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
    // A datapath an older build loaded, or one whose control map cannot be read, has no
    // record: nothing is cut for policy changes made before this agent.
    let recorded = dp.policies_record().unwrap_or(0);
    let mut state = WatchState::new(telemetry.clone(), &statics, recorded);
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
    // The node's namespaces are read after every pass and at least this often: a pod's
    // address is its own once its namespace holds it, and its connections are cut once
    // its network is down or gone.
    // A link or an address changing wakes the read too (subscribed before the first).
    let mut owners = crate::owners::Watcher::new(dp)?;
    // Without the ownership check no pass cuts the links astray: done here, against the
    // adopted pod maps, before anything else is cut, and on every turn until it holds.
    let mut audited = owners.is_some();
    let mut link_events = owners
        .is_some()
        .then(|| crate::owners::Events::open(Some(telemetry.agent.clone())));
    let mut owners_tick = tokio::time::interval(crate::owners::poll_interval()?);
    owners_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut pace = Pace::default();
    let mut policies_recorded = false;
    let shutdown = shutdown.fuse();
    futures::pin_mut!(shutdown);
    info!(node = %node, "watching the node, its pods, namespaces, ServiceCIDRs, Services and EndpointSlices");
    loop {
        // A batched pass waits for its time; before the first listing nothing is due.
        let due = pace
            .due(Instant::now())
            .filter(|_| state.listed.core())
            .map(tokio::time::Instant::from_std);
        let batched = async {
            match due {
                Some(t) => tokio::time::sleep_until(t).await,
                None => futures::future::pending().await,
            }
        };
        let mut read_owners = false;
        let mut pass = None;
        tokio::select! {
            signal = &mut shutdown => return Ok(signal),
            item = events.next() => match item {
                Some(item) => note(&mut state, &mut pace, item),
                None => {
                    return Err(AgentError::WatchEnded);
                }
            },
            _ = resync.tick() => pace.note(Urgency::Batched),
            _ = owners_tick.tick(), if owners.is_some() => read_owners = true,
            () = async {
                match link_events.as_mut() {
                    Some(e) => e.due().await,
                    None => futures::future::pending().await,
                }
            } => read_owners = true,
            Some(item) = policies.next() => state.note_policy(item),
            () = batched => {}
        }
        while let Some(Some(item)) = policies.next().now_or_never() {
            state.note_policy(item);
        }
        // Until its cut holds (a failed one is retried by the next pass).
        if !state.policy_changed.is_empty() {
            pace.note(Urgency::Now);
        }
        // Coalesce a burst (a relist delivers every object) into one reconcile.
        while let Some(Some(item)) = events.next().now_or_never() {
            note(&mut state, &mut pace, item);
        }
        if !audited {
            audited = crate::owners::cut_astray_or_retry(dp).is_some();
        }
        if state.listed.core() {
            if !telemetry.health.ready() {
                info!("node, pods and namespaces listed; reconciling");
            }
            telemetry.health.set_synced(true);
            telemetry.agent.synced.set(1);
            let now = Instant::now();
            if pace.is_due(now) {
                let started = Instant::now();
                ctl.reconcile(&stores, &state.listed, dp);
                // With the pass: a changed policy waits for no interval, only for the
                // pace a tenant editing its policies in a loop would otherwise defeat.
                ctl.cut_policy_changes(&stores, &mut state.policy_changed, dp);
                // So that a pod address added now is owned at once; the pass's length,
                // which paces the next, counts that read too (not the publish below).
                read_owners = true;
                pass = Some((now, started.elapsed()));
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
            // Once every change seen is cut: the next agent cuts what changes after.
            if let Some(f) = state.policies_to_record() {
                match dp.set_policies_record(f) {
                    Ok(()) => {
                        if f != super::watch::POLICIES_PENDING && !policies_recorded {
                            policies_recorded = true;
                            info!(
                                "NetworkPolicies recorded: a change made while no agent runs is cut when the next one starts"
                            );
                        }
                        state.policies_recorded(f);
                    }
                    Err(e) => {
                        telemetry.agent.error(ErrorKind::MapUpdate);
                        warn!(error = %e, "could not record the NetworkPolicies in the datapath; retrying");
                    }
                }
            }
        }
        // After a pass, on a link event, and on the tick.
        let mut owners_took = std::time::Duration::ZERO;
        if read_owners && let Some(w) = owners.as_mut() {
            let started = Instant::now();
            if let Err(e) = w.pass(dp) {
                telemetry.agent.error(ErrorKind::MapUpdate);
                warn!(error = %e, "reading the pod network namespaces failed; retrying");
            }
            if let Some(e) = link_events.as_mut() {
                e.ran(started);
            }
            owners_took = started.elapsed();
        }
        if let Some((started, busy)) = pass {
            pace.ran(started, busy + owners_took, Instant::now());
        }
        for _ in 0..dp.take_cuts_of_everything() {
            telemetry.agent.error(ErrorKind::CutMapFull);
        }
    }
}

/// Records a watch item and how soon it needs a pass.
fn note(state: &mut WatchState, pace: &mut Pace, item: super::watch::Item) {
    if let Some(u) = pace::urgency(&item) {
        pace.note(u);
    }
    state.note(item);
}
