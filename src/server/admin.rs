//! The admin port: `/livez`, `/readyz`, `/metrics` (plain HTTP).

use std::sync::atomic::Ordering;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use super::AppState;
use crate::metrics::KindLabels;

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
    let (nodes, pods) = state.cache.with_state(|s| (s.node_count(), s.pod_count()));
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
