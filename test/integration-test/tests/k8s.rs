//! The Kubernetes agent against a real kube-apiserver and etcd (built and started by
//! the `kube-testenv` crate, one pair per test): pod addresses follow Pod objects into
//! and out of the maps within a second (IPv4 and IPv6), ineligible pods never enter,
//! traffic between two netns "pods" whose addresses come only from Pod objects is
//! redirected, the node label switches it off and on without losing a byte, the
//! datapath survives the API server going away and the maps match the API when it is
//! back, bad input fails clearly, and every manifest in `deploy/` is accepted. Service
//! CIDRs follow the ServiceCIDR objects (with the `--service-cidr` flags), a malformed
//! one (written to etcd, as an older API server could have stored it) does not stop pod
//! sync, and without RBAC for them the agent falls back to the flags and recovers.
//! Service backends follow the Services and EndpointSlices (with the
//! `--service-backend` flags).
//!
//! Objects are made as a kubelet and controllers would: status through the status
//! subresource, pods force-deleted, the `default` ServiceAccount created by hand.

pub mod bad_input;
pub mod cluster;
pub mod deploy;
pub mod opt_outs;
pub mod outage;
pub mod pods;
pub mod policies;
pub mod service_backends;
pub mod service_cidrs;
pub mod support;
pub mod toggle;
