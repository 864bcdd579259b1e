//! Shared setup for the HTTP-level tests: an offline cluster from YAML text, the app
//! router over it, and request helpers.
#![allow(dead_code, clippy::unwrap_used)]

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use gpu_admission::backend::Backend;
use gpu_admission::cache::Projection;
use gpu_admission::config::Config;
use gpu_admission::server::listener::ConnectionLimits;
use gpu_admission::server::{AppState, extender_router, webhook_router};
use serde_json::{Value, json};
use tower::ServiceExt;

/// The routes of both TLS doors (webhooks and extender) over an offline cluster given
/// as YAML text, merged for convenience: which door serves what is tested on the real
/// routers (tests/doors.rs).
pub fn app(cluster_yaml: &str, config: Config) -> (AppState, Router) {
    let state = app_state(
        cluster_yaml,
        config,
        ConnectionLimits::default().request_timeout,
    );
    let router = webhook_router(state.clone()).fallback_service(extender_router(state.clone()));
    (state, router)
}

/// The state of an offline server of `cluster_yaml`, giving bodies `body_timeout`.
pub fn app_state(cluster_yaml: &str, config: Config, body_timeout: Duration) -> AppState {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cluster.yaml");
    std::fs::write(&path, cluster_yaml).unwrap();
    let backend = Backend::from_file(&path, Projection::from_config(&config)).unwrap();
    AppState::with_body_timeout(backend, config, body_timeout)
}

pub fn config_with_policy(policy: &str) -> Config {
    Config::parse(&format!("placement: {{policy: {policy}}}\n")).unwrap()
}

/// POST a JSON body; returns status and body (JSON when it parses, else a string).
pub async fn post(router: &Router, path: &str, body: impl Into<Body>) -> (StatusCode, Value) {
    let request = Request::post(path)
        .header("content-type", "application/json")
        .body(body.into())
        .unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
    (status, value)
}

/// A vcuda node as YAML.
pub fn vcuda_node(name: &str, core: u32, memory: u32, model: &str) -> String {
    format!(
        "---\napiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n  labels: {{nvidia.com/gpu.product: {model}}}\n\
         status:\n  capacity: {{tencent.com/vcuda-core: \"{core}\", tencent.com/vcuda-memory: \"{memory}\"}}\n"
    )
}

/// A pod JSON with containers given as (vcuda-core, vcuda-memory); (0, 0) = no GPU.
pub fn gpu_pod(namespace: &str, name: &str, containers: &[(u32, u32)]) -> Value {
    let containers: Vec<Value> = containers
        .iter()
        .enumerate()
        .map(|(i, &(core, memory))| {
            let limits = if core == 0 {
                json!({"cpu": "1"})
            } else {
                json!({"tencent.com/vcuda-core": core.to_string(), "tencent.com/vcuda-memory": memory.to_string()})
            };
            json!({"name": format!("c{i}"), "image": "busybox", "resources": {"limits": limits}})
        })
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{namespace}-{name}")},
        "spec": {"containers": containers}
    })
}

pub fn filter_args(pod: &Value, nodes: &[&str]) -> String {
    json!({"Pod": pod, "Nodes": null, "NodeNames": nodes}).to_string()
}
