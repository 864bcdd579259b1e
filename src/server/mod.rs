//! HTTP serving: routers for the TLS port, the plain extender port and the admin port.
//! Handlers only decode, call the core through the cache, encode and count.

pub mod admin;
pub mod tls;
mod webhooks;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::cache::ClusterCache;
use crate::config::Config;
use crate::extender::volcano::{PredicateArgs, predicate};
use crate::extender::{ExtenderArgs, filter};
use crate::metrics::Metrics;
use crate::placement::learn::LearningPlacer;

/// The apiserver never sends an AdmissionReview over 3 MiB.
pub const WEBHOOK_BODY_LIMIT: usize = 3 << 20;
/// Extender requests in the `Nodes` form carry whole Node objects for every candidate.
pub const EXTENDER_BODY_LIMIT: usize = 64 << 20;

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    pub cache: ClusterCache,
    pub config: Arc<Config>,
    pub metrics: Arc<Metrics>,
    /// Set when shutdown begins, so `/readyz` turns away new traffic first.
    pub shutting_down: Arc<AtomicBool>,
    /// The placement policy, learning the request mix from the pods it places.
    pub placer: Arc<LearningPlacer>,
}

impl AppState {
    pub fn new(cache: ClusterCache, config: Config) -> Self {
        let placement = &config.placement;
        AppState {
            placer: Arc::new(LearningPlacer::new(
                placement.policy,
                placement.gpu_manager_compat,
            )),
            cache,
            config: Arc::new(config),
            metrics: Arc::new(Metrics::default()),
            shutting_down: Arc::new(AtomicBool::new(false)),
        }
    }
}

/// Routes of the TLS port.
pub fn app_router(state: AppState) -> Router {
    extender_routes()
        .route("/version", get(version))
        .route("/validate", post(webhooks::validate_route))
        .route("/mutate", post(webhooks::mutate_route))
        .with_state(state)
}

/// Routes of the optional plain-HTTP extender port: the extender and the probes.
pub fn insecure_extender_router(state: AppState) -> Router {
    extender_routes()
        .route("/livez", get(admin::livez))
        .route("/readyz", get(admin::readyz))
        .with_state(state)
}

fn extender_routes() -> Router<AppState> {
    Router::new()
        .route("/scheduler/predicates", post(predicates))
        .route("/scheduler/filter", post(predicates))
        .route("/scheduler/vpredicates", post(vpredicates))
}

async fn version() -> impl IntoResponse {
    axum::Json(serde_json::json!({
        "name": env!("CARGO_PKG_NAME"),
        "version": env!("CARGO_PKG_VERSION"),
    }))
}

/// Why a request was not judged: bad input (400, the text names the problem) or our
/// own state not ready (503, so the caller's failure policy decides).
#[derive(Debug)]
pub enum Rejection {
    BadRequest(String),
    NotReady,
}

impl Rejection {
    pub const fn label(&self) -> &'static str {
        match self {
            Rejection::BadRequest(_) => "bad_request",
            Rejection::NotReady => "not_ready",
        }
    }
}

impl IntoResponse for Rejection {
    fn into_response(self) -> Response {
        match self {
            Rejection::BadRequest(message) => (StatusCode::BAD_REQUEST, message).into_response(),
            Rejection::NotReady => (
                StatusCode::SERVICE_UNAVAILABLE,
                "gpu-admission's cluster cache is not ready yet",
            )
                .into_response(),
        }
    }
}

/// Read a body of at most `limit` bytes, decode it with `parse`, and check readiness.
pub async fn accept<T>(
    state: &AppState,
    body: Body,
    limit: usize,
    parse: impl FnOnce(&[u8]) -> Result<T, String>,
) -> Result<T, Rejection> {
    let bytes = axum::body::to_bytes(body, limit).await.map_err(|error| {
        let text = format!(
            "{error} {}",
            std::error::Error::source(&error)
                .map(|s| s.to_string())
                .unwrap_or_default()
        );
        if text.contains("length limit") {
            Rejection::BadRequest(format!(
                "request body is larger than the {} MiB limit",
                limit >> 20
            ))
        } else {
            Rejection::BadRequest(format!("cannot read request body: {error}"))
        }
    })?;
    let parsed = parse(&bytes).map_err(Rejection::BadRequest)?;
    if !state.cache.is_ready() {
        return Err(Rejection::NotReady);
    }
    Ok(parsed)
}

/// The shape of every POST handler: read and decode the body (400 on bad input, 503
/// while not ready), judge it, count the request by route and decision.
pub async fn answer<T, Judged>(
    state: &AppState,
    route: &'static str,
    body: Body,
    limit: usize,
    parse: impl FnOnce(&[u8]) -> Result<T, String>,
    judge: impl FnOnce(T) -> Judged,
) -> Response
where
    Judged: Future<Output = (&'static str, Response)>,
{
    let started = Instant::now();
    let (decision, response) = match accept(state, body, limit, parse).await {
        Ok(parsed) => judge(parsed).await,
        Err(rejection) => (rejection.label(), rejection.into_response()),
    };
    state
        .metrics
        .observe(route, decision, started.elapsed().as_secs_f64());
    response
}

async fn predicates(State(state): State<AppState>, body: Body) -> Response {
    answer(
        &state,
        "predicates",
        body,
        EXTENDER_BODY_LIMIT,
        ExtenderArgs::from_json,
        async |args| {
            let (result, outcome) = filter(&state.cache, &state.config, &state.placer, args).await;
            (outcome.label(), axum::Json(result).into_response())
        },
    )
    .await
}

async fn vpredicates(State(state): State<AppState>, body: Body) -> Response {
    answer(
        &state,
        "vpredicates",
        body,
        EXTENDER_BODY_LIMIT,
        PredicateArgs::from_json,
        async |args| {
            let response = predicate(&state.cache, &state.config, args);
            let decision = if response.code == 0 { "fits" } else { "unfit" };
            (decision, axum::Json(response).into_response())
        },
    )
    .await
}
