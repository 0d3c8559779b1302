//! `bench`: the bypass bench. Two pods on one node (the `testbed` topology), qperf and
//! sockperf between them with the bypass attached and detached, interleaved; the
//! Unix-domain socket floor measured in the same run; the agent's own memory and CPU.
//! Writes a terminal table, a JSON file with every raw sample and an SVG plot.
//!
//! Data flow: [`driver`] runs the tools ([`qperf`], [`sockperf`], [`floor`]) and probes
//! the agent ([`procfs`]) into a [`model::Results`]; [`report`] (pure) turns it into the
//! table and the PASS/MISS targets, [`plot`] (pure) into SVG. [`scenario`] puts a
//! service-mesh sidecar chain or a ClusterIP DNAT between client and server; [`cluster`]
//! runs the sweep between two real pods of the one-node cluster instead. [`apps`] runs
//! real applications (`testbed::apps`) between the pods instead of qperf, on the same
//! path switching, into its own results and tables.
//! [`demo`] is the bench at small scale, with a verdict on whether the bypass bypassed.
//! [`wakeups`] is a research probe of small-message streams. [`scale`] measures one agent
//! against an API server holding a large cluster's objects, under churn.

// Unit tests may unwrap: a panic is their failure report.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod apps;
pub mod cluster;
pub mod demo;
pub mod driver;
pub mod env;
pub mod floor;
pub mod minimal;
pub mod model;
pub mod plot;
pub mod procfs;
pub mod progstats;
pub mod qperf;
pub mod report;
pub mod scale;
pub mod scenario;
pub mod sockperf;
pub mod stats;
pub mod wakeups;
