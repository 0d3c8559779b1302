//! The read guard's checks as BPF LSM programs on the kernel's `bpf_lsm_*` hooks where
//! the BPF LSM runs (from Linux 6.2 on the kernel runs them on every call), else as
//! fmod_ret programs on its `security_*` functions, which run whether or not the BPF LSM
//! is active (the verifier allows fmod_ret on any `security_*` function:
//! kernel/bpf/verifier.c, check_attach_modify_return) but are skipped on a CPU where a
//! preempted task is inside them. aya 0.14 loads no fmod_ret program, so both are loaded
//! here, by one loader that gives the verifier's log when a load fails: the object's
//! program (declared as an LSM program, whose context is the same: the hook's
//! arguments, then the return value so far) is taken from aya's own object parser,
//! relocated against the maps aya created for this load, and loaded and attached with
//! bpf(2) (include/uapi/linux/bpf.h). Its link is pinned like the others.

use std::{
    collections::HashSet,
    os::fd::{AsFd as _, AsRawFd as _},
};

use aya::{Ebpf, maps::Map};
use aya_obj::{Object, generated::bpf_insn};

use super::{
    object,
    rawbpf::{self, Attr, BPF_PROG_LOAD, BPF_RAW_TRACEPOINT_OPEN, bpf_fd},
};
use crate::error::AgentError;

/// `BPF_MODIFY_RETURN`.
const BPF_MODIFY_RETURN: u32 = 26;
/// `BPF_LSM_MAC` and `BPF_PROG_TYPE_LSM`.
const BPF_LSM_MAC: u32 = 27;
const BPF_PROG_TYPE_LSM: u32 = 29;
/// Room for the verifier's log when a load fails.
const LOG_SIZE: usize = 1 << 20;

/// The raw fd of a map aya created, whatever its type.
fn map_fd(map: &Map) -> i32 {
    let data = match map {
        Map::Array(d)
        | Map::ArrayOfMaps(d)
        | Map::BloomFilter(d)
        | Map::CgroupArray(d)
        | Map::CgroupStorage(d)
        | Map::CgrpStorage(d)
        | Map::CpuMap(d)
        | Map::DevMap(d)
        | Map::DevMapHash(d)
        | Map::HashMap(d)
        | Map::HashOfMaps(d)
        | Map::InodeStorage(d)
        | Map::LpmTrie(d)
        | Map::LruHashMap(d)
        | Map::PerCpuArray(d)
        | Map::PerCpuCgroupStorage(d)
        | Map::PerCpuHashMap(d)
        | Map::PerCpuLruHashMap(d)
        | Map::PerfEventArray(d)
        | Map::ProgramArray(d)
        | Map::Queue(d)
        | Map::ReusePortSockArray(d)
        | Map::RingBuf(d)
        | Map::SockHash(d)
        | Map::SockMap(d)
        | Map::SkStorage(d)
        | Map::Stack(d)
        | Map::StackTraceMap(d)
        | Map::Unsupported(d)
        | Map::XskMap(d) => d,
    };
    data.fd().as_fd().as_raw_fd()
}

/// The instructions of program `name` of the embedded object, relocated against the
/// maps of `ebpf` (the load the program joins: same maps, same frozen globals).
fn relocated(ebpf: &Ebpf, name: &str) -> Result<Vec<bpf_insn>, AgentError> {
    let err = |e: &dyn std::fmt::Display| {
        AgentError::bpf(format!("relocate {name} for fmod_ret"), e.to_string())
    };
    let mut obj = Object::parse(object::BYTES).map_err(|e| err(&e))?;
    let text_sections: HashSet<usize> = obj.functions.keys().map(|(s, _)| *s).collect();
    let maps: Vec<(String, aya_obj::Map, i32)> = obj
        .maps
        .iter()
        .filter_map(|(n, m)| {
            ebpf.map(n)
                .map(|loaded| (n.clone(), m.clone(), map_fd(loaded)))
        })
        .collect();
    obj.relocate_maps(
        maps.iter().map(|(n, m, fd)| (n.as_str(), *fd, m)),
        &text_sections,
    )
    .map_err(|e| err(&e))?;
    obj.relocate_calls(&text_sections).map_err(|e| err(&e))?;
    let prog = obj
        .programs
        .get(name)
        .ok_or_else(|| AgentError::missing("program", name))?;
    let function = obj
        .functions
        .get(&prog.function_key())
        .ok_or_else(|| AgentError::missing("function", name))?;
    Ok(function.instructions.clone())
}

/// How a read guard's check is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum As {
    /// fmod_ret on the kernel's `security_*` function.
    FmodRet,
    /// A BPF LSM program on the kernel's `bpf_lsm_*` hook.
    Lsm,
}

/// Loads program `name` as `how` says on the kernel function whose BTF id is `btf_id`
/// (`target` names it in errors) and attaches it: the link, which detaches it when
/// closed unless pinned.
pub fn attach(
    ebpf: &Ebpf,
    name: &str,
    target: &str,
    btf_id: u32,
    how: As,
) -> Result<std::os::fd::OwnedFd, AgentError> {
    let insns = relocated(ebpf, name)?;
    let mut attr = match how {
        As::FmodRet => rawbpf::tracing_prog(&insns, c"GPL", BPF_MODIFY_RETURN, btf_id),
        As::Lsm => rawbpf::btf_prog(BPF_PROG_TYPE_LSM, &insns, c"GPL", BPF_LSM_MAC, btf_id),
    };
    // prog_load, beside the program's fields: prog_name (48).
    let short: Vec<u8> = name.bytes().take(15).collect();
    attr.bytes(48, &short);
    let action = || format!("load {name} as {how:?} on the kernel's {target}");
    // Without a log first: a log that overflows its buffer fails the load by itself
    // (ENOSPC). Again with one only to say why a load failed.
    let prog = match bpf_fd(BPF_PROG_LOAD, &mut attr) {
        Ok(prog) => prog,
        Err(first) => {
            let mut log = vec![0u8; LOG_SIZE];
            // log_level (24), log_size (28), log_buf (32).
            attr.u32(24, 1)
                .u32(28, LOG_SIZE as u32)
                .u64(32, log.as_mut_ptr() as u64);
            match bpf_fd(BPF_PROG_LOAD, &mut attr) {
                Ok(prog) => prog,
                Err(source) => {
                    let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                    let text = String::from_utf8_lossy(&log[..end]).into_owned();
                    return Err(if text.trim().is_empty() {
                        AgentError::bpf(action(), first)
                    } else {
                        AgentError::Verifier {
                            action: action(),
                            source,
                            log: text,
                        }
                    });
                }
            }
        }
    };
    // raw_tracepoint: name (0, none: the attach point was given at load), prog_fd (8).
    let mut attr = Attr::zeroed();
    attr.u32(8, prog.as_raw_fd() as u32);
    bpf_fd(BPF_RAW_TRACEPOINT_OPEN, &mut attr)
        .map_err(|e| AgentError::attach(name, format_args!("the kernel's {target}"), e))
}
