//! Wire types of the kube-scheduler extender (`k8s.io/kube-scheduler/extender/v1`).
//! The Go structs carry no json tags: the scheduler sends and expects the Go field
//! names. We emit them exactly and accept any letter case on input, as Go does.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::core::v1::Pod;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::wire::{self, Bounded, MAX_NODES, decode_raw, object_parts};

/// `ExtenderArgs`: the pod and the candidate nodes, as objects or as names.
///
/// Node objects a caller sends are never believed: only their names are read, and the
/// cluster's own view of each node decides (docs/security.md). Their text stays in the
/// request's body, to answer in the form the request used.
#[derive(Debug, Clone)]
pub struct ExtenderArgs {
    pub pod: Pod,
    pub nodes: Option<Vec<GivenNode>>,
    pub node_names: Option<Vec<String>>,
    /// The request's body: `nodes` are spans of it.
    body: RequestBody,
}

/// A node object from the request: its name, and where its JSON text is in the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GivenNode {
    pub name: String,
    span: Range<usize>,
}

#[derive(Clone, Default)]
struct RequestBody(Bytes);

impl fmt::Debug for RequestBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<{} bytes>", self.0.len())
    }
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

/// A `NodeList` of node objects the request carried, echoed unchanged: spans of the
/// request's body, written back byte for byte.
#[derive(Debug, Clone, Default)]
pub struct NodeItems {
    body: RequestBody,
    spans: Vec<Range<usize>>,
}

impl NodeItems {
    /// The objects' JSON texts, in the request's order.
    pub fn texts(&self) -> impl Iterator<Item = &str> {
        self.bytes()
            .map(|bytes| std::str::from_utf8(bytes).unwrap_or_default())
    }

    fn bytes(&self) -> impl Iterator<Item = &[u8]> {
        self.spans
            .iter()
            .map(|span| self.body.0.get(span.clone()).unwrap_or_default())
    }

    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// `{"metadata":{},"items":[...]}` with each object's text as it came (each was
    /// checked to be valid JSON when the request was decoded), as pieces of the
    /// request's body, not copied. Objects that follow each other in the request (only
    /// a comma and spaces between them) go out as one piece: every node passing is the
    /// request's own array, whole.
    fn raw_pieces(&self, pieces: &mut Vec<Bytes>) {
        pieces.push(Bytes::from_static(br#"{"metadata":{},"items":["#));
        let body = &self.body.0;
        let mut run: Option<Range<usize>> = None;
        for span in &self.spans {
            run = match run {
                Some(run) if is_separator(body.get(run.end..span.start)) => {
                    Some(run.start..span.end)
                }
                Some(run) => {
                    pieces.extend(piece(body, run));
                    pieces.push(Bytes::from_static(b","));
                    Some(span.clone())
                }
                None => Some(span.clone()),
            };
        }
        pieces.extend(run.and_then(|run| piece(body, run)));
        pieces.push(Bytes::from_static(b"]}"));
    }
}

/// `range` of `body`, shared (spans come from decoding `body`: always inside it).
fn piece(body: &Bytes, range: Range<usize>) -> Option<Bytes> {
    (range.start <= range.end && range.end <= body.len()).then(|| body.slice(range))
}

/// Whether `between` two array elements is a comma among spaces.
fn is_separator(between: Option<&[u8]>) -> bool {
    let Some(between) = between else {
        return false;
    };
    let mut commas = 0;
    for byte in between {
        match byte {
            b',' => commas += 1,
            b' ' | b'\n' | b'\r' | b'\t' => {}
            _ => return false,
        }
    }
    commas == 1
}

impl Serialize for NodeItems {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{Error, SerializeMap};
        let items = self
            .texts()
            .map(serde_json::from_str::<&RawValue>)
            .collect::<Result<Vec<_>, _>>()
            .map_err(S::Error::custom)?;
        let mut list = serializer.serialize_map(Some(2))?;
        list.serialize_entry("metadata", &serde_json::json!({}))?;
        list.serialize_entry("items", &items)?;
        list.end()
    }
}

/// The answer as the HTTP response: what `Serialize` writes, but the node objects go
/// out as the request's own bytes instead of being parsed and written again (in the
/// `Nodes` form a pod without GPUs passes every node: the whole request comes back).
impl IntoResponse for ExtenderFilterResult {
    fn into_response(self) -> Response {
        #[derive(Serialize)]
        struct Rest<'a> {
            #[serde(rename = "NodeNames")]
            node_names: &'a Option<Vec<String>>,
            #[serde(rename = "FailedNodes")]
            failed_nodes: &'a NodeReasons,
            #[serde(rename = "FailedAndUnresolvableNodes")]
            failed_and_unresolvable_nodes: &'a NodeReasons,
            #[serde(rename = "Error")]
            error: &'a str,
        }
        let rest = Rest {
            node_names: &self.node_names,
            failed_nodes: &self.failed_nodes,
            failed_and_unresolvable_nodes: &self.failed_and_unresolvable_nodes,
            error: &self.error,
        };
        let rest = match serde_json::to_vec(&rest) {
            Ok(rest) => rest,
            Err(error) => {
                return (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response();
            }
        };
        let mut pieces = vec![Bytes::from_static(br#"{"Nodes":"#)];
        match &self.nodes {
            Some(items) => items.raw_pieces(&mut pieces),
            None => pieces.push(Bytes::from_static(b"null")),
        }
        pieces.push(Bytes::from_static(b","));
        let rest = Bytes::from(rest);
        pieces.push(rest.slice(rest.len().min(1)..)); // without its opening brace
        let length: usize = pieces.iter().map(Bytes::len).sum();
        let body = futures::stream::iter(pieces.into_iter().map(Ok::<_, Infallible>));
        (
            [
                (
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                ),
                (header::CONTENT_LENGTH, HeaderValue::from(length)),
            ],
            Body::from_stream(body),
        )
            .into_response()
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
    /// Decode a request body (copied; the server hands over its buffer through
    /// [`ExtenderArgs::from_body`]).
    pub fn from_json(body: &[u8]) -> Result<Self, String> {
        Self::from_body(Bytes::copy_from_slice(body))
    }

    /// Decode a request body; the error says which part is wrong. Keys are matched in
    /// any letter case (Go's decoder does the same; very old schedulers sent
    /// `nodenames`), and every part is bounded (see `crate::wire`).
    ///
    /// One pass over the body checks it all and reads the parts (`Nodes` forms are tens
    /// of MB: 5,000 objects of a few KB); of each node object only the start, up to
    /// its name, is read again. Only a body that fails is decoded again, part by part,
    /// to say where (docs/design.md, "The extender's filter").
    pub fn from_body(body: Bytes) -> Result<Self, String> {
        let text = wire::text(&body)?;
        let parts = match serde_json::from_str::<Parts>(text) {
            Ok(parts) => parts,
            Err(_) => Parts::by_part(text)?,
        };
        let pod = wire::pod::decode("Pod", parts.pod.ok_or("request has no Pod")?.get())?;
        let nodes = parts.nodes.map(|nodes| {
            nodes
                .into_iter()
                .map(|(name, raw)| GivenNode {
                    name: name.unwrap_or_default(),
                    span: span_in(text, raw.get()),
                })
                .collect()
        });
        let node_names = parts.names.map(|names| names.0);
        if nodes.is_none() && node_names.is_none() {
            return Err("request has neither NodeNames nor Nodes".into());
        }
        Ok(ExtenderArgs {
            pod,
            nodes,
            node_names,
            body: RequestBody(body),
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

    /// The request's node objects `keep` accepts, as the answer's `Nodes`; `None` when
    /// the request named its nodes instead.
    pub fn echo(&self, keep: impl Fn(&GivenNode) -> bool) -> Option<NodeItems> {
        let nodes = self.nodes.as_ref()?;
        Some(NodeItems {
            body: self.body.clone(),
            spans: nodes
                .iter()
                .filter(|n| keep(n))
                .map(|n| n.span.clone())
                .collect(),
        })
    }
}

/// Where `part` (a slice of `text`) is in `text`.
fn span_in(text: &str, part: &str) -> Range<usize> {
    let start = (part.as_ptr() as usize).saturating_sub(text.as_ptr() as usize);
    start..start + part.len()
}

/// The parts of a request, borrowed from its text: the pod's JSON, the names, and each
/// node object's name and JSON.
#[derive(Default)]
struct Parts<'a> {
    pod: Option<&'a RawValue>,
    names: Option<Bounded<String, MAX_NODES>>,
    nodes: Option<Vec<(Option<String>, &'a RawValue)>>,
}

impl<'a> Parts<'a> {
    /// The same parts, decoded one by one (several passes) so that an error names the
    /// part and where in it: `request`, `NodeNames`, `Nodes`, `Nodes.items[i]`...
    fn by_part(text: &'a str) -> Result<Parts<'a>, String> {
        let [pod, names, nodes] = object_parts("request", text, ["Pod", "NodeNames", "Nodes"])
            .map_err(|e| {
                e.replace(
                    "a JSON object",
                    "a JSON object with Pod and NodeNames or Nodes",
                )
            })?;
        let names = names
            .map(|raw| decode_raw::<Bounded<String, MAX_NODES>>("NodeNames", raw.get()))
            .transpose()?;
        let nodes = nodes.map(|raw| given_nodes(raw.get())).transpose()?;
        Ok(Parts { pod, names, nodes })
    }
}

/// The `Nodes` part (a NodeList), decoded part by part: each item's name and text.
fn given_nodes(raw: &str) -> Result<Vec<(Option<String>, &RawValue)>, String> {
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
            Ok((name, item))
        })
        .collect()
}

/// The request object in one pass: `Pod` kept as text, `NodeNames` decoded, `Nodes`
/// walked item by item; other keys skipped. Keys in any letter case, `null` as absent,
/// the last of a repeated key wins (as `wire::object_parts`).
impl<'de: 'a, 'a> Deserialize<'de> for Parts<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Request;
        impl<'de> Visitor<'de> for Request {
            type Value = Parts<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object with Pod and NodeNames or Nodes")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                const KEYS: [&str; 3] = ["Pod", "NodeNames", "Nodes"];
                let mut parts = Parts::default();
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    match KEYS.iter().position(|k| k.eq_ignore_ascii_case(&key)) {
                        Some(0) => {
                            let pod: &'de RawValue = map.next_value()?;
                            parts.pod = (pod.get() != "null").then_some(pod);
                        }
                        Some(1) => parts.names = map.next_value()?,
                        Some(2) => parts.nodes = map.next_value_seed(NodeList)?,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(parts)
            }
        }
        deserializer.deserialize_map(Request)
    }
}

/// A `NodeList` (or `null`): its items' names and texts.
struct NodeList;

impl<'de> DeserializeSeed<'de> for NodeList {
    type Value = Option<Vec<(Option<String>, &'de RawValue)>>;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for NodeList {
    type Value = Option<Vec<(Option<String>, &'de RawValue)>>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a NodeList object")
    }
    fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            if key.eq_ignore_ascii_case("items") {
                items = map.next_value::<Option<Items>>()?.unwrap_or_default().0;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(Some(items))
    }
}

/// `NodeList.items`: at most [`MAX_NODES`], each an object, read up to its name.
#[derive(Default)]
struct Items<'de>(Vec<(Option<String>, &'de RawValue)>);

impl<'de> Deserialize<'de> for Items<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Elements;
        impl<'de> Visitor<'de> for Elements {
            type Value = Items<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                write!(f, "an array of at most {MAX_NODES} node objects")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
                while let Some(item) = seq.next_element::<&'de RawValue>()? {
                    if items.len() == MAX_NODES {
                        return Err(serde::de::Error::custom(format!(
                            "more than {MAX_NODES} elements"
                        )));
                    }
                    let name = node_name(item.get()).map_err(serde::de::Error::custom)?;
                    items.push((name, item));
                }
                Ok(Items(items))
            }
        }
        deserializer.deserialize_seq(Elements)
    }
}

/// `metadata.name` of a node object given as valid JSON text, read only as far as it:
/// kube-scheduler writes `metadata` before `spec` and `status` and `name` first in it,
/// so this reads a few dozen bytes of an object of several KB. Keys in any letter
/// case, `null` as absent; the first `metadata` and `name` are read (kube-scheduler
/// writes each key once).
fn node_name(item: &str) -> Result<Option<String>, &'static str> {
    const BAD: &str = "a node object must be a JSON object with a string metadata.name";
    let mut at = Cursor { text: item, at: 0 };
    if !at.enter("metadata").ok_or(BAD)? || !at.enter("name").ok_or(BAD)? {
        return Ok(None);
    }
    let name = at.value().ok_or(BAD)?;
    serde_json::from_str::<String>(name)
        .map(Some)
        .map_err(|_| BAD)
}

/// A reading position in JSON text that has been checked to be valid: only the
/// structure is followed here. Never panics, whatever the text.
struct Cursor<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&mut self) -> Option<u8> {
        let bytes = self.text.as_bytes();
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = bytes.get(self.at) {
            self.at += 1;
        }
        bytes.get(self.at).copied()
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.at += 1)
    }

    /// In the object that starts here, move to the value of the first member named
    /// `key` (any letter case) that is not `null`: `Some(false)` if there is none.
    fn enter(&mut self, key: &str) -> Option<bool> {
        self.eat(b'{')?;
        if self.peek()? == b'}' {
            return Some(false);
        }
        loop {
            let name = key_text(self.value()?)?;
            self.eat(b':')?;
            if name.eq_ignore_ascii_case(key) && self.peek()? != b'n' {
                return Some(true);
            }
            self.value()?;
            match self.peek()? {
                b',' => self.at += 1,
                b'}' => return Some(false),
                _ => return None,
            }
        }
    }

    /// The text of the value that starts here; the cursor moves past it.
    fn value(&mut self) -> Option<&'a str> {
        let bytes = self.text.as_bytes();
        let start = self.at;
        let mut depth = 0usize;
        match self.peek()? {
            b'"' | b'{' | b'[' => loop {
                let byte = *bytes.get(self.at)?;
                self.at += 1;
                match byte {
                    b'"' => self.skip_string()?,
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => depth = depth.checked_sub(1)?,
                    _ => {}
                }
                if depth == 0 {
                    break;
                }
            },
            _ => {
                while !matches!(
                    bytes.get(self.at),
                    None | Some(b',' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t')
                ) {
                    self.at += 1;
                }
            }
        }
        self.text.get(start..self.at).map(str::trim_start)
    }

    /// Past the end of the string whose opening quote was just read.
    fn skip_string(&mut self) -> Option<()> {
        let bytes = self.text.as_bytes();
        loop {
            match *bytes.get(self.at)? {
                b'"' => {
                    self.at += 1;
                    return Some(());
                }
                b'\\' => self.at += 2,
                _ => self.at += 1,
            }
        }
    }
}

/// A key's text (a JSON string) as the key: most keys have no escapes and are read in
/// place.
fn key_text(raw: &str) -> Option<Cow<'_, str>> {
    match raw.strip_prefix('"')?.strip_suffix('"')? {
        plain if !plain.contains('\\') => Some(Cow::Borrowed(plain)),
        _ => serde_json::from_str::<String>(raw).ok().map(Cow::Owned),
    }
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
            nodes: args.echo(|_| true),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(&result).unwrap()["Nodes"],
            serde_json::json!({"metadata": {}, "items": [{"metadata": {"name": "n1"}, "status": {"x": 1}}]})
        );
    }

    /// Request bodies in many spellings: the one-pass decoder reads what the part by
    /// part decoder reads (the names, and each node object's exact text).
    #[test]
    fn one_pass_reads_what_part_by_part_reads() {
        let bodies = [
            r#"{"Pod": {}, "NodeNames": ["a", "b"]}"#,
            r#"{"pod": null, "Pod": {"metadata": {}}, "nodenames": null, "NODES": {"items": null}}"#,
            r#"{"Nodes": {"kind": "NodeList", "metadata": {"resourceVersion": "1"}, "ITEMS": [
                {"metadata": {"name": "plain"}},
                {"kind": "Node", "apiVersion": "v1", "metadata": {"uid": "u", "labels": {"k": "}\"{"}, "name": "later"}},
                { "Metadata" : { "Name" : "spaced" } , "spec" : {} },
                {"metadata": null, "metadata": {"name": "second metadata"}},
                {"metadata": {"name": null, "name": "second name"}},
                {"status": {"images": [{"names": ["x"]}]}, "metadata": {"name": "metadata last"}},
                {"metadata": {"na\u006de": "escaped key", "x": 1}},
                {"metadata": {"name": "escaped \"name\" \u00e9"}},
                {"metadata": {}}, {}
            ]}, "Pod": {}, "junk": [1, {"Nodes": 2}]}"#,
            r#"{"Pod": {}, "Nodes": {"items": []}, "NodeNames": ["n"]}"#,
            "{\"Pod\":{},\"Nodes\":{\"items\":[\n  {\n    \"metadata\": {\"name\": \"pretty\"}\n  }\n]}}",
        ];
        for body in bodies {
            let fast: Parts = serde_json::from_str(body).unwrap();
            let slow = Parts::by_part(body).unwrap();
            assert_eq!(
                fast.pod.map(RawValue::get),
                slow.pod.map(RawValue::get),
                "{body}"
            );
            assert_eq!(fast.names, slow.names, "{body}");
            let texts = |parts: &Parts| -> Option<Vec<(Option<String>, String)>> {
                let nodes = parts.nodes.as_ref()?;
                Some(
                    nodes
                        .iter()
                        .map(|(n, raw)| (n.clone(), raw.get().to_string()))
                        .collect(),
                )
            };
            assert_eq!(texts(&fast), texts(&slow), "{body}");
        }
        let args = ExtenderArgs::from_json(bodies[2].as_bytes()).unwrap();
        assert_eq!(
            args.candidate_names(),
            [
                "plain",
                "later",
                "spaced",
                "second metadata",
                "second name",
                "metadata last",
                "escaped key",
                "escaped \"name\" \u{e9}",
                "",
                ""
            ]
        );
    }

    #[test]
    fn answers_carry_the_requests_node_objects_byte_for_byte() {
        let pretty = "{\n  \"metadata\": {\"name\": \"n2\"},\n  \"status\": {\"a\": [1, 2.50, \"\\u00e9\"]}\n}";
        let body = format!(
            r#"{{"Pod": {{}}, "Nodes": {{"items": [{{"metadata": {{"name": "n1"}}}}, {pretty}]}}}}"#
        );
        let args = ExtenderArgs::from_json(body.as_bytes()).unwrap();
        let mut result = ExtenderFilterResult {
            nodes: args.echo(|n| n.name == "n2"),
            ..Default::default()
        };
        result.failed_nodes.insert("n1", "no room");
        assert_eq!(
            result.nodes.as_ref().unwrap().texts().collect::<Vec<_>>(),
            [pretty]
        );
        let response = result.clone().into_response();
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
        let answer =
            futures::executor::block_on(axum::body::to_bytes(response.into_body(), 1 << 20))
                .unwrap();
        let answer = std::str::from_utf8(&answer).unwrap();
        assert!(answer.contains(pretty), "{answer}");
        let answered: serde_json::Value = serde_json::from_str(answer).unwrap();
        assert_eq!(answered, serde_json::to_value(&result).unwrap());
        // Every node passing: the request's array goes back as it is, in one piece.
        let all = ExtenderFilterResult {
            nodes: args.echo(|_| true),
            ..Default::default()
        };
        let answer = futures::executor::block_on(axum::body::to_bytes(
            all.clone().into_response().into_body(),
            1 << 20,
        ))
        .unwrap();
        let items = &body[body.find('[').unwrap()..body.rfind(']').unwrap() + 1];
        assert!(std::str::from_utf8(&answer).unwrap().contains(items));
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&answer).unwrap(),
            serde_json::to_value(&all).unwrap()
        );
        let names_only = ExtenderFilterResult {
            node_names: Some(vec!["n1".into()]),
            ..Default::default()
        };
        let answer = futures::executor::block_on(axum::body::to_bytes(
            names_only.clone().into_response().into_body(),
            1 << 20,
        ))
        .unwrap();
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&answer).unwrap(),
            serde_json::to_value(&names_only).unwrap()
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
        assert_eq!(
            err(r#"{"Pod": {}, "Nodes": {"items": [{"metadata": {"name": "a"}}, []]}}"#),
            "Nodes.items[1] must be a JSON object"
        );
        assert!(
            err(r#"{"Pod": {}, "Nodes": {"items": [{"metadata": {"name": 5}}]}}"#)
                .starts_with("Nodes.items[0].metadata.name: invalid type"),
        );
        assert_eq!(
            err(r#"{"Pod": {}, "Nodes": []}"#),
            "Nodes must be a NodeList object"
        );
        assert!(
            err(r#"{"Pod": {}, "Nodes": {"items": [{]}}"#).starts_with("request is not valid JSON")
        );
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
