//! A schema check of the chart and of `deploy/` with kubeconform, against the schemas
//! of the cluster's own API server: its OpenAPI v2 document (`/openapi/v2`) turned into
//! one standalone JSON schema per kind (references inlined, strict: no field the API
//! does not know), since no schema registry is reachable here. The conversion is pure.

use std::{collections::BTreeMap, path::Path, process::Command};

use anyhow::{Context as _, Result, ensure};
use serde_json::{Map, Value, json};

use crate::kube::{FIX, k};

/// The kinds the chart and `deploy/` render (only their schemas are written: all of
/// the API's would be hundreds of files).
pub const KINDS: [&str; 13] = [
    "Namespace",
    "ServiceAccount",
    "ConfigMap",
    "Service",
    "Pod",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "DaemonSet",
    "Job",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
];

/// One schema file per kind in `kinds` of the OpenAPI v2 `doc`, named as the
/// kubeconform template [`TEMPLATE`] asks (`<kind>_<group or v1>_<version>.json`): the
/// kind's definition by reference, with only the definitions it reaches (pure).
pub fn schemas(doc: &Value, kinds: &[&str]) -> BTreeMap<String, Value> {
    let defs = doc["definitions"].as_object().cloned().unwrap_or_default();
    let mut out = BTreeMap::new();
    for (name, def) in &defs {
        let Some(gvks) = def["x-kubernetes-group-version-kind"].as_array() else {
            continue;
        };
        for gvk in gvks {
            let (group, version, kind) = (
                gvk["group"].as_str().unwrap_or(""),
                gvk["version"].as_str().unwrap_or(""),
                gvk["kind"].as_str().unwrap_or(""),
            );
            if !kinds.contains(&kind) {
                continue;
            }
            let group = if group.is_empty() { version } else { group };
            let reached: Map<String, Value> = reachable(name, &defs)
                .into_iter()
                .filter_map(|n| defs.get(&n).map(|d| (n, strict(d))))
                .collect();
            out.insert(
                format!("{}_{}_{}.json", kind.to_lowercase(), group, version),
                json!({
                    "$schema": "http://json-schema.org/draft-07/schema#",
                    "$ref": format!("#/definitions/{name}"),
                    "definitions": reached,
                }),
            );
        }
    }
    out
}

/// The kubeconform `-schema-location` for a directory of [`schemas`].
pub const TEMPLATE: &str = "{{ .ResourceKind }}_{{ .Group }}_{{ .ResourceAPIVersion }}.json";

/// The definitions `root` reaches through `$ref`s, itself included.
fn reachable(root: &str, defs: &Map<String, Value>) -> Vec<String> {
    let mut seen = vec![root.to_owned()];
    let mut todo = vec![root.to_owned()];
    while let Some(name) = todo.pop() {
        let mut refs = Vec::new();
        if let Some(d) = defs.get(&name) {
            collect_refs(d, &mut refs);
        }
        for r in refs {
            if !seen.contains(&r) {
                seen.push(r.clone());
                todo.push(r);
            }
        }
    }
    seen
}

fn collect_refs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            if let Some(r) = m.get("$ref").and_then(Value::as_str) {
                out.push(r.trim_start_matches("#/definitions/").to_owned());
            }
            m.values().for_each(|x| collect_refs(x, out));
        }
        Value::Array(a) => a.iter().for_each(|x| collect_refs(x, out)),
        _ => {}
    }
}

/// A definition made strict (objects closed to unknown fields) and lenient where YAML
/// is (int-or-string, quantities as numbers) (pure).
fn strict(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            if m.get("format").and_then(Value::as_str) == Some("int-or-string") {
                return json!({"oneOf": [{"type": "string"}, {"type": "integer"}]});
            }
            if m.get("format").and_then(Value::as_str) == Some("quantity") {
                return json!({"oneOf": [{"type": "string"}, {"type": "number"}]});
            }
            let open = m.contains_key("x-kubernetes-preserve-unknown-fields");
            let mut out = Map::new();
            for (key, val) in m {
                if key.starts_with("x-kubernetes-") {
                    continue;
                }
                let val = if key == "properties" {
                    Value::Object(
                        val.as_object()
                            .map(|p| p.iter().map(|(k, s)| (k.clone(), strict(s))).collect())
                            .unwrap_or_default(),
                    )
                } else {
                    strict(val)
                };
                out.insert(key.clone(), val);
            }
            if out.contains_key("properties") && !out.contains_key("additionalProperties") && !open
            {
                out.insert("additionalProperties".into(), Value::Bool(false));
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(strict).collect()),
        other => other.clone(),
    }
}

/// Writes the cluster's schemas into `dir` (once per run).
pub fn write_cluster_schemas(dir: &Path) -> Result<()> {
    let doc: Value =
        serde_json::from_str(&k(&["get", "--raw", "/openapi/v2"])?).context("parse /openapi/v2")?;
    std::fs::create_dir_all(dir)?;
    let all = schemas(&doc, &KINDS);
    ensure!(
        all.contains_key("daemonset_apps_v1.json") && all.contains_key("configmap_v1_v1.json"),
        "no DaemonSet or ConfigMap schema in /openapi/v2"
    );
    for (name, schema) in all {
        std::fs::write(dir.join(name), serde_json::to_vec(&schema)?)?;
    }
    Ok(())
}

/// kubeconform, strict, on `files` against the schemas in `dir`; `skip` kinds (CRDs the
/// cluster does not serve). Its summary, or an error with every finding.
pub fn kubeconform(dir: &Path, files: &[&Path], skip: &[&str]) -> Result<String> {
    let bin = kube_testenv::env_path("BYPASS_KUBECONFORM", FIX)?;
    let mut cmd = Command::new(bin);
    cmd.args(["-strict", "-summary", "-output", "text", "-schema-location"])
        .arg(format!("{}/{TEMPLATE}", dir.display()));
    if !skip.is_empty() {
        cmd.args(["-skip", &skip.join(",")]);
    }
    cmd.args(files);
    let out = cmd.output().context("run kubeconform")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(out.status.success(), "kubeconform: {text}");
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_file_per_kind_with_what_it_reaches() {
        let doc = json!({"definitions": {
            "io.k8s.api.apps.v1.DaemonSet": {
                "x-kubernetes-group-version-kind": [{"group": "apps", "version": "v1", "kind": "DaemonSet"}],
                "properties": {
                    "spec": {"$ref": "#/definitions/Spec"},
                    "kind": {"type": "string"}
                }
            },
            "Spec": {"properties": {
                "max": {"type": "string", "format": "int-or-string"},
                "self": {"$ref": "#/definitions/Spec"}
            }},
            "Unrelated": {"properties": {"x": {"type": "string"}}},
            "io.k8s.api.core.v1.ConfigMap": {
                "x-kubernetes-group-version-kind": [{"group": "", "version": "v1", "kind": "ConfigMap"}],
                "properties": {"data": {"type": "object", "additionalProperties": {"type": "string"}}}
            },
            "io.k8s.api.core.v1.Secret": {
                "x-kubernetes-group-version-kind": [{"group": "", "version": "v1", "kind": "Secret"}]
            }
        }});
        let s = schemas(&doc, &KINDS);
        assert_eq!(
            s.keys().collect::<Vec<_>>(),
            ["configmap_v1_v1.json", "daemonset_apps_v1.json"]
        );
        let ds = &s["daemonset_apps_v1.json"];
        assert_eq!(ds["$ref"], "#/definitions/io.k8s.api.apps.v1.DaemonSet");
        let defs = ds["definitions"].as_object().unwrap();
        assert_eq!(defs.len(), 2, "the kind and Spec, not Unrelated: {defs:?}");
        assert_eq!(defs["Spec"]["additionalProperties"], false);
        assert_eq!(
            defs["Spec"]["properties"]["max"]["oneOf"][1]["type"],
            "integer"
        );
        assert_eq!(
            defs["Spec"]["properties"]["self"]["$ref"],
            "#/definitions/Spec"
        );
    }
}
