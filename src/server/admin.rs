//! The admin port: `/livez`, `/readyz`, `/metrics`, `/explain` (plain HTTP).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use super::{AppState, explain};
use crate::cache::ClusterState;
use crate::metrics::{FreeLabels, KindLabels, NamespaceModelLabels, QuotaLabels};
use crate::placement::free::FreeByCause;
use crate::placement::mig;
use crate::placement::quantity::Milli;
use crate::quota::pool;
use crate::quota::{ModelAmounts, QuotaView, quota_name};

/// One row of the quota metrics, in GPUs (pods for `queued_pods`).
struct QuotaRow {
    labels: QuotaLabels,
    hard: f64,
    used: f64,
    queued: f64,
    queued_pods: f64,
    borrowed: f64,
    lent: f64,
}

/// A row for every model of every GPUQuota, and for models no quota of the namespace
/// lists that pods use anyway (hard 0). Used is the status (the ledger) in API mode, and
/// counted from the pods offline; queued is what waits in the quota queue.
fn quota_rows(state: &ClusterState) -> Vec<QuotaRow> {
    let gpus = |m: Milli| m.0 as f64 / 1000.0;
    let parse = |q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity| {
        Milli::parse(&q.0).unwrap_or_default()
    };
    let mut rows = Vec::new();
    let lent = lent_by_quota(state);
    for quota in state.quotas() {
        let namespace = quota.metadata.namespace.clone().unwrap_or_default();
        let used: ModelAmounts = state.quota_used(quota);
        let lent = lent.get(&quota_name(quota));
        let queued = state.queued_usage(&namespace);
        let queued_pods = state.queued_pods(&namespace);
        let unlisted = used.keys().filter(|m| !quota.spec.hard.contains_key(*m));
        let models = quota.spec.hard.keys().chain(unlisted);
        for model in models {
            let hard = quota.spec.hard.get(model).map(parse).unwrap_or_default();
            let labels = QuotaLabels {
                namespace: namespace.clone(),
                quota: quota.metadata.name.clone().unwrap_or_default(),
                model: model.clone(),
            };
            let amount = |of: &ModelAmounts| gpus(of.get(model).copied().unwrap_or_default());
            let in_cohort = quota.spec.cohort.is_some() && !mig::is_profile_key(model);
            let used_milli = used.get(model).copied().unwrap_or_default();
            let borrowed = Milli(used_milli.0.saturating_sub(hard.0));
            rows.push(QuotaRow {
                labels,
                borrowed: if in_cohort { gpus(borrowed) } else { 0.0 },
                lent: lent.map(amount).unwrap_or_default(),
                hard: gpus(hard),
                used: amount(&used),
                queued: amount(&queued),
                queued_pods: queued_pods.get(model).copied().unwrap_or_default() as f64,
            });
        }
    }
    rows
}

/// What each GPUQuota of a cohort lends now (`quota::cohort::lent`), by quota name, from
/// the same usage its `used` metric shows.
fn lent_by_quota(state: &ClusterState) -> std::collections::HashMap<String, ModelAmounts> {
    let mut members: Vec<QuotaView> = Vec::new();
    for quota in state.quotas().filter(|q| q.spec.cohort.is_some()) {
        if let Ok(mut view) = QuotaView::from_crd(quota) {
            view.used = state.quota_used(quota);
            members.push(view);
        }
    }
    pool::lent_by_quota(&members)
}

pub fn admin_router(state: AppState) -> Router {
    // One render at a time: a flood of scrapes costs each extra caller an immediate
    // 503, not a worker thread, so the probes next to it keep answering.
    let rendering = Arc::new(parking_lot::Mutex::new(()));
    let explaining = Arc::new(tokio::sync::Semaphore::new(explain::IN_FLIGHT));
    let on_manifest = explaining.clone();
    let routes = Router::new()
        .route(
            "/explain",
            get(
                move |State(state): State<AppState>, headers: HeaderMap, query| {
                    explain::explain_pod(state, explaining.clone(), headers, query)
                },
            )
            .post(
                move |State(state): State<AppState>, headers: HeaderMap, body: Body| {
                    explain::explain_manifest(state, on_manifest.clone(), headers, body)
                },
            ),
        )
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route(
            "/metrics",
            get(move |state: State<AppState>| metrics_once(state, rendering.clone())),
        );
    super::trace::trace_requests(routes).with_state(state)
}

async fn metrics_once(
    state: State<AppState>,
    rendering: Arc<parking_lot::Mutex<()>>,
) -> axum::response::Response {
    // Held only across synchronous code: the render below never awaits.
    let Some(_rendering) = rendering.try_lock() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "1")],
            "metrics are being rendered for another scrape; retry",
        )
            .into_response();
    };
    metrics(state).into_response()
}

pub(super) async fn livez() -> &'static str {
    "ok"
}

/// Ready once the cache holds a complete first list, and until shutdown begins.
pub(super) async fn readyz(State(state): State<AppState>) -> (StatusCode, &'static str) {
    if state.shutting_down.load(Ordering::Acquire) {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down")
    } else if !state.cache().is_ready() {
        (StatusCode::SERVICE_UNAVAILABLE, "cache not synced")
    } else {
        (StatusCode::OK, "ok")
    }
}

fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let mix = state.placer.learned_mix();
    let (nodes, pods, quotas, fragmentation, gpu_seconds, free) = state.cache().read(|s| {
        let now = std::time::Instant::now();
        let meters = s.gpu_seconds(now);
        let gpu_seconds: Vec<_> = meters
            .map(|(n, m, secs)| (n.to_string(), m.to_string(), secs))
            .collect();
        (
            s.node_count(),
            s.pod_count(),
            quota_rows(s),
            mix.cluster_fragmentation(s.nodes()),
            gpu_seconds,
            s.free_gpus(&mix),
        )
    });
    set_free_gpus(&state.metrics, free);
    state.metrics.set_gpu_seconds(gpu_seconds);
    state.metrics.gpu_fragmentation.set(fragmentation);
    let m = &state.metrics;
    for family in [
        &m.quota_hard,
        &m.quota_used,
        &m.quota_queued_gpus,
        &m.quota_queued_pods,
        &m.quota_borrowed,
        &m.quota_lent,
    ] {
        family.clear();
    }
    for row in quotas {
        m.quota_hard.get_or_create(&row.labels).set(row.hard);
        m.quota_used.get_or_create(&row.labels).set(row.used);
        m.quota_queued_gpus
            .get_or_create(&row.labels)
            .set(row.queued);
        m.quota_queued_pods
            .get_or_create(&row.labels)
            .set(row.queued_pods);
        if row.queued_pods > 0.0 {
            // The wait series exists (at zero) while its first pod still waits: a series
            // born at its first release would show Prometheus no increase, and the
            // dashboard's wait quantiles no data, for that release.
            let waits = NamespaceModelLabels {
                namespace: row.labels.namespace.clone(),
                model: row.labels.model.clone(),
            };
            let _ = m.quota_queue_wait.get_or_create(&waits);
        }
        if row.borrowed > 0.0 {
            m.quota_borrowed
                .get_or_create(&row.labels)
                .set(row.borrowed);
        }
        if row.lent > 0.0 {
            m.quota_lent.get_or_create(&row.labels).set(row.lent);
        }
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

/// `gpu_admission_free_gpus`: this scrape's counts only (a model whose nodes are gone
/// leaves the family).
fn set_free_gpus(metrics: &crate::metrics::Metrics, free: FreeByCause) {
    metrics.free_gpus.clear();
    for ((model, cause), core) in free {
        let labels = FreeLabels {
            model: model.as_deref().unwrap_or("unlabelled").to_string(),
            cause: cause.as_str(),
        };
        let gpus = core as f64 / f64::from(crate::placement::request::CORE_PER_GPU);
        metrics.free_gpus.get_or_create(&labels).set(gpus);
    }
}
