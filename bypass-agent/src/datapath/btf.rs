//! Member offsets of kernel structures from the running kernel's BTF
//! (`/sys/kernel/btf/vmlinux`), for the fields the programs read
//! ([`bypass_common::KernelLayout`]). A pure parse of the BTF
//! bytes (the format is include/uapi/linux/btf.h); only the header, struct/union
//! members and the string table are interpreted, every other kind is skipped by size.

use bypass_common::{KernelLayout, layout::Source};
use thiserror::Error;

/// Where the running kernel publishes its BTF.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

const BTF_MAGIC: u16 = 0xeb9f;
const KIND_INT: u32 = 1;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_ENUM64: u32 = 19;
/// `BTF_KIND_TYPEDEF`.
pub const KIND_TYPEDEF: u32 = 8;
/// `BTF_KIND_FUNC`.
pub const KIND_FUNC: u32 = 12;

/// Why an offset could not be found.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum BtfError {
    /// The bytes are not BTF of this machine's byte order.
    #[error("not BTF (bad magic or header)")]
    BadHeader,
    /// A type record runs past the end of the type section.
    #[error("truncated BTF type section")]
    Truncated,
    /// A type kind this parser does not know how to skip.
    #[error("unknown BTF kind {kind}")]
    UnknownKind {
        /// The kind number.
        kind: u32,
    },
    /// No struct of that name.
    #[error("no struct {name} in BTF")]
    NoStruct {
        /// The struct.
        name: String,
    },
    /// The struct has no such member (directly or in an anonymous struct/union).
    #[error("struct {strukt} has no member {member}")]
    NoMember {
        /// The struct.
        strukt: String,
        /// The member.
        member: String,
    },
    /// The member is a bitfield or lies beyond 4 GiB.
    #[error("struct {strukt} member {member} is not byte-addressable")]
    NotByteAligned {
        /// The struct.
        strukt: String,
        /// The member.
        member: String,
    },
}

/// Why the running kernel's BTF could not be used.
#[derive(Debug, Error)]
pub enum VmlinuxError {
    /// [`VMLINUX_BTF`] could not be read.
    #[error("{path}: {0}", path = VMLINUX_BTF)]
    Read(#[source] std::io::Error),
    /// It is not BTF this parser understands.
    #[error("{path}: {0}", path = VMLINUX_BTF)]
    Parse(#[source] BtfError),
}

/// The fields every load needs that this kernel's BTF lacks.
#[derive(Debug, Error)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct MissingFields(pub Vec<BtfError>);

#[derive(Clone, Copy)]
struct Member {
    name_off: u32,
    type_id: u32,
    bit_offset: u32,
}

struct Type {
    name_off: u32,
    kind: u32,
    /// Size in bytes (structs and unions); for a `FUNC`, its prototype's type id.
    size: u32,
    members: Vec<Member>,
    /// Members, parameters or values (`vlen`).
    vlen: u32,
}

/// Parsed BTF: named structs and unions with their members.
pub struct Btf {
    types: Vec<Type>,
    strings: Vec<u8>,
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

impl Btf {
    /// The running kernel's BTF, from [`VMLINUX_BTF`].
    pub fn vmlinux() -> Result<Self, VmlinuxError> {
        let bytes = std::fs::read(VMLINUX_BTF).map_err(VmlinuxError::Read)?;
        Self::parse(&bytes).map_err(VmlinuxError::Parse)
    }

    /// Parses raw BTF (little-endian, as on x86_64 and arm64).
    pub fn parse(bytes: &[u8]) -> Result<Self, BtfError> {
        let header = |at| u32_at(bytes, at).ok_or(BtfError::BadHeader);
        if u16_at(bytes, 0) != Some(BTF_MAGIC) {
            return Err(BtfError::BadHeader);
        }
        let hdr_len = header(4)? as usize;
        let (type_off, type_len) = (header(8)? as usize, header(12)? as usize);
        let (str_off, str_len) = (header(16)? as usize, header(20)? as usize);
        let section = |off: usize, len: usize| {
            let start = hdr_len.checked_add(off).ok_or(BtfError::BadHeader)?;
            let end = start.checked_add(len).ok_or(BtfError::BadHeader)?;
            bytes.get(start..end).ok_or(BtfError::BadHeader)
        };
        let t = section(type_off, type_len)?;
        let strings = section(str_off, str_len)?.to_vec();
        // Type ids start at 1; id 0 is void.
        let mut types = vec![Type {
            name_off: 0,
            kind: 0,
            size: 0,
            members: Vec::new(),
            vlen: 0,
        }];
        let mut p = 0;
        while p < t.len() {
            let word = |at: usize| u32_at(t, at).ok_or(BtfError::Truncated);
            let (name_off, info, size) = (word(p)?, word(p + 4)?, word(p + 8)?);
            p += 12;
            let kind = (info >> 24) & 0x1f;
            let vlen = (info & 0xffff) as usize;
            let kind_flag = info >> 31 == 1;
            let mut members = Vec::new();
            let extra = match kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                KIND_ARRAY => 12,
                KIND_STRUCT | KIND_UNION => {
                    for i in 0..vlen {
                        let m = p + 12 * i;
                        let raw = word(m + 8)?;
                        members.push(Member {
                            name_off: word(m)?,
                            type_id: word(m + 4)?,
                            // With kind_flag the high 8 bits are a bitfield size.
                            bit_offset: if kind_flag { raw & 0x00ff_ffff } else { raw },
                        });
                    }
                    12 * vlen
                }
                KIND_ENUM => {
                    for i in 0..vlen {
                        let m = p + 8 * i;
                        // An enumerator: its name and value (kept in `type_id`).
                        members.push(Member {
                            name_off: word(m)?,
                            type_id: word(m + 4)?,
                            bit_offset: 0,
                        });
                    }
                    8 * vlen
                }
                KIND_FUNC_PROTO => 8 * vlen,
                KIND_DATASEC | KIND_ENUM64 => 12 * vlen,
                // PTR, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT, FUNC, FLOAT, TYPE_TAG.
                2 | 7..=12 | 16 | 18 => 0,
                _ => return Err(BtfError::UnknownKind { kind }),
            };
            p += extra;
            if p > t.len() {
                return Err(BtfError::Truncated);
            }
            types.push(Type {
                name_off,
                kind,
                size,
                members,
                vlen: vlen as u32,
            });
        }
        Ok(Self { types, strings })
    }

    fn name(&self, off: u32) -> &[u8] {
        let rest = self.strings.get(off as usize..).unwrap_or_default();
        let end = rest.iter().position(|&c| c == 0).unwrap_or(rest.len());
        &rest[..end]
    }

    fn find_struct(&self, strukt: &str) -> Result<&Type, BtfError> {
        self.types
            .iter()
            .find(|t| t.kind == KIND_STRUCT && self.name(t.name_off) == strukt.as_bytes())
            .ok_or_else(|| BtfError::NoStruct {
                name: strukt.to_owned(),
            })
    }

    /// The type id of the type of `kind` named `name` (ids start at 1).
    pub fn type_id(&self, kind: u32, name: &str) -> Option<u32> {
        self.types
            .iter()
            .position(|t| t.kind == kind && self.name(t.name_off) == name.as_bytes())
            .and_then(|i| u32::try_from(i).ok())
    }

    /// The value of enumerator `member` of `enum name` (32-bit enums).
    pub fn enum_value(&self, name: &str, member: &str) -> Option<i64> {
        self.types
            .iter()
            .filter(|t| t.kind == KIND_ENUM && self.name(t.name_off) == name.as_bytes())
            .flat_map(|t| t.members.iter())
            .find(|m| self.name(m.name_off) == member.as_bytes())
            .map(|m| i64::from(m.type_id as i32))
    }

    /// How many parameters the kernel function `name` takes (its `FUNC`'s prototype).
    pub fn func_params(&self, name: &str) -> Option<u32> {
        let func = self.types.get(self.type_id(KIND_FUNC, name)? as usize)?;
        let proto = self.types.get(func.size as usize)?;
        (proto.kind == KIND_FUNC_PROTO).then_some(proto.vlen)
    }

    /// Size in bytes of `struct strukt`.
    pub fn struct_size(&self, strukt: &str) -> Result<u32, BtfError> {
        self.find_struct(strukt).map(|t| t.size)
    }

    /// Byte offset of `member` in `struct strukt`, looking into anonymous structs and
    /// unions the way C does.
    pub fn member_offset(&self, strukt: &str, member: &str) -> Result<u32, BtfError> {
        let st = self.find_struct(strukt)?;
        let bits = self
            .find_member(st, member.as_bytes(), 0, 0)
            .ok_or_else(|| BtfError::NoMember {
                strukt: strukt.to_owned(),
                member: member.to_owned(),
            })?;
        if bits % 8 != 0 {
            return Err(BtfError::NotByteAligned {
                strukt: strukt.to_owned(),
                member: member.to_owned(),
            });
        }
        u32::try_from(bits / 8).map_err(|_| BtfError::NotByteAligned {
            strukt: strukt.to_owned(),
            member: member.to_owned(),
        })
    }

    fn find_member(&self, t: &Type, member: &[u8], base: u64, depth: u32) -> Option<u64> {
        if depth > 8 {
            return None;
        }
        for m in &t.members {
            let at = base + u64::from(m.bit_offset);
            if m.name_off != 0 && self.name(m.name_off) == member {
                return Some(at);
            }
            if m.name_off == 0 {
                let inner = self.types.get(m.type_id as usize)?;
                if (inner.kind == KIND_STRUCT || inner.kind == KIND_UNION)
                    && let Some(found) = self.find_member(inner, member, at, depth + 1)
                {
                    return Some(found);
                }
            }
        }
        None
    }

    /// The offsets the datapath needs ([`KernelLayout::FIELDS`]); a field this kernel
    /// lacks stays 0 (unknown), and its absence is reported.
    pub fn kernel_layout(&self) -> (KernelLayout, Vec<BtfError>) {
        let mut missing = Vec::new();
        let mut no_zerocopy_bit = false;
        let mut layout = KernelLayout::default();
        for (field, slot) in KernelLayout::FIELDS.iter().zip(layout.fields_mut()) {
            *slot = match self.resolve(field.source) {
                Ok(v) => v,
                Err((e, fallback)) => {
                    no_zerocopy_bit |= field.name == "sock_zerocopy";
                    missing.push(e);
                    fallback
                }
            };
        }
        if no_zerocopy_bit {
            // Without the bit the flag is not read.
            layout.sk_flags = 0;
        }
        (layout, missing)
    }

    /// The value of one catalogue field on this kernel, or why it is missing and the
    /// value it takes then.
    fn resolve(&self, source: Source) -> Result<u32, (BtfError, u32)> {
        match source {
            // A bitfield (`sk_userlocks` before Linux 6.x) is NotByteAligned: not read.
            Source::Member { strukt, member, or } => {
                let first = self.member_offset(strukt, member);
                match (first, or) {
                    (Err(_), Some((strukt, member))) => self.member_offset(strukt, member),
                    (first, _) => first,
                }
                .map_err(|e| (e, 0))
            }
            Source::Bit { name, value } => match self.enum_value(name, value) {
                Some(bit) if (0..64).contains(&bit) => Ok(bit as u32),
                _ => Err((
                    BtfError::NoMember {
                        strukt: format!("enum {name}"),
                        member: value.into(),
                    },
                    0,
                )),
            },
            Source::MessageCost { strukt } => self
                .struct_size(strukt)
                .map(bypass_common::layout::message_cost)
                .map_err(|e| (e, bypass_common::names::DEFAULT_MSG_COST)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob with: 1 int, 2 `struct inner { int b; int c; }`, 3 `struct outer {
    /// int a; struct inner x; union { int d; }; }` where the union is type 4.
    fn sample() -> Vec<u8> {
        let strings = b"\0int\0inner\0b\0c\0outer\0a\0x\0d\0";
        let name = |s: &str| {
            let needle = format!("\0{s}\0");
            strings
                .windows(needle.len())
                .position(|w| w == needle.as_bytes())
                .map(|p| p as u32 + 1)
                .unwrap()
        };
        let mut t = Vec::new();
        let mut push = |w: u32| t.extend_from_slice(&w.to_le_bytes());
        // 1: int
        push(name("int"));
        push(KIND_INT << 24);
        push(4);
        push(32);
        // 2: struct inner, two members
        push(name("inner"));
        push((KIND_STRUCT << 24) | 2);
        push(8);
        push(name("b"));
        push(1);
        push(0);
        push(name("c"));
        push(1);
        push(32);
        // 3: struct outer, three members, the last anonymous (type 4) at byte 12
        push(name("outer"));
        push((KIND_STRUCT << 24) | 3);
        push(16);
        push(name("a"));
        push(1);
        push(0);
        push(name("x"));
        push(2);
        push(32);
        push(0);
        push(4);
        push(96);
        // 4: anonymous union { int d; }
        push(0);
        push((KIND_UNION << 24) | 1);
        push(4);
        push(name("d"));
        push(1);
        push(0);
        let mut b = Vec::new();
        b.extend_from_slice(&BTF_MAGIC.to_le_bytes());
        b.extend_from_slice(&[1, 0]);
        for w in [
            24u32,
            0,
            t.len() as u32,
            t.len() as u32,
            strings.len() as u32,
        ] {
            b.extend_from_slice(&w.to_le_bytes());
        }
        b.extend_from_slice(&t);
        b.extend_from_slice(strings);
        b
    }

    #[test]
    fn offsets_of_direct_and_anonymous_members() {
        let btf = Btf::parse(&sample()).unwrap();
        assert_eq!(btf.member_offset("outer", "a"), Ok(0));
        assert_eq!(btf.member_offset("outer", "x"), Ok(4));
        assert_eq!(btf.member_offset("outer", "d"), Ok(12), "through the union");
        assert_eq!(btf.member_offset("inner", "c"), Ok(4));
        assert_eq!(btf.struct_size("outer"), Ok(16));
        assert_eq!(btf.struct_size("inner"), Ok(8));
        assert_eq!(btf.type_id(KIND_STRUCT, "outer"), Some(3));
        assert_eq!(btf.type_id(KIND_STRUCT, "nope"), None);
        assert!(matches!(
            btf.member_offset("outer", "b"),
            Err(BtfError::NoMember { .. })
        ));
        assert!(matches!(
            btf.member_offset("nope", "a"),
            Err(BtfError::NoStruct { .. })
        ));
    }

    #[test]
    fn rejects_garbage_and_truncation() {
        assert!(Btf::parse(b"not btf at all, not at all").is_err());
        let mut b = sample();
        b.truncate(b.len() - 30);
        assert!(Btf::parse(&b).is_err());
        let missing = Btf::parse(&sample()).unwrap().kernel_layout();
        assert_eq!(
            missing.0,
            KernelLayout {
                msg_cost: bypass_common::names::DEFAULT_MSG_COST,
                ..KernelLayout::default()
            }
        );
        assert_eq!(missing.1.len(), KernelLayout::FIELDS.len());
    }

    #[test]
    fn running_kernel_has_the_fields() {
        // The kernels this runs on all publish BTF (the agent needs it).
        let bytes = std::fs::read(VMLINUX_BTF).unwrap();
        let (layout, missing) = Btf::parse(&bytes).unwrap().kernel_layout();
        assert!(layout.has_required(), "{missing:?}");
        assert!(layout.tcp_copied_seq > layout.icsk_ulp_ops, "{layout:?}");
        assert!(
            (4096 + 512..=4096 + 4096).contains(&layout.msg_cost),
            "struct sk_msg's slab: {layout:?}"
        );
        assert!(layout.sk_flags != 0, "{missing:?}");
        assert_eq!(layout.sock_zerocopy, 18, "SOCK_ZEROCOPY since Linux 4.14");
        // The node's TCP memory counter, through the socket's protocol.
        assert!(
            layout.sk_prot != 0 && layout.proto_memory_allocated != 0,
            "{missing:?}"
        );
    }
}
