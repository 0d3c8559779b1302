//! Before anything is loaded: does this kernel have what the datapath uses? Each
//! facility is probed (the map and program types, the helpers each program calls, BTF),
//! not inferred from the version string, so a kernel with the features backported (RHEL
//! 9 and RHCOS: 5.14) runs the agent and one without them is refused in one line naming
//! what it lacks, before any verifier log.
//!
//! What is probed, why, and the upstream release of each is the catalogue
//! [`bypass_common::kernel::NEEDS`]; everything is there from
//! [`bypass_common::MIN_KERNEL`] on.
//!
//! The probes are aya's (`BPF_MAP_CREATE`, and libbpf's helper probe: a two-instruction
//! program whose verifier log names an unknown helper); [`missing`] is the pure part.

use aya::{
    maps::MapType,
    programs::ProgramType,
    sys::{BpfHelper, is_helper_supported, is_map_supported, is_program_supported},
};
use bypass_common::kernel::{Helper, MapKind, ProgramKind};
pub use bypass_common::kernel::{NEEDS, Need, Probe};

use crate::error::AgentError;

/// aya's name of a map type.
fn map_type(kind: MapKind) -> MapType {
    match kind {
        MapKind::SockHash => MapType::SockHash,
        MapKind::SkStorage => MapType::SkStorage,
        MapKind::LruHash => MapType::LruHash,
        MapKind::LpmTrie => MapType::LpmTrie,
    }
}

/// aya's name of a program type.
fn program_type(kind: ProgramKind) -> ProgramType {
    match kind {
        ProgramKind::SockOps => ProgramType::SockOps,
        ProgramKind::SkMsg => ProgramType::SkMsg,
        ProgramKind::CgroupSockopt => ProgramType::CgroupSockopt,
    }
}

/// aya's name of a helper.
fn helper(h: Helper) -> BpfHelper {
    match h {
        Helper::GetNetnsCookie => BpfHelper::BPF_FUNC_get_netns_cookie,
        Helper::SkStorageGet => BpfHelper::BPF_FUNC_sk_storage_get,
        Helper::SkcToTcpSock => BpfHelper::BPF_FUNC_skc_to_tcp_sock,
        Helper::SockHashUpdate => BpfHelper::BPF_FUNC_sock_hash_update,
        Helper::KtimeGetNs => BpfHelper::BPF_FUNC_ktime_get_ns,
        Helper::MsgRedirectHash => BpfHelper::BPF_FUNC_msg_redirect_hash,
    }
}

/// What a probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// There.
    Yes,
    /// Not there.
    No,
    /// The probe could not tell (no privilege, an unexpected error): the load will.
    Unknown(String),
}

/// Runs one probe.
pub fn probe(p: Probe) -> Found {
    let answer = match p {
        Probe::Btf => Ok(std::path::Path::new(super::btf::VMLINUX_BTF).exists()),
        Probe::Map(t) => is_map_supported(map_type(t)).map_err(|e| crate::error::chain(&e)),
        Probe::Program(t) => {
            is_program_supported(program_type(t)).map_err(|e| crate::error::chain(&e))
        }
        Probe::Helper(t, h) => {
            is_helper_supported(program_type(t), helper(h)).map_err(|e| crate::error::chain(&e))
        }
        Probe::ReadHook => super::btf::Btf::vmlinux()
            .map(|b| super::plan::read_hook_in_btf(&b))
            .map_err(|e| e.to_string()),
    };
    match answer {
        Ok(true) => Found::Yes,
        Ok(false) => Found::No,
        Err(e) => Found::Unknown(e),
    }
}

/// Every need with what its probe found.
pub fn probe_all() -> Vec<(Need, Found)> {
    NEEDS.iter().map(|n| (*n, probe(n.probe))).collect()
}

/// The needs found missing (pure): a probe that could not tell is not a refusal.
pub fn missing(found: &[(Need, Found)]) -> Vec<Need> {
    found
        .iter()
        .filter(|(_, f)| *f == Found::No)
        .map(|(n, _)| *n)
        .collect()
}

/// The one-line refusal for `missing` on kernel `release` (pure), `None` if nothing is.
pub fn refusal(release: &str, missing: &[Need]) -> Option<AgentError> {
    let first = missing.first()?;
    Some(AgentError::KernelLacks {
        release: release.to_owned(),
        what: missing
            .iter()
            .map(|n| n.what)
            .collect::<Vec<_>>()
            .join(", "),
        why: first.why,
    })
}

/// Probes the running kernel; refuses it if anything the datapath needs is missing.
pub fn check(release: &str) -> Result<(), AgentError> {
    match refusal(release, &missing(&probe_all())) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_5_10_kernel_is_refused_for_what_it_lacks() {
        let found: Vec<(Need, Found)> = NEEDS
            .iter()
            .map(|n| {
                let f = match n.probe {
                    Probe::Helper(_, Helper::GetNetnsCookie) => Found::No,
                    Probe::Btf => Found::Unknown("EPERM".into()),
                    _ => Found::Yes,
                };
                (*n, f)
            })
            .collect();
        let m = missing(&found);
        assert_eq!(m.len(), 1, "an unknown answer is not a refusal: {m:?}");
        let e = refusal("5.10.0-46-amd64", &m).unwrap().to_string();
        assert!(
            e.contains("5.10.0-46-amd64")
                && e.contains("bpf_get_netns_cookie")
                && e.contains(bypass_common::kernel::REFUSAL),
            "{e}"
        );
        assert!(!e.contains('\n'), "one line: {e}");
        assert!(refusal("6.18", &[]).is_none());
        // The words a 5.10 kernel gets, as the kernel matrix records them.
        assert_eq!(
            e,
            "kernel 5.10.0-46-amd64 lacks what the datapath needs: it has no \
             bpf_get_netns_cookie in sock_ops (Linux 5.15, or backported), and every bypass \
             key carries the socket's network namespace: run the agent on a kernel with them \
             (Linux >= 5.19 upstream, or one that backports them, such as RHEL 9's 5.14), or \
             keep it off this node (the chart's nodeSelector/affinity)"
        );
    }

    #[test]
    fn this_kernel_passes() {
        // The machines the tests run on have what the datapath needs.
        let found = probe_all();
        assert!(missing(&found).is_empty(), "{found:?}");
        check(&super::super::host::kernel_release()).unwrap();
    }
}
