//! Service-mesh and Service traffic (issue 6), with real iptables rules made by the test
//! inside the pods' network namespaces:
//!
//! - the sidecar chain app → proxy → proxy → app behind Istio-style REDIRECTs, over
//!   IPv4 and IPv6: byte-exact, every hop paired and redirected (two translated hops,
//!   one loopback hop), the veth nearly idle;
//! - identical loopback tuples in two pods at once: four distinct SockHash keys (the
//!   network namespace is in the key), each pod gets its own bytes;
//! - a ClusterIP written as kube-proxy writes it (DNAT to a pod of this node), IPv4 and
//!   IPv6: paired across the translation, redirected both ways;
//! - the same DNAT to a backend on another "node" (outside the pod CIDRs): normal path;
//! - a port in `--skip-ports` (Istio's 15021 by default) is left alone, and `none`
//!   bypasses it;
//! - a client kube-proxy masquerades (`--random-fully`): byte-exact, never mispaired;
//! - a source NAT onto the address and port of another live connection: the accepting
//!   side's candidate fails the sequence-number check, normal path, byte-exact;
//! - 300 short connections through the chain, each writing at once: all paired, the
//!   maps empty afterwards; egress to an outside address: that hop not watched;
//!   loopback bypassed only once the namespace is known as a pod's, and no longer once
//!   it lost its address (its connections cut, though the datapath forgot it).
//!
//! The proxies are `bypass-test-tool proxy` (testbed's src/bin/bypass-test-tool/proxy.rs);
//! the rules come from `testbed::iptables` and vanish with the namespaces.

use crate::support::privileged;

// The scenarios by topic, one file each under tests/mesh/; the tests below name them,
// so every test keeps its name in the harness (filters, `--skip`, the kernel table).
// A new test is a `#[test]` in its file (`mesh::loopback::...`), its name written once.
pub mod chain;
pub mod loopback;
pub mod service;
pub mod skip_ports;
pub mod snat;
pub mod support;

use anyhow::{Context as _, Result};
use testbed::{iptables::Family, require::preflight_iptables};

// -------------------------------------------------------------------------------------
// The sidecar chain (tests/mesh/chain.rs).

#[test]
fn sidecar_chain_ipv4_every_hop_bypassed() -> Result<()> {
    privileged!(preflight_iptables);
    chain::sidecar_chain(Family::V4)
}

#[test]
fn sidecar_chain_ipv6_every_hop_bypassed() -> Result<()> {
    privileged!(preflight_iptables);
    chain::sidecar_chain(Family::V6)
}

#[test]
fn sidecar_chain_short_connections_exact() -> Result<()> {
    privileged!(preflight_iptables);
    chain::sidecar_chain_short_connections_exact()
}

#[test]
fn egress_to_outside_address_first_hop_normal_path() -> Result<()> {
    privileged!(preflight_iptables);
    chain::egress_to_outside_address_first_hop_normal_path()
}

// -------------------------------------------------------------------------------------
// Loopback in pods (tests/mesh/loopback.rs).

#[test]
fn loopback_tuples_in_two_pods_do_not_collide() -> Result<()> {
    privileged!(preflight_iptables);
    loopback::loopback_tuples_in_two_pods_do_not_collide()
}

#[test]
fn loopback_bypassed_once_namespace_known_as_pod() -> Result<()> {
    privileged!(preflight_iptables);
    loopback::loopback_bypassed_once_namespace_known_as_pod()
}

// -------------------------------------------------------------------------------------
// ClusterIP Services and DNAT (tests/mesh/service.rs).

#[test]
fn clusterip_dnat_to_local_pod_ipv4_bypassed_both_ways() -> Result<()> {
    privileged!(preflight_iptables);
    service::clusterip_to_local_pod(Family::V4)
}

#[test]
fn clusterip_dnat_to_local_pod_ipv6_bypassed_both_ways() -> Result<()> {
    privileged!(preflight_iptables);
    service::clusterip_to_local_pod(Family::V6)
}

#[test]
fn clusterip_dnat_to_a_pod_not_its_backend_stays_on_tcp() -> Result<()> {
    privileged!(preflight_iptables);
    service::clusterip_to_a_pod_not_its_backend_stays_on_tcp()
}

#[test]
fn clusterip_masqueraded_client_exact() -> Result<()> {
    privileged!(preflight_iptables);
    service::clusterip_masqueraded_client_exact()
}

#[test]
fn clusterip_dnat_to_other_node_stays_on_normal_path() -> Result<()> {
    privileged!(preflight_iptables);
    service::clusterip_dnat_to_other_node_stays_on_normal_path()
}

#[test]
fn clusterip_dnat_in_client_pod_output_bypassed() -> Result<()> {
    privileged!(preflight_iptables);
    for family in [Family::V4, Family::V6] {
        for to_self in [false, true] {
            service::output_dnat(family, to_self)
                .with_context(|| format!("{family:?}, to itself: {to_self}"))?;
        }
    }
    Ok(())
}

// -------------------------------------------------------------------------------------
// Ports left alone (tests/mesh/skip_ports.rs).

#[test]
fn skip_ports_default_and_none() -> Result<()> {
    privileged!(preflight_iptables);
    skip_ports::skip_ports_default_and_none()
}

// -------------------------------------------------------------------------------------
// Source NAT onto a live connection (tests/mesh/snat.rs).

#[test]
fn snat_onto_a_live_source_port_is_rejected() -> Result<()> {
    privileged!(preflight_iptables);
    snat::snat_onto_a_live_source_port_is_rejected()
}
