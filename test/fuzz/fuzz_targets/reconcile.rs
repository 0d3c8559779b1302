//! Reconcile (desired map contents and the plan to reach them) on arbitrary JSON of
//! cluster objects and map contents (`bypass_agent::sync::properties::reconcile`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bypass_agent::sync::properties::reconcile(data));
