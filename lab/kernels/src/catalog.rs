//! Pure: the kernels the matrix boots (a Debian package each, found in Debian's package
//! indexes), what each run checks, and the parsing of those indexes.

/// One kernel of the matrix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kernel {
    /// The name given to `cargo xtask test --kernel`.
    pub name: &'static str,
    /// Debian architecture (`amd64`, `arm64`).
    pub arch: &'static str,
    /// The Debian suites whose package indexes are searched (on the mirror this
    /// machine's apt sources name: see `fetch::mirror`).
    pub suites: &'static [&'static str],
    /// The package name, with `*` standing for the ABI number or version.
    pub package: &'static str,
    /// Extra kernel command line.
    pub cmdline: &'static str,
    /// What the run expects of the agent.
    pub expect: Expect,
    /// Who runs on it, for the README table.
    pub note: &'static str,
}

/// What a kernel's run expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// The agent loads: run the privileged tests.
    Loads,
    /// The agent refuses to start with one line (a kernel older than the minimum).
    Refuses,
    /// The agent loads and redirects one pod-to-pod transfer, byte-exact (a foreign
    /// architecture: the privileged tests need the host's tools, which do not run there).
    Smoke,
}

const BOOKWORM: &[&str] = &["bookworm", "bookworm-updates", "bookworm-security"];
const BULLSEYE: &[&str] = &["bullseye", "bullseye-security"];
const TRIXIE: &[&str] = &["trixie", "trixie-updates", "trixie-security"];
/// Debian 13's backports: the newest stable kernels of each upstream line.
const TRIXIE_BACKPORTS: &[&str] = &["trixie-backports"];

/// Every kernel the matrix knows.
pub const KERNELS: &[Kernel] = &[
    Kernel {
        name: "6.1",
        arch: "amd64",
        suites: BOOKWORM,
        package: "linux-image-6.1.0-*-amd64",
        cmdline: "",
        expect: Expect::Loads,
        note: "Debian 12, Bottlerocket, EKS AL2023",
    },
    Kernel {
        name: "6.12-lockdown",
        arch: "amd64",
        suites: BOOKWORM,
        package: "linux-image-6.12.*+deb12-amd64",
        cmdline: "lockdown=confidentiality",
        expect: Expect::Loads,
        note: "6.12 booted with lockdown=confidentiality (its sockmap has the queue length)",
    },
    Kernel {
        name: "6.12",
        arch: "amd64",
        suites: TRIXIE,
        package: "linux-image-6.12.*+deb13-amd64",
        cmdline: "",
        expect: Expect::Loads,
        note: "Debian 13 (Debian 12's backports: the same 6.12 line)",
    },
    Kernel {
        name: "7.3",
        arch: "amd64",
        suites: TRIXIE_BACKPORTS,
        package: "linux-image-7.3.*+deb13-amd64",
        cmdline: "",
        expect: Expect::Loads,
        note: "the newest upstream line (Debian 13 backports)",
    },
    Kernel {
        name: "7.3-cloud",
        arch: "amd64",
        suites: TRIXIE_BACKPORTS,
        package: "linux-image-7.3.*+deb13-cloud-amd64",
        cmdline: "",
        expect: Expect::Loads,
        note: "7.3's cloud flavour, the kernel Debian's cloud images boot (no 9p: the host's root over virtiofs)",
    },
    Kernel {
        name: "6.18",
        arch: "amd64",
        suites: TRIXIE_BACKPORTS,
        package: "linux-image-6.18.*+deb13-amd64",
        cmdline: "",
        expect: Expect::Loads,
        note: "6.18 (Debian 13 backports), with the sockmap FIONREAD series of 6.19 and 6.18.14+",
    },
    Kernel {
        name: "5.10",
        arch: "amd64",
        suites: BULLSEYE,
        package: "linux-image-5.10.0-*-amd64",
        cmdline: "",
        expect: Expect::Refuses,
        note: "Debian 11: below the minimum",
    },
    Kernel {
        name: "6.1-arm64",
        arch: "arm64",
        suites: BOOKWORM,
        package: "linux-image-6.1.0-*-arm64",
        cmdline: "",
        expect: Expect::Smoke,
        note: "Debian 12 on arm64 (Graviton, Ampere): smoke test",
    },
];

/// The kernel named `name`.
pub fn find(name: &str) -> Option<&'static Kernel> {
    KERNELS.iter().find(|k| k.name == name)
}

/// The Debian archive URIs in apt sources (`deb822` `.sources` files or one-line
/// `sources.list`): the main archive (`…/debian`) and the security archive
/// (`…/debian-security`), each the first one named. Suites of other releases live on
/// the same mirror, so the matrix uses whatever mirror this machine is set up with.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Mirrors {
    /// The main archive's base URI.
    pub main: Option<String>,
    /// The security archive's base URI.
    pub security: Option<String>,
}

impl Mirrors {
    /// Takes every URI in `text` (one apt sources file).
    pub fn add_sources(&mut self, text: &str) {
        for line in text.lines().map(str::trim) {
            if line.starts_with('#') {
                continue;
            }
            let uris: Vec<&str> = if let Some(rest) = line.strip_prefix("URIs:") {
                rest.split_whitespace().collect()
            } else if let Some(rest) = line.strip_prefix("deb ") {
                // `deb [options] uri suite components...`
                let rest = match rest.trim_start().strip_prefix('[') {
                    Some(opts) => opts.split_once(']').map_or("", |(_, r)| r),
                    None => rest,
                };
                rest.split_whitespace().take(1).collect()
            } else {
                Vec::new()
            };
            for uri in uris {
                let uri = uri.trim_end_matches('/');
                let slot = if uri.ends_with("/debian-security") {
                    &mut self.security
                } else if uri.ends_with("/debian") {
                    &mut self.main
                } else {
                    continue;
                };
                slot.get_or_insert_with(|| uri.to_owned());
            }
        }
    }

    /// The base URI that serves `suite`.
    pub fn base(&self, suite: &str) -> Option<&str> {
        if suite.ends_with("-security") {
            self.security.as_deref()
        } else {
            self.main.as_deref()
        }
    }
}

/// One binary package of an index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// `Package:`.
    pub package: String,
    /// `Version:`.
    pub version: String,
    /// `Filename:` (relative to the archive's base URL).
    pub filename: String,
    /// `SHA256:`.
    pub sha256: String,
    /// `Depends:` (empty when absent).
    pub depends: String,
}

impl Entry {
    /// The packages this one is only a name for: its dependencies pinned to its own
    /// version (`linux-binary-X (= V)`, `linux-modules-X (= V)`, `linux-base-X (= V)`).
    /// Debian's kernels from 6.16 on split `linux-image-X` into those, the image itself
    /// (vmlinuz) in `linux-binary-X`, the modules in `linux-modules-X`; earlier ones have
    /// none.
    pub fn parts(&self) -> Vec<String> {
        let pin = format!("(= {})", self.version);
        self.depends
            .split(',')
            .map(str::trim)
            // An alternative (`a | b`) is a choice, never a part.
            .filter(|d| !d.contains('|'))
            .filter_map(|d| {
                let (name, constraint) = d.split_once(' ')?;
                (constraint.trim() == pin).then(|| name.to_owned())
            })
            .collect()
    }
}

/// The entries of a `Packages` index whose name matches `pattern` (`*`: any run of
/// characters other than `-`... digits, dots and `+`).
pub fn matching(index: &str, pattern: &str) -> Vec<Entry> {
    let mut out = Vec::new();
    for stanza in index.split("\n\n") {
        let field = |name: &str| {
            stanza.lines().find_map(|l| {
                l.strip_prefix(name)
                    .and_then(|r| r.strip_prefix(": "))
                    .map(str::trim)
                    .map(str::to_owned)
            })
        };
        let (Some(package), Some(version), Some(filename), Some(sha256)) = (
            field("Package"),
            field("Version"),
            field("Filename"),
            field("SHA256"),
        ) else {
            continue;
        };
        if glob(pattern, &package) {
            out.push(Entry {
                package,
                version,
                filename,
                sha256,
                depends: field("Depends").unwrap_or_default(),
            });
        }
    }
    out
}

/// `pattern` with one `*` standing for digits, dots and `+` (an ABI number or a
/// version), nothing else.
pub fn glob(pattern: &str, name: &str) -> bool {
    let Some((head, tail)) = pattern.split_once('*') else {
        return pattern == name;
    };
    name.len() >= head.len() + tail.len()
        && name.starts_with(head)
        && name.ends_with(tail)
        && name[head.len()..name.len() - tail.len()]
            .chars()
            .all(|c| c.is_ascii_digit() || c == '.' || c == '+')
        && name.len() > head.len() + tail.len()
}

/// The numbers in a Debian version, in order, to compare versions of one package line
/// (enough for kernel images: `6.1.176-1` < `6.1.180-1`).
fn numbers(version: &str) -> Vec<u64> {
    version
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .filter_map(|s| s.parse().ok())
        .collect()
}

/// The newest entry: by the numbers in its package name (the ABI), then its version.
pub fn newest(entries: Vec<Entry>) -> Option<Entry> {
    entries
        .into_iter()
        .max_by_key(|e| (numbers(&e.package), numbers(&e.version)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const INDEX: &str = "Package: linux-image-6.1.0-47-amd64\nVersion: 6.1.170-3\n\
Filename: pool/main/l/linux-signed-amd64/a.deb\nSHA256: aa\n\n\
Package: linux-image-6.1.0-50-amd64\nVersion: 6.1.176-1\n\
Filename: pool/main/l/linux-signed-amd64/b.deb\nSHA256: bb\n\n\
Package: linux-image-6.1.0-50-cloud-amd64\nVersion: 6.1.176-1\n\
Filename: pool/main/l/linux-signed-amd64/c.deb\nSHA256: cc\n\n\
Package: linux-image-6.12.117+deb12-amd64\nVersion: 6.12.117-1~deb12u1\n\
Filename: pool/main/l/linux-signed-amd64/d.deb\nSHA256: dd\n\n\
Package: busybox-static\nVersion: 1:1.35.0-4+b3\n\
Filename: pool/main/b/busybox/e.deb\nSHA256: ee\n";

    #[test]
    fn finds_the_newest_generic_image() {
        let found = newest(matching(INDEX, "linux-image-6.1.0-*-amd64")).unwrap();
        assert_eq!(found.package, "linux-image-6.1.0-50-amd64");
        assert_eq!(found.sha256, "bb");
        let twelve = newest(matching(INDEX, "linux-image-6.12.*+deb12-amd64")).unwrap();
        assert_eq!(twelve.version, "6.12.117-1~deb12u1");
        assert!(matching(INDEX, "linux-image-5.10.0-*-amd64").is_empty());
        let busybox = newest(matching(INDEX, "busybox-static")).unwrap();
        assert_eq!(busybox.filename, "pool/main/b/busybox/e.deb");
    }

    #[test]
    fn split_images_name_their_parts() {
        let index = "Package: linux-image-7.3.4+deb13-cloud-amd64\nVersion: 7.3.4-1~bpo13+1\n\
Depends: dracut | initramfs-tools (>= 0.120+deb8u2) | linux-initramfs-tool, \
linux-base-7.3.4+deb13-cloud-amd64 (= 7.3.4-1~bpo13+1), \
linux-binary-7.3.4+deb13-cloud-amd64 (= 7.3.4-1~bpo13+1), \
linux-modules-7.3.4+deb13-cloud-amd64 (= 7.3.4-1~bpo13+1)\n\
Filename: pool/main/l/linux-signed-amd64/i.deb\nSHA256: ii\n";
        let e = newest(matching(index, "linux-image-7.3.*+deb13-cloud-amd64")).unwrap();
        assert_eq!(
            e.parts(),
            [
                "linux-base-7.3.4+deb13-cloud-amd64",
                "linux-binary-7.3.4+deb13-cloud-amd64",
                "linux-modules-7.3.4+deb13-cloud-amd64"
            ]
        );
        // 6.1's image is whole: its dependencies are tools, not parts.
        let whole = newest(matching(INDEX, "linux-image-6.1.0-*-amd64")).unwrap();
        assert!(whole.parts().is_empty());
        assert!(!glob("linux-image-7.3.*+deb13-amd64", &e.package));
    }

    #[test]
    fn mirrors_from_apt_sources() {
        let mut m = Mirrors::default();
        m.add_sources(
            "Types: deb\nURIs: http://mirror.example/debian/\nSuites: bookworm\n\n\
             Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n",
        );
        m.add_sources(
            "# deb http://old.example/debian bookworm main\n\
             deb [arch=amd64 signed-by=/k.gpg] https://other.example/debian bookworm main\n\
             deb https://packages.example/apt cloud main\n",
        );
        assert_eq!(m.base("bullseye"), Some("http://mirror.example/debian"));
        assert_eq!(
            m.base("bookworm-updates"),
            Some("http://mirror.example/debian")
        );
        assert_eq!(
            m.base("bullseye-security"),
            Some("http://mirror.example/debian-security")
        );
        let mut one_line = Mirrors::default();
        one_line.add_sources("deb [signed-by=/k.gpg] https://other.example/debian bookworm main\n");
        assert_eq!(
            one_line.base("bookworm"),
            Some("https://other.example/debian")
        );
        assert_eq!(one_line.base("bookworm-security"), None);
    }

    #[test]
    fn globs_take_numbers_only() {
        assert!(glob(
            "linux-image-6.1.0-*-amd64",
            "linux-image-6.1.0-50-amd64"
        ));
        assert!(!glob(
            "linux-image-6.1.0-*-amd64",
            "linux-image-6.1.0-50-cloud-amd64"
        ));
        assert!(!glob(
            "linux-image-6.1.0-*-amd64",
            "linux-image-6.1.0--amd64"
        ));
    }

    #[test]
    fn only_kernels_below_the_minimum_expect_a_refusal() {
        use bypass_common::{KernelVersion, MIN_KERNEL};
        for k in KERNELS {
            let mut numbers = k.name.split(['.', '-']).map(|n| n.parse::<u32>());
            let (Some(Ok(major)), Some(Ok(minor))) = (numbers.next(), numbers.next()) else {
                panic!("kernel {} is not named major.minor", k.name);
            };
            let below = KernelVersion { major, minor } < MIN_KERNEL;
            assert_eq!(below, k.expect == Expect::Refuses, "kernel {}", k.name);
        }
    }

    #[test]
    fn every_kernel_is_findable_and_unique() {
        for k in KERNELS {
            assert_eq!(find(k.name), Some(k));
        }
        let mut names: Vec<_> = KERNELS.iter().map(|k| k.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), KERNELS.len());
    }
}
