//! `/explain` on the admin port (docs/explain.md, "On the admin port"): the verdict of
//! `gpu-admission explain -o json`, judged on the server's live cache. `GET
//! /explain?pod=NAMESPACE/NAME` for a pod, `POST /explain` with a Pod manifest (JSON)
//! for a what-if. The planner's "fits after N moves" is left to the CLI: it needs the
//! cluster's PodDisruptionBudgets and controllers, which the cache does not keep.
//!
//! Who asks is checked before anything else: a caller without a token is refused
//! before any API call, and the token is reviewed (`Backend::identify`) before a
//! manifest's body is read; whether the caller may read the pod's namespace
//! (`Backend::may`) before anything is judged. [`IN_FLIGHT`] reviews and judgments run
//! at once: any more are turned away at once (503), so a flood costs the server
//! neither threads nor API calls. A judgment holds its slot until it has ended, and
//! ends at its next node once its caller has left (`explain::Cancel`).

use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::body::Body;
use axum::extract::Query;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{AppState, Route, accept};
use crate::backend::access::{AccessError, Caller, PodVerb};
use crate::explain::{Asked, Cancel, ExplainError, Explanation, judge_on};
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
#[derive(Debug)]
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
            Refused::Explain(e @ (ExplainError::Status(_) | ExplainError::Abandoned(_))) => {
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
        let permit = admitted(&state, &permits)?;
        let caller = state.backend.identify(bearer(&headers)).await;
        let caller = caller.map_err(Refused::Access)?;
        let asked = Asked::Existing(format!("{namespace}/{name}"));
        judged(&state, permit, &caller, (&namespace, PodVerb::Get), asked).await
    };
    respond(&state, started, answer.await)
}

/// `POST /explain` with a Pod manifest: judged as if created now. The caller's token
/// is reviewed before a byte of the body is read; the body is read without a slot (a
/// slow one holds none), and the slot taken again to judge.
pub(super) async fn explain_manifest(
    state: AppState,
    permits: Arc<Semaphore>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let started = Instant::now();
    let answer = async {
        let caller = {
            let _permit = admitted(&state, &permits)?;
            let caller = state.backend.identify(bearer(&headers)).await;
            caller.map_err(Refused::Access)?
        };
        let pod = match accept(&state, &headers, body, &MANIFEST).await {
            Ok(pod) => pod,
            Err(rejection) => return Err(Unanswered::Rejected(rejection.into_response())),
        };
        let namespace = pod.metadata.namespace.clone();
        let namespace = namespace.unwrap_or_else(|| "default".into());
        let permit = admitted(&state, &permits)?;
        let asked = Asked::Manifest(pod);
        let judged = judged(
            &state,
            permit,
            &caller,
            (&namespace, PodVerb::Create),
            asked,
        );
        Ok(judged.await?)
    };
    match answer.await {
        Ok(explanation) => respond(&state, started, Ok(explanation)),
        Err(Unanswered::Refused(refused)) => respond(&state, started, Err(refused)),
        Err(Unanswered::Rejected(response)) => {
            state
                .metrics
                .observe("explain", "refused", started.elapsed().as_secs_f64());
            response
        }
    }
}

/// A manifest's request that got no verdict: refused by `/explain`'s own rules, or its
/// body rejected as every route rejects one.
enum Unanswered {
    Refused(Refused),
    Rejected(Response),
}

impl From<Refused> for Unanswered {
    fn from(refused: Refused) -> Self {
        Unanswered::Refused(refused)
    }
}

/// A slot for one review or judgment, if one is free now, and the cache ready.
fn admitted(state: &AppState, permits: &Arc<Semaphore>) -> Result<OwnedSemaphorePermit, Refused> {
    let permit = permits.clone().try_acquire_owned();
    let permit = permit.map_err(|_| Refused::Busy)?;
    if !state.cache().is_ready() {
        return Err(Refused::NotReady);
    }
    Ok(permit)
}

/// Check that `caller` may `verb` pods in `namespace`, then judge, in `permit`'s slot.
async fn judged(
    state: &AppState,
    permit: OwnedSemaphorePermit,
    caller: &Caller,
    (namespace, verb): (&str, PodVerb),
    asked: Asked,
) -> Result<Explanation, Refused> {
    let may = state.backend.may(caller, namespace, verb).await;
    may.map_err(Refused::Access)?;
    // Raised when this future is dropped: the client hung up, or the answer is out.
    let (cancel, _raise_on_drop) = Cancel::on_drop();
    let slot = Arc::new(permit);
    let existing = matches!(asked, Asked::Existing(_));
    let key = asked.key();
    let judging = (slot.clone(), cancel.clone());
    match judge(state, asked, judging).await? {
        // Not in the cache: a pod whose GPUs come only through ResourceClaims?
        Err(ExplainError::NotFound(_)) if existing => match state.backend.read_pod(&key).await {
            Some(pod) => judge(state, Asked::Uncached(Box::new(pod)), (slot, cancel)).await?,
            None => Err(ExplainError::NotFound(key)),
        },
        judged => judged,
    }
    .map_err(Refused::Explain)
}

/// Judge `asked` on the live cache, off the async workers, in the request's span. The
/// judging thread holds the slot until it ends, even when this future is dropped
/// first, and stops at its next node once `cancel` is raised.
async fn judge(
    state: &AppState,
    asked: Asked,
    (slot, cancel): (Arc<OwnedSemaphorePermit>, Cancel),
) -> Result<Result<Explanation, ExplainError>, Refused> {
    let (state, now) = (state.clone(), crate::quota::pending::now_second());
    let span = tracing::Span::current();
    let judged = tokio::task::spawn_blocking(move || {
        span.in_scope(|| {
            let _slot = slot;
            let placer = state.placer.placer();
            judge_on(state.cache(), &placer, &state.config, (asked, &cancel), now)
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

#[cfg(test)]
#[path = "explain_tests.rs"]
mod tests;
