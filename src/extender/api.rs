//! Wire types of the kube-scheduler extender (`k8s.io/kube-scheduler/extender/v1`).
//! The Go structs carry no json tags: the scheduler sends and expects the Go field
//! names. We emit them exactly and accept any letter case on input, as Go does.

use std::sync::Arc;

use k8s_openapi::List;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde::Serialize;
use serde_json::Value;
use serde_json::value::RawValue;

/// `ExtenderArgs`: the pod and the candidate nodes, as objects or as names.
#[derive(Debug, Clone)]
pub struct ExtenderArgs {
    pub pod: Pod,
    pub nodes: Option<Vec<Node>>,
    pub node_names: Option<Vec<String>>,
}

/// `ExtenderFilterResult`.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ExtenderFilterResult {
    #[serde(rename = "Nodes")]
    pub nodes: Option<List<Node>>,
    #[serde(rename = "NodeNames")]
    pub node_names: Option<Vec<String>>,
    #[serde(rename = "FailedNodes")]
    pub failed_nodes: NodeReasons,
    #[serde(rename = "FailedAndUnresolvableNodes")]
    pub failed_and_unresolvable_nodes: NodeReasons,
    #[serde(rename = "Error")]
    pub error: String,
}

/// Node name → why it failed, written as a JSON object. Kept as a list of shared
/// strings: an unschedulable pod has a reason for every candidate (thousands), and most
/// candidates share a handful of distinct reasons.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeReasons(pub Vec<(Arc<str>, Arc<str>)>);

impl NodeReasons {
    pub fn insert(&mut self, node: impl Into<Arc<str>>, reason: impl Into<Arc<str>>) {
        self.0.push((node.into(), reason.into()));
    }

    pub fn get(&self, node: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| &**n == node)
            .map(|(_, reason)| &**reason)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Serialize for NodeReasons {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().map(|(node, reason)| (&**node, &**reason)))
    }
}

/// Find `key` in a JSON object ignoring letter case (Go's decoder does the same).
pub fn field<'a>(object: &'a serde_json::Map<String, Value>, key: &str) -> Option<&'a Value> {
    object
        .get(key)
        .or_else(|| {
            object
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(key))
                .map(|(_, v)| v)
        })
        .filter(|v| !v.is_null())
}

impl ExtenderArgs {
    /// Decode a request body; the error says which part is wrong. Top-level keys are
    /// matched in any letter case; each part is decoded straight from its raw text.
    pub fn from_json(body: &[u8]) -> Result<Self, String> {
        let parts: std::collections::HashMap<String, &RawValue> = serde_json::from_slice(body)
            .map_err(|e| {
                if e.is_data() {
                    "request must be a JSON object with Pod and NodeNames or Nodes".to_string()
                } else {
                    format!("request is not valid JSON: {e}")
                }
            })?;
        let part = |key: &str| {
            parts
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(key))
                .map(|(_, v)| *v)
                .filter(|v| v.get() != "null")
        };
        let pod: Pod = decode_raw("Pod", part("Pod").ok_or("request has no Pod")?)?;
        let node_names = part("NodeNames")
            .map(|raw| decode_raw::<Vec<String>>("NodeNames", raw))
            .transpose()?;
        let nodes = match part("Nodes") {
            Some(raw) => {
                let list: Value = decode_raw("Nodes", raw)?;
                let Value::Object(list) = list else {
                    return Err("Nodes: expected a NodeList object".into());
                };
                let items = field(&list, "items")
                    .cloned()
                    .unwrap_or(Value::Array(Vec::new()));
                Some(decode::<Vec<Node>>("Nodes.items", &items)?)
            }
            None => None,
        };
        if nodes.is_none() && node_names.is_none() {
            return Err("request has neither NodeNames nor Nodes".into());
        }
        Ok(ExtenderArgs {
            pod,
            nodes,
            node_names,
        })
    }
}

pub fn decode<T: serde::de::DeserializeOwned>(what: &str, value: &Value) -> Result<T, String> {
    serde_path_to_error::deserialize(value).map_err(|e| located(what, e))
}

/// Like [`decode`], from raw JSON text (no intermediate `Value`). Decodes untracked
/// first (tracking the path costs a third of decoding 5,000 node names); only a part
/// that fails is decoded again with its path, for the error message.
pub fn decode_raw<T: serde::de::DeserializeOwned>(what: &str, raw: &RawValue) -> Result<T, String> {
    serde_json::from_str(raw.get()).or_else(|_| {
        let mut deserializer = serde_json::Deserializer::from_str(raw.get());
        serde_path_to_error::deserialize(&mut deserializer).map_err(|e| located(what, e))
    })
}

fn located<E: std::fmt::Display>(what: &str, e: serde_path_to_error::Error<E>) -> String {
    let path = e.path().to_string();
    let at = if path == "." {
        String::new()
    } else {
        format!(" at {path}")
    };
    format!("{what}{at}: {}", e.inner())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn accepts_any_letter_case_and_both_forms() {
        let args = ExtenderArgs::from_json(
            br#"{"pod": {"metadata": {"name": "p"}}, "nodenames": ["a", "b"], "Nodes": null}"#,
        )
        .unwrap();
        assert_eq!(args.node_names.unwrap(), ["a", "b"]);
        assert!(args.nodes.is_none());
        let args = ExtenderArgs::from_json(
            br#"{"Pod": {}, "Nodes": {"metadata": {}, "items": [{"metadata": {"name": "n1"}}]}, "NodeNames": null}"#,
        )
        .unwrap();
        assert_eq!(args.nodes.unwrap()[0].metadata.name.as_deref(), Some("n1"));
    }

    #[test]
    fn errors_name_the_part_that_is_wrong() {
        let err = |body: &str| ExtenderArgs::from_json(body.as_bytes()).unwrap_err();
        assert!(err("{").starts_with("request is not valid JSON"));
        assert_eq!(err(r#"{"NodeNames": []}"#), "request has no Pod");
        assert_eq!(
            err(r#"{"Pod": {}}"#),
            "request has neither NodeNames nor Nodes"
        );
        let bad = err(r#"{"Pod": {"spec": {"containers": 5}}, "NodeNames": []}"#);
        assert!(
            bad.starts_with("Pod at spec.containers: invalid type"),
            "{bad}"
        );
        assert!(err(r#"{"Pod": {}, "NodeNames": "a"}"#).starts_with("NodeNames: invalid type"));
    }

    #[test]
    fn result_uses_exact_go_field_names() {
        let result = ExtenderFilterResult {
            node_names: Some(vec!["n1".into()]),
            ..Default::default()
        };
        let json = serde_json::to_value(&result).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"Nodes": null, "NodeNames": ["n1"], "FailedNodes": {},
                "FailedAndUnresolvableNodes": {}, "Error": ""})
        );
    }

    #[test]
    fn reasons_are_a_json_object_of_node_to_text() {
        let shared: Arc<str> = Arc::from("no GPU has room");
        let mut reasons = NodeReasons::default();
        reasons.insert("n1", shared.clone());
        reasons.insert("n2", shared);
        reasons.insert("n3", "node has no GPUs");
        assert_eq!(reasons.get("n3"), Some("node has no GPUs"));
        assert_eq!(
            serde_json::to_value(&reasons).unwrap(),
            serde_json::json!({"n1": "no GPU has room", "n2": "no GPU has room", "n3": "node has no GPUs"})
        );
    }
}
