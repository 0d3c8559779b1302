//! The pod CIDR parser on arbitrary bytes (`bypass_agent::props::cidr_parse`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bypass_agent::props::cidr_parse(data));
