//! The kube-scheduler extender's filter request (`ExtenderArgs` of
//! `k8s.io/kube-scheduler/extender/v1`): the pod and its candidate nodes. The Go structs
//! carry no json tags: the scheduler sends the Go field names, and any letter case is
//! accepted on input, as Go does. The answer is in [`super::filter_result`].

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

use axum::body::Bytes;
use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::filter_result::{NodeItems, RequestBody};
use super::{self as wire, Bounded, DecodeError, MAX_NODES, decode_raw, object_parts};

/// `ExtenderArgs`: the pod and the candidate nodes, as objects or as names.
///
/// Node objects a caller sends are never believed: only their names are read, and the
/// cluster's own view of each node decides (docs/security.md). Their text stays in the
/// request's body, to answer in the form the request used.
#[derive(Debug, Clone)]
pub struct ExtenderArgs {
    pub pod: Pod,
    pub nodes: Option<Vec<GivenNode>>,
    pub(crate) node_names: Option<Vec<String>>,
    /// The request's body: `nodes` are spans of it.
    body: RequestBody,
}

/// A node object from the request: its name, and where its JSON text is in the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GivenNode {
    pub(crate) name: String,
    span: Range<usize>,
}

impl ExtenderArgs {
    /// Decode a request body (copied; the server hands over its buffer through
    /// [`ExtenderArgs::from_body`]).
    pub fn from_json(body: &[u8]) -> Result<Self, DecodeError> {
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
    pub(crate) fn from_body(body: Bytes) -> Result<Self, DecodeError> {
        let text = wire::text(&body)?;
        let parts = match serde_json::from_str::<Parts>(text) {
            Ok(parts) => parts,
            Err(_) => Parts::by_part(text)?,
        };
        let pod = parts.pod.ok_or(DecodeError::Missing {
            within: "request",
            part: "Pod",
        })?;
        let pod = wire::pod::decode("Pod", pod.get())?;
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
            return Err(DecodeError::NoCandidates);
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
    fn by_part(text: &'a str) -> Result<Parts<'a>, DecodeError> {
        let [pod, names, nodes] = object_parts("request", text, ["Pod", "NodeNames", "Nodes"])
            .map_err(|e| e.expecting("a JSON object with Pod and NodeNames or Nodes"))?;
        let names = names
            .map(|raw| decode_raw::<Bounded<String, MAX_NODES>>("NodeNames", raw.get()))
            .transpose()?;
        let nodes = nodes.map(|raw| given_nodes(raw.get())).transpose()?;
        Ok(Parts { pod, names, nodes })
    }
}

/// The `Nodes` part (a NodeList), decoded part by part: each item's name and text.
fn given_nodes(raw: &str) -> Result<Vec<(Option<String>, &RawValue)>, DecodeError> {
    let [items] =
        object_parts("Nodes", raw, ["items"]).map_err(|e| e.expecting("a NodeList object"))?;
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
#[path = "extender_tests.rs"]
mod tests;
