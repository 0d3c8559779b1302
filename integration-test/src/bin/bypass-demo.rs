//! `bypass-demo`: placeholder, replaced below.
fn main() {}
