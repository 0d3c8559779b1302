//! What aya keeps in its xtask library, shared by xtask, the lab crates (the Kubernetes
//! lab, the kernel matrix) and the testbed: [`cmd`] runs child processes and names the
//! command in every failure; [`workspace`] says where things are (the root, the target
//! directory, the packages the tasks build by name); [`http`] is one GET with hyper's
//! HTTP/1 client, plain or over TLS.
//!
//! A crate of its own rather than xtask's `src/lib.rs`: xtask's binary uses the lab
//! crates, which use these, and Cargo refuses a cycle between packages.

pub mod cmd;
pub mod http;
pub mod workspace;
