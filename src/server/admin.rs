//! The admin port: `/livez`, `/readyz`, `/metrics` (plain HTTP).

use std::sync::atomic::Ordering;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use super::AppState;
use crate::cache::ClusterState;
use crate::metrics::{KindLabels, QuotaLabels};
use crate::placement::quantity::Milli;

/// (labels, hard, used) in GPUs for every model of every GPUQuota. Used is the status
/// (the ledger) in API mode, and counted from the pods offline.
fn quota_rows(state: &ClusterState, api_mode: bool) -> Vec<(QuotaLabels, f64, f64)> {
    let gpus = |m: Milli| m.0 as f64 / 1000.0;
    let parse = |q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity| {
        Milli::parse(&q.0).unwrap_or_default()
    };
    let mut rows = Vec::new();
    for quota in state.quotas() {
        let namespace = quota.metadata.namespace.clone().unwrap_or_default();
        let usage = if api_mode {
            Default::default()
        } else {
            state.usage(&namespace)
        };
        for (model, hard) in &quota.spec.hard {
            let used = if api_mode {
                quota
                    .status
                    .as_ref()
                    .and_then(|s| s.used.get(model))
                    .map(parse)
                    .unwrap_or_default()
            } else {
                usage.get(model).copied().unwrap_or_default()
            };
            let labels = QuotaLabels {
                namespace: namespace.clone(),
                quota: quota.metadata.name.clone().unwrap_or_default(),
                model: model.clone(),
            };
            rows.push((labels, gpus(parse(hard)), gpus(used)));
        }
    }
    rows
}

pub fn admin_router(state: AppState) -> Router {
    Router::new()
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
}

pub async fn livez() -> &'static str {
    "ok"
}

/// Ready once the cache holds a complete first list, and until shutdown begins.
pub async fn readyz(State(state): State<AppState>) -> (StatusCode, &'static str) {
    if state.shutting_down.load(Ordering::Acquire) {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down")
    } else if !state.cache.is_ready() {
        (StatusCode::SERVICE_UNAVAILABLE, "cache not synced")
    } else {
        (StatusCode::OK, "ok")
    }
}

async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let api_mode = state.cache.client().is_some();
    let mix = state.placer.learned_mix();
    let (nodes, pods, quotas, fragmentation) = state.cache.with_state(|s| {
        (
            s.node_count(),
            s.pod_count(),
            quota_rows(s, api_mode),
            mix.cluster_fragmentation(s.nodes()),
        )
    });
    state.metrics.gpu_fragmentation.set(fragmentation);
    state.metrics.quota_hard.clear();
    state.metrics.quota_used.clear();
    for (labels, hard, used) in quotas {
        state.metrics.quota_hard.get_or_create(&labels).set(hard);
        state.metrics.quota_used.get_or_create(&labels).set(used);
    }
    let gauge = |kind| {
        state
            .metrics
            .cache_objects
            .get_or_create(&KindLabels { kind })
            .clone()
    };
    gauge("node").set(nodes as i64);
    gauge("pod").set(pods as i64);
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
}
