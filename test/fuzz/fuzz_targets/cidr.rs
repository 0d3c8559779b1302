//! The CIDR parser (pod and Service CIDRs) on arbitrary bytes
//! (`bypass_agent::sync::properties::cidr_parse`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bypass_agent::sync::properties::cidr_parse(data));
