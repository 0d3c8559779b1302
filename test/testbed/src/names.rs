//! Unique resource names: every netns, bridge, veth, cgroup and pin directory this
//! crate creates starts with a prefix ([`PREFIX`] unless [`set_prefix`] chose another)
//! and carries a per-process tag, so parallel users (other tests, other engineers)
//! never collide.

use std::sync::{
    OnceLock,
    atomic::{AtomicU32, Ordering},
};

/// Default prefix of everything we create.
pub const PREFIX: &str = "bt";

static CHOSEN_PREFIX: OnceLock<String> = OnceLock::new();

/// Uses `prefix` instead of [`PREFIX`] for every name made from now on (a tool that
/// shares the machine under its own prefix, e.g. the bench). One to four lower-case
/// letters or digits, so interface names stay within 15 characters. Only the first
/// successful call counts.
pub fn set_prefix(prefix: &str) -> Result<(), String> {
    let valid = (1..=4).contains(&prefix.len())
        && prefix
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if !valid {
        return Err(format!(
            "prefix {prefix:?} must be 1 to 4 lower-case letters or digits"
        ));
    }
    let chosen = CHOSEN_PREFIX.get_or_init(|| prefix.to_owned());
    if chosen != prefix {
        return Err(format!("the prefix is already {chosen:?}"));
    }
    Ok(())
}

/// The prefix in use.
pub fn prefix() -> &'static str {
    CHOSEN_PREFIX.get().map_or(PREFIX, String::as_str)
}

/// Interface names are at most this long (IFNAMSIZ - 1).
pub const IFNAME_MAX: usize = 15;

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A fresh tag: [`tag`] of this process and its next counter value.
pub fn unique_tag() -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    tag(std::process::id(), n)
}

/// The tag of process `pid`'s `n`-th instance: the pid and `n` in base 33 (the digits
/// `0`-`9`, `a`-`w`) with `x` between (at most 8 characters for any pid below 2^22 and
/// the first 1089 tags of a process), e.g. `3bj8x0`. No digit is an `x`, so the pid reads
/// back unambiguously ([`tag_pid`]); only characters every name allows (a Kubernetes
/// node's too).
pub fn tag(pid: u32, n: u32) -> String {
    format!("{}x{}", base33(u64::from(pid)), base33(u64::from(n)))
}

/// The pid a [`tag`] was made by.
pub fn tag_pid(tag: &str) -> Option<u32> {
    let (pid, n) = tag.split_once('x')?;
    let digits = |t: &str| {
        !t.is_empty()
            && t.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'w').contains(&b))
    };
    if !digits(pid) || !digits(n) {
        return None;
    }
    u32::from_str_radix(pid, 33).ok()
}

/// Lower-case base-33 digits of `n` (`0`-`9`, `a`-`w`).
fn base33(mut n: u64) -> String {
    const DIGITS: &[u8; 33] = b"0123456789abcdefghijklmnopqrstuvw";
    let mut out = Vec::new();
    loop {
        out.push(DIGITS[(n % 33) as usize]);
        n /= 33;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

/// `<prefix>-<tag>-<what>`, for netns, cgroup and pin directory names (no length limit).
pub fn resource(tag: &str, what: &str) -> String {
    format!("{}-{tag}-{what}", prefix())
}

/// An interface name `<prefix><kind><tag>`, checked against [`IFNAME_MAX`].
pub fn ifname(kind: &str, tag: &str) -> Result<String, String> {
    let name = format!("{}{kind}{tag}", prefix());
    if name.len() > IFNAME_MAX {
        return Err(format!("interface name {name} is longer than {IFNAME_MAX}"));
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base33_digits() {
        assert_eq!(base33(0), "0");
        assert_eq!(base33(32), "w");
        assert_eq!(base33(33), "10");
        assert!(!base33(4_194_303).contains('x'));
    }

    #[test]
    fn tags_are_unique_and_short() {
        let a = unique_tag();
        let b = unique_tag();
        assert_ne!(a, b);
        assert!(a.len() <= 8, "{a}");
        assert!(ifname("-br", &a).is_ok());
        assert!(ifname("-br", "123456789abc").is_err());
        assert_eq!(resource("t1", "a"), "bt-t1-a");
    }

    #[test]
    fn prefix_is_checked() {
        assert!(set_prefix("BB").is_err());
        assert!(set_prefix("toolong").is_err());
        assert!(set_prefix("").is_err());
        // The default stays: no valid prefix was set in this test binary.
        assert_eq!(prefix(), PREFIX);
    }
}
