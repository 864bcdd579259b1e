//! AdmissionReview on the wire (`admission.k8s.io/v1`, and `v1beta1` when a request
//! comes in that version): the review decoded, the checks that it adds up (the route's
//! kind and resource, one namespace), its objects decoded, and the answer. The answer
//! always echoes the request's uid and version.

use std::fmt;

use base64::Engine as _;
use k8s_openapi::api::core::v1::Pod;
use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;

use super::expect::{Expected, Mismatch};
use super::{self as wire, DecodeError, KeyIndex, MAX_POD_VALUES, decode_raw, object_parts};

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
    /// The object's kind, which must be the route's ([`Review::expect`]).
    #[serde(default)]
    kind: Option<GroupVersionKind>,
    /// The resource the request is made on, which must be the route's.
    #[serde(default)]
    resource: Option<GroupVersionResource>,
    /// Who asks: placement annotations may only be changed by the identities that
    /// write them by protocol (`placementWriters`).
    #[serde(default)]
    pub(crate) user_info: UserInfo,
    /// The object: JSON text until the handler decodes the pod (see `crate::wire::pod`).
    #[serde(default)]
    object: Option<Object>,
    /// The object before an UPDATE (null for a CREATE).
    #[serde(default)]
    old_object: Option<Object>,
    #[serde(default)]
    pub dry_run: Option<bool>,
}

/// `request.kind`: the kind of the object under review.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
struct GroupVersionKind {
    group: String,
    version: String,
    kind: String,
}

/// `request.resource`: the resource the request was made on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
struct GroupVersionResource {
    group: String,
    version: String,
    resource: String,
}

/// `request.userInfo`: the authenticated user behind the request (the API server's
/// word; only the API server gets past the webhook door's client-certificate check).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub(crate) struct UserInfo {
    pub(crate) username: String,
    groups: Vec<String>,
}

/// The operations the API server sends, spelled as it spells them.
const OPERATIONS: [&str; 4] = ["CREATE", "UPDATE", "DELETE", "CONNECT"];

/// A review's object: its JSON text ([`Review::from_json`]), or the pod already decoded
/// from it ([`Review::decode`]'s single pass).
#[derive(Debug, Clone)]
enum Object {
    Raw(Box<RawValue>),
    Pod(Box<Pod>),
}

impl<'de> Deserialize<'de> for Object {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Box::<RawValue>::deserialize(deserializer).map(Object::Raw)
    }
}

/// A decoded review: its apiVersion (echoed back) and request.
#[derive(Debug, Clone)]
pub struct Review {
    pub api_version: String,
    pub request: AdmissionRequest,
}

const VERSIONS: [&str; 2] = ["admission.k8s.io/v1", "admission.k8s.io/v1beta1"];
const REVIEW_KEYS: [&str; 3] = ["apiVersion", "kind", "request"];

/// A string part's text; anything else reads as empty (and is refused as such).
fn part_text(raw: Option<&RawValue>) -> String {
    raw.and_then(|r| serde_json::from_str::<String>(r.get()).ok())
        .unwrap_or_default()
}

impl Review {
    /// Decode a review body. Only `apiVersion`, `kind` and the request's few fields
    /// are read; the objects stay JSON text until the handler decodes the pod.
    pub fn from_json(body: &[u8]) -> Result<Review, DecodeError> {
        let [api_version, kind, request] =
            object_parts("AdmissionReview", wire::text(body)?, REVIEW_KEYS)?;
        let api_version = checked_version(api_version, kind)?;
        let request = request.ok_or(DecodeError::Missing {
            within: "AdmissionReview",
            part: "request",
        })?;
        let request: AdmissionRequest = decode_raw("request", request.get())?;
        Ok(Review {
            api_version,
            request,
        })
    }

    /// [`Review::from_json`] with the objects' pods decoded too, in one pass over the
    /// body instead of one for the review, one for the request and two for each pod.
    /// The one pass is taken when the whole body is within one pod's value budget (so
    /// each pod in it is) and decodes without error, as every review kube-apiserver
    /// sends does; any other body goes the reference way (`from_json`, then each pod
    /// decoded when it is taken), so what is accepted, and every error message, is the
    /// same either way.
    pub fn decode(body: &[u8]) -> Result<Review, DecodeError> {
        match one_pass(body) {
            Some(review) => Ok(review),
            None => Review::from_json(body),
        }
    }

    /// Refuse a review that does not add up, before anything in it is judged: an
    /// operation the API server does not spell so, no namespace, or a kind or resource
    /// that is not the route's. The API server never sends these; a caller that does
    /// gets 400 naming the mismatch, and no namespace is charged for it.
    pub(crate) fn expect(&self, route: Expected) -> Result<(), Mismatch> {
        let request = &self.request;
        if !OPERATIONS.contains(&request.operation.as_str()) {
            return Err(Mismatch::Operation(request.operation.clone()));
        }
        if request.namespace.as_deref().unwrap_or_default().is_empty() {
            return Err(Mismatch::NoNamespace(route));
        }
        match request.kind.as_ref() {
            Some(kind) if kind.group == route.group && kind.kind == route.kind => {}
            kind => {
                let found = kind.map(|k| (k.kind.clone(), k.group.clone()));
                return Err(Mismatch::Kind { found, route });
            }
        }
        match request.resource.as_ref() {
            Some(r) if r.group == route.group && r.resource == route.resource => Ok(()),
            resource => {
                let found = resource.map(|r| (r.resource.clone(), r.group.clone()));
                Err(Mismatch::Resource { found, route })
            }
        }
    }

    /// An object's own namespace must be the request's (the API server sets it so
    /// before admission), or absent; anything else is a forged review.
    pub(crate) fn check_namespace(
        &self,
        field: &'static str,
        own: Option<&str>,
    ) -> Result<(), Mismatch> {
        let request = self.request.namespace.as_deref().unwrap_or_default();
        match own {
            Some(own) if !own.is_empty() && own != request => Err(Mismatch::Namespace {
                field,
                own: own.to_string(),
                request: request.to_string(),
            }),
            _ => Ok(()),
        }
    }

    /// The pod in `request.object` (or `request.oldObject`), decoded with bounded memory.
    pub fn pod(&self, old: bool) -> Result<Pod, DecodeError> {
        let (field, object) = self.object(old);
        self.decode_object(field, object)
    }

    /// [`Review::pod`], moving a pod [`Review::decode`] already decoded out of the
    /// review (the object is gone afterwards).
    pub fn take_pod(&mut self, old: bool) -> Result<Box<Pod>, DecodeError> {
        let (field, _) = self.object(old);
        let slot = match old {
            true => &mut self.request.old_object,
            false => &mut self.request.object,
        };
        match slot.take() {
            Some(Object::Pod(pod)) => Ok(pod),
            object => self.decode_object(field, object.as_ref()).map(Box::new),
        }
    }

    /// The ResourceClaim in `request.object` of a review read with [`Review::from_json`],
    /// decoded with bounded memory.
    pub(crate) fn claim(&self) -> Result<crate::dra::ResourceClaim, DecodeError> {
        match self.request.object.as_ref() {
            Some(Object::Raw(raw)) if raw.get() != "null" => {
                wire::claim::decode("request.object", raw.get())
            }
            _ => Err(self.no_object("object")),
        }
    }

    fn object(&self, old: bool) -> (&'static str, Option<&Object>) {
        match old {
            true => ("oldObject", self.request.old_object.as_ref()),
            false => ("object", self.request.object.as_ref()),
        }
    }

    fn decode_object(
        &self,
        field: &'static str,
        object: Option<&Object>,
    ) -> Result<Pod, DecodeError> {
        match object {
            Some(Object::Pod(pod)) => Ok((**pod).clone()),
            Some(Object::Raw(raw)) if raw.get() != "null" => {
                wire::pod::decode(&format!("request.{field}"), raw.get())
            }
            _ => Err(self.no_object(field)),
        }
    }

    fn no_object(&self, field: &'static str) -> DecodeError {
        DecodeError::NoObject {
            operation: self.request.operation.clone(),
            field,
        }
    }

    fn respond<'a>(&'a self, response: Response<'a>) -> Answer<'a> {
        Answer {
            api_version: &self.api_version,
            kind: "AdmissionReview",
            response,
        }
    }

    fn response(&self, allowed: bool) -> Response<'_> {
        Response {
            allowed,
            patch: None,
            patch_type: None,
            status: None,
            uid: &self.request.uid,
            warnings: &[],
        }
    }

    pub(crate) fn allow(&self) -> Answer<'_> {
        self.respond(self.response(true))
    }

    /// Allowed, with warnings the client shows (`kubectl` prints each as
    /// `Warning: ...`); plain [`Review::allow`] when there are none.
    pub(crate) fn allow_with<'a>(&'a self, warnings: &'a [String]) -> Answer<'a> {
        self.respond(Response {
            warnings,
            ..self.response(true)
        })
    }

    /// A denial: code 403, reason Forbidden, the message a person reads.
    pub(crate) fn deny<'a>(&'a self, message: &'a str) -> Answer<'a> {
        self.respond(Response {
            status: Some(Status {
                code: 403,
                message,
                reason: "Forbidden",
            }),
            ..self.response(false)
        })
    }

    /// Allowed with a JSON Patch (RFC 6902) as standard padded base64; none when empty.
    pub(crate) fn patch(&self, patch: &json_patch::Patch) -> Answer<'_> {
        self.patch_with(patch, &[])
    }

    /// [`Review::patch`], with warnings the client shows.
    pub(crate) fn patch_with<'a>(
        &'a self,
        patch: &json_patch::Patch,
        warnings: &'a [String],
    ) -> Answer<'a> {
        if patch.0.is_empty() {
            return self.allow_with(warnings);
        }
        let bytes = serde_json::to_vec(patch).unwrap_or_default();
        self.respond(Response {
            patch: Some(base64::engine::general_purpose::STANDARD.encode(bytes)),
            patch_type: Some("JSONPatch"),
            warnings,
            ..self.response(true)
        })
    }
}

/// The AdmissionReview a webhook answers with. Written straight to the response body
/// (no `serde_json::Value` in between); the fields are in the order a `Value` would
/// print them, so the bytes are the same.
#[derive(Debug, Serialize)]
pub(crate) struct Answer<'a> {
    #[serde(rename = "apiVersion")]
    api_version: &'a str,
    kind: &'static str,
    response: Response<'a>,
}

#[derive(Debug, Serialize)]
struct Response<'a> {
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch: Option<String>,
    #[serde(rename = "patchType", skip_serializing_if = "Option::is_none")]
    patch_type: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<Status<'a>>,
    uid: &'a str,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    warnings: &'a [String],
}

#[derive(Debug, Serialize)]
struct Status<'a> {
    code: u16,
    message: &'a str,
    reason: &'static str,
}

/// The apiVersion, once both it and the kind are what a review must have.
fn checked_version(
    api_version: Option<&RawValue>,
    kind: Option<&RawValue>,
) -> Result<String, DecodeError> {
    let api_version = part_text(api_version);
    if !VERSIONS.contains(&api_version.as_str()) {
        return Err(DecodeError::Version(api_version));
    }
    if part_text(kind) != "AdmissionReview" {
        return Err(DecodeError::NotAReview);
    }
    Ok(api_version)
}

/// [`Review::decode`]'s single pass; `None` sends the body the reference way.
fn one_pass(body: &[u8]) -> Option<Review> {
    // Every pod in the body is within its budget when the whole body is.
    if !wire::within_budget(body, MAX_POD_VALUES) {
        return None;
    }
    let text = std::str::from_utf8(body).ok()?;
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let parts = serde::Deserializer::deserialize_map(&mut deserializer, OnePass).ok()?;
    deserializer.end().ok()?;
    let api_version = checked_version(parts.api_version, parts.kind).ok()?;
    let request = parts.request?;
    let pod = |lite: Option<wire::pod::Lite>| lite.map(|lite| Object::Pod(lite.0));
    Some(Review {
        api_version,
        request: AdmissionRequest {
            uid: request.uid,
            namespace: request.namespace,
            name: request.name,
            operation: request.operation,
            kind: request.kind,
            resource: request.resource,
            user_info: request.user_info,
            object: pod(request.object),
            old_object: pod(request.old_object),
            dry_run: request.dry_run,
        },
    })
}

/// The request as [`AdmissionRequest`] reads it, with its pods decoded in place.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct OnePassRequest {
    uid: String,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    name: Option<String>,
    operation: String,
    #[serde(default)]
    kind: Option<GroupVersionKind>,
    #[serde(default)]
    resource: Option<GroupVersionResource>,
    #[serde(default)]
    user_info: UserInfo,
    #[serde(default)]
    object: Option<wire::pod::Lite>,
    #[serde(default)]
    old_object: Option<wire::pod::Lite>,
    #[serde(default)]
    dry_run: Option<bool>,
}

/// The review's parts as [`object_parts`] finds them (keys in any letter case, the
/// last one wins, `null` is absent), the request decoded where it stands.
struct OnePassParts<'a> {
    api_version: Option<&'a RawValue>,
    kind: Option<&'a RawValue>,
    request: Option<OnePassRequest>,
}

struct OnePass;

impl<'de> Visitor<'de> for OnePass {
    type Value = OnePassParts<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an AdmissionReview object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut parts = OnePassParts {
            api_version: None,
            kind: None,
            request: None,
        };
        let text = |value: &'de RawValue| (value.get() != "null").then_some(value);
        while let Some(index) = map.next_key_seed(KeyIndex { keys: &REVIEW_KEYS })? {
            match index {
                Some(0) => parts.api_version = text(map.next_value()?),
                Some(1) => parts.kind = text(map.next_value()?),
                Some(_) => parts.request = map.next_value()?,
                None => drop(map.next_value::<IgnoredAny>()?),
            }
        }
        Ok(parts)
    }
}

#[cfg(test)]
#[path = "review_tests.rs"]
mod tests;
