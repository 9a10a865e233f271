//! The API reference of the book (`docs/src/reference/api.md`), rendered from
//! the CRDs the provider ships ([`crate::manifests::crds`]): every field of
//! the six kinds by its dotted path, with its type, default, allowed values,
//! whether it can change, and its description.
//!
//! `cargo xtask manifests` writes it beside the CRDs, and the same test that
//! finds stale CRDs finds a stale reference.

use serde_json::Value;

use crate::manifests;

/// Where the reference lives, relative to the repository root.
pub const PATH: &str = "docs/src/reference/api.md";

/// One field of a kind's schema.
#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    /// Dotted path from the object's root, `[]` for a list's items: `spec.hosts[].uri`.
    pub path: String,
    pub type_: String,
    pub default: Option<String>,
    /// Required, ranges, lengths, patterns, enums and the other CEL rules.
    pub allowed: Vec<String>,
    pub mutability: Option<String>,
    pub description: String,
}

/// Every documented field of a CRD, depth first, `spec` before `status`.
/// `apiVersion`, `kind` and `metadata` are Kubernetes' own and left out.
pub fn fields(crd: &Value, template_kind: bool) -> Vec<Field> {
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    let mut out = Vec::new();
    let Some(props) = schema["properties"].as_object() else { return out };
    for (name, prop) in props {
        if matches!(name.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        walk(name, name, prop, schema, template_kind, &mut out);
    }
    out
}

fn walk(path: &str, name: &str, prop: &Value, parent: &Value, template_kind: bool, out: &mut Vec<Field>) {
    out.push(describe(path, name, prop, parent, template_kind));
    let (inner, inner_path) = match prop["type"].as_str() {
        Some("array") => (&prop["items"], format!("{path}[]")),
        _ if prop["additionalProperties"].is_object() => (&prop["additionalProperties"], format!("{path}.*")),
        _ => (prop, path.to_string()),
    };
    if let Some(children) = inner["properties"].as_object() {
        for (child, child_prop) in children {
            walk(&format!("{inner_path}.{child}"), child, child_prop, inner, template_kind, out);
        }
    }
}

fn describe(path: &str, name: &str, prop: &Value, parent: &Value, template_kind: bool) -> Field {
    let mut allowed = Vec::new();
    if parent["required"].as_array().is_some_and(|r| r.iter().any(|n| n == name)) {
        allowed.push("required".to_string());
    }
    let items = if prop["type"] == "array" { &prop["items"] } else { &Value::Null };
    for (schema, prefix) in [(prop, ""), (items, "items: ")] {
        for (key, label) in [("minimum", "≥"), ("maximum", "≤")] {
            if let Some(n) = schema[key].as_f64() {
                allowed.push(format!("{prefix}{label} {n}"));
            }
        }
        for (key, label) in [("minLength", "length ≥"), ("maxLength", "length ≤")] {
            if let Some(n) = schema[key].as_u64() {
                allowed.push(format!("{prefix}{label} {n}"));
            }
        }
        if let Some(pattern) = schema["pattern"].as_str() {
            allowed.push(format!("{prefix}pattern `{pattern}`"));
        }
        if let Some(values) = schema["enum"].as_array() {
            let values: Vec<String> = values.iter().map(|v| format!("`{}`", compact(v))).collect();
            allowed.push(format!("{prefix}one of {}", values.join(", ")));
        }
    }
    for (key, label) in [("minItems", "items ≥"), ("maxItems", "items ≤")] {
        if let Some(n) = prop[key].as_u64() {
            allowed.push(format!("{label} {n}"));
        }
    }
    let mut mutability = Vec::new();
    for rule in rules(prop).chain(rules(items)) {
        if rule.0 == "self == oldSelf" {
            mutability.push("immutable".to_string());
        } else if !rule.0.contains("oldSelf") {
            allowed.push(rule.1.to_string());
        }
    }
    // Rules of the enclosing object that compare this field with its old value.
    for (rule, _) in rules(parent) {
        if rule.contains(&format!("!has(oldSelf.{name})")) {
            mutability.push("set once, then immutable".to_string());
        } else if rule.contains(&format!("has(self.{name}) == has(oldSelf.{name})")) {
            mutability.push("cannot be added or removed".to_string());
        }
    }
    if template_kind && path.starts_with("spec.template.spec.") {
        mutability.push("immutable (the template's whole spec)".to_string());
    }
    mutability.dedup();
    Field {
        path: path.to_string(),
        type_: type_name(prop),
        default: prop.get("default").map(compact),
        allowed,
        mutability: (!mutability.is_empty()).then(|| mutability.join("; ")),
        description: description(prop["description"].as_str().unwrap_or_default()),
    }
}

fn rules(schema: &Value) -> impl Iterator<Item = (&str, &str)> {
    schema["x-kubernetes-validations"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| (r["rule"].as_str().unwrap_or_default(), r["message"].as_str().unwrap_or_default()))
}

fn type_name(prop: &Value) -> String {
    if prop["x-kubernetes-int-or-string"] == true {
        return "int or string".into();
    }
    match prop["type"].as_str() {
        Some("array") => format!("[]{}", type_name(&prop["items"])),
        Some("object") if prop["additionalProperties"].is_object() => {
            format!("map[string]{}", type_name(&prop["additionalProperties"]))
        }
        Some(t) => match prop["format"].as_str() {
            Some(format) => format!("{t} ({format})"),
            None => t.to_string(),
        },
        None => "any".into(),
    }
}

fn compact(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The description as one line: paragraphs joined, up to a code block
/// (Kubernetes' Quantity explains its grammar in one).
fn description(text: &str) -> String {
    let prose = text.split("```").next().unwrap_or_default();
    prose.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A table cell: `|` escaped, and `<` outside inline code escaped so that a
/// placeholder such as `<name>` is not read as an HTML tag.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
        .split('`')
        .enumerate()
        .map(|(i, part)| if i % 2 == 0 { part.replace('<', "&lt;") } else { part.to_string() })
        .collect::<Vec<_>>()
        .join("`")
}

/// The whole page.
pub fn markdown() -> String {
    let mut out = String::from(
        "<!-- Generated by `cargo xtask manifests` from the CRDs. Do not edit by hand. -->\n\
         # API reference\n\n\
         The six kinds of `infrastructure.cluster.x-k8s.io/v1alpha1`, every field by its path \
         (`[]` marks a list's items, `.*` a map's values). **Allowed** lists what the API server \
         checks: required fields, ranges, lengths, patterns and the other validation rules. \
         **Changes** says whether a field can change once set: the CRDs' rules for LibvirtCluster \
         and LibvirtMachine, and for LibvirtMachineTemplate and LibvirtClusterTemplate the admission policy that keeps \
         `spec.template.spec` as it was created (except in CAPI's topology dry runs). A field \
         without an entry there can change.\n",
    );
    for crd in manifests::crds() {
        let kind = crd.spec.names.kind.clone();
        let scope = crd.spec.scope.clone();
        let value = serde_json::to_value(&crd).expect("CRD serializes");
        let version = &value["spec"]["versions"][0];
        out.push_str(&format!("\n## {kind}\n\n"));
        let schema_description =
            description(version["schema"]["openAPIV3Schema"]["description"].as_str().unwrap_or(""));
        if !schema_description.is_empty() {
            out.push_str(&format!("{schema_description}\n\n"));
        }
        out.push_str(&format!(
            "`kubectl get {}`; {scope}.\n\n| Field | Type | Default | Allowed | Changes | Description |\n|---|---|---|---|---|---|\n",
            crd.spec.names.plural
        ));
        for field in fields(&value, kind.ends_with("Template")) {
            out.push_str(&format!(
                "| `{}` | {} | {} | {} | {} | {} |\n",
                field.path,
                cell(&field.type_),
                field.default.map(|d| format!("`{}`", cell(&d))).unwrap_or_default(),
                cell(&field.allowed.join("; ")),
                field.mutability.unwrap_or_default(),
                cell(&field.description),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine_fields() -> Vec<Field> {
        let crd = manifests::crds().into_iter().find(|c| c.spec.names.kind == "LibvirtMachine").unwrap();
        fields(&serde_json::to_value(&crd).unwrap(), false)
    }

    #[test]
    fn a_field_carries_its_default_range_and_immutability() {
        let fields = machine_fields();
        let vcpu = fields.iter().find(|f| f.path == "spec.vcpu").unwrap();
        assert_eq!(vcpu.default.as_deref(), Some("1"));
        assert!(vcpu.allowed.contains(&"≥ 1".to_string()) && vcpu.allowed.contains(&"≤ 255".to_string()), "{vcpu:?}");
        assert_eq!(vcpu.mutability.as_deref(), Some("immutable"));
        let provider_id = fields.iter().find(|f| f.path == "spec.providerID").unwrap();
        assert_eq!(provider_id.mutability.as_deref(), Some("set once, then immutable"));
        let image = fields.iter().find(|f| f.path == "spec.image").unwrap();
        assert!(!image.allowed.iter().any(|a| a == "required"), "one of image and imageURL: {image:?}");
        assert!(image.allowed.iter().any(|a| a.starts_with("pattern")), "{image:?}");
        let url = fields.iter().find(|f| f.path == "spec.imageURL.url").unwrap();
        assert!(url.allowed.iter().any(|a| a == "required"), "{url:?}");
        assert!(url.allowed.iter().any(|a| a.starts_with("pattern")), "{url:?}");
        assert!(fields.iter().any(|f| f.path == "spec.additionalNetworks[].bridge"));
    }

    #[test]
    fn template_fields_are_immutable_through_the_policy() {
        let crd = manifests::crds().into_iter().find(|c| c.spec.names.kind == "LibvirtMachineTemplate").unwrap();
        let fields = fields(&serde_json::to_value(&crd).unwrap(), true);
        let vcpu = fields.iter().find(|f| f.path == "spec.template.spec.vcpu").unwrap();
        assert!(vcpu.mutability.as_deref().unwrap().contains("template"), "{vcpu:?}");
        assert!(fields.iter().any(|f| f.path.starts_with("status.capacity")));
    }
}
