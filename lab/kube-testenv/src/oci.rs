//! `cargo xtask image --oci DIR`: the agent image for every architecture the project
//! builds (amd64 natively, arm64 with Debian's cross toolchain) as one OCI image index
//! in an OCI image layout (`oci-layout`, `index.json`, `blobs/sha256/`), each image with
//! an SPDX SBOM attached as an OCI 1.1 artifact whose `subject` is that image. Built
//! with no registry and no container tool: `skopeo copy oci:DIR docker://REGISTRY/...`
//! (or `podman manifest push`) publishes it, and the chart's `image.digest` pins the
//! index's digest. The documents are pure functions; writing blobs is thin I/O.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use serde_json::{Value, json};
use xtask_lib::cmd;

use crate::image::ImageSpec;

/// `application/vnd.oci.image.index.v1+json`.
pub const INDEX: &str = "application/vnd.oci.image.index.v1+json";
/// `application/vnd.oci.image.manifest.v1+json`.
pub const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// `application/vnd.oci.image.config.v1+json`.
pub const CONFIG: &str = "application/vnd.oci.image.config.v1+json";
/// A gzip-compressed layer.
pub const LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
/// The SBOM's media and artifact type.
pub const SPDX: &str = "application/spdx+json";
/// The empty config of an artifact (OCI 1.1).
pub const EMPTY: &str = "application/vnd.oci.empty.v1+json";

/// A content descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    /// Media type.
    pub media_type: String,
    /// `sha256:...`.
    pub digest: String,
    /// Bytes.
    pub size: u64,
}

impl Descriptor {
    /// As JSON.
    pub fn json(&self) -> Value {
        json!({"mediaType": self.media_type, "digest": self.digest, "size": self.size})
    }
}

/// An image manifest (pure).
pub fn image_manifest(config: &Descriptor, layer: &Descriptor) -> Value {
    json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": config.json(),
        "layers": [layer.json()],
    })
}

/// The SBOM artifact manifest for `subject` (pure): OCI 1.1 referrers.
pub fn sbom_manifest(sbom: &Descriptor, empty: &Descriptor, subject: &Descriptor) -> Value {
    json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "artifactType": SPDX,
        "config": empty.json(),
        "layers": [sbom.json()],
        "subject": subject.json(),
        "annotations": {"org.opencontainers.image.created": "1970-01-01T00:00:00Z"},
    })
}

/// One platform's entries in the index.
#[derive(Debug, Clone)]
pub struct Platform {
    /// `amd64`, `arm64`.
    pub arch: String,
    /// Its image manifest.
    pub image: Descriptor,
    /// Its SBOM manifest.
    pub sbom: Descriptor,
}

/// The index (pure): every image with its platform, every SBOM as an artifact naming
/// its image, and the reference name `tag`.
pub fn index(platforms: &[Platform], tag: &str) -> Value {
    let mut manifests = Vec::new();
    for p in platforms {
        let mut image = p.image.json();
        image["platform"] = json!({"architecture": p.arch, "os": "linux"});
        manifests.push(image);
    }
    for p in platforms {
        let mut sbom = p.sbom.json();
        sbom["artifactType"] = json!(SPDX);
        sbom["annotations"] = json!({
            "org.opencontainers.image.ref.name": format!("{tag}-{}.sbom", p.arch),
            "dev.bypass.sbom.of": p.image.digest,
        });
        manifests.push(sbom);
    }
    json!({
        "schemaVersion": 2,
        "mediaType": INDEX,
        "manifests": manifests,
        "annotations": {"org.opencontainers.image.ref.name": tag},
    })
}

/// The image config of `spec` for `arch` (pure), in the OCI layout and the docker
/// archives alike: `diff_id` is the uncompressed layer's `sha256:...`.
pub fn config(spec: &ImageSpec, arch: &str, diff_id: &str) -> Value {
    let labels: serde_json::Map<String, Value> = spec
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    json!({
        "architecture": arch,
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "Entrypoint": if spec.entrypoint.is_empty() { Value::Null } else { spec.entrypoint.clone().into() },
            "Cmd": spec.cmd,
            "Labels": labels,
            "WorkingDir": "/",
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    })
}

/// One package of the SBOM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Package {
    /// Name.
    pub name: String,
    /// Version.
    pub version: String,
    /// Package URL (`pkg:cargo/...`, `pkg:deb/debian/...`).
    pub purl: String,
}

/// An SPDX 2.3 document of what the image holds (pure).
pub fn spdx(image: &str, arch: &str, packages: &[Package]) -> Value {
    let pkgs: Vec<Value> = packages
        .iter()
        .enumerate()
        .map(|(i, p)| {
            json!({
                "SPDXID": format!("SPDXRef-Package-{i}"),
                "name": p.name,
                "versionInfo": p.version,
                "downloadLocation": "NOASSERTION",
                "filesAnalyzed": false,
                "externalRefs": [{
                    "referenceCategory": "PACKAGE-MANAGER",
                    "referenceType": "purl",
                    "referenceLocator": p.purl,
                }],
            })
        })
        .collect();
    let relationships: Vec<Value> = (0..packages.len())
        .map(|i| {
            json!({
                "spdxElementId": "SPDXRef-DOCUMENT",
                "relationshipType": "DESCRIBES",
                "relatedSpdxElement": format!("SPDXRef-Package-{i}"),
            })
        })
        .collect();
    json!({
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": format!("{image} ({arch})"),
        "documentNamespace": format!("https://bypass.dev/spdx/{image}/{arch}"),
        "creationInfo": {"created": "1970-01-01T00:00:00Z", "creators": ["Tool: cargo xtask image"]},
        "packages": pkgs,
        "relationships": relationships,
    })
}

/// The crates of `cargo tree --prefix none -e normal` output (pure): `name vX (path)`
/// lines, each once; the workspace's own path crates included with their version.
pub fn cargo_packages(tree: &str) -> Vec<Package> {
    let mut out: Vec<Package> = Vec::new();
    for line in tree.lines() {
        let mut words = line.split_whitespace();
        let (Some(name), Some(v)) = (words.next(), words.next()) else {
            continue;
        };
        let Some(version) = v.strip_prefix('v') else {
            continue;
        };
        if out.iter().any(|p| p.name == name && p.version == version) {
            continue;
        }
        out.push(Package {
            name: name.to_owned(),
            version: version.to_owned(),
            purl: format!("pkg:cargo/{name}@{version}"),
        });
    }
    out.sort_by(|a, b| (&a.name, &a.version).cmp(&(&b.name, &b.version)));
    out
}

/// An OCI image layout being written.
pub struct Layout {
    dir: PathBuf,
}

impl Layout {
    /// A fresh layout at `dir`.
    pub fn create(dir: &Path) -> Result<Self> {
        if dir.exists() {
            std::fs::remove_dir_all(dir).with_context(|| format!("clean {}", dir.display()))?;
        }
        std::fs::create_dir_all(dir.join("blobs/sha256"))?;
        std::fs::write(
            dir.join("oci-layout"),
            json!({"imageLayoutVersion": "1.0.0"}).to_string(),
        )?;
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }

    /// Stores `bytes` as a blob of `media_type`.
    pub fn blob(&self, media_type: &str, bytes: &[u8]) -> Result<Descriptor> {
        let tmp = self.dir.join("blobs/incoming");
        std::fs::write(&tmp, bytes)?;
        let d = self.adopt(media_type, &tmp)?;
        Ok(d)
    }

    /// Moves file `path` into the blobs as `media_type`.
    pub fn adopt(&self, media_type: &str, path: &Path) -> Result<Descriptor> {
        let hex = sha256(path)?;
        let size = std::fs::metadata(path)?.len();
        std::fs::rename(path, self.dir.join("blobs/sha256").join(&hex))?;
        Ok(Descriptor {
            media_type: media_type.to_owned(),
            digest: format!("sha256:{hex}"),
            size,
        })
    }

    /// Writes `index.json`.
    pub fn finish(&self, index: &Value) -> Result<()> {
        std::fs::write(
            self.dir.join("index.json"),
            serde_json::to_vec_pretty(index)?,
        )?;
        Ok(())
    }
}

/// `sha256sum` of `path`, hex.
pub fn sha256(path: &Path) -> Result<String> {
    let out = cmd::output(std::process::Command::new("sha256sum").arg(path))?;
    out.split_whitespace()
        .next()
        .map(str::to_owned)
        .context("sha256sum printed nothing")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(media: &str, hex: char) -> Descriptor {
        Descriptor {
            media_type: media.into(),
            digest: format!("sha256:{}", hex.to_string().repeat(64)),
            size: 10,
        }
    }

    #[test]
    fn an_index_of_two_platforms_with_their_sboms() {
        let p = |arch: &str, i, s| Platform {
            arch: arch.into(),
            image: d(MANIFEST, i),
            sbom: d(MANIFEST, s),
        };
        let idx = index(&[p("amd64", 'a', 'b'), p("arm64", 'c', 'e')], "0.1.0");
        assert_eq!(idx["mediaType"], INDEX);
        let m = idx["manifests"].as_array().unwrap();
        assert_eq!(m.len(), 4);
        assert_eq!(m[0]["platform"]["architecture"], "amd64");
        assert_eq!(m[1]["platform"]["architecture"], "arm64");
        assert_eq!(m[2]["artifactType"], SPDX);
        assert_eq!(m[3]["annotations"]["dev.bypass.sbom.of"], m[1]["digest"]);
        let s = sbom_manifest(&d(SPDX, 'f'), &d(EMPTY, '4'), &d(MANIFEST, 'a'));
        assert_eq!(s["subject"]["digest"], m[0]["digest"]);
        assert_eq!(s["artifactType"], SPDX);
        assert_eq!(
            image_manifest(&d(CONFIG, '1'), &d(LAYER_GZIP, '2'))["layers"][0]["mediaType"],
            LAYER_GZIP
        );
        let spec = ImageSpec {
            entrypoint: vec!["/e".into()],
            labels: vec![("a".into(), "b".into())],
            ..ImageSpec::default()
        };
        let c = config(&spec, "arm64", "sha256:x");
        assert_eq!(c["architecture"], "arm64");
        assert_eq!(c["rootfs"]["diff_ids"][0], "sha256:x");
        assert_eq!(c["config"]["Entrypoint"][0], "/e");
        assert_eq!(c["config"]["Labels"]["a"], "b");
        let bare = config(&ImageSpec::default(), "amd64", "sha256:x");
        assert_eq!(bare["config"]["Entrypoint"], Value::Null);
    }

    #[test]
    fn sbom_lists_each_crate_once_with_its_purl() {
        let tree =
            "bypass-agent v0.1.0 (/w/bypass-agent)\naya v0.14.0\nlibc v0.2.191\naya v0.14.0\n\n";
        let p = cargo_packages(tree);
        assert_eq!(
            p.iter().map(|p| p.purl.as_str()).collect::<Vec<_>>(),
            [
                "pkg:cargo/aya@0.14.0",
                "pkg:cargo/bypass-agent@0.1.0",
                "pkg:cargo/libc@0.2.191"
            ]
        );
        let doc = spdx("bypass-agent:0.1.0", "arm64", &p);
        assert_eq!(doc["spdxVersion"], "SPDX-2.3");
        assert_eq!(doc["packages"].as_array().unwrap().len(), 3);
        assert_eq!(doc["relationships"][0]["relationshipType"], "DESCRIBES");
    }
}
