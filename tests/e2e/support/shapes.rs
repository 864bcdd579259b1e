//! The objects both the end-to-end tests (tests/e2e/, through `support`) and the
//! cluster-scale benchmark (examples/scale.rs, which `#[path]`-includes this file) create:
//! the names gpu-admission reads, a fake GPU node's resources and Ready status, one
//! gpu-admission webhook of a webhook configuration. Plain JSON, no cluster access, no
//! panics.
use serde_json::{Value, json};

pub const MODEL_LABEL: &str = "nvidia.com/gpu.product";
pub const TYPE_ANNOTATION: &str = "gpu-admission.io/gpu-type";
pub const CORE: &str = "tencent.com/vcuda-core";
pub const MEMORY: &str = "tencent.com/vcuda-memory";
/// vcuda-memory units per GPU on every test node.
pub const MEMORY_PER_GPU: u32 = 16;
/// The label a namespace needs for the webhooks of [`webhook`] to apply to it (value: the
/// registration's `selector`).
pub const WEBHOOK_LABEL: &str = "gpu-admission-e2e/webhooks";

/// `capacity` (= `allocatable`) of a test node with `gpus` GPUs in gpu-manager resources
/// (`tencent.com/vcuda-core` 100 per GPU, `tencent.com/vcuda-memory` [`MEMORY_PER_GPU`]
/// per GPU), 32 CPUs, 128 GiB, 110 pods.
pub fn node_resources(gpus: u32) -> Value {
    json!({
        "cpu": "32",
        "memory": "128Gi",
        "pods": "110",
        CORE: (100 * gpus).to_string(),
        MEMORY: (MEMORY_PER_GPU * gpus).to_string(),
    })
}

/// The `status` of a Ready node (no kubelet: `message` says what it is) whose capacity
/// and allocatable are `resources`.
pub fn ready_node_status(resources: &Value, message: &str) -> Value {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    json!({
        "capacity": resources,
        "allocatable": resources,
        "conditions": [{
            "type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": message,
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        }],
    })
}

/// The users gpu-admission runs as under hack/e2e.sh and hack/scale.sh (their admin
/// certificate's common name), its placementWriters and queue releasers there.
pub const HARNESS_WRITERS: [&str; 2] = ["e2e-admin", "scale-admin"];

/// The validating webhook's match condition on pods, as deploy/ and the chart write it:
/// every CREATE; of the UPDATEs, those that change the GPU model annotation, or a
/// placement annotation (`<prefix>/predicate-*`, `<prefix>/gpu-assigned`) by a user
/// who is not one of `writers`; and the quota queue's gate removed, or its release
/// annotation changed, by a user who is not one of `releasers`. tests/manifests.rs holds
/// deploy/ to this text.
pub fn guarded_annotation_change(prefix: &str, writers: &[&str], releasers: &[&str]) -> String {
    let model_of = |object: &str| {
        format!(
            "(has({object}.metadata.annotations) && '{TYPE_ANNOTATION}' in {object}.metadata.annotations ? {object}.metadata.annotations['{TYPE_ANNOTATION}'] : '')"
        )
    };
    let placement =
        format!("(k.startsWith('{prefix}/predicate-') || k == '{prefix}/gpu-assigned')");
    let added = format!(
        "(has(object.metadata.annotations) && object.metadata.annotations.exists(k, {placement} && !(has(oldObject.metadata.annotations) && k in oldObject.metadata.annotations && oldObject.metadata.annotations[k] == object.metadata.annotations[k])))"
    );
    let removed = format!(
        "(has(oldObject.metadata.annotations) && oldObject.metadata.annotations.exists(k, {placement} && !(has(object.metadata.annotations) && k in object.metadata.annotations)))"
    );
    let writers = serde_json::to_string(writers).unwrap_or_default();
    let gated = |object: &str| {
        format!(
            "(has({object}.spec.schedulingGates) && {object}.spec.schedulingGates.exists(g, g.name == 'gpu-admission.io/quota'))"
        )
    };
    let released = |object: &str| {
        format!(
            "(has({object}.metadata.annotations) && 'gpu-admission.io/quota-released' in {object}.metadata.annotations ? {object}.metadata.annotations['gpu-admission.io/quota-released'] : '')"
        )
    };
    let releasers = serde_json::to_string(releasers).unwrap_or_default();
    format!(
        "request.operation == 'CREATE' || {} != {} || (!(request.userInfo.username in {writers}) && ({added} || {removed})) || (!(request.userInfo.username in {releasers}) && (({} && !{}) || {} != {}))",
        model_of("object"),
        model_of("oldObject"),
        gated("oldObject"),
        gated("object"),
        released("object"),
        released("oldObject"),
    )
}

/// One webhook of a (mutating or validating) webhook configuration, as deploy/ registers
/// gpu-admission's: `name` calling `url` (trusted through the base64 PEM `ca_bundle`), for
/// pods in namespaces labelled [`WEBHOOK_LABEL`]`=<selector>` (and matching
/// `object_selector` when given), failing closed. The validating webhook also sees pod
/// UPDATEs, but only those [`guarded_annotation_change`] lets through.
pub fn webhook(
    name: &str,
    url: &str,
    ca_bundle: &str,
    validating: bool,
    selector: &str,
    object_selector: Option<&Value>,
) -> Value {
    let operations = if validating {
        json!(["CREATE", "UPDATE"])
    } else {
        json!(["CREATE"])
    };
    let mut webhook = json!({
        "name": name,
        "clientConfig": {"url": url, "caBundle": ca_bundle},
        "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": operations,
                   "resources": ["pods"]}],
        "matchConditions": [{"name": "create-or-guarded-annotation-change",
            "expression": guarded_annotation_change("tencent.com", &HARNESS_WRITERS, &HARNESS_WRITERS)}],
        "namespaceSelector": {"matchLabels": {WEBHOOK_LABEL: selector}},
        "failurePolicy": "Fail",
        "sideEffects": "NoneOnDryRun",
        "admissionReviewVersions": ["v1"],
        "timeoutSeconds": 10,
    });
    if let Some(selector) = object_selector {
        webhook["objectSelector"] = selector.clone();
    }
    webhook
}
