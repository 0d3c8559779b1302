//! The agent's pure modules, compiled into each fuzz target from their own source (the
//! agent is a binary crate), and the properties they must keep.
#[path = "../../bypass-agent/src/cidr.rs"]
pub mod cidr;
#[path = "../../bypass-agent/src/props.rs"]
pub mod props;
#[path = "../../bypass-agent/src/sync.rs"]
pub mod sync;
#[path = "../../bypass-agent/src/toggle.rs"]
pub mod toggle;
