//! The TCP semantics matrix: each behaviour an application can observe, run once on the
//! normal path and once bypassed, between the same two pods, with the same
//! `bypass-test-tool probe` case; the observations must be the same. Where this kernel's
//! sockmap differs and the datapath cannot avoid it, the test pins the documented
//! difference (named `..._known_difference`), so a kernel that fixes it shows up as a
//! failure to update docs/limitations.md.

pub mod closing;
pub mod protocols;
pub mod reading;
pub mod scale;
pub mod sending;
pub mod support;
