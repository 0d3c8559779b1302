//! `deploy/` as the chart rendered: `helm template` of `deploy/chart/bypass-agent` with
//! `deploy/values.yaml`, split into one file per template (`deploy/<template>.yaml`), so
//! `kubectl apply -k deploy/` and `helm install` cannot drift apart. `cargo xtask
//! render-deploy` writes them; the cluster tests check that they agree. Splitting is
//! pure; rendering runs `helm`.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

/// The release name `deploy/` is rendered with (its cluster-scoped objects' names).
pub const RELEASE: &str = "bypass-agent";
/// The namespace `deploy/` is rendered for.
pub const NAMESPACE: &str = "bypass-system";
/// The chart, under the repository.
pub const CHART: &str = "deploy/chart/bypass-agent";
/// The values `deploy/` is rendered with, under the repository.
pub const VALUES: &str = "deploy/values.yaml";
/// What every rendered file starts with.
pub const HEADER: &str = "# Rendered from deploy/chart/bypass-agent with deploy/values.yaml by `cargo xtask render-deploy`:\n# edit the chart or the values, not this file.\n";

/// `helm template` of the chart with `deploy/values.yaml`, as text, for the Kubernetes
/// release the tests run ([`crate::KUBE_VERSION`]; alone, `helm template` assumes
/// v1.20.0, which the chart's `kubeVersion` refuses).
pub fn render(helm: &Path, repo: &Path) -> Result<String> {
    xtask_lib::cmd::output_named(
        Command::new(helm)
            .args(["template", RELEASE])
            .arg(repo.join(CHART))
            .args(["--kube-version", crate::KUBE_VERSION])
            .args(["--namespace", NAMESPACE, "--values"])
            .arg(repo.join(VALUES)),
        "helm template",
    )
}

/// Splits `helm template` output into `deploy/` files (pure): one per template by its
/// `# Source:` line, named by the template's file name, each with [`HEADER`]. The
/// chart's tests (`templates/tests/`) are not part of `deploy/`.
pub fn split(rendered: &str) -> Result<BTreeMap<String, String>> {
    let mut files: BTreeMap<String, String> = BTreeMap::new();
    for doc in rendered
        .split("\n---\n")
        .map(|d| d.trim_start_matches("---\n"))
    {
        let Some(source) = doc
            .lines()
            .find_map(|l| l.strip_prefix("# Source: "))
            .map(str::trim)
        else {
            if doc.trim().is_empty() {
                continue;
            }
            bail!("a rendered document without a `# Source:` line: {doc}");
        };
        let rel = source
            .split_once("/templates/")
            .map(|(_, r)| r)
            .with_context(|| format!("source {source} is not a template"))?;
        if rel.starts_with("tests/") {
            continue;
        }
        let name = Path::new(rel)
            .file_name()
            .and_then(|n| n.to_str())
            .with_context(|| format!("source {source} has no file name"))?
            .to_owned();
        let body: String = doc
            .lines()
            .filter(|l| !l.starts_with("# Source: "))
            .map(|l| format!("{l}\n"))
            .collect();
        let file = files.entry(name).or_insert_with(|| HEADER.to_owned());
        if file.len() > HEADER.len() {
            file.push_str("---\n");
        }
        file.push_str(&body);
    }
    Ok(files)
}

/// The files of `deploy/` that are rendered ones (they start with [`HEADER`]).
pub fn rendered_files(deploy: &Path) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(deploy).with_context(|| format!("read {}", deploy.display()))? {
        let path: PathBuf = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()).map(str::to_owned) else {
            continue;
        };
        if !name.ends_with(".yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path)?;
        if text.starts_with(HEADER) {
            out.insert(name, text);
        }
    }
    Ok(out)
}

/// What differs between the files `deploy/` holds and what the chart renders (pure):
/// the names of files missing, extra or changed.
pub fn drift(have: &BTreeMap<String, String>, want: &BTreeMap<String, String>) -> Vec<String> {
    let mut out = Vec::new();
    for (name, text) in want {
        match have.get(name) {
            None => out.push(format!("{name}: missing")),
            Some(t) if t != text => out.push(format!("{name}: differs")),
            Some(_) => {}
        }
    }
    for name in have.keys().filter(|n| !want.contains_key(*n)) {
        out.push(format!("{name}: not rendered by the chart"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const RENDERED: &str = "---
# Source: bypass-agent/templates/serviceaccount.yaml
apiVersion: v1
kind: ServiceAccount
---
# Source: bypass-agent/templates/rbac.yaml
kind: ClusterRole
---
# Source: bypass-agent/templates/rbac.yaml
kind: ClusterRoleBinding
---
# Source: bypass-agent/templates/tests/check.yaml
kind: Pod
";

    #[test]
    fn one_file_per_template_without_the_tests() {
        let f = split(RENDERED).unwrap();
        assert_eq!(
            f.keys().collect::<Vec<_>>(),
            ["rbac.yaml", "serviceaccount.yaml"]
        );
        assert_eq!(
            f["rbac.yaml"],
            format!("{HEADER}kind: ClusterRole\n---\nkind: ClusterRoleBinding\n")
        );
        assert!(f["serviceaccount.yaml"].starts_with(HEADER));
    }

    #[test]
    fn drift_names_each_file() {
        let want = split(RENDERED).unwrap();
        assert!(drift(&want, &want).is_empty());
        let mut have = want.clone();
        have.insert("rbac.yaml".into(), "old".into());
        have.insert("extra.yaml".into(), HEADER.into());
        have.remove("serviceaccount.yaml");
        assert_eq!(
            drift(&have, &want),
            [
                "rbac.yaml: differs",
                "serviceaccount.yaml: missing",
                "extra.yaml: not rendered by the chart"
            ]
        );
    }
}
