//! The kube-scheduler extender's bind request and answer (`ExtenderBindingArgs`,
//! `ExtenderBindingResult`), with the Go field names, keys in any letter case.

use serde::Serialize;
use serde_json::value::RawValue;

use super::{self as wire, DecodeError, decode_raw, object_parts};

/// `ExtenderBindingArgs`: bind this pod (by namespace, name and uid) to this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ExtenderBindingArgs {
    pub(crate) pod_name: String,
    pub(crate) pod_namespace: String,
    pub(crate) pod_uid: String,
    pub(crate) node: String,
}

/// `ExtenderBindingResult`: an empty `Error` means bound.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct ExtenderBindingResult {
    #[serde(rename = "Error")]
    pub(crate) error: String,
}

/// Longest name a Kubernetes object can have (a DNS subdomain).
const MAX_NAME: usize = 253;

impl ExtenderBindingArgs {
    /// Decode a request body (keys in any letter case, as Go reads them); every field is
    /// required and bounded.
    pub(crate) fn from_json(body: &[u8]) -> Result<Self, DecodeError> {
        const KEYS: [&str; 4] = ["PodName", "PodNamespace", "PodUID", "Node"];
        let [name, namespace, uid, node] = object_parts("request", wire::text(body)?, KEYS)?;
        Ok(ExtenderBindingArgs {
            pod_name: name_field(KEYS[0], name)?,
            pod_namespace: name_field(KEYS[1], namespace)?,
            pod_uid: name_field(KEYS[2], uid)?,
            node: name_field(KEYS[3], node)?,
        })
    }
}

/// The required, non-empty name of the request's member `key`.
fn name_field(key: &'static str, raw: Option<&RawValue>) -> Result<String, DecodeError> {
    let raw = raw.ok_or(DecodeError::Missing {
        within: "request",
        part: key,
    })?;
    let value: String = decode_raw(key, raw.get())?;
    match value.len() {
        0 => Err(DecodeError::Empty { field: key }),
        len if len > MAX_NAME => Err(DecodeError::TooLong {
            field: key,
            len,
            max: MAX_NAME,
        }),
        _ => Ok(value),
    }
}

#[cfg(test)]
mod tests {
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
        let missing = missing.unwrap_err();
        assert_eq!(missing.to_string(), "request has no PodUID");
        assert_eq!(missing.kind(), "missing_field");
        let long = format!(
            r#"{{"PodName":"{}","PodNamespace":"a","PodUID":"u","Node":"n"}}"#,
            "x".repeat(300)
        );
        let error = ExtenderBindingArgs::from_json(long.as_bytes()).unwrap_err();
        assert_eq!(error.kind(), "over_limit");
        let error = error.to_string();
        assert!(error.contains("PodName is 300 bytes long"), "{error}");
        let empty = ExtenderBindingArgs::from_json(
            br#"{"PodName":"p","PodNamespace":"a","PodUID":"","Node":"n"}"#,
        );
        assert_eq!(empty.unwrap_err().to_string(), "PodUID is empty");
    }
}
