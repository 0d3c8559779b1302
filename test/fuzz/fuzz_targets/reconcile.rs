//! Reconcile (desired map contents and the plan to reach them) on arbitrary JSON of
//! cluster objects and map contents (`bypass_agent::fuzz_properties::reconcile`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bypass_agent::fuzz_properties::reconcile(data));
