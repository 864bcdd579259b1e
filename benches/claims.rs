//! `/validate/resourceclaims` and `/mutate/resourceclaims` on the webhook door (the real
//! TLS server on loopback), for an honest claim and for hostile shapes of CEL, each
//! within every per-expression bound (Kubernetes' 10 KiB, our nesting and cost caps),
//! which the webhook must compile and evaluate against the published devices until the
//! claim's budget runs out: the 2 MiB claim of 60-string `exists`, 32 requests of 64
//! `"".matches("\\w+")`, nested ternaries, long string concatenations, long strings
//! compared in a loop, and 64 requests of 64 trivial selectors. `/version` (TLS, HTTP,
//! routing, no handler) is the floor. Requests are sent one at a time on one keep-alive
//! connection; for each body, the latencies and the process's CPU time per request
//! (server and client, from `/proc/self/stat`).
//!
//! Then the interference: pod reviews (`/validate`) and `/livez` one at a time, quiet and
//! while four connections send the 32x64 `matches` claim to both claim webhooks without
//! pause; their p50/p99 side by side, and how the hostile claims were answered.
//!
//! The cache is offline: 200 DRA nodes (ResourceSlices of 8 GPUs each, A100 or T4, every
//! device with its own UUID), NVIDIA's DeviceClasses, and a GPUQuota in the namespace.
//!
//! Run: `cargo bench --bench claims`. Environment: `REQUESTS` (30 per body), `PROBES`
//! (200 pod reviews and probes per phase).
#![allow(clippy::unwrap_used)]

mod support;

use std::time::{Duration, Instant};

use axum::body::Bytes;
use gpu_admission::backend::Backend;
use gpu_admission::cache::{CacheWriter, Projection};
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
const UID: &str = "7e1d2c3b-0000-4000-8000-000000000003";

fn fill(cache: &CacheWriter, dra: &gpu_admission::dra::Dra) {
    cache.write(|state| {
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

/// A pod review: one T4 GPU, dry run.
fn pod_review() -> Bytes {
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "7e1d2c3b-0000-4000-8000-0000000000ff",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": NAMESPACE, "operation": "CREATE", "userInfo": {"username": "bench"},
            "dryRun": true, "object": {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "p", "namespace": NAMESPACE,
                    "annotations": {"gpu-admission.io/gpu-type": "Tesla-T4"}},
                "spec": {"containers": [{"name": "app", "image": "app:1",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}
    });
    Bytes::from(serde_json::to_vec(&review).unwrap())
}

/// A claim of `requests` GPU requests, each with the selectors `selectors(r)`.
fn claim_of(name: &str, requests: usize, selectors: impl Fn(usize) -> Vec<String>) -> Value {
    let requests: Vec<Value> = (0..requests)
        .map(|r| {
            let selectors: Vec<Value> = selectors(r)
                .into_iter()
                .map(|e| json!({"cel": {"expression": e}}))
                .collect();
            json!({"name": format!("r{r}"), "exactly": {"deviceClassName": "gpu.nvidia.com",
                "selectors": selectors}})
        })
        .collect();
    json!({"metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {"requests": requests}}})
}

/// The issue's claim: 32 requests of 64 `"".matches("\\w+")` joined by `||` (false on
/// every device, so every term runs).
fn matches_claim() -> Value {
    let term = r#""".matches("\\w+")"#;
    claim_of("matches", 32, |_| vec![vec![term; 64].join(" || ")])
}

/// 64 requests of 4 selectors nesting ternaries 3 deep (brackets and conditionals
/// together at the nesting bound), false on every device.
fn ternary_claim() -> Value {
    claim_of("ternaries", 64, |r| {
        (0..4)
            .map(|s| {
                let mut e = format!("{PRODUCT} == \"{r}-{s}\"");
                for d in 0..3 {
                    e = format!("({PRODUCT}.size() > {d} ? {e} : {PRODUCT} == \"x{d}\")");
                }
                e
            })
            .collect()
    })
}

/// 64 requests of 4 selectors concatenating 9 strings of 1 KiB and comparing the
/// result with the model.
fn concat_claim() -> Value {
    claim_of("concat", 64, |r| {
        (0..4)
            .map(|s| {
                let parts: Vec<String> = (0..9)
                    .map(|p| format!("\"{r:02}{s}{p}{}\"", "y".repeat(1020)))
                    .collect();
                format!("{} == {PRODUCT}", parts.join(" + "))
            })
            .collect()
    })
}

/// 64 requests of 4 selectors comparing 60 long strings with themselves in a loop.
fn loop_claim() -> Value {
    claim_of("loops", 64, |r| {
        (0..4)
            .map(|s| {
                let words: Vec<String> = (0..60)
                    .map(|w| format!("\"{r:02}{s}{w:02}{}\"", "z".repeat(150)))
                    .collect();
                format!(
                    "[{}].all(x, x == x && x + x != x && x.startsWith(x)) && {PRODUCT} == \"none\"",
                    words.join(",")
                )
            })
            .collect()
    })
}

/// 64 requests of 64 selectors `true`: the most evaluations a claim can ask for.
fn trivial_claim() -> Value {
    claim_of("trivial", 64, |_| vec!["true".to_string(); 64])
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

/// As a tenant writes it (unpinned): 20Gi of an A100's memory, and alternatives
/// [A100, T4]. `/mutate` pins the first to shareable devices and keeps one alternative
/// by the quota's room; `/validate` refuses it unpinned.
fn share_and_alternatives_claim() -> Value {
    let product = |p: &str| json!([{"cel": {"expression": format!(r#"{PRODUCT} == "{p}""#)}}]);
    json!({"metadata": {"name": "shares", "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [
            {"name": "share", "exactly": {"deviceClassName": "gpu.nvidia.com",
                "selectors": product("NVIDIA A100-SXM4-80GB"),
                "capacity": {"requests": {"memory": "20Gi"}}}},
            {"name": "either", "firstAvailable": [
                {"name": "a100", "deviceClassName": "gpu.nvidia.com",
                    "selectors": product("NVIDIA A100-SXM4-80GB")},
                {"name": "t4", "deviceClassName": "gpu.nvidia.com",
                    "selectors": product("Tesla T4")}]}]}}})
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

/// The process's CPU time so far (user and system), in seconds.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime, fields 14 and 15 of stat(5), at 100 ticks a second.
    (ticks(11) + ticks(12)) / 100.0
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
    let cpu = cpu_seconds();
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
    let cpu_ms = (cpu_seconds() - cpu) * 1000.0 / n as f64;
    let message = response["status"]["message"].as_str().unwrap_or_default();
    let patched = response["patch"].as_str().map_or(0, str::len);
    println!(
        "{what:<34} {n} requests: p50 {:.2?}  p90 {:.2?}  max {:.2?}  CPU {cpu_ms:.1} ms/request  allowed {}  patch {patched} B  {}",
        p(0.5),
        p(0.9),
        latencies[n - 1],
        response["allowed"],
        message.chars().take(150).collect::<String>(),
    );
}

/// `n` pod reviews and `n` probes, alternating, one at a time: their latencies.
async fn probe(pods: &mut Sender, admin: &mut Sender, n: usize) -> [Vec<Duration>; 2] {
    let pod = pod_review();
    let (mut reviews, mut probes) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let sent = Instant::now();
        let (status, _) = send(pods, "/validate", Some(pod.clone())).await;
        assert_eq!(status, 200);
        reviews.push(sent.elapsed());
        let sent = Instant::now();
        let (status, _) = send(admin, "/livez", None).await;
        assert_eq!(status, 200);
        probes.push(sent.elapsed());
    }
    [reviews, probes]
}

/// The p50 and p99 of `latencies`.
fn p50_p99(mut latencies: Vec<Duration>) -> (Duration, Duration) {
    latencies.sort();
    let n = latencies.len();
    let at = |q: f64| latencies[((n as f64 * q).ceil() as usize).clamp(1, n) - 1];
    (at(0.5), at(0.99))
}

/// Pod reviews and probes, quiet and while four connections send `hostile` to both
/// claim webhooks without pause.
async fn interference(door: &support::WebhookDoor, admin: &support::WebhookDoor, hostile: Bytes) {
    let n: usize = std::env::var("PROBES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let mut pods: Sender = connect(door.addr, &door.ca).await;
    let mut probes: Sender = connect(admin.addr, &admin.ca).await;
    let quiet = probe(&mut pods, &mut probes, n).await.map(p50_p99);
    let stop = tokio_util::sync::CancellationToken::new();
    let mut senders = Vec::new();
    for i in 0..4 {
        let (addr, ca, body, stop) = (door.addr, door.ca.clone(), hostile.clone(), stop.clone());
        senders.push(tokio::spawn(async move {
            let mut sender: Sender = connect(addr, &ca).await;
            let path = ["/validate/resourceclaims", "/mutate/resourceclaims"][i % 2];
            let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
            while !stop.is_cancelled() {
                let (status, _) = send(&mut sender, path, Some(body.clone())).await;
                *statuses.entry(status).or_default() += 1;
            }
            statuses
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let cpu = cpu_seconds();
    let started = Instant::now();
    // As many rounds as fit in 3 s, so that the hostile claims run all along.
    let [mut reviews, mut probed] = probe(&mut pods, &mut probes, n).await;
    while started.elapsed() < Duration::from_secs(3) {
        let [more_reviews, more_probes] = probe(&mut pods, &mut probes, n).await;
        reviews.extend(more_reviews);
        probed.extend(more_probes);
    }
    let measured = reviews.len();
    let loaded = [reviews, probed].map(p50_p99);
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu;
    stop.cancel();
    let mut answered = std::collections::BTreeMap::<u16, usize>::new();
    for sender in senders {
        for (status, count) in sender.await.unwrap() {
            *answered.entry(status).or_default() += count;
        }
    }
    for (what, (q, l)) in ["pod review /validate", "/livez"]
        .iter()
        .zip(quiet.iter().zip(&loaded))
    {
        println!(
            "{what:<22} one at a time: quiet ({n}) p50 {:.2?} p99 {:.2?}; under hostile claims ({measured}) p50 {:.2?} p99 {:.2?}; p99 ratio {:.2}",
            q.0,
            q.1,
            l.0,
            l.1,
            l.1.as_secs_f64() / q.1.as_secs_f64()
        );
    }
    println!(
        "hostile claims answered meanwhile (status: count) {answered:?}; process CPU {:.0}% of one core over {elapsed:.1} s",
        cpu / elapsed * 100.0
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
    let cache = CacheWriter::in_memory(Projection::from_config(&config));
    fill(&cache, &config.dra);
    let state = AppState::new(Backend::offline(cache), config);
    let door = support::serve_webhooks(state.clone()).await;
    let admin = support::serve_router(gpu_admission::server::admin::admin_router(state)).await;
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
    let before = peak_rss_kib();
    let bodies = [
        ("honest claim", honest),
        (
            "share + alternatives",
            review(UID, &share_and_alternatives_claim()),
        ),
        ("exists over 60 strings (2 MiB)", hostile),
        (
            "32x64 \"\".matches(\"\\\\w+\")",
            review(UID, &matches_claim()),
        ),
        ("nested ternaries", review(UID, &ternary_claim())),
        ("9 KiB concatenations", review(UID, &concat_claim())),
        ("long strings in a loop", review(UID, &loop_claim())),
        ("64x64 selectors `true`", review(UID, &trivial_claim())),
    ];
    for (what, body) in &bodies {
        for (verb, path) in [
            ("validate", "/validate/resourceclaims"),
            ("mutate", "/mutate/resourceclaims"),
        ] {
            let what = format!("{what} {verb}");
            measure(&mut sender, &what, path, Some(body.clone()), n).await;
        }
    }
    println!(
        "peak RSS: {} KiB before the hostile claims, {} KiB after",
        before,
        peak_rss_kib()
    );
    interference(&door, &admin, bodies[3].1.clone()).await;
    door.shutdown.cancel();
    admin.shutdown.cancel();
}
