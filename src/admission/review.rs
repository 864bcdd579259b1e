//! AdmissionReview on the wire (`admission.k8s.io/v1`, and `v1beta1` when a request
//! comes in that version). The response always echoes the request's uid and version.

use base64::Engine as _;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::wire::{self, decode_raw, object_parts};

/// The parts of a review request we read.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    pub uid: String,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    pub operation: String,
    /// The object's JSON text, decoded by the handler (see `crate::wire::pod`).
    #[serde(default)]
    pub object: Option<Box<RawValue>>,
    /// The object before an UPDATE (null for a CREATE).
    #[serde(default)]
    pub old_object: Option<Box<RawValue>>,
    #[serde(default)]
    pub dry_run: Option<bool>,
}

/// A decoded review: its apiVersion (echoed back) and request.
#[derive(Debug, Clone)]
pub struct Review {
    pub api_version: String,
    pub request: AdmissionRequest,
}

const VERSIONS: [&str; 2] = ["admission.k8s.io/v1", "admission.k8s.io/v1beta1"];

impl Review {
    /// Decode a review body. Only `apiVersion`, `kind` and the request's few fields
    /// are read; the objects stay JSON text until the handler decodes the pod.
    pub fn from_json(body: &[u8]) -> Result<Review, String> {
        let [api_version, kind, request] = object_parts(
            "AdmissionReview",
            wire::text(body)?,
            ["apiVersion", "kind", "request"],
        )?;
        let text = |raw: Option<&RawValue>| {
            raw.and_then(|r| serde_json::from_str::<String>(r.get()).ok())
                .unwrap_or_default()
        };
        let api_version = text(api_version);
        if !VERSIONS.contains(&api_version.as_str()) {
            return Err(format!(
                "apiVersion {api_version:?} is not admission.k8s.io/v1 or admission.k8s.io/v1beta1"
            ));
        }
        if text(kind) != "AdmissionReview" {
            return Err("kind must be AdmissionReview".into());
        }
        let request = request.ok_or("AdmissionReview has no request")?;
        let request: AdmissionRequest = decode_raw("request", request.get())?;
        Ok(Review {
            api_version,
            request,
        })
    }

    /// The pod in `request.object` (or `request.oldObject`), decoded with bounded memory.
    pub fn pod(&self, old: bool) -> Result<k8s_openapi::api::core::v1::Pod, String> {
        let (field, raw) = if old {
            ("oldObject", &self.request.old_object)
        } else {
            ("object", &self.request.object)
        };
        let raw = raw
            .as_deref()
            .filter(|r| r.get() != "null")
            .ok_or_else(|| format!("{} review has no request.{field}", self.request.operation))?;
        wire::pod::decode(&format!("request.{field}"), raw.get())
    }

    fn respond(&self, response: Value) -> Value {
        json!({"apiVersion": self.api_version, "kind": "AdmissionReview", "response": response})
    }

    pub fn allow(&self) -> Value {
        self.respond(json!({"uid": self.request.uid, "allowed": true}))
    }

    /// A denial: code 403, reason Forbidden, the message a person reads.
    pub fn deny(&self, message: &str) -> Value {
        self.respond(json!({
            "uid": self.request.uid,
            "allowed": false,
            "status": {"code": 403, "reason": "Forbidden", "message": message}
        }))
    }

    /// Allowed with a JSON Patch (RFC 6902) as standard padded base64; none when empty.
    pub fn patch(&self, patch: &json_patch::Patch) -> Value {
        if patch.0.is_empty() {
            return self.allow();
        }
        let bytes = serde_json::to_vec(patch).unwrap_or_default();
        self.respond(json!({
            "uid": self.request.uid,
            "allowed": true,
            "patchType": "JSONPatch",
            "patch": base64::engine::general_purpose::STANDARD.encode(bytes),
        }))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn review(version: &str) -> Review {
        let body = json!({"apiVersion": version, "kind": "AdmissionReview",
            "request": {"uid": "u-1", "operation": "CREATE", "namespace": "ns", "object": {}}});
        Review::from_json(body.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn responses_echo_uid_and_version() {
        for version in VERSIONS {
            let answer = review(version).deny("no");
            assert_eq!(answer["apiVersion"], version);
            assert_eq!(answer["kind"], "AdmissionReview");
            assert_eq!(answer["response"]["uid"], "u-1");
            assert_eq!(
                answer["response"]["status"],
                json!({"code": 403, "reason": "Forbidden", "message": "no"})
            );
        }
    }

    #[test]
    fn patch_is_standard_base64_of_a_json_array() {
        let patch: json_patch::Patch =
            serde_json::from_value(json!([{"op": "add", "path": "/a", "value": "?>?>"}])).unwrap();
        let answer = review("admission.k8s.io/v1").patch(&patch);
        let encoded = answer["response"]["patch"].as_str().unwrap();
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .unwrap();
        assert_eq!(
            serde_json::from_slice::<Value>(&decoded).unwrap()[0]["path"],
            "/a"
        );
        assert_eq!(answer["response"]["patchType"], "JSONPatch");
        let empty = review("admission.k8s.io/v1").patch(&json_patch::Patch(vec![]));
        assert!(empty["response"].get("patch").is_none());
    }

    #[test]
    fn undecodable_reviews_say_why() {
        let err = |body: &str| Review::from_json(body.as_bytes()).unwrap_err();
        assert!(err("{").starts_with("AdmissionReview is not valid JSON"));
        assert_eq!(err("[1]"), "AdmissionReview must be a JSON object");
        assert!(
            err(r#"{"apiVersion": "v1", "kind": "AdmissionReview"}"#)
                .contains("is not admission.k8s.io/v1")
        );
        assert_eq!(
            err(r#"{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}"#),
            "AdmissionReview has no request"
        );
        assert!(err(r#"{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"operation": "CREATE"}}"#)
            .contains("uid"));
    }
}
