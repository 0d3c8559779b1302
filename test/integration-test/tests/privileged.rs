//! The privileged tests, one binary with a module per topic (aya's
//! `test/integration-test` layout): `cargo xtask test` runs it one test at a time, since
//! the tests share kernel state (bpffs, cgroups, network namespaces). Each test is one
//! `#[test]` in its topic's files, named by its module path
//! (`tcp_semantics::reading::epoll_readiness`); a prefix such as `mesh::` selects a topic.

mod support;

mod apps;
mod bad_input;
mod cleanup;
mod datapath;
mod demo;
mod detach;
mod isolation;
mod k8s;
mod limits;
mod mesh;
mod queue_bound;
mod restart;
mod small_messages;
mod socket_semantics;
mod tcp_semantics;
