//! What a load fixes in the programs' read-only globals, found on this host: kernel
//! field offsets from BTF, the host namespace, and which optional parts are on.

use bypass_common::{
    KernelLayout,
    layout::{self, features},
};

use super::{btf, host};
use crate::error::AgentError;

/// What a load fixes in the programs' read-only globals, found on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadPlan {
    /// Kernel field offsets, from BTF.
    pub layout: KernelLayout,
    /// [`features`] bits: what the programs do, and why an optional part is off.
    pub features: u32,
    /// The host's network namespace cookie.
    pub host_netns: u64,
}

impl LoadPlan {
    /// Reads this host: BTF offsets (those every load needs must be there), the host
    /// namespace, whether the queue bound can be measured.
    pub fn detect() -> Result<Self, AgentError> {
        let layout = kernel_layout()?;
        let host_netns = host::netns_cookie()?;
        let mut f = 0;
        if !layout.can_bound() {
            f |= features::NO_QUEUE_FIELD;
        }
        if host::probe_reads_forbidden() {
            f |= features::NO_PROBE_READ;
        }
        if f == 0 {
            f = features::QUEUE_BOUND;
        }
        Ok(Self {
            layout,
            features: f,
            host_netns,
        })
    }

    /// The same load without the probe reads (the verifier refused the helper).
    pub(super) fn without_probe_reads(self) -> Self {
        Self {
            features: (self.features & !features::QUEUE_BOUND) | features::NO_PROBE_READ,
            ..self
        }
    }

    /// Digest of what the programs were loaded with.
    pub fn digest(&self) -> u64 {
        layout::digest(&self.layout, self.features, self.host_netns)
    }
}

/// Why the queue bound is off, for logs and status; `None` when it is on.
pub fn queue_bound_off_reason(features_bits: u32) -> Option<&'static str> {
    const FIELD: &str =
        "this kernel's sockmap does not expose its queue length (sk_psock.msg_tot_len)";
    const LOCKDOWN: &str =
        "bpf_probe_read_kernel is unavailable (kernel lockdown, confidentiality mode)";
    let (field, lockdown) = (
        features_bits & features::NO_QUEUE_FIELD != 0,
        features_bits & features::NO_PROBE_READ != 0,
    );
    match (features_bits & features::QUEUE_BOUND != 0, field, lockdown) {
        (true, _, _) => None,
        (false, true, true) => Some(
            "this kernel's sockmap does not expose its queue length (sk_psock.msg_tot_len), \
             and bpf_probe_read_kernel is unavailable (kernel lockdown, confidentiality mode)",
        ),
        (false, true, false) => Some(FIELD),
        (false, false, true) => Some(LOCKDOWN),
        (false, false, false) => Some("not loaded with it"),
    }
}

/// The running kernel's layout of the fields the programs read. Those every load needs
/// must be there; the others turn off what needs them.
fn kernel_layout() -> Result<KernelLayout, AgentError> {
    let b = btf::Btf::vmlinux().map_err(|e| AgentError::KernelSupport {
        what: "describe its structures",
        source: Box::new(e),
    })?;
    let (layout, missing) = b.kernel_layout();
    if !layout.has_required() {
        return Err(AgentError::KernelSupport {
            what: "show the socket fields the datapath checks at insertion",
            source: Box::new(btf::MissingFields(missing)),
        });
    }
    // What is missing turns off an optional guarantee, reported once by the caller.
    for e in &missing {
        tracing::debug!(error = %e, "kernel field not found in BTF");
    }
    Ok(layout)
}
