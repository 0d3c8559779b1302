//! Reconcile (desired map contents and the plan to reach them) on arbitrary JSON of
//! cluster objects and map contents (`bypass_agent::props::reconcile`).
#![no_main]
#![allow(dead_code, reason = "the agent's modules are compiled in whole")]

#[path = "agent.rs"]
mod agent;
use agent::*;

libfuzzer_sys::fuzz_target!(|data: &[u8]| props::reconcile(data));
