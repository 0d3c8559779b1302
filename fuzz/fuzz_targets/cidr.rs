//! The pod CIDR parser on arbitrary bytes (`bypass_agent::props::cidr_parse`).
#![no_main]
#![allow(dead_code, reason = "the agent's modules are compiled in whole")]

#[path = "agent.rs"]
mod agent;
use agent::*;

libfuzzer_sys::fuzz_target!(|data: &[u8]| props::cidr_parse(data));
