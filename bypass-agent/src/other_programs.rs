//! Other programs that put sockets in a sockmap of their own (Merbridge, Kmesh, Cilium's
//! old sockops acceleration). A socket has one psock: once another program's sockmap
//! with an sk_msg program holds it, the kernel refuses to add it to ours (`EBUSY`,
//! net/core/sock_map.c, `sock_map_link`), and `insert_failures` grows although the
//! SockHash is not full. `status` names them, and says which cause the failures have.
//! The naming and the cause are pure; listing the kernel's programs is the thin I/O.

use bypass_common::names::{PROG_SKMSG, PROG_SOCKOPS, PROG_SOCKOPT};

/// BPF_PROG_TYPE_SOCK_OPS (include/uapi/linux/bpf.h).
const PROG_TYPE_SOCK_OPS: u32 = 13;
/// BPF_PROG_TYPE_SK_MSG.
const PROG_TYPE_SK_MSG: u32 = 16;

/// A loaded sock_ops or sk_msg program that is not this agent's.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct OtherProgram {
    /// The kernel's program id.
    pub id: u32,
    /// Its name (the kernel keeps 15 characters).
    pub name: String,
    /// `sock_ops` or `sk_msg`.
    pub kind: &'static str,
    /// Who ships a program of that name, when known.
    pub owner: Option<&'static str>,
}

impl std::fmt::Display for OtherProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} (id {}, {})",
            self.kind,
            self.name,
            self.id,
            self.owner.unwrap_or("unknown owner")
        )
    }
}

/// Kmesh's sock_ops and sk_msg programs, which carry no prefix of theirs
/// (kmesh-net/kmesh, bpf/kmesh/workload: `sockops_prog`, `sendmsg_prog`).
pub const KMESH_PROGRAMS: [&str; 2] = ["sockops_prog", "sendmsg_prog"];

/// Who ships a sock_ops or sk_msg program called `name` (pure).
pub fn owner_of(name: &str) -> Option<&'static str> {
    if name.starts_with("mb_") {
        Some("Merbridge")
    } else if name.contains("kmesh") || KMESH_PROGRAMS.contains(&name) {
        Some("Kmesh")
    } else if name == "bpf_redir_proxy" || name == "bpf_sockmap" {
        Some("Cilium sockops acceleration (< 1.14)")
    } else {
        None
    }
}

/// Whether `name` is one of this agent's programs (every build uses the same names).
fn ours(name: &str) -> bool {
    [PROG_SOCKOPS, PROG_SKMSG, PROG_SOCKOPT]
        .iter()
        .any(|p| p.get(..p.len().min(15)) == Some(name))
}

/// The other programs among `(id, name, program type)` (pure).
pub fn not_ours(programs: &[(u32, String, u32)]) -> Vec<OtherProgram> {
    programs
        .iter()
        .filter_map(|(id, name, ty)| {
            let kind = match *ty {
                PROG_TYPE_SOCK_OPS => "sock_ops",
                PROG_TYPE_SK_MSG => "sk_msg",
                _ => return None,
            };
            (!ours(name)).then(|| OtherProgram {
                id: *id,
                name: name.clone(),
                kind,
                owner: owner_of(name),
            })
        })
        .collect()
}

/// The kernel's loaded programs that are other sock_ops/sk_msg programs. Programs whose
/// information cannot be read are left out.
pub fn list() -> Vec<OtherProgram> {
    let programs: Vec<(u32, String, u32)> = aya::programs::loaded_programs()
        .flatten()
        .map(|p| {
            (
                p.id(),
                p.name_as_str().unwrap_or("").to_owned(),
                p.program_type() as u32,
            )
        })
        .collect();
    not_ours(&programs)
}

/// Why inserts failed (pure). Without another sk_msg program on the node the kernel
/// refuses an insert only when the SockHash is full (`E2BIG`, or memory); with one, the
/// failures are most likely sockets it holds (`EBUSY`). The failures are past events:
/// the map's occupancy now says nothing about then, so it is only shown.
pub fn insert_failure_cause(
    failures: u64,
    sockets: usize,
    max_sockets: Option<u32>,
    others: &[OtherProgram],
) -> Option<String> {
    if failures == 0 {
        return None;
    }
    let capacity = max_sockets.map_or_else(|| "?".to_owned(), |m| m.to_string());
    let sk_msg: Vec<String> = others
        .iter()
        .filter(|o| o.kind == "sk_msg")
        .map(ToString::to_string)
        .collect();
    Some(if sk_msg.is_empty() {
        format!("SockHash full ({capacity} sockets; {sockets} now): raise --max-sockets")
    } else {
        format!(
            "another program holds those sockets in its own sockmap ({}): the kernel gives a socket one sk_msg program; opt those pods out or remove the other program (SockHash: {capacity} sockets, {sockets} now)",
            sk_msg.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progs() -> Vec<(u32, String, u32)> {
        vec![
            (1, "bypass_sockops".into(), PROG_TYPE_SOCK_OPS),
            (2, "bypass_skmsg".into(), PROG_TYPE_SK_MSG),
            (3, "mb_msg_redir".into(), PROG_TYPE_SK_MSG),
            (4, "mb_sockops".into(), PROG_TYPE_SOCK_OPS),
            (5, "bpf_redir_proxy".into(), PROG_TYPE_SK_MSG),
            (6, "xdp_prog".into(), 6),
            (7, "something".into(), PROG_TYPE_SK_MSG),
            (8, "sockops_prog".into(), PROG_TYPE_SOCK_OPS),
            (9, "sendmsg_prog".into(), PROG_TYPE_SK_MSG),
        ]
    }

    #[test]
    fn names_the_other_programs_and_their_owners() {
        let o = not_ours(&progs());
        let shown: Vec<String> = o.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "sk_msg mb_msg_redir (id 3, Merbridge)",
                "sock_ops mb_sockops (id 4, Merbridge)",
                "sk_msg bpf_redir_proxy (id 5, Cilium sockops acceleration (< 1.14))",
                "sk_msg something (id 7, unknown owner)",
                "sock_ops sockops_prog (id 8, Kmesh)",
                "sk_msg sendmsg_prog (id 9, Kmesh)",
            ]
        );
        // The kernel truncates names to 15 characters: ours stay ours.
        assert!(ours("bypass_sockops") && ours("bypass_sockopt"));
        assert!(!ours("mb_sockops") && !ours(""));
    }

    #[test]
    fn insert_failures_are_told_apart() {
        let o = not_ours(&progs());
        assert_eq!(insert_failure_cause(0, 10, Some(10), &o), None);
        let other = insert_failure_cause(3, 2, Some(10), &o).unwrap();
        assert!(
            other.contains("Merbridge") && !other.contains("SockHash full"),
            "{other}"
        );
        let full = insert_failure_cause(3, 0, Some(4), &[]).unwrap();
        assert_eq!(
            full,
            "SockHash full (4 sockets; 0 now): raise --max-sockets"
        );
        // A sock_ops program alone does not take the socket's sk_msg slot.
        let sock_ops_only: Vec<OtherProgram> =
            o.iter().filter(|p| p.kind == "sock_ops").cloned().collect();
        let full = insert_failure_cause(3, 0, Some(4), &sock_ops_only).unwrap();
        assert!(full.starts_with("SockHash full"), "{full}");
    }
}
