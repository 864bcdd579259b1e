//! [`DecodeError`]: why a request body was refused before anything in it was judged.
//! Its text is the HTTP 400 body a caller reads; its [`DecodeError::kind`] is the
//! bounded `decision` label the request is counted under.

use std::fmt;

use super::expect::Mismatch;

/// A request body, or a part of it, that cannot be read as its route's request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Not JSON: bad syntax, cut short, text after it, or not UTF-8.
    #[error("{what} is not valid JSON: {detail}")]
    Malformed { what: String, detail: String },
    /// Nested deeper than the decoder follows.
    #[error("{what} is not valid JSON: {detail}")]
    TooDeep { what: String, detail: String },
    /// More JSON values than the part's budget, counted before it is decoded.
    #[error("{what} has more than {max} JSON values; refusing to decode it")]
    OverBudget { what: String, max: usize },
    /// More entries than a map may hold.
    #[error("{what} lists more than {max} {entries}; refusing to decode it")]
    TooMany {
        what: &'static str,
        max: usize,
        entries: &'static str,
    },
    /// A name longer than Kubernetes allows.
    #[error("{field} is {len} bytes long, over {max}")]
    TooLong {
        field: &'static str,
        len: usize,
        max: usize,
    },
    /// A part that is not the JSON object it must be.
    #[error("{what} must be {expected}")]
    NotAnObject {
        what: String,
        expected: &'static str,
    },
    /// A required part that is absent or `null`.
    #[error("{within} has no {part}")]
    Missing {
        within: &'static str,
        part: &'static str,
    },
    /// A required name that is empty.
    #[error("{field} is empty")]
    Empty { field: &'static str },
    /// A filter request that names no candidate nodes in either form.
    #[error("request has neither NodeNames nor Nodes")]
    NoCandidates,
    /// A review without the object its operation is judged on.
    #[error("{operation} review has no request.{field}")]
    NoObject {
        operation: String,
        field: &'static str,
    },
    /// A body whose apiVersion is not one of AdmissionReview's.
    #[error("apiVersion {0:?} is not admission.k8s.io/v1 or admission.k8s.io/v1beta1")]
    Version(String),
    /// A body whose kind is not AdmissionReview.
    #[error("kind must be AdmissionReview")]
    NotAReview,
    /// A part whose content the decoder refused: `fault` says how, `detail` is the
    /// decoder's own text, `path` where inside the part (empty: the part itself).
    #[error("{what}{}: {detail}", Located(.path))]
    Content {
        what: String,
        path: String,
        fault: Fault,
        detail: String,
    },
    /// A review that does not add up: not the route's kind, not one namespace...
    #[error(transparent)]
    Mismatch(#[from] Mismatch),
    /// The decoder itself failed (it ran on the blocking pool and did not finish).
    #[error("decoding the request failed: {0}")]
    Aborted(String),
}

/// How a part's content is wrong, as the decoder's error tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    Malformed,
    TooDeep,
    TooMany,
    WrongType,
    MissingField,
    InvalidValue,
}

impl DecodeError {
    /// The metric label of this failure: one of a dozen fixed words, never text from
    /// the request.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            DecodeError::Malformed { .. } => "malformed_json",
            DecodeError::TooDeep { .. } => "too_deep",
            DecodeError::OverBudget { .. }
            | DecodeError::TooMany { .. }
            | DecodeError::TooLong { .. } => "over_limit",
            DecodeError::NotAnObject { .. } => "wrong_type",
            DecodeError::Missing { .. }
            | DecodeError::Empty { .. }
            | DecodeError::NoCandidates
            | DecodeError::NoObject { .. } => "missing_field",
            DecodeError::Version(_) | DecodeError::NotAReview => "wrong_kind",
            DecodeError::Content { fault, .. } => fault.kind(),
            DecodeError::Mismatch(mismatch) => mismatch.kind(),
            DecodeError::Aborted(_) => "decode_aborted",
        }
    }

    /// The same error, saying what the part must be when it is not a JSON object (a
    /// caller knows the part's shape better than [`super::object_parts`]).
    pub(super) fn expecting(self, shape: &'static str) -> Self {
        match self {
            DecodeError::NotAnObject { what, .. } => DecodeError::NotAnObject {
                what,
                expected: shape,
            },
            other => other,
        }
    }

    /// `what` is not valid JSON, as serde_json says why (its depth limit apart).
    pub(super) fn syntax(what: &str, error: &serde_json::Error) -> Self {
        let (what, detail) = (what.to_string(), error.to_string());
        match Fault::of(error) {
            Fault::TooDeep => DecodeError::TooDeep { what, detail },
            _ => DecodeError::Malformed { what, detail },
        }
    }
}

impl Fault {
    /// The fault serde_json reports. Its errors carry no more than a category and a
    /// text, and bounded lists (`Bounded`, `dra::wire`'s lists) speak through the text:
    /// the kinds below are read from its start.
    pub(super) fn of(error: &serde_json::Error) -> Fault {
        use serde_json::error::Category;
        let text = error.to_string();
        match error.classify() {
            Category::Data if text.starts_with("invalid type") => Fault::WrongType,
            Category::Data if text.starts_with("missing field") => Fault::MissingField,
            Category::Data if text.starts_with("more than ") => Fault::TooMany,
            Category::Data => Fault::InvalidValue,
            _ if text.starts_with("recursion limit exceeded") => Fault::TooDeep,
            _ => Fault::Malformed,
        }
    }

    fn kind(self) -> &'static str {
        match self {
            Fault::Malformed => "malformed_json",
            Fault::TooDeep => "too_deep",
            Fault::TooMany => "over_limit",
            Fault::WrongType => "wrong_type",
            Fault::MissingField => "missing_field",
            Fault::InvalidValue => "invalid_value",
        }
    }
}

/// ` at spec.containers`, or nothing for the part itself.
struct Located<'a>(&'a str);

impl fmt::Display for Located<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            "" | "." => Ok(()),
            path => write!(f, " at {path}"),
        }
    }
}
