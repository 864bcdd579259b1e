//! Filter latency at scale, over loopback TLS, as kube-scheduler calls it: 5,000 nodes
//! x 8 GPUs, 40,000 placed GPU pods in the cache, every request naming all 5,000 nodes
//! (as names, or as whole Node objects), one keep-alive connection. Two clusters: the
//! heterogeneous one (`support/cluster.rs`: three models, random occupancy, mixed
//! shapes, a quota namespace), which every row measures unless it says "uniform", and
//! the uniform one (identical T4 nodes, identical 20% pods), kept as one row. Also:
//! resident memory per cached pod, and the rate of small requests the server sustains.
//! Run: `cargo bench --bench filter` (`FILTER_ONLY=1`: the filter only; `ROUNDS`, `NAMES_PER_ROUND`).
#![allow(clippy::unwrap_used)]

#[path = "support/cluster.rs"]
mod cluster;
mod support;

use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use gpu_admission::backend::Backend;
use gpu_admission::cache::{CacheWriter, Projection, pod_key};
use gpu_admission::certs::{self, CertFiles};
use gpu_admission::config::Config;
use gpu_admission::placement::{GpuUse, NodeGpus};
use gpu_admission::server::listener::{ConnectionLimits, serve_tls};
use gpu_admission::server::tls::{CertResolver, server_config};
use gpu_admission::server::{AppState, extender_router, webhook_router};
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use support::connect;
use tokio_util::sync::CancellationToken;

const NODES: usize = 5_000;
const GPUS: usize = 8;
const PODS: usize = 40_000;

fn resident_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn node_name(i: usize) -> String {
    format!("gpu-node-{i:05}")
}

fn pod_json(namespace: &str, name: &str, core: u32, memory: u32) -> serde_json::Value {
    json!({
        "metadata": {"name": name, "namespace": namespace, "uid": format!("{name}-uid")},
        "spec": {"containers": [{"name": "main", "image": "trainer:latest",
            "resources": {"limits": {"tencent.com/vcuda-core": core.to_string(), "tencent.com/vcuda-memory": memory.to_string()}}}]}
    })
}

/// 5,000 nodes, then 40,000 running share-mode pods spread over them (20% of a GPU each),
/// projected from real Pod objects as the watch would deliver them.
fn fill_uniform(cache: &CacheWriter) -> f64 {
    cache.write(|s| {
        for i in 0..NODES {
            s.apply_node(NodeGpus {
                name: node_name(i).into(),
                model: Some("Tesla-T4".into()),
                pool: None,
                memory_per_gpu: 64,
                used: vec![GpuUse::default(); GPUS],
                mig_slices: Vec::new(),
                created: 0,
                closed: None,
            })
        }
    });
    let projection = cache.projection().clone();
    let before = resident_bytes();
    for i in 0..PODS {
        let mut value = pod_json("team-a", &format!("running-{i:06}"), 20, 8);
        value["spec"]["nodeName"] = json!(node_name(i % NODES));
        value["metadata"]["annotations"] =
            json!({"tencent.com/predicate-gpu-idx-0": ((i / NODES) % GPUS).to_string()});
        let pod: Pod = serde_json::from_value(value).unwrap();
        let cached = gpu_admission::cache::CachedPod::from_pod(&pod, &projection).unwrap();
        cache.write(|s| s.apply_pod(pod_key(&pod), cached));
    }
    (resident_bytes().saturating_sub(before)) as f64 / PODS as f64
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

fn report(what: &str, mut latencies: Vec<Duration>) {
    if latencies.is_empty() {
        return;
    }
    latencies.sort();
    println!(
        "{what}: p50 {:.2?}  p90 {:.2?}  p99 {:.2?}  max {:.2?}",
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.90),
        percentile(&latencies, 0.99),
        latencies[latencies.len() - 1]
    );
}

type Sender = hyper::client::conn::http1::SendRequest<Body>;

async fn post(sender: &mut Sender, path: &str, body: String) -> (u16, axum::body::Bytes) {
    let request = axum::http::Request::post(path)
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap();
    sender.ready().await.unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status().as_u16();
    (
        status,
        axum::body::to_bytes(Body::new(response.into_body()), 64 << 20)
            .await
            .unwrap(),
    )
}

/// The heterogeneous cluster (`support/cluster.rs`) with its GPUQuota; resident memory
/// per cached pod.
fn fill_mixed(cache: &CacheWriter) -> f64 {
    let hard: serde_json::Map<String, serde_json::Value> = cluster::MODELS
        .iter()
        .map(|(model, _, _)| (model.to_string(), json!("100000")))
        .collect();
    let quota: gpu_admission::quota::GPUQuota = serde_json::from_value(json!({
        "apiVersion": "gpu-admission.io/v1alpha1", "kind": "GPUQuota",
        "metadata": {"name": "default", "namespace": cluster::QUOTA_NAMESPACE},
        "spec": {"hard": hard}
    }))
    .unwrap();
    cache.write(|s| s.apply_quota(quota));
    cluster::add_nodes(cache, NODES, GPUS, node_name);
    // The quota first: its namespace's pods are charged as they come (the ledger's
    // entries count in the memory per pod).
    let before = resident_bytes();
    let placed = cluster::fill(cache, NODES, GPUS, PODS, node_name);
    let per_pod = (resident_bytes().saturating_sub(before)) as f64 / placed as f64;
    let models: Vec<String> = cluster::MODELS
        .iter()
        .map(|(m, memory, _)| {
            let count = (0..NODES)
                .filter(|&i| cluster::MODELS[cluster::model_of(i)].0 == *m)
                .count();
            format!("{count} {m} ({memory} memory units)")
        })
        .collect();
    println!(
        "cache, heterogeneous: {NODES} nodes x {GPUS} GPUs: {}; {placed} pods of shapes {:?} (core, % memory), random occupancy; GPUQuota in {} over the three models",
        models.join(", "),
        cluster::SHAPES,
        cluster::QUOTA_NAMESPACE
    );
    per_pod
}

/// Pods waiting in a quota queue (`onExceed: Queue`): the resident memory each adds, and
/// what the releaser's plan over a 1,000-pod line costs (`quota::queue::plan`).
fn queue(cache: &CacheWriter, config: &Config) {
    const WAITING: usize = 20_000;
    let quota: gpu_admission::quota::GPUQuota = serde_json::from_value(json!({
        "apiVersion": "gpu-admission.io/v1alpha1", "kind": "GPUQuota",
        "metadata": {"name": "default", "namespace": "team-line"},
        "spec": {"hard": {"Tesla-T4": "10"}, "defaultType": "Tesla-T4", "onExceed": "Queue"}
    }))
    .unwrap();
    cache.write(|s| s.apply_quota(quota));
    let waiting = |i: usize| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": format!("wait-{i:06}"), "namespace": "team-line",
                "uid": format!("w{i}"), "creationTimestamp": "2026-11-25T10:00:00Z",
                "annotations": {"gpu-admission.io/gpu-type": "Tesla-T4"}},
            "spec": {"priority": (i % 3) as i32, "schedulingGates": [{"name": "gpu-admission.io/quota"}],
                "containers": [{"name": "c", "resources": {"limits": {"tencent.com/vcuda-core": "100",
                    "tencent.com/vcuda-memory": "8"}}}]}
        }))
        .unwrap()
    };
    let projection = Projection::from_config(config);
    let pods: Vec<Pod> = (0..WAITING).map(waiting).collect();
    let before = resident_bytes();
    for pod in &pods {
        let cached = gpu_admission::cache::CachedPod::from_pod(pod, &projection).unwrap();
        cache.write(|s| s.apply_pod(pod_key(pod), cached));
    }
    let per_pod = resident_bytes().saturating_sub(before) as f64 / WAITING as f64;
    drop(pods);
    // The plan over the first 1,000 of the line (the releaser plans one namespace at a
    // time; a line this long in one namespace is the heavy case).
    let rules = config.queue_rules();
    let head = |s: &gpu_admission::cache::ClusterState| {
        s.waiting_line("team-line", 1_795_600_900, rules.max_pass_over, 1_000)
    };
    let line = cache.read(head);
    let started = Instant::now();
    for _ in 0..20 {
        std::hint::black_box(cache.read(head));
    }
    let read_time = started.elapsed() / 20;
    let views = cache.read(|s| s.quota_views("team-line").unwrap());
    let rounds = 200;
    let started = Instant::now();
    for _ in 0..rounds {
        let turns = gpu_admission::quota::queue::plan(
            "team-line",
            &views,
            line.clone(),
            1_795_600_900,
            rules,
        );
        std::hint::black_box(turns);
    }
    let plan = started.elapsed() / rounds;
    println!(
        "queue: resident memory per waiting pod {per_pod:.0} bytes ({WAITING} pods in one line); the head of the line ({} pods) read under the cache lock in {read_time:.2?}; plan over it {plan:.2?}",
        line.len()
    );
}

/// Serve `cache` behind the extender's door and the webhooks' door, as `serve` runs
/// them; their addresses.
async fn serve(
    cache: &CacheWriter,
    config: Config,
    resolver: &std::sync::Arc<CertResolver>,
    shutdown: &CancellationToken,
) -> (std::net::SocketAddr, std::net::SocketAddr) {
    let state = AppState::new(Backend::offline(cache.clone()), config);
    let mut doors = Vec::new();
    for router in [extender_router(state.clone()), webhook_router(state)] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        doors.push(listener.local_addr().unwrap());
        tokio::spawn(serve_tls(
            listener,
            server_config(resolver.clone()),
            router,
            shutdown.clone(),
            Duration::from_secs(1),
            ConnectionLimits::default(),
        ));
    }
    (doors[0], doors[1])
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let policy = std::env::var("POLICY").unwrap_or_else(|_| "fgd".into());
    let config = Config::parse(&format!("placement: {{policy: {policy}}}")).unwrap();
    println!("policy: {policy}");
    let mixed = CacheWriter::in_memory(Projection::from_config(&config));
    let started = Instant::now();
    let mixed_per_pod = fill_mixed(&mixed);
    println!("cache, heterogeneous: loaded in {:.2?}", started.elapsed());
    let uniform = CacheWriter::in_memory(Projection::from_config(&config));
    let started = Instant::now();
    let per_pod = fill_uniform(&uniform);
    let quota: gpu_admission::quota::GPUQuota = serde_json::from_value(json!({
        "apiVersion": "gpu-admission.io/v1alpha1", "kind": "GPUQuota",
        "metadata": {"name": "default", "namespace": "team-q"},
        "spec": {"hard": {"Tesla-T4": "10000"}, "defaultType": "Tesla-T4"}
    }))
    .unwrap();
    uniform.write(|s| s.apply_quota(quota));
    println!(
        "cache, uniform: {NODES} nodes x {GPUS} GPUs, {PODS} pods loaded in {:.2?}",
        started.elapsed()
    );
    println!(
        "cache: resident memory per cached pod: heterogeneous {mixed_per_pod:.0} bytes, uniform {per_pod:.0} bytes"
    );
    queue(&uniform, &config);

    let dir = tempfile::tempdir().unwrap();
    let files = CertFiles::in_dir(dir.path());
    certs::ensure(
        &files,
        &certs::dev_request(),
        Duration::from_secs(86400),
        time::OffsetDateTime::now_utc(),
    )
    .unwrap();
    let resolver = CertResolver::load(&files.cert, &files.key).unwrap();
    let shutdown = CancellationToken::new();
    let (addr, webhooks) = serve(&mixed, config.clone(), &resolver, &shutdown).await;
    let (uniform_addr, _) = serve(&uniform, config, &resolver, &shutdown).await;

    let mut sender = connect(addr, &files.ca_cert).await;
    let mut uniform_sender = connect(uniform_addr, &files.ca_cert).await;
    let (placed, uniform_placed) = interleaved(&mut sender, &mut uniform_sender).await;
    decisions("heterogeneous", &mixed, placed, MIXED_PREFIX);
    decisions("uniform", &uniform, uniform_placed, UNIFORM_PREFIX);

    if std::env::var_os("FILTER_ONLY").is_none() {
        small_request_rate(addr, &files.ca_cert).await;
        for route in ["/mutate", "/validate"] {
            admission_latency(webhooks, &files.ca_cert, route).await;
        }
    }
    shutdown.cancel();
}

/// p50/p99 of one webhook under concurrent load: 16 keep-alive connections, each sending
/// reviews back to back for 3 s. Validation charges a 10,000-GPU quota in team-q.
async fn admission_latency(addr: std::net::SocketAddr, ca: &std::path::Path, route: &'static str) {
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut tasks = Vec::new();
    for connection in 0..16 {
        let mut sender = connect(addr, ca).await;
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut i = 0;
            while Instant::now() < deadline {
                let pod = pod_json("team-q", &format!("{route}-{connection}-{i}"), 50, 8);
                let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                    "request": {"uid": format!("u{connection}-{i}"), "operation": "CREATE", "namespace": "team-q",
                        "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "resource": {"group": "", "version": "v1", "resource": "pods"}, "object": pod}});
                let sent = Instant::now();
                let (status, _) = post(&mut sender, route, review.to_string()).await;
                latencies.push(sent.elapsed());
                assert_eq!(status, 200);
                i += 1;
            }
            latencies
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    all.sort();
    println!(
        "{route} over TLS, 16 concurrent connections: {} reviews in 3 s ({:.0}/s), p50 {:.2?}  p99 {:.2?}  max {:.2?}",
        all.len(),
        all.len() as f64 / 3.0,
        percentile(&all, 0.50),
        percentile(&all, 0.99),
        all[all.len() - 1]
    );
}

/// Many small Volcano-sized predicate requests from 32 keep-alive connections for 3 s.
async fn small_request_rate(addr: std::net::SocketAddr, ca: &std::path::Path) {
    let body = json!({"task": {"Pod": pod_json("team-b", "small", 10, 4)}, "node": {"Name": node_name(1)}}).to_string();
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let mut sender = connect(addr, ca).await;
        let body = body.clone();
        tasks.push(tokio::spawn(async move {
            let mut done = 0u64;
            while Instant::now() < deadline {
                let (status, _) = post(&mut sender, "/scheduler/vpredicates", body.clone()).await;
                assert_eq!(status, 200);
                done += 1;
            }
            done
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await.unwrap();
    }
    println!(
        "small requests (vpredicates, 32 connections, client in the same process): {:.0}/s",
        total as f64 / 3.0
    );
}

/// Ten request shapes, as a real mix has: the fgd policy learns and scores them all.
/// Every GPU carries a 20% pod, so the whole-GPU shapes fit nowhere (an answer with a
/// reason for each of the 5,000 nodes).
const SHAPES: [(u32, u32); 10] = [
    (10, 4),
    (20, 8),
    (30, 12),
    (50, 20),
    (100, 64),
    (200, 128),
    (40, 16),
    (60, 24),
    (25, 10),
    (400, 256),
];

/// A Node object as kubelet posts it and kube-scheduler sends it in the `Nodes` form
/// (encoded by Go: struct fields in declaration order, map keys sorted): labels (GPU
/// model among them), annotations, capacity and allocatable with the GPU resources,
/// conditions, addresses, nodeInfo and a list of images. About 4.7 KB.
fn node_object(i: usize) -> String {
    // A JSON object with its fields in this order (values are JSON texts).
    fn fields(fields: &[(&str, String)]) -> String {
        let fields: Vec<String> = fields.iter().map(|(k, v)| format!("{k:?}:{v}")).collect();
        format!("{{{}}}", fields.join(","))
    }
    let text = |s: &str| serde_json::to_string(s).unwrap();
    let name = node_name(i);
    let hex = |seed: usize, len: usize| -> String {
        let mut x = (seed as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                char::from_digit((x % 16) as u32, 16).unwrap()
            })
            .collect()
    };
    let uuid = |seed: usize| {
        let h = hex(seed, 32);
        format!(
            "{}-{}-{}-{}-{}",
            &h[..8],
            &h[8..12],
            &h[12..16],
            &h[16..20],
            &h[20..]
        )
    };
    let ip = format!("10.{}.{}.{}", 20 + i / 65536, (i / 256) % 256, i % 256);
    let heartbeat = "2026-11-24T09:41:27Z";
    let since = "2026-11-02T03:15:09Z";
    let condition = |kind: &str, status: &str, reason: &str, message: &str| {
        fields(&[
            ("type", text(kind)),
            ("status", text(status)),
            ("lastHeartbeatTime", text(heartbeat)),
            ("lastTransitionTime", text(since)),
            ("reason", text(reason)),
            ("message", text(message)),
        ])
    };
    let images: Vec<String> = [
        (
            "ccr.ccs.tencentyun.com/tke/gpu-manager",
            "v1.1.5",
            412_304_102u64,
        ),
        ("nvcr.io/nvidia/pytorch", "24.05-py3", 9_893_120_455),
        ("nvcr.io/nvidia/tritonserver", "24.05-py3", 7_210_443_180),
        ("registry.k8s.io/kube-proxy", "v1.33.2", 31_102_440),
        ("docker.io/flannel/flannel", "v0.25.4", 33_441_200),
        ("docker.io/calico/node", "v3.28.0", 115_028_764),
        ("registry.k8s.io/pause", "3.10", 320_368),
        ("nvcr.io/nvidia/k8s-device-plugin", "v0.16.1", 145_021_388),
        ("docker.io/library/trainer", "latest", 5_403_118_002),
        (
            "ccr.ccs.tencentyun.com/tke/node-problem-detector",
            "v0.8.19",
            41_200_918,
        ),
    ]
    .iter()
    .enumerate()
    .map(|(k, (repo, tag, size))| {
        let names = json!([
            format!("{repo}@sha256:{}", hex(k * 7919 + 1, 64)),
            format!("{repo}:{tag}")
        ]);
        fields(&[
            ("names", names.to_string()),
            ("sizeBytes", size.to_string()),
        ])
    })
    .collect();
    // Maps: Go writes their keys sorted, as serde_json's map does.
    let resources = |cpu: &str, memory: &str| {
        json!({"cpu": cpu, "ephemeral-storage": "103079844Ki", "hugepages-1Gi": "0",
            "hugepages-2Mi": "0", "memory": memory, "pods": "110",
            "tencent.com/vcuda-core": "800", "tencent.com/vcuda-memory": "512"})
        .to_string()
    };
    let labels = json!({
        "beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/instance-type": "GN7.20XLARGE320",
        "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux", "node.kubernetes.io/instance-type": "GN7.20XLARGE320",
        "topology.kubernetes.io/region": "ap-guangzhou",
        "topology.kubernetes.io/zone": format!("ap-guangzhou-{}", 3 + i % 3),
        "nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.count": "8",
        "nvidia.com/cuda.driver.major": "535"
    });
    let annotations = json!({
        "node.alpha.kubernetes.io/ttl": "0",
        "volumes.kubernetes.io/controller-managed-attach-detach": "true",
        "kubeadm.alpha.kubernetes.io/cri-socket": "unix:///run/containerd/containerd.sock",
        "csi.volume.kubernetes.io/nodeid": format!("{{\"com.tencent.cloud.csi.cbs\":\"ins-{}\"}}", hex(i, 8)),
        "flannel.alpha.coreos.com/backend-data": format!("{{\"VNI\":1,\"VtepMAC\":\"{}\"}}", hex(i + 3, 12)),
        "flannel.alpha.coreos.com/backend-type": "vxlan",
        "flannel.alpha.coreos.com/public-ip": ip
    });
    let cidr = format!("172.{}.{}.0/24", 16 + i / 256, i % 256);
    fields(&[
        (
            "metadata",
            fields(&[
                ("name", text(&name)),
                ("uid", text(&uuid(i))),
                ("resourceVersion", text(&(48_000_000 + i * 17).to_string())),
                ("creationTimestamp", text(since)),
                ("labels", labels.to_string()),
                ("annotations", annotations.to_string()),
            ]),
        ),
        (
            "spec",
            fields(&[
                ("podCIDR", text(&cidr)),
                ("podCIDRs", json!([cidr]).to_string()),
                (
                    "providerID",
                    text(&format!("qcloud:///800003/ins-{}", hex(i, 8))),
                ),
            ]),
        ),
        (
            "status",
            fields(&[
                ("capacity", resources("82", "329543488Ki")),
                ("allocatable", resources("81600m", "320198464Ki")),
                (
                    "conditions",
                    format!(
                        "[{}]",
                        [
                            condition(
                                "MemoryPressure",
                                "False",
                                "KubeletHasSufficientMemory",
                                "kubelet has sufficient memory available"
                            ),
                            condition(
                                "DiskPressure",
                                "False",
                                "KubeletHasNoDiskPressure",
                                "kubelet has no disk pressure"
                            ),
                            condition(
                                "PIDPressure",
                                "False",
                                "KubeletHasSufficientPID",
                                "kubelet has sufficient PID available"
                            ),
                            condition(
                                "Ready",
                                "True",
                                "KubeletReady",
                                "kubelet is posting ready status"
                            ),
                        ]
                        .join(",")
                    ),
                ),
                (
                    "addresses",
                    format!(
                        "[{},{}]",
                        fields(&[("type", text("InternalIP")), ("address", text(&ip))]),
                        fields(&[("type", text("Hostname")), ("address", text(&name))])
                    ),
                ),
                (
                    "daemonEndpoints",
                    r#"{"kubeletEndpoint":{"Port":10250}}"#.to_string(),
                ),
                (
                    "nodeInfo",
                    fields(&[
                        ("machineID", text(&hex(i + 11, 32))),
                        ("systemUUID", text(&uuid(i + 13))),
                        ("bootID", text(&uuid(i + 17))),
                        ("kernelVersion", text("5.15.0-91-generic")),
                        ("osImage", text("Ubuntu 22.04.3 LTS")),
                        ("containerRuntimeVersion", text("containerd://1.7.13")),
                        ("kubeletVersion", text("v1.33.2")),
                        ("kubeProxyVersion", text("v1.33.2")),
                        ("operatingSystem", text("linux")),
                        ("architecture", text("amd64")),
                    ]),
                ),
                ("images", format!("[{}]", images.join(","))),
            ]),
        ),
    ])
}

fn pod_without_gpu(name: &str) -> serde_json::Value {
    json!({
        "metadata": {"name": name, "namespace": "team-b", "uid": format!("{name}-uid")},
        "spec": {"containers": [{"name": "main", "image": "web:latest",
            "resources": {"limits": {"cpu": "2", "memory": "4Gi"}}}]}
    })
}

/// POST a body given in parts (the 20 MB node list is shared, not copied per request),
/// with its Content-Length, as kube-scheduler's Go client sends it.
async fn post_parts(sender: &mut Sender, path: &str, parts: Vec<Bytes>) -> (u16, Bytes) {
    let (status, body) = send_parts(sender, path, parts).await;
    (status, axum::body::to_bytes(body, 64 << 20).await.unwrap())
}

/// [`post_parts`] for a large answer: read and counted, not kept (so that the client
/// holds no copy of it: resident memory is the server's).
async fn post_parts_counted(sender: &mut Sender, path: &str, parts: Vec<Bytes>) -> (u16, usize) {
    use http_body_util::BodyExt;
    let (status, mut body) = send_parts(sender, path, parts).await;
    let mut length = 0;
    while let Some(frame) = body.frame().await {
        length += frame.unwrap().into_data().map_or(0, |d| d.len());
    }
    (status, length)
}

async fn send_parts(sender: &mut Sender, path: &str, parts: Vec<Bytes>) -> (u16, Body) {
    let length: usize = parts.iter().map(Bytes::len).sum();
    let stream = futures::stream::iter(parts.into_iter().map(Ok::<_, std::convert::Infallible>));
    let request = axum::http::Request::post(path)
        .header("host", "localhost")
        .header("content-type", "application/json")
        .header("content-length", length)
        .body(Body::from_stream(stream))
        .unwrap();
    sender.ready().await.unwrap();
    let response = sender.send_request(request).await.unwrap();
    (response.status().as_u16(), Body::new(response.into_body()))
}

#[derive(serde::Deserialize)]
struct Answer<'a> {
    #[serde(rename = "NodeNames")]
    names: Option<Vec<String>>,
    #[serde(rename = "Nodes", borrow)]
    nodes: Option<NodeListAnswer<'a>>,
    #[serde(rename = "Error")]
    error: String,
}

#[derive(serde::Deserialize)]
struct NodeListAnswer<'a> {
    #[serde(borrow)]
    items: Vec<&'a serde_json::value::RawValue>,
}

fn vm_kib(field: &str) -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn mib(bytes: usize) -> String {
    format!("{:.0} MiB", bytes as f64 / f64::from(1 << 20))
}

fn p50(latencies: &[Duration]) -> Duration {
    let mut sorted = latencies.to_vec();
    sorted.sort();
    percentile(&sorted, 0.50)
}

/// The names of the GPU pods sent to each cluster (then a sequence number).
const MIXED_PREFIX: &str = "team-q/mixed-";
const UNIFORM_PREFIX: &str = "team-b/new-";

/// The request kinds interleaved on one keep-alive connection per cluster, round after
/// round: a pod without GPUs, a GPU pod (heterogeneous cluster) and a GPU pod (uniform
/// cluster, its own connection) with the 5,000 names (`nodeCacheCapable: true`), ten
/// times (`NAMES_PER_ROUND`), then a GPU pod and a pod without GPUs with the 5,000 Node
/// objects (`nodeCacheCapable: false`, heterogeneous cluster). Prints p50/p99 of each,
/// the ratios, and the resident memory around the full-Nodes calls. Returns how many GPU
/// pods went to each cluster.
async fn interleaved(sender: &mut Sender, uniform: &mut Sender) -> (usize, usize) {
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(100);
    let names_per_round: usize = std::env::var("NAMES_PER_ROUND")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(10);
    let names: Vec<String> = (0..NODES).map(node_name).collect();
    let names_text = Bytes::from(serde_json::to_string(&names).unwrap());
    let node_texts: Vec<String> = (0..NODES).map(|i| node_object(i).to_string()).collect();
    let nodes_text = Bytes::from(format!(
        r#"{{"metadata":{{"resourceVersion":""}},"items":[{}]}}"#,
        node_texts.join(",")
    ));
    println!(
        "request: {NODES} names {} KiB; {NODES} Node objects {} MiB ({} bytes per Node)",
        names_text.len() >> 10,
        nodes_text.len() >> 20,
        nodes_text.len() / NODES
    );
    let body = |pod: serde_json::Value, names: bool| -> Vec<Bytes> {
        let (key, other) = match names {
            true => ("NodeNames", "Nodes"),
            false => ("Nodes", "NodeNames"),
        };
        let list = match names {
            true => names_text.clone(),
            false => nodes_text.clone(),
        };
        vec![
            Bytes::from(format!(r#"{{"Pod":{pod},"{other}":null,"{key}":"#)),
            list,
            Bytes::from_static(b"}"),
        ]
    };
    let mut uniform_sequence = 0usize;
    let mut uniform_pod = || {
        let (core, memory) = SHAPES[uniform_sequence % SHAPES.len()];
        uniform_sequence += 1;
        pod_json(
            "team-b",
            &format!("new-{uniform_sequence:06}"),
            core,
            memory,
        )
    };
    // The heterogeneous cluster's GPU pods: the four shapes in turn (share pods ask for
    // the memory share of the smallest GPU), one in five naming a model.
    let mut sequence = 0usize;
    let mut gpu_pod = || {
        let (core, share) = cluster::SHAPES[sequence % cluster::SHAPES.len()];
        let model = (sequence % 5 == 4).then(|| cluster::MODELS[sequence / 5 % 3].0);
        sequence += 1;
        let name = format!("{}{sequence:06}", &MIXED_PREFIX["team-q/".len()..]);
        cluster::gpu_pod(
            "team-q",
            &name,
            core,
            cluster::memory_units(share, 64),
            model,
        )
    };
    // Warm up, and let fgd learn the mix.
    for _ in 0..100 {
        let (status, _) = post_parts(sender, "/scheduler/predicates", body(gpu_pod(), true)).await;
        assert_eq!(status, 200);
        let (status, _) =
            post_parts(uniform, "/scheduler/predicates", body(uniform_pod(), true)).await;
        assert_eq!(status, 200);
    }

    #[derive(Default)]
    struct Kind {
        placed: Vec<Duration>,
        unplaced: Vec<Duration>,
    }
    let (mut plain_names, mut gpu_names, mut gpu_nodes, mut plain_nodes, mut uniform_names) = (
        Kind::default(),
        Kind::default(),
        Kind::default(),
        Kind::default(),
        Kind::default(),
    );
    let mut floor = Vec::new();
    // Resident memory once each round's names calls are done (the previous round's
    // Nodes calls long answered and dropped), and once more after the last round.
    let mut rss = Vec::with_capacity(rounds + 1);
    for round in 0..rounds {
        for _ in 0..names_per_round {
            let pod = pod_without_gpu(&format!("web-{round}"));
            let sent = Instant::now();
            let (status, answer) =
                post_parts(sender, "/scheduler/predicates", body(pod, true)).await;
            plain_names.placed.push(sent.elapsed());
            assert_eq!(status, 200);
            let answer: Answer = serde_json::from_slice(&answer).unwrap();
            assert_eq!(answer.names.map_or(0, |n| n.len()), NODES);

            let sent = Instant::now();
            let (status, answer) =
                post_parts(sender, "/scheduler/predicates", body(gpu_pod(), true)).await;
            let took = sent.elapsed();
            assert_eq!(status, 200);
            let answer: Answer = serde_json::from_slice(&answer).unwrap();
            assert_eq!(answer.error, "");
            match answer.names.map_or(0, |n| n.len()) {
                0 => gpu_names.unplaced.push(took),
                _ => gpu_names.placed.push(took),
            }

            let sent = Instant::now();
            let (status, answer) =
                post_parts(uniform, "/scheduler/predicates", body(uniform_pod(), true)).await;
            let took = sent.elapsed();
            assert_eq!(status, 200);
            let answer: Answer = serde_json::from_slice(&answer).unwrap();
            assert_eq!(answer.error, "");
            match answer.names.map_or(0, |n| n.len()) {
                0 => uniform_names.unplaced.push(took),
                _ => uniform_names.placed.push(took),
            }
        }

        rss.push(resident_bytes());
        let sent = Instant::now();
        let (status, answer) =
            post_parts(sender, "/scheduler/predicates", body(gpu_pod(), false)).await;
        let took = sent.elapsed();
        assert_eq!(status, 200);
        let answer: Answer = serde_json::from_slice(&answer).unwrap();
        assert_eq!(answer.error, "");
        let items = answer.nodes.map(|n| n.items).unwrap_or_default();
        match items.as_slice() {
            [] => gpu_nodes.unplaced.push(took),
            [node] => {
                // The chosen Node comes back exactly as it was sent.
                let echoed: serde_json::Value = serde_json::from_str(node.get()).unwrap();
                let name = echoed["metadata"]["name"].as_str().unwrap();
                let index: usize = name.trim_start_matches("gpu-node-").parse().unwrap();
                assert_eq!(node.get(), node_texts[index]);
                gpu_nodes.placed.push(took);
            }
            more => panic!("{} nodes passed", more.len()),
        }

        // The same body to a route that reads it, checks it is UTF-8 and JSON in one
        // pass and answers 400 (no `task`): what any Nodes-form call costs at least.
        let sent = Instant::now();
        let (status, _) =
            post_parts_counted(sender, "/scheduler/vpredicates", body(gpu_pod(), false)).await;
        floor.push(sent.elapsed());
        assert_eq!(status, 400);

        let pod = pod_without_gpu(&format!("web-{round}"));
        let sent = Instant::now();
        let (status, length) =
            post_parts_counted(sender, "/scheduler/predicates", body(pod, false)).await;
        plain_nodes.placed.push(sent.elapsed());
        assert_eq!(status, 200);
        assert!(length >= nodes_text.len() - 64, "every Node echoed");
    }
    for _ in 0..names_per_round {
        let pod = pod_without_gpu("web-last");
        let (status, _) = post_parts(sender, "/scheduler/predicates", body(pod, true)).await;
        assert_eq!(status, 200);
    }
    rss.push(resident_bytes());

    println!(
        "filter, {NODES} nodes, {rounds} rounds on one connection per cluster, each: {names_per_round} x (pod without GPUs, GPU pod, uniform cluster's GPU pod) with names, then a GPU pod and a pod without GPUs with Node objects"
    );
    let show = |what: &str, latencies: &[Duration]| {
        report(
            &format!("  {what} ({})", latencies.len()),
            latencies.to_vec(),
        )
    };
    show("names, pod without GPUs", &plain_names.placed);
    show("names, GPU pod placed", &gpu_names.placed);
    show(
        &format!("names, GPU pod unschedulable, {NODES} reasons"),
        &gpu_names.unplaced,
    );
    show(
        "uniform cluster: names, GPU pod placed",
        &uniform_names.placed,
    );
    show(
        &format!("uniform cluster: names, GPU pod unschedulable, {NODES} reasons"),
        &uniform_names.unplaced,
    );
    show("Nodes, GPU pod placed", &gpu_nodes.placed);
    show(
        &format!("Nodes, GPU pod unschedulable, {NODES} reasons"),
        &gpu_nodes.unplaced,
    );
    show(
        "Nodes, pod without GPUs (every Node echoed)",
        &plain_nodes.placed,
    );
    show(
        "the Nodes body to /scheduler/vpredicates: read, one JSON pass, 400 (floor)",
        &floor,
    );
    let ratio = |a: &[Duration], b: &[Duration]| p50(a).as_secs_f64() / p50(b).as_secs_f64();
    let all = |kind: &Kind| [kind.placed.clone(), kind.unplaced.clone()].concat();
    println!(
        "ratio (p50) GPU pod placed / pod without GPUs, names: {:.2} (all GPU pods: {:.2}); uniform cluster {:.2}",
        ratio(&gpu_names.placed, &plain_names.placed),
        ratio(&all(&gpu_names), &plain_names.placed),
        ratio(&uniform_names.placed, &plain_names.placed)
    );
    println!(
        "ratio (p50) GPU pod placed, Nodes / names: {:.2}",
        ratio(&gpu_nodes.placed, &gpu_names.placed)
    );
    let after_first = rss.get(1..).unwrap_or_default();
    println!(
        "resident memory (whole process, client included): before the Nodes calls {}, after 1 round {}, after {} {}, after {} {} (after 1 to {} rounds: {} to {}); peak {}",
        mib(rss[0]),
        mib(rss[1.min(rounds)]),
        rounds / 2,
        mib(rss[rounds / 2]),
        rounds,
        mib(rss[rounds]),
        rounds,
        mib(after_first.iter().copied().min().unwrap_or(0)),
        mib(after_first.iter().copied().max().unwrap_or(0)),
        mib(vm_kib("VmHWM:") << 10),
    );
    (sequence, uniform_sequence)
}

/// Where every GPU pod the run sent ended up (node and GPU indices, or nothing), in
/// the order sent: a digest to compare two builds' decisions, and the list itself in
/// the file `DECISIONS` names.
fn decisions(cluster: &str, cache: &CacheWriter, sent: usize, prefix: &str) {
    let lines: Vec<String> = cache.read(|s| {
        (1..=sent)
            .map(|i| {
                let key = format!("{prefix}{i:06}");
                let placed = s
                    .pod(&key)
                    .and_then(|p| Some((p.node.clone()?, p.assignment.clone()?)));
                match placed {
                    Some((node, assignment)) => {
                        let gpus: Vec<Vec<u8>> =
                            assignment.choices.iter().map(|c| c.gpus.clone()).collect();
                        format!("{key} {node} {gpus:?}")
                    }
                    None => format!("{key} -"),
                }
            })
            .collect()
    });
    // FNV-1a over the lines.
    let digest = lines
        .iter()
        .flat_map(|l| l.bytes().chain([b'\n']))
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
    let placed = lines.iter().filter(|l| !l.ends_with(" -")).count();
    println!("decisions, {cluster}: {placed} of {sent} GPU pods placed, digest {digest:016x}");
    if let Some(path) = std::env::var_os("DECISIONS") {
        let path = format!("{}.{cluster}", path.to_string_lossy());
        std::fs::write(path, lines.join("\n") + "\n").unwrap();
    }
}
