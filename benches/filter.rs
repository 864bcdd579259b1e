//! Filter latency at scale, over loopback TLS, as kube-scheduler calls it: 5,000 nodes
//! x 8 GPUs, 40,000 placed GPU pods in the cache, every request naming all 5,000 nodes,
//! one keep-alive connection. Also: resident memory per cached pod, and the rate of
//! small requests the server sustains. Run: `cargo bench --bench filter`.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use gpu_admission::cache::{ClusterCache, Projection, pod_key};
use gpu_admission::certs::{self, CertFiles};
use gpu_admission::config::Config;
use gpu_admission::placement::{GpuUse, NodeGpus};
use gpu_admission::server::tls::{CertResolver, ConnectionLimits, serve_tls, server_config};
use gpu_admission::server::{AppState, extender_router, webhook_router};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use rustls::pki_types::ServerName;
use rustls::pki_types::pem::PemObject;
use serde_json::json;
use tokio_util::sync::CancellationToken;

const NODES: usize = 5_000;
const GPUS: usize = 8;
const PODS: usize = 40_000;
const REQUESTS: usize = 2_000;

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
fn fill(cache: &ClusterCache) -> f64 {
    cache.with_state(|s| {
        for i in 0..NODES {
            s.apply_node(NodeGpus {
                name: node_name(i).into(),
                model: Some("Tesla-T4".into()),
                pool: None,
                memory_per_gpu: 64,
                used: vec![GpuUse::default(); GPUS],
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
        cache.with_state(|s| s.apply_pod(pod_key(&pod), cached));
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

async fn connect(addr: std::net::SocketAddr, ca: &std::path::Path) -> Sender {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from_pem_file(ca).unwrap())
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender
}

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

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let policy = std::env::var("POLICY").unwrap_or_else(|_| "fgd".into());
    let config = Config::parse(&format!("placement: {{policy: {policy}}}")).unwrap();
    println!("policy: {policy}");
    let cache = ClusterCache::in_memory(Projection::from_config(&config));
    let started = Instant::now();
    let per_pod = fill(&cache);
    let quota: gpu_admission::quota::GPUQuota = serde_json::from_value(json!({
        "apiVersion": "gpu-admission.io/v1alpha1", "kind": "GPUQuota",
        "metadata": {"name": "default", "namespace": "team-q"},
        "spec": {"hard": {"Tesla-T4": "10000"}, "defaultType": "Tesla-T4"}
    }))
    .unwrap();
    cache.with_state(|s| s.apply_quota(quota));
    println!(
        "cache: {NODES} nodes x {GPUS} GPUs, {PODS} pods loaded in {:.2?}",
        started.elapsed()
    );
    println!("cache: resident memory per cached pod: {per_pod:.0} bytes");

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
    let state = AppState::new(cache.clone(), config);
    // The two doors, as `serve` runs them: the extender's and the webhooks'.
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
    let (addr, webhooks) = (doors[0], doors[1]);

    let names: Vec<String> = (0..NODES).map(node_name).collect();
    let mut sender = connect(addr, &files.ca_cert).await;
    let mut latencies = Vec::with_capacity(REQUESTS);
    let (mut placed, mut unplaced) = (Vec::new(), Vec::new());
    for i in 0..REQUESTS + 100 {
        // Ten request shapes, as a real mix has: the fgd policy learns and scores them all.
        let (core, memory) = [
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
        ][i % 10];
        let pod = pod_json("team-b", &format!("new-{i:06}"), core, memory);
        let body = json!({"Pod": pod, "Nodes": null, "NodeNames": names}).to_string();
        let sent = Instant::now();
        let (status, answer) = post(&mut sender, "/scheduler/predicates", body).await;
        let took = sent.elapsed();
        assert_eq!(status, 200);
        if i >= 100 {
            latencies.push(took); // the first 100 warm up
            let answer: serde_json::Value = serde_json::from_slice(&answer).unwrap();
            match answer["NodeNames"].as_array().map_or(0, Vec::len) {
                0 => unplaced.push(took),
                _ => placed.push(took),
            }
        }
    }
    report(
        &format!("filter over TLS, {NODES} names per request, all {REQUESTS} requests"),
        latencies,
    );
    report(&format!("  of which placed ({})", placed.len()), placed);
    report(
        &format!(
            "  of which unschedulable, {NODES} reasons in the answer ({})",
            unplaced.len()
        ),
        unplaced,
    );

    small_request_rate(addr, &files.ca_cert).await;
    for route in ["/mutate", "/validate"] {
        admission_latency(webhooks, &files.ca_cert, route).await;
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
                    "request": {"uid": format!("u{connection}-{i}"), "operation": "CREATE", "namespace": "team-q", "object": pod}});
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
