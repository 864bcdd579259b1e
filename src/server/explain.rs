//! `/explain` on the admin port (docs/explain.md, "On the admin port"): the verdict of
//! `gpu-admission explain -o json`, judged on the server's live cache. `GET
//! /explain?pod=NAMESPACE/NAME` for a pod, `POST /explain` with a Pod manifest (JSON)
//! for a what-if. The planner's "fits after N moves" is left to the CLI: it needs the
//! cluster's PodDisruptionBudgets and controllers, which the cache does not keep.
//!
//! Who asks is checked before anything is judged (`Backend::may`), and one judgment at
//! a time runs per [`IN_FLIGHT`]: any more are turned away at once (503), so a flood
//! costs the server neither threads nor API calls.

use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::body::Body;
use axum::extract::Query;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tokio::sync::Semaphore;

use super::{AppState, Route, accept};
use crate::backend::access::{AccessError, PodVerb};
use crate::explain::{Asked, ExplainError, Explanation, judge_on};
use crate::wire::DecodeError;

/// Judgments (with their access reviews) running at once.
pub(super) const IN_FLIGHT: usize = 2;
/// A Pod manifest: the webhooks' own bound.
const MANIFEST_LIMIT: usize = 256 << 10;
/// The longest namespace and name Kubernetes allows.
const NAME_MAX: usize = 253;

const MANIFEST: Route<Box<k8s_openapi::api::core::v1::Pod>> = Route {
    name: "explain",
    limit: MANIFEST_LIMIT,
    parse: |bytes| {
        let text = std::str::from_utf8(bytes).map_err(|e| DecodeError::Malformed {
            what: "the manifest".into(),
            detail: e.to_string(),
        })?;
        crate::wire::pod::decode("the manifest", text).map(Box::new)
    },
};

#[derive(Deserialize)]
pub(super) struct PodQuery {
    pod: Option<String>,
}

/// Why `/explain` did not answer with a verdict.
enum Refused {
    Access(AccessError),
    Explain(ExplainError),
    BadPod(String),
    /// Our own failure: a 500, never a verdict.
    Internal(String),
    Busy,
    NotReady,
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        let (status, text) = match self {
            Refused::Access(e @ (AccessError::NoToken | AccessError::BadToken)) => {
                let challenge = [(header::WWW_AUTHENTICATE, "Bearer")];
                return (StatusCode::UNAUTHORIZED, challenge, e.to_string()).into_response();
            }
            Refused::Access(e @ AccessError::Forbidden { .. }) => {
                (StatusCode::FORBIDDEN, e.to_string())
            }
            Refused::Access(e @ AccessError::Unavailable(_)) => {
                (StatusCode::SERVICE_UNAVAILABLE, e.to_string())
            }
            Refused::Explain(e @ ExplainError::NotFound(_)) => {
                (StatusCode::NOT_FOUND, e.to_string())
            }
            Refused::Explain(e @ ExplainError::Manifest(_)) => {
                (StatusCode::BAD_REQUEST, e.to_string())
            }
            Refused::Explain(e @ ExplainError::Status(_)) => {
                (StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
            }
            Refused::BadPod(text) => (StatusCode::BAD_REQUEST, text),
            Refused::Internal(text) => (StatusCode::INTERNAL_SERVER_ERROR, text),
            Refused::Busy => {
                let retry = [(header::RETRY_AFTER, "1")];
                let text = "another explain is being answered; retry";
                return (StatusCode::SERVICE_UNAVAILABLE, retry, text).into_response();
            }
            Refused::NotReady => (
                StatusCode::SERVICE_UNAVAILABLE,
                "gpu-admission's cluster cache is not ready yet".to_string(),
            ),
        };
        (status, text).into_response()
    }
}

/// `NAMESPACE/NAME`, each part a possible Kubernetes name length.
fn pod_key(pod: Option<&str>) -> Result<(String, String), Refused> {
    let pod = pod.ok_or_else(|| Refused::BadPod("name the pod: ?pod=NAMESPACE/NAME".into()))?;
    match pod.split_once('/') {
        Some((ns, name))
            if !ns.is_empty()
                && !name.is_empty()
                && ns.len() <= NAME_MAX
                && name.len() <= NAME_MAX
                && !name.contains('/') =>
        {
            Ok((ns.to_string(), name.to_string()))
        }
        _ => Err(Refused::BadPod(format!(
            "{:?} is not NAMESPACE/NAME",
            pod.chars().take(2 * NAME_MAX + 1).collect::<String>()
        ))),
    }
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// `GET /explain?pod=NAMESPACE/NAME`.
pub(super) async fn explain_pod(
    state: AppState,
    permits: Arc<Semaphore>,
    headers: HeaderMap,
    query: Query<PodQuery>,
) -> Response {
    let started = Instant::now();
    let answer = async {
        let (namespace, name) = pod_key(query.pod.as_deref())?;
        let asked = Asked::Existing(format!("{namespace}/{name}"));
        judged(&state, &permits, &headers, &namespace, PodVerb::Get, asked).await
    };
    respond(&state, started, answer.await)
}

/// `POST /explain` with a Pod manifest: judged as if created now.
pub(super) async fn explain_manifest(
    state: AppState,
    permits: Arc<Semaphore>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let started = Instant::now();
    let answer = async {
        let pod = match accept(&state, &headers, body, &MANIFEST).await {
            Ok(pod) => pod,
            Err(rejection) => return Err(rejection.into_response()),
        };
        let namespace = pod.metadata.namespace.clone();
        let namespace = namespace.unwrap_or_else(|| "default".into());
        let asked = Asked::Manifest(pod);
        let judged = judged(
            &state,
            &permits,
            &headers,
            &namespace,
            PodVerb::Create,
            asked,
        );
        judged.await.map_err(IntoResponse::into_response)
    };
    match answer.await {
        Ok(explanation) => respond(&state, started, Ok(explanation)),
        Err(response) => {
            state
                .metrics
                .observe("explain", "refused", started.elapsed().as_secs_f64());
            response
        }
    }
}

/// Check who asks, then judge: at most [`IN_FLIGHT`] at once.
async fn judged(
    state: &AppState,
    permits: &Arc<Semaphore>,
    headers: &HeaderMap,
    namespace: &str,
    verb: PodVerb,
    asked: Asked,
) -> Result<Explanation, Refused> {
    let _permit = permits
        .clone()
        .try_acquire_owned()
        .map_err(|_| Refused::Busy)?;
    if !state.cache().is_ready() {
        return Err(Refused::NotReady);
    }
    (state.backend.may(bearer(headers), namespace, verb).await).map_err(Refused::Access)?;
    let existing = matches!(asked, Asked::Existing(_));
    let key = asked.key();
    match judge(state, asked).await? {
        // Not in the cache: a pod whose GPUs come only through ResourceClaims?
        Err(ExplainError::NotFound(_)) if existing => match state.backend.read_pod(&key).await {
            Some(pod) => judge(state, Asked::Uncached(Box::new(pod))).await?,
            None => Err(ExplainError::NotFound(key)),
        },
        judged => judged,
    }
    .map_err(Refused::Explain)
}

/// Judge `asked` on the live cache, off the async workers, in the request's span.
async fn judge(
    state: &AppState,
    asked: Asked,
) -> Result<Result<Explanation, ExplainError>, Refused> {
    let (state, now) = (state.clone(), crate::quota::pending::now_second());
    let span = tracing::Span::current();
    let judged = tokio::task::spawn_blocking(move || {
        span.in_scope(|| {
            let placer = state.placer.placer();
            judge_on(state.cache(), &placer, &state.config, asked, now)
        })
    })
    .await;
    judged.map_err(|e| Refused::Internal(format!("judging failed: {e}")))
}

fn respond(state: &AppState, started: Instant, answer: Result<Explanation, Refused>) -> Response {
    let decision = if answer.is_ok() {
        "answered"
    } else {
        "refused"
    };
    state
        .metrics
        .observe("explain", decision, started.elapsed().as_secs_f64());
    match answer {
        Ok(explanation) => Json(explanation).into_response(),
        Err(refused) => refused.into_response(),
    }
}
