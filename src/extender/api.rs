//! Wire types of the kube-scheduler extender (`k8s.io/kube-scheduler/extender/v1`).
//! The Go structs carry no json tags: the scheduler sends and expects the Go field
//! names. We emit them exactly and accept any letter case on input, as Go does.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;
use serde_json::value::RawValue;

use crate::wire::{self, Bounded, MAX_NODES, decode_raw, object_parts};

/// `ExtenderArgs`: the pod and the candidate nodes, as objects or as names.
///
/// Node objects a caller sends are never believed: only their names are read, and the
/// cluster's own view of each node decides (docs/security.md). The raw objects are kept
/// to answer in the form the request used.
#[derive(Debug, Clone)]
pub struct ExtenderArgs {
    pub pod: Pod,
    pub nodes: Option<Vec<GivenNode>>,
    pub node_names: Option<Vec<String>>,
}

/// A node object from the request: its name, and its JSON text to echo back.
#[derive(Debug, Clone)]
pub struct GivenNode {
    pub name: String,
    pub raw: Box<RawValue>,
}

/// `ExtenderFilterResult`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ExtenderFilterResult {
    #[serde(rename = "Nodes")]
    pub nodes: Option<NodeItems>,
    #[serde(rename = "NodeNames")]
    pub node_names: Option<Vec<String>>,
    #[serde(rename = "FailedNodes")]
    pub failed_nodes: NodeReasons,
    #[serde(rename = "FailedAndUnresolvableNodes")]
    pub failed_and_unresolvable_nodes: NodeReasons,
    #[serde(rename = "Error")]
    pub error: String,
}

/// A `NodeList` of the node objects the request carried, echoed unchanged.
#[derive(Debug, Clone, Default)]
pub struct NodeItems(pub Vec<Box<RawValue>>);

impl Serialize for NodeItems {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut list = serializer.serialize_map(Some(2))?;
        list.serialize_entry("metadata", &serde_json::json!({}))?;
        list.serialize_entry("items", &self.0)?;
        list.end()
    }
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

impl ExtenderArgs {
    /// Decode a request body; the error says which part is wrong. Keys are matched in
    /// any letter case (Go's decoder does the same; very old schedulers sent
    /// `nodenames`), and every part is bounded (see `crate::wire`).
    pub fn from_json(body: &[u8]) -> Result<Self, String> {
        let [pod, names, nodes] =
            object_parts("request", wire::text(body)?, ["Pod", "NodeNames", "Nodes"]).map_err(
                |e| {
                    e.replace(
                        "a JSON object",
                        "a JSON object with Pod and NodeNames or Nodes",
                    )
                },
            )?;
        let pod = wire::pod::decode("Pod", pod.ok_or("request has no Pod")?.get())?;
        let node_names = names
            .map(|raw| decode_raw::<Bounded<String, MAX_NODES>>("NodeNames", raw.get()))
            .transpose()?
            .map(|names| names.0);
        let nodes = nodes.map(|raw| given_nodes(raw.get())).transpose()?;
        if nodes.is_none() && node_names.is_none() {
            return Err("request has neither NodeNames nor Nodes".into());
        }
        Ok(ExtenderArgs {
            pod,
            nodes,
            node_names,
        })
    }

    /// The candidates' names, in the order the scheduler sent them.
    pub fn candidate_names(&self) -> Vec<&str> {
        match (&self.node_names, &self.nodes) {
            (Some(names), _) => names.iter().map(String::as_str).collect(),
            (None, Some(nodes)) => nodes.iter().map(|n| n.name.as_str()).collect(),
            (None, None) => Vec::new(),
        }
    }
}

/// The `Nodes` part (a NodeList): each item's name and text, nothing else decoded.
fn given_nodes(raw: &str) -> Result<Vec<GivenNode>, String> {
    let [items] = object_parts("Nodes", raw, ["items"])
        .map_err(|e| e.replace("a JSON object", "a NodeList object"))?;
    let Some(items) = items else {
        return Ok(Vec::new());
    };
    let items: Bounded<&RawValue, MAX_NODES> = decode_raw("Nodes.items", items.get())?;
    items
        .0
        .into_iter()
        .enumerate()
        .map(|(index, item)| {
            let what = format!("Nodes.items[{index}]");
            let [metadata] = object_parts(&what, item.get(), ["metadata"])?;
            let name = match metadata {
                Some(m) => object_parts(&what, m.get(), ["name"])?[0]
                    .map(|n| decode_raw::<String>(&format!("{what}.metadata.name"), n.get()))
                    .transpose()?,
                None => None,
            };
            Ok(GivenNode {
                name: name.unwrap_or_default(),
                raw: item.to_owned(),
            })
        })
        .collect()
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
        assert_eq!(args.nodes.as_ref().unwrap()[0].name, "n1");
        assert_eq!(args.candidate_names(), ["n1"]);
    }

    #[test]
    fn lists_are_bounded_while_decoding() {
        let names = vec!["\"n\""; MAX_NODES + 1].join(",");
        let body = format!(r#"{{"Pod": {{}}, "NodeNames": [{names}]}}"#);
        let err = ExtenderArgs::from_json(body.as_bytes()).unwrap_err();
        assert!(
            err.contains(&format!("more than {MAX_NODES} elements")),
            "{err}"
        );
        let items = vec!["{}"; MAX_NODES + 1].join(",");
        let body = format!(r#"{{"Pod": {{}}, "Nodes": {{"items": [{items}]}}}}"#);
        let err = ExtenderArgs::from_json(body.as_bytes()).unwrap_err();
        assert!(err.starts_with("Nodes.items"), "{err}");
    }

    #[test]
    fn node_objects_are_echoed_unchanged() {
        let args = ExtenderArgs::from_json(
            br#"{"Pod": {}, "Nodes": {"items": [{"metadata": {"name": "n1"}, "status": {"x": 1}}]}}"#,
        )
        .unwrap();
        let result = ExtenderFilterResult {
            nodes: Some(NodeItems(
                args.nodes.unwrap().into_iter().map(|n| n.raw).collect(),
            )),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(&result).unwrap()["Nodes"],
            serde_json::json!({"metadata": {}, "items": [{"metadata": {"name": "n1"}, "status": {"x": 1}}]})
        );
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

/// `ExtenderBindingArgs`: bind this pod (by namespace, name and uid) to this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtenderBindingArgs {
    pub pod_name: String,
    pub pod_namespace: String,
    pub pod_uid: String,
    pub node: String,
}

/// `ExtenderBindingResult`: an empty `Error` means bound.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ExtenderBindingResult {
    #[serde(rename = "Error")]
    pub error: String,
}

/// Longest name a Kubernetes object can have (a DNS subdomain).
const MAX_NAME: usize = 253;

impl ExtenderBindingArgs {
    /// Decode a request body (keys in any letter case, as Go reads them); every field is
    /// required and bounded.
    pub fn from_json(body: &[u8]) -> Result<Self, String> {
        let keys = ["PodName", "PodNamespace", "PodUID", "Node"];
        let parts = object_parts("request", wire::text(body)?, keys)?;
        let mut fields = keys.iter().zip(parts).map(|(key, raw)| {
            let raw = raw.ok_or_else(|| format!("request has no {key}"))?;
            let value: String = decode_raw(key, raw.get())?;
            match value.len() {
                0 => Err(format!("{key} is empty")),
                n if n > MAX_NAME => Err(format!("{key} is {n} bytes long, over {MAX_NAME}")),
                _ => Ok(value),
            }
        });
        let mut next = || fields.next().unwrap_or_else(|| Err("missing field".into()));
        Ok(ExtenderBindingArgs {
            pod_name: next()?,
            pod_namespace: next()?,
            pod_uid: next()?,
            node: next()?,
        })
    }
}

#[cfg(test)]
mod binding_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn binding_args_read_in_any_letter_case() {
        let body = br#"{"podname":"p","PODNAMESPACE":"team-a","PodUID":"u-1","Node":"n1"}"#;
        let args = ExtenderBindingArgs::from_json(body).unwrap();
        assert_eq!(
            args,
            ExtenderBindingArgs {
                pod_name: "p".into(),
                pod_namespace: "team-a".into(),
                pod_uid: "u-1".into(),
                node: "n1".into(),
            }
        );
    }

    #[test]
    fn binding_args_name_what_is_missing_or_too_long() {
        let missing =
            ExtenderBindingArgs::from_json(br#"{"PodName":"p","PodNamespace":"a","Node":"n"}"#);
        assert_eq!(missing.unwrap_err(), "request has no PodUID");
        let long = format!(
            r#"{{"PodName":"{}","PodNamespace":"a","PodUID":"u","Node":"n"}}"#,
            "x".repeat(300)
        );
        let error = ExtenderBindingArgs::from_json(long.as_bytes()).unwrap_err();
        assert!(error.contains("PodName is 300 bytes long"), "{error}");
        let empty = ExtenderBindingArgs::from_json(
            br#"{"PodName":"p","PodNamespace":"a","PodUID":"","Node":"n"}"#,
        );
        assert_eq!(empty.unwrap_err(), "PodUID is empty");
    }
}
