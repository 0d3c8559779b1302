//! Executes a [`sync::Plan`] on the address maps: the one place their contents change,
//! in Kubernetes and standalone mode alike. The plan itself is pure (`sync::plan`).

use crate::{
    datapath::PodMaps,
    error::AgentError,
    sync::{Current, Plan},
};

/// What the address maps hold now.
pub fn current(maps: &PodMaps) -> Current {
    Current {
        cidrs: maps.cidrs(),
        addrs: maps.addrs(),
        excluded: maps.excluded(),
        service_cidrs: maps.service_cidrs(),
        service_backends: maps.service_backends(),
    }
}

/// Applies `plan` in this order: add exclusions, remove pod addresses, add pod CIDRs,
/// add pod addresses, remove pod CIDRs, remove exclusions; then add and remove Service
/// CIDRs, then remove and add Service backends.
///
/// The datapath takes an address for a pod's if it is in the exact map, or inside a pod
/// CIDR and not excluded. With this order an address that is no pod's before the plan
/// and none after is none in between either: an exclusion is in place before the CIDR
/// it cuts from is added, and lifted only after that CIDR is removed. The other way
/// round (an exact address leaving for a CIDR's cover) it may briefly be none, which
/// only sends its connections by TCP.
///
/// Every step is tried; each failure goes to `on_error`. Returns the number of failures.
pub fn apply(maps: &mut PodMaps, plan: &Plan, mut on_error: impl FnMut(AgentError)) -> usize {
    let mut failed = 0;
    let mut check = |r: Result<(), AgentError>| {
        if let Err(e) = r {
            failed += 1;
            on_error(e);
        }
    };
    for ip in &plan.add_excluded {
        check(maps.insert_excluded(*ip));
    }
    for ip in &plan.remove_addrs {
        check(maps.remove_addr(*ip));
    }
    for cidr in &plan.add_cidrs {
        check(maps.insert_cidr(cidr));
    }
    for ip in &plan.add_addrs {
        check(maps.insert_addr(*ip));
    }
    for cidr in &plan.remove_cidrs {
        check(maps.remove_cidr(cidr));
    }
    for ip in &plan.remove_excluded {
        check(maps.remove_excluded(*ip));
    }
    for cidr in &plan.add_service_cidrs {
        check(maps.insert_service_cidr(cidr));
    }
    for cidr in &plan.remove_service_cidrs {
        check(maps.remove_service_cidr(cidr));
    }
    // Removed first, so that a full map makes room for what replaces them (a backend
    // briefly in neither only sends a new connection by TCP).
    for b in &plan.remove_service_backends {
        check(maps.remove_service_backend(b));
    }
    for b in &plan.add_service_backends {
        check(maps.insert_service_backend(b));
    }
    failed
}
