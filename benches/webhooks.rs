//! The webhook handlers against the framework's own cost, on one TLS listener (the
//! webhook door, `server::webhook_router`, served by the real TLS server on loopback) at
//! one concurrency: 64 keep-alive connections, rounds of `GET /version`, `POST /mutate`,
//! `POST /validate` interleaved (`/version`, `/mutate`, `/validate`, `/version`, ...), so
//! the three rates come from the same minutes of the same machine. `/version` is the
//! floor: TLS, HTTP and routing, no handler work. It carries no body, so a second floor,
//! `/floor` (this bench's own route, beside the webhooks' on the same listener), reads the
//! same review `/mutate` gets and answers the bytes `/mutate` answered, with no work in
//! between: what moving a review and its answer costs, which any handler pays.
//!
//! The reviews carry a GPU pod of a typical size, as kube-apiserver sends a Deployment's
//! pod (labels, owner reference, managedFields, probes, env, volumes with the projected
//! service-account token, the default tolerations). `/mutate` gets it as created;
//! `/validate` gets it as `/mutate` left it (the bench applies the webhook's own patch).
//! The cache is offline (`/validate` is judged against the in-memory ledger): 1,000 nodes
//! x 8 GPUs of three models (`support/cluster.rs`), a quota namespace over the three
//! (T4 its default type) holding `QUOTA_PODS` placed pods (5,000 by default), and 10,000
//! pods of another namespace.
//!
//! The server logs as the binary does by default (text, `info`): every request runs in
//! its `request` span, whose fields are recorded whether or not a line is written.
//!
//! Run: `cargo bench --bench webhooks`. Environment: `ROUNDS` (2), `ROUND_SECS` (3),
//! `QUOTA_PODS` (5000), `ROUTES` (e.g. `/mutate`, to profile one route; all three by
//! default), `POD=bare` (a pod of only a name, a container and its GPU limits, as
//! tests post one, instead of the Deployment's), `POD=mixed` (small pods of seven
//! shapes, slot by slot: 10% and 30% shares, a whole GPU, two `nvidia.com/gpu`, a named
//! model, a GPU init container, a native sidecar; each in the quota namespace, in one
//! whose GPUQuota has no room, whose reviews `/validate` denies and logs, and in one
//! without a GPUQuota; run it with `2>/dev/null`), `IN_PROCESS=1` (each route's
//! handler called through the router in this thread, over every connection's reviews:
//! no TLS, HTTP or socket), `NO_LOG=1` (no logger, to see what the span costs).
#![allow(clippy::unwrap_used)]

#[path = "support/cluster.rs"]
#[allow(dead_code)] // benches/filter.rs uses the rest
mod cluster;
mod support;

use std::time::{Duration, Instant};

use axum::body::Bytes;
use base64::Engine as _;
use gpu_admission::backend::Backend;
use gpu_admission::cache::{CacheWriter, CachedPod, Projection, pod_key};
use gpu_admission::config::Config;
use gpu_admission::placement::{GpuUse, NodeGpus};
use gpu_admission::server::AppState;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};
use support::{Sender, connect, send};

const CONNECTIONS: usize = 64;
const NODES: usize = 1_000;
const GPUS: usize = 8;
const OTHER_PODS: usize = 10_000;
/// Distinct pods each connection cycles through: an admitted pod joins the offline
/// cluster, so a re-sent one replaces itself and the namespace stays the same size.
const SLOTS: usize = 32;
const NAMESPACE: &str = "team-q";
/// `POD=mixed` only: a namespace whose GPUQuota has no room (its reviews are denied,
/// and each denial logged), and one with no GPUQuota.
const FULL: &str = "team-full";
const OPEN: &str = "team-open";

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn node_name(i: usize) -> String {
    format!("gpu-node-{i:04}")
}

/// CPU time this process has used (user + system), from /proc/self/stat: with the
/// client in the same process, CPU per request is less sensitive than the rate to other
/// work on the machine.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command (which may hold spaces): state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let ticks: u64 = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|t| t.parse::<u64>().ok())
        .sum();
    Duration::from_millis(ticks * 10) // USER_HZ is 100 on Linux
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// A placed share-mode pod (20% of a GPU) bound to a node, as the watch delivers it.
fn placed_pod(namespace: &str, i: usize) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": format!("running-{i:06}"), "namespace": namespace,
            "uid": format!("running-{namespace}-{i}"),
            "annotations": {"tencent.com/predicate-gpu-idx-0": ((i / NODES) % GPUS).to_string()}},
        "spec": {"nodeName": node_name(i % NODES), "schedulerName": "gpu-scheduler",
            "containers": [{"name": "main", "resources": {"limits":
                {"tencent.com/vcuda-core": "20", "tencent.com/vcuda-memory": "8"}}}]}
    }))
    .unwrap()
}

fn fill(cache: &CacheWriter, quota_pods: usize) {
    cache.write(|s| {
        for i in 0..NODES {
            let (model, memory, _) = cluster::MODELS[cluster::model_of(i)];
            s.apply_node(NodeGpus {
                name: node_name(i).into(),
                model: Some(model.into()),
                pool: None,
                memory_per_gpu: memory,
                used: vec![GpuUse::default(); GPUS],
                mig_slices: Vec::new(),
                created: 0,
                closed: None,
            })
        }
    });
    let projection = cache.projection().clone();
    for (namespace, count) in [(NAMESPACE, quota_pods), ("team-a", OTHER_PODS)] {
        for i in 0..count {
            let pod = placed_pod(namespace, i);
            let cached = CachedPod::from_pod(&pod, &projection).unwrap();
            cache.write(|s| s.apply_pod(pod_key(&pod), cached));
        }
    }
    let quota: gpu_admission::quota::GPUQuota = serde_json::from_value(json!({
        "apiVersion": "gpu-admission.io/v1alpha1", "kind": "GPUQuota",
        "metadata": {"name": "default", "namespace": NAMESPACE},
        "spec": {"hard": {"Tesla-T4": "100000", "Tesla-V100-SXM2-32GB": "100000",
            "A100-SXM4-40GB": "100000"}, "defaultType": "Tesla-T4"}
    }))
    .unwrap();
    cache.write(|s| s.apply_quota(quota));
    // A namespace whose quota has no room at all: every GPU pod of it is refused.
    let full: gpu_admission::quota::GPUQuota = serde_json::from_value(json!({
        "apiVersion": "gpu-admission.io/v1alpha1", "kind": "GPUQuota",
        "metadata": {"name": "default", "namespace": FULL},
        "spec": {"hard": {"Tesla-T4": "0"}, "defaultType": "Tesla-T4"}
    }))
    .unwrap();
    cache.write(|s| s.apply_quota(full));
}

/// A Deployment's GPU pod as kube-apiserver hands it to the webhooks on CREATE: named
/// by `generateName` (the webhook names it after the review's uid), with what the
/// controllers and the built-in admission plugins have set by then.
fn typical_pod() -> Value {
    let env: Vec<Value> = [
        ("NCCL_DEBUG", "WARN"),
        ("OMP_NUM_THREADS", "8"),
        ("TRAIN_CONFIG", "/etc/trainer/config.yaml"),
        ("DATA_DIR", "/data"),
        ("LOG_LEVEL", "info"),
        ("PYTHONUNBUFFERED", "1"),
    ]
    .iter()
    .map(|(name, value)| json!({"name": name, "value": value}))
    .chain([
        json!({"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}}),
        json!({"name": "POD_IP", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}}),
    ])
    .collect();
    let fields = json!({
        "f:metadata": {"f:generateName": {}, "f:labels": {".": {}, "f:app": {}, "f:pod-template-hash": {}, "f:team": {}},
            "f:annotations": {".": {}, "f:prometheus.io/port": {}, "f:prometheus.io/scrape": {}},
            "f:ownerReferences": {".": {}, "k:{\"uid\":\"5c0ffee0-1111-4222-8333-444455556666\"}": {}}},
        "f:spec": {"f:containers": {"k:{\"name\":\"trainer\"}": {".": {}, "f:args": {}, "f:command": {}, "f:env": {},
            "f:image": {}, "f:imagePullPolicy": {}, "f:livenessProbe": {}, "f:name": {}, "f:ports": {},
            "f:readinessProbe": {}, "f:resources": {".": {}, "f:limits": {}, "f:requests": {}},
            "f:securityContext": {}, "f:terminationMessagePath": {}, "f:terminationMessagePolicy": {}, "f:volumeMounts": {}}},
            "f:dnsPolicy": {}, "f:enableServiceLinks": {}, "f:restartPolicy": {}, "f:schedulerName": {},
            "f:securityContext": {}, "f:terminationGracePeriodSeconds": {}, "f:volumes": {}}
    });
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "generateName": "trainer-7d9f8b6c5-", "namespace": NAMESPACE,
            "labels": {"app": "trainer", "pod-template-hash": "7d9f8b6c5", "team": "q"},
            "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "9090"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "trainer-7d9f8b6c5",
                "uid": "5c0ffee0-1111-4222-8333-444455556666", "controller": true, "blockOwnerDeletion": true}],
            "managedFields": [{"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
                "time": "2026-11-23T10:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": fields}]
        },
        "spec": {
            "containers": [{
                "name": "trainer", "image": "registry.example.com/ml/trainer:2.4.1",
                "command": ["python", "-m", "trainer"], "args": ["--config", "/etc/trainer/config.yaml", "--epochs", "40"],
                "ports": [{"name": "metrics", "containerPort": 9090, "protocol": "TCP"}],
                "env": env,
                "resources": {
                    "limits": {"tencent.com/vcuda-core": "100", "tencent.com/vcuda-memory": "32", "cpu": "8", "memory": "32Gi"},
                    "requests": {"tencent.com/vcuda-core": "100", "tencent.com/vcuda-memory": "32", "cpu": "4", "memory": "16Gi"}
                },
                "volumeMounts": [
                    {"name": "config", "mountPath": "/etc/trainer", "readOnly": true},
                    {"name": "data", "mountPath": "/data"},
                    {"name": "dshm", "mountPath": "/dev/shm"},
                    {"name": "kube-api-access-x7k2p", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}
                ],
                "livenessProbe": {"httpGet": {"path": "/healthz", "port": 9090, "scheme": "HTTP"}, "initialDelaySeconds": 30,
                    "timeoutSeconds": 1, "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3},
                "readinessProbe": {"httpGet": {"path": "/ready", "port": 9090, "scheme": "HTTP"}, "timeoutSeconds": 1,
                    "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3},
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent", "securityContext": {"allowPrivilegeEscalation": false}
            }],
            "volumes": [
                {"name": "config", "configMap": {"name": "trainer-config", "defaultMode": 420}},
                {"name": "data", "persistentVolumeClaim": {"claimName": "trainer-data"}},
                {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}},
                {"name": "kube-api-access-x7k2p", "projected": {"defaultMode": 420, "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
                ]}}
            ],
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default", "serviceAccount": "default", "securityContext": {},
            "schedulerName": "default-scheduler", "enableServiceLinks": true,
            "preemptionPolicy": "PreemptLowerPriority", "priority": 0,
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
            ]
        },
        "status": {"phase": "Pending", "qosClass": "Burstable"}
    })
}

/// The least a GPU pod can be: generated name, one container, its GPU limits.
fn bare_pod() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "trainer-", "namespace": NAMESPACE},
        "spec": {"containers": [{"name": "trainer", "image": "registry.example.com/ml/trainer:2.4.1",
            "resources": {"limits": {"tencent.com/vcuda-core": "100", "tencent.com/vcuda-memory": "32"}}}]}
    })
}

/// Pods of the shapes a shared cluster's tenants create, one of each: shares of 10% and
/// 30% of a GPU, a whole GPU through gpu-manager, two whole `nvidia.com/gpu`, a pod that
/// names its model, one with a GPU init container, one with a native sidecar holding a
/// share beside its app; each in the quota namespace, in one whose quota is full, and in
/// one without a quota.
fn mixed_pods() -> Vec<Value> {
    // Interleaved: slot `s` is in namespace `s % 3`.
    let in_namespace = |mut pod: Value, namespace: &str| {
        pod["metadata"]["namespace"] = json!(namespace);
        pod
    };
    (mixed_shapes().into_iter())
        .flat_map(|pod| [NAMESPACE, FULL, OPEN].map(|ns| in_namespace(pod.clone(), ns)))
        .collect()
}

fn mixed_shapes() -> Vec<Value> {
    let share = |core: u32, memory: u32| {
        json!({"limits": {"tencent.com/vcuda-core": core.to_string(),
            "tencent.com/vcuda-memory": memory.to_string()}})
    };
    let pod = |name: &str, annotations: Value, spec: Value| {
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": format!("{name}-"), "namespace": NAMESPACE,
                "annotations": annotations},
            "spec": spec})
    };
    let app = |resources: Value| json!({"name": "app", "image": "registry.example.com/ml/app:1", "resources": resources});
    vec![
        pod(
            "infer",
            json!({}),
            json!({"containers": [app(share(10, 2))]}),
        ),
        pod(
            "tune",
            json!({}),
            json!({"containers": [app(share(30, 8))]}),
        ),
        pod(
            "train",
            json!({}),
            json!({"containers": [app(share(100, 32))]}),
        ),
        pod(
            "ddp",
            json!({}),
            json!({"containers": [app(json!({"limits": {"nvidia.com/gpu": "2"}}))]}),
        ),
        pod(
            "a100",
            json!({"gpu-admission.io/gpu-type": "A100-SXM4-40GB"}),
            json!({"containers": [app(share(50, 20))]}),
        ),
        pod(
            "warm",
            json!({}),
            json!({
            "initContainers": [{"name": "warmup", "image": "registry.example.com/ml/warm:1",
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            "containers": [app(share(20, 4))]}),
        ),
        pod(
            "sidecar",
            json!({}),
            json!({
            "initContainers": [{"name": "exporter", "image": "registry.example.com/ml/exp:1",
                "restartPolicy": "Always", "resources": share(10, 2)}],
            "containers": [app(share(30, 8))]}),
        ),
    ]
}

/// `pod` through `/mutate`: the answer, and the pod as its patch leaves it.
async fn mutate_once(sender: &mut Sender, pod: &Value) -> (Bytes, Value) {
    let (status, answer) = send(sender, "/mutate", Some(review(&uid(999, 0), pod))).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
    let response = response_of(&answer);
    assert_eq!(response["allowed"], true, "{response}");
    let patch = base64::engine::general_purpose::STANDARD
        .decode(response["patch"].as_str().expect("/mutate patches the pod"))
        .unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
    let mut mutated = pod.clone();
    json_patch::patch(&mut mutated, &patch).unwrap();
    assert_eq!(mutated["spec"]["schedulerName"], "gpu-scheduler");
    (answer, mutated)
}

fn review(uid: &str, pod: &Value) -> Bytes {
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": pod["metadata"]["namespace"], "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller",
                "uid": "0b1c2d3e-aaaa-4bbb-8ccc-ddddeeeeffff",
                "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"]},
            "object": pod, "oldObject": null, "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
        }
    });
    Bytes::from(serde_json::to_vec(&review).unwrap())
}

fn uid(connection: usize, slot: usize) -> String {
    format!("7e1d2c3b-{connection:04x}-4000-8000-{slot:012x}")
}

fn response_of(answer: &[u8]) -> Value {
    let answer: Value = serde_json::from_slice(answer).unwrap();
    answer["response"].clone()
}

#[derive(Clone, Copy)]
enum Route {
    Version,
    Floor,
    Mutate,
    Validate,
}

impl Route {
    const fn path(self) -> &'static str {
        match self {
            Route::Version => "/version",
            Route::Floor => "/floor",
            Route::Mutate => "/mutate",
            Route::Validate => "/validate",
        }
    }
}

/// Bodies by route, connection and slot.
struct Bodies {
    mutate: Vec<Vec<Bytes>>,
    validate: Vec<Vec<Bytes>>,
}

impl Bodies {
    fn of(&self, route: Route, connection: usize) -> Option<Vec<Bytes>> {
        match route {
            Route::Version => None,
            Route::Mutate | Route::Floor => Some(self.mutate[connection].clone()),
            Route::Validate => Some(self.validate[connection].clone()),
        }
    }
}

struct Round {
    requests: usize,
    cpu: Duration,
    failed: usize,
    elapsed: Duration,
    latencies: Vec<Duration>,
}

impl Round {
    fn rate(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }

    /// CPU time (server and client) per request, in microseconds.
    fn cpu_per_request(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / self.requests.max(1) as f64
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

/// Every connection sends `route` back to back until `length` has passed.
async fn round(
    senders: &mut Vec<Sender>,
    route: Route,
    bodies: &Bodies,
    length: Duration,
) -> Round {
    let started = Instant::now();
    let cpu = cpu_time();
    let deadline = started + length;
    let mut tasks = Vec::with_capacity(senders.len());
    for (connection, mut sender) in senders.drain(..).enumerate() {
        let bodies = bodies.of(route, connection);
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(1 << 12);
            let mut failed = 0;
            let mut i = 0;
            while Instant::now() < deadline {
                let body = bodies.as_ref().map(|b| b[i % b.len()].clone());
                let sent = Instant::now();
                let (status, _) = send(&mut sender, route.path(), body).await;
                latencies.push(sent.elapsed());
                failed += usize::from(status != 200);
                i += 1;
            }
            (sender, latencies, failed)
        }));
    }
    let (mut latencies, mut failed) = (Vec::new(), 0);
    for task in tasks {
        let (sender, done, fails) = task.await.unwrap();
        senders.push(sender);
        latencies.extend(done);
        failed += fails;
    }
    let elapsed = started.elapsed();
    let cpu = cpu_time().saturating_sub(cpu);
    latencies.sort();
    Round {
        requests: latencies.len(),
        cpu,
        failed,
        elapsed,
        latencies,
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    if std::env::var_os("NO_LOG").is_none() {
        let args = gpu_admission::cli::LogArgs {
            log_format: gpu_admission::cli::LogFormat::Text,
            log_level: "info".into(),
        };
        gpu_admission::telemetry::init(&args).unwrap();
    }
    let rounds = env_or("ROUNDS", 2);
    let length = Duration::from_secs(env_or("ROUND_SECS", 3) as u64);
    let quota_pods = env_or("QUOTA_PODS", 5_000);
    let config = Config::default();
    let cache = CacheWriter::in_memory(Projection::from_config(&config));
    let started = Instant::now();
    fill(&cache, quota_pods);
    println!(
        "cache: {NODES} nodes x {GPUS} GPUs, {quota_pods} pods in {NAMESPACE} (GPUQuota, default model), \
         {OTHER_PODS} in team-a; loaded in {:.2?}",
        started.elapsed()
    );

    // `/floor` answers what `/mutate` answered for the first review (set below).
    let floor_answer = std::sync::Arc::new(std::sync::OnceLock::<Bytes>::new());
    let floor = {
        let answer = floor_answer.clone();
        axum::routing::post(move |_review: Bytes| {
            let answer = answer.get().cloned().unwrap_or_default();
            async move {
                (
                    [(axum::http::header::CONTENT_TYPE, "application/json")],
                    answer,
                )
            }
        })
    };
    let router = gpu_admission::server::webhook_router(AppState::new(
        Backend::offline(cache.clone()),
        config,
    ))
    .route("/floor", floor);
    let door = support::serve_router(router.clone()).await;

    // The pods as created go to /mutate; /validate gets each as its patch left it.
    let created = match std::env::var("POD").as_deref() {
        Ok("bare") => vec![bare_pod()],
        Ok("mixed") => mixed_pods(),
        _ => vec![typical_pod()],
    };
    let mut sender = connect(door.addr, &door.ca).await;
    let mut mutated = Vec::new();
    for (i, pod) in created.iter().enumerate() {
        let (answer, patched) = mutate_once(&mut sender, pod).await;
        floor_answer.get_or_init(|| answer);
        let (status, answer) = send(
            &mut sender,
            "/validate",
            Some(review(&uid(999, i), &patched)),
        )
        .await;
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
        let refused = patched["metadata"]["namespace"] == FULL;
        assert_eq!(response_of(&answer)["allowed"], !refused, "{patched}");
        mutated.push(patched);
    }
    drop(sender);

    // Slot `s` of every connection carries pod shape `s` (of as many as there are).
    let shape = |pods: &[Value], s: usize| pods[s % pods.len()].clone();
    let bodies = Bodies {
        mutate: (0..CONNECTIONS)
            .map(|c| {
                (0..SLOTS)
                    .map(|s| review(&uid(c, s), &shape(&created, s)))
                    .collect()
            })
            .collect(),
        validate: (0..CONNECTIONS)
            .map(|c| {
                (0..SLOTS)
                    .map(|s| review(&uid(c, s), &shape(&mutated, s)))
                    .collect()
            })
            .collect(),
    };
    println!(
        "bodies: /mutate review {} bytes, /validate review {} bytes (the patched pod); {CONNECTIONS} keep-alive TLS connections, {rounds} rounds of {length:?} per route",
        bodies.mutate[0][0].len(),
        bodies.validate[0][0].len(),
    );
    if std::env::var("IN_PROCESS").is_ok() {
        in_process(router, &bodies, rounds).await;
        door.shutdown.cancel();
        return;
    }
    let mut senders = Vec::with_capacity(CONNECTIONS);
    for _ in 0..CONNECTIONS {
        senders.push(connect(door.addr, &door.ca).await);
    }
    // Warm up every connection and route.
    for route in [Route::Version, Route::Floor, Route::Mutate, Route::Validate] {
        round(&mut senders, route, &bodies, Duration::from_millis(300)).await;
    }
    println!("load average before: {}", load_average());

    let routes = [Route::Version, Route::Floor, Route::Mutate, Route::Validate];
    let mut totals = [(0usize, Duration::ZERO, Duration::ZERO); 4];
    for r in 1..=rounds {
        for (index, route) in routes.into_iter().enumerate() {
            if !chosen(route) {
                continue;
            }
            let done = round(&mut senders, route, &bodies, length).await;
            assert_eq!(done.failed, 0, "{} answered non-200", route.path());
            println!(
                "round {r} {:<9} {:>7} requests in {:.2?}: {:>7.0}/s  CPU {:>4.0} µs/request  p50 {:.2?}  p99 {:.2?}  max {:.2?}",
                route.path(),
                done.requests,
                done.elapsed,
                done.rate(),
                done.cpu_per_request(),
                percentile(&done.latencies, 0.50),
                percentile(&done.latencies, 0.99),
                done.latencies[done.latencies.len() - 1],
            );
            totals[index].0 += done.requests;
            totals[index].1 += done.elapsed;
            totals[index].2 += done.cpu;
        }
    }
    println!("load average after: {}", load_average());
    let rate = |i: usize| totals[i].0 as f64 / totals[i].1.as_secs_f64().max(1e-9);
    let (version, floor, mutate, validate) = (rate(0), rate(1), rate(2), rate(3));
    let cpu = |i: usize| totals[i].2.as_secs_f64() * 1e6 / totals[i].0.max(1) as f64;
    println!(
        "CPU per request (server + client): /version {:.0} µs, /floor {:.0} µs, /mutate {:.0} µs, /validate {:.0} µs",
        cpu(0),
        cpu(1),
        cpu(2),
        cpu(3)
    );
    println!(
        "all rounds: /version {version:.0}/s, /floor {floor:.0}/s, /mutate {mutate:.0}/s, /validate {validate:.0}/s"
    );
    println!(
        "rates against /version: /floor {:.2}, /mutate {:.2}, /validate {:.2}; against /floor (the same bytes moved): /mutate {:.2}, /validate {:.2}",
        floor / version,
        mutate / version,
        validate / version,
        mutate / floor,
        validate / floor
    );
    door.shutdown.cancel();
}

/// Whether `ROUTES` (comma-separated paths; all when unset) names `route`.
fn chosen(route: Route) -> bool {
    let only = std::env::var("ROUTES").unwrap_or_default();
    only.is_empty() || only.split(',').any(|r| r == route.path())
}

/// Each route's handler called in this thread, without TLS, HTTP or a socket: the
/// router's own cost per request, routes interleaved.
async fn in_process(router: axum::Router, bodies: &Bodies, rounds: usize) {
    use tower::ServiceExt as _;
    let calls = 20_000;
    let routes = [Route::Version, Route::Floor, Route::Mutate, Route::Validate];
    for r in 1..=rounds {
        for route in routes.into_iter().filter(|r| chosen(*r)) {
            // Every connection's reviews, as the TLS rounds send them: the pods /validate
            // admits join the cluster, which the handler's cost grows with.
            let bodies: Option<Vec<Bytes>> = (0..CONNECTIONS)
                .map(|c| bodies.of(route, c))
                .collect::<Option<Vec<_>>>()
                .map(|all| all.concat());
            let started = Instant::now();
            for i in 0..calls {
                let builder = axum::http::Request::builder().uri(route.path());
                let request = match &bodies {
                    None => builder.method("GET").body(axum::body::Body::empty()),
                    Some(b) => builder
                        .method("POST")
                        .header("content-type", "application/json")
                        .header("content-length", b[i % b.len()].len())
                        .body(axum::body::Body::from(b[i % b.len()].clone())),
                }
                .unwrap();
                let response = router.clone().oneshot(request).await.unwrap();
                let answer = axum::body::to_bytes(response.into_body(), usize::MAX).await;
                std::hint::black_box(answer.unwrap());
            }
            println!(
                "in process, round {r} {:<9} {:>6.2} µs/request",
                route.path(),
                started.elapsed().as_secs_f64() * 1e6 / calls as f64
            );
        }
    }
}
