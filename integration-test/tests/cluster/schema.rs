//! A schema check of the chart and of `deploy/` with kubeconform, against the schemas
//! of the cluster's own API server: its OpenAPI v2 document (`/openapi/v2`) turned into
//! one standalone JSON schema per kind (references inlined, strict: no field the API
//! does not know), since no schema registry is reachable here. The conversion is pure.

use std::{collections::BTreeMap, path::Path, process::Command};

use anyhow::{Context as _, Result, ensure};
use serde_json::{Map, Value, json};

use crate::kube::{FIX, k};

/// How deep references are inlined (recursive types such as a CRD's JSONSchemaProps are
/// cut there, to "anything").
const MAX_DEPTH: usize = 24;

/// One schema file per kind of the OpenAPI v2 `doc`, named as the kubeconform template
/// [`TEMPLATE`] asks: `<kind>_<group or v1>_<version>.json` (pure).
pub fn schemas(doc: &Value) -> BTreeMap<String, Value> {
    let defs = doc["definitions"].as_object().cloned().unwrap_or_default();
    let mut out = BTreeMap::new();
    for def in defs.values() {
        let Some(gvks) = def["x-kubernetes-group-version-kind"].as_array() else {
            continue;
        };
        for gvk in gvks {
            let (group, version, kind) = (
                gvk["group"].as_str().unwrap_or(""),
                gvk["version"].as_str().unwrap_or(""),
                gvk["kind"].as_str().unwrap_or(""),
            );
            let group = if group.is_empty() { version } else { group };
            let mut schema = inline(def, &defs, 0);
            schema["$schema"] = json!("http://json-schema.org/draft-07/schema#");
            out.insert(
                format!("{}_{}_{}.json", kind.to_lowercase(), group, version),
                schema,
            );
        }
    }
    out
}

/// The kubeconform `-schema-location` for a directory of [`schemas`].
pub const TEMPLATE: &str = "{{ .ResourceKind }}_{{ .Group }}_{{ .ResourceAPIVersion }}.json";

/// `v` with its references inlined, int-or-string and quantities accepting numbers,
/// and objects closed to unknown fields (pure).
fn inline(v: &Value, defs: &Map<String, Value>, depth: usize) -> Value {
    match v {
        Value::Object(m) => {
            if let Some(r) = m.get("$ref").and_then(Value::as_str) {
                let name = r.trim_start_matches("#/definitions/");
                if depth >= MAX_DEPTH {
                    return json!({});
                }
                return match defs.get(name) {
                    Some(d) => inline(d, defs, depth + 1),
                    None => json!({}),
                };
            }
            if m.get("format").and_then(Value::as_str) == Some("int-or-string") {
                return json!({"oneOf": [{"type": "string"}, {"type": "integer"}]});
            }
            let mut out = Map::new();
            for (key, val) in m {
                if key.starts_with("x-kubernetes-") && key != "x-kubernetes-preserve-unknown-fields"
                {
                    continue;
                }
                let val = match key.as_str() {
                    // Names of fields, not schemas.
                    "properties" | "definitions" => Value::Object(
                        val.as_object()
                            .map(|p| {
                                p.iter()
                                    .map(|(k, s)| (k.clone(), inline(s, defs, depth)))
                                    .collect()
                            })
                            .unwrap_or_default(),
                    ),
                    _ => inline(val, defs, depth),
                };
                out.insert(key.clone(), val);
            }
            if out.contains_key("properties")
                && !out.contains_key("additionalProperties")
                && !out.contains_key("x-kubernetes-preserve-unknown-fields")
            {
                out.insert("additionalProperties".into(), Value::Bool(false));
            }
            // A quantity (resources) may be written as a number in YAML.
            if out.get("type").and_then(Value::as_str) == Some("string")
                && out.get("format").and_then(Value::as_str) == Some("quantity")
            {
                return json!({"oneOf": [{"type": "string"}, {"type": "number"}]});
            }
            out.remove("x-kubernetes-preserve-unknown-fields");
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(|x| inline(x, defs, depth)).collect()),
        other => other.clone(),
    }
}

/// Writes the cluster's schemas into `dir` (once per run).
pub fn write_cluster_schemas(dir: &Path) -> Result<()> {
    let doc: Value =
        serde_json::from_str(&k(&["get", "--raw", "/openapi/v2"])?).context("parse /openapi/v2")?;
    std::fs::create_dir_all(dir)?;
    let all = schemas(&doc);
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
    fn references_inlined_and_objects_closed() {
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
            "io.k8s.api.core.v1.ConfigMap": {
                "x-kubernetes-group-version-kind": [{"group": "", "version": "v1", "kind": "ConfigMap"}],
                "properties": {"data": {"type": "object", "additionalProperties": {"type": "string"}}}
            }
        }});
        let s = schemas(&doc);
        assert_eq!(
            s.keys().collect::<Vec<_>>(),
            ["configmap_v1_v1.json", "daemonset_apps_v1.json"]
        );
        let ds = &s["daemonset_apps_v1.json"];
        assert_eq!(ds["additionalProperties"], false);
        assert_eq!(ds["properties"]["spec"]["additionalProperties"], false);
        assert_eq!(
            ds["properties"]["spec"]["properties"]["max"]["oneOf"][1]["type"],
            "integer"
        );
        // Recursion ends.
        assert!(ds.to_string().len() < 100_000);
    }
}
