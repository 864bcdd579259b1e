//! The kube-scheduler extender's filter answer (`ExtenderFilterResult`), written with
//! the Go field names the scheduler expects. Node objects of a `Nodes`-form request go
//! back as the request's own bytes.

use std::convert::Infallible;
use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::value::RawValue;

/// A request's body, shared by the answer that echoes parts of it.
#[derive(Clone, Default)]
pub(super) struct RequestBody(pub(super) Bytes);

impl fmt::Debug for RequestBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<{} bytes>", self.0.len())
    }
}

/// `ExtenderFilterResult`.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct ExtenderFilterResult {
    #[serde(rename = "Nodes")]
    pub(crate) nodes: Option<NodeItems>,
    #[serde(rename = "NodeNames")]
    pub(crate) node_names: Option<Vec<String>>,
    #[serde(rename = "FailedNodes")]
    pub(crate) failed_nodes: NodeReasons,
    #[serde(rename = "FailedAndUnresolvableNodes")]
    pub(crate) failed_and_unresolvable_nodes: NodeReasons,
    #[serde(rename = "Error")]
    pub(crate) error: String,
}

/// A `NodeList` of node objects the request carried, echoed unchanged: spans of the
/// request's body, written back byte for byte.
#[derive(Debug, Clone, Default)]
pub struct NodeItems {
    pub(super) body: RequestBody,
    pub(super) spans: Vec<Range<usize>>,
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
pub(crate) struct NodeReasons(pub(crate) Vec<(Arc<str>, Arc<str>)>);

impl NodeReasons {
    pub(crate) fn insert(&mut self, node: impl Into<Arc<str>>, reason: impl Into<Arc<str>>) {
        self.0.push((node.into(), reason.into()));
    }

    #[cfg(test)]
    pub(super) fn get(&self, node: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| &**n == node)
            .map(|(_, reason)| &**reason)
    }
}

impl Serialize for NodeReasons {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().map(|(node, reason)| (&**node, &**reason)))
    }
}
