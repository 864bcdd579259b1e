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

/// The users gpu-admission runs as under hack/e2e.sh and hack/scale.sh (the GPU
/// scheduler's ServiceAccount, as deploy/ runs it, and their admin certificate's common
/// name), its placementWriters and queue releasers there.
pub const HARNESS_WRITERS: [&str; 3] = [
    "system:serviceaccount:gpu-admission:gpu-scheduler",
    "e2e-admin",
    "scale-admin",
];

/// The validating webhook's match condition on pods as deploy/ and the chart ship it
/// (gpu-admission's one list of what only it writes, `Config::guarded_change_condition`),
/// for gpu-admission running as [`HARNESS_WRITERS`].
pub fn guarded_change() -> String {
    let users = serde_json::to_string(&HARNESS_WRITERS).unwrap_or_default();
    let config = format!("placementWriters: {users}\nqueue: {{releasers: {users}}}\n");
    gpu_admission::config::Config::parse(&config)
        .map(|c| c.guarded_change_condition())
        .unwrap_or_default()
}

/// One webhook of a (mutating or validating) webhook configuration, as deploy/ registers
/// gpu-admission's: `name` calling `url` (trusted through the base64 PEM `ca_bundle`), for
/// pods in namespaces labelled [`WEBHOOK_LABEL`]`=<selector>` (and matching
/// `object_selector` when given), failing closed. The validating webhook also sees pod
/// UPDATEs, but only those [`guarded_change`] lets through.
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
        "matchConditions": [{"name": "create-or-guarded-change", "expression": guarded_change()}],
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
