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

pub mod chain;
pub mod loopback;
pub mod service;
pub mod skip_ports;
pub mod snat;
pub mod support;
