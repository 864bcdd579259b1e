//! `/validate/resourceclaims` on the webhook door (the real TLS server on loopback), for
//! an honest claim and for a 2 MiB claim of hostile CEL: 64 requests of selectors each
//! just within the per-expression bounds (Kubernetes' 10 KiB, our cost cap), which the
//! webhook must compile and evaluate against the published devices until the claim's
//! budget runs out. `/version` (TLS, HTTP, routing, no handler) is the floor. Requests
//! are sent one at a time on one keep-alive connection; the process's peak RSS is
//! printed after the hostile claims.
//!
//! The cache is offline: 200 DRA nodes (ResourceSlices of 8 GPUs each, A100 or T4, every
//! device with its own UUID), NVIDIA's DeviceClasses, and a GPUQuota in the namespace.
//!
//! Run: `cargo bench --bench claims`. Environment: `REQUESTS` (30 per body).
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Instant;

use axum::body::Bytes;
use gpu_admission::backend::Backend;
use gpu_admission::cache::{ClusterCache, Projection};
use gpu_admission::config::Config;
use gpu_admission::dra::classes::{ClassInfo, DeviceClass};
use gpu_admission::dra::slices::{ResourceSlice, gpu_devices};
use gpu_admission::quota::GPUQuota;
use gpu_admission::server::AppState;
use serde_json::{Value, json};
use support::{Sender, connect, send};

const NODES: usize = 200;
const NAMESPACE: &str = "team-q";
const PRODUCT: &str = r#"device.attributes["gpu.nvidia.com"].productName"#;

fn fill(cache: &ClusterCache, dra: &gpu_admission::dra::Dra) {
    cache.with_state(|state| {
        for kind in ["gpu", "mig"] {
            let class: DeviceClass = serde_json::from_value(json!({
                "metadata": {"name": format!("{kind}.nvidia.com")},
                "spec": {"selectors": [{"cel": {"expression": format!(
                    r#"device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type == "{kind}""#)}}]}
            }))
            .unwrap();
            state.apply_class(&format!("{kind}.nvidia.com"), ClassInfo::of(&class));
        }
        for n in 0..NODES {
            let product = if n % 2 == 0 { "NVIDIA A100-SXM4-80GB" } else { "Tesla T4" };
            let devices: Vec<Value> = (0..8)
                .map(|g| json!({"name": format!("gpu-{g}"), "attributes": {
                    "productName": {"string": product}, "type": {"string": "gpu"},
                    "uuid": {"string": format!("GPU-{n:04}-{g}")}, "index": {"int": g},
                    "driverVersion": {"version": "550.54.15"}},
                    "capacity": {"memory": {"value": "80Gi"}}}))
                .collect();
            let node = format!("dra-node-{n}");
            let slice: ResourceSlice = serde_json::from_value(json!({
                "metadata": {"name": format!("{node}-gpus")},
                "spec": {"driver": "gpu.nvidia.com", "nodeName": node, "pool": {"name": node},
                    "devices": devices}
            }))
            .unwrap();
            state.apply_slice(&format!("{node}-gpus"), gpu_devices(&slice, dra));
        }
        let quota: GPUQuota = serde_json::from_value(json!({
            "apiVersion": "gpu-admission.io/v1alpha1", "kind": "GPUQuota",
            "metadata": {"name": "q", "namespace": NAMESPACE},
            "spec": {"hard": {"A100-SXM4-80GB": "100000", "Tesla-T4": "100000"},
                "defaultType": "Tesla-T4"}
        }))
        .unwrap();
        state.apply_quota(quota);
    });
}

fn review(uid: &str, claim: &Value) -> Bytes {
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": uid,
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
            "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaims"},
            "namespace": NAMESPACE, "operation": "CREATE", "userInfo": {"username": "bench"},
            "dryRun": true, "object": claim}
    });
    Bytes::from(serde_json::to_vec(&review).unwrap())
}

/// One request for an A100, pinned as the mutating webhook leaves it.
fn honest_claim() -> Value {
    let profile = r#"device.attributes["gpu.nvidia.com"].profile"#;
    let pin = format!(r#"{PRODUCT} in ["NVIDIA A100-SXM4-80GB"] && !has({profile})"#);
    json!({"metadata": {"name": "honest", "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.nvidia.com", "count": 1, "selectors": [
                {"cel": {"expression": format!(r#"{PRODUCT} == "NVIDIA A100-SXM4-80GB""#)}},
                {"cel": {"expression": pin}}]}}]}}})
}

/// 64 requests of 4 selectors, each about 8 KiB of CEL that stays within the
/// expression's cost cap and evaluates true (so every selector of a request runs), and
/// each different (nothing can be shared between them).
fn hostile_claim() -> Value {
    let requests: Vec<Value> = (0..64)
        .map(|r| {
            let selectors: Vec<Value> = (0..4)
                .map(|s| {
                    let words: Vec<String> = (0..60)
                        .map(|w| format!("\"{r:02}-{s}-{w:03}-{}\"", "x".repeat(120)))
                        .collect();
                    let expression = format!(
                        "[{}].exists(x, {PRODUCT}.contains(x) || x.matches(\"^[0-9]+-[0-9]-[0-9]+-x+$\"))",
                        words.join(",")
                    );
                    json!({"cel": {"expression": expression}})
                })
                .collect();
            json!({"name": format!("r{r}"), "exactly": {"deviceClassName": "gpu.nvidia.com",
                "selectors": selectors}})
        })
        .collect();
    json!({"metadata": {"name": "hostile", "namespace": NAMESPACE},
        "spec": {"devices": {"requests": requests}}})
}

fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

async fn measure(sender: &mut Sender, what: &str, path: &str, body: Option<Bytes>, n: usize) {
    let mut latencies = Vec::with_capacity(n);
    let mut answer = Bytes::new();
    for _ in 0..n {
        let sent = Instant::now();
        let (status, body) = send(sender, path, body.clone()).await;
        latencies.push(sent.elapsed());
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        answer = body;
    }
    latencies.sort();
    let p = |q: f64| latencies[((latencies.len() as f64 * q).ceil() as usize).clamp(1, n) - 1];
    let answer: Value = serde_json::from_slice(&answer).unwrap_or_default();
    let response = &answer["response"];
    println!(
        "{what:<30} {n} requests: p50 {:.2?}  p90 {:.2?}  max {:.2?}  allowed {}  {}",
        p(0.5),
        p(0.9),
        latencies[n - 1],
        response["allowed"],
        response["status"]["message"].as_str().unwrap_or_default(),
    );
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let n: usize = std::env::var("REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let config = Config::default();
    let cache = ClusterCache::in_memory(Projection::from_config(&config));
    fill(&cache, &config.dra);
    let door = support::serve_webhooks(AppState::new(Backend::offline(cache), config)).await;
    let mut sender: Sender = connect(door.addr, &door.ca).await;
    let honest = review("7e1d2c3b-0000-4000-8000-000000000001", &honest_claim());
    let hostile = review("7e1d2c3b-0000-4000-8000-000000000002", &hostile_claim());
    println!(
        "cache: {NODES} DRA nodes x 8 GPUs; bodies: honest {} bytes, hostile {} bytes ({:.2} MiB)",
        honest.len(),
        hostile.len(),
        hostile.len() as f64 / f64::from(1 << 20)
    );
    measure(&mut sender, "GET /version", "/version", None, n).await;
    let path = "/validate/resourceclaims";
    measure(&mut sender, "honest claim", path, Some(honest), n).await;
    let before = peak_rss_kib();
    measure(
        &mut sender,
        "hostile claim (2 MiB of CEL)",
        path,
        Some(hostile),
        n,
    )
    .await;
    println!(
        "peak RSS: {} KiB before the hostile claims, {} KiB after",
        before,
        peak_rss_kib()
    );
    door.shutdown.cancel();
}
