//! `POST /validate` and `POST /mutate` (pods and ResourceClaims): AdmissionReview in,
//! AdmissionReview out. Undecodable reviews get 400; our own failures 5xx (never a
//! denial). The object under review is recorded on the request span once decoded.

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::core::v1::Pod;

use crate::dra::ResourceClaim;

use crate::admission::claim::{mutate_claim, validate_claim};
use crate::admission::mutate::{GpuNodes, mutation};
use crate::admission::validate::{Verdict, validate, validate_update};
use crate::backend::ChargeError;
use crate::metrics::ExceededLabels;
use crate::placement::request::asks_for_gpu;
use crate::wire::DecodeError;
use crate::wire::expect::{PODS, RESOURCE_CLAIMS};
use crate::wire::review::{Answer, Review};

use super::{AppState, Route, WEBHOOK_BODY_LIMIT, answer, trace};

/// A review and, for a CREATE, its pod with namespace and name (even under generateName).
type Created = (Review, Option<(String, Box<Pod>)>);

fn created_pod(body: &[u8]) -> Result<Created, DecodeError> {
    let mut review = Review::decode(body)?;
    review.expect(PODS)?;
    if review.request.operation != "CREATE" {
        return Ok((review, None));
    }
    let mut pod = review.take_pod(false)?;
    review.check_namespace("object", pod.metadata.namespace.as_deref())?;
    let request = &review.request;
    let namespace = request.namespace.clone().unwrap_or_default();
    if pod.metadata.name.as_deref().unwrap_or_default().is_empty() {
        let generated = pod.metadata.generate_name.clone().unwrap_or_default() + &request.uid;
        pod.metadata.name = Some(
            request
                .name
                .clone()
                .filter(|n| !n.is_empty())
                .unwrap_or(generated),
        );
    }
    pod.metadata.namespace = Some(namespace.clone());
    Ok((review, Some((namespace, pod))))
}

/// What the validating webhook judges: a pod being created, or being updated.
enum Reviewed {
    Create { namespace: String, pod: Box<Pod> },
    Update { old: Box<Pod>, new: Box<Pod> },
    Other,
}

fn reviewed_pod(body: &[u8]) -> Result<(Review, Reviewed), DecodeError> {
    let (mut review, created) = created_pod(body)?;
    if let Some((namespace, pod)) = created {
        return Ok((review, Reviewed::Create { namespace, pod }));
    }
    if review.request.operation != "UPDATE" {
        return Ok((review, Reviewed::Other));
    }
    let new = review.take_pod(false)?;
    let old = review.take_pod(true)?;
    review.check_namespace("object", new.metadata.namespace.as_deref())?;
    review.check_namespace("oldObject", old.metadata.namespace.as_deref())?;
    Ok((review, Reviewed::Update { old, new }))
}

/// The object under review, on the request span: the review's namespace and name, or
/// `created`, the name given to an object created under `generateName`.
fn record_review(review: &Review, kind: &'static str, created: Option<&str>) {
    let request = &review.request;
    let name = created.or(request.name.as_deref()).unwrap_or_default();
    trace::record_object(kind, request.namespace.as_deref().unwrap_or_default(), name);
}

fn reply(decision: &'static str, answer: Answer) -> (&'static str, Response) {
    (decision, Json(answer).into_response())
}

const VALIDATE: Route<(Review, Reviewed)> = Route {
    name: "validate",
    limit: WEBHOOK_BODY_LIMIT,
    parse: reviewed_pod,
};

const MUTATE: Route<Created> = Route {
    name: "mutate",
    limit: WEBHOOK_BODY_LIMIT,
    parse: created_pod,
};

pub(super) async fn validate_route(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    answer(&state, &VALIDATE, &headers, body, async |(review, pod)| {
        let created = match &pod {
            Reviewed::Create { pod, .. } => pod.metadata.name.as_deref(),
            _ => None,
        };
        record_review(&review, "pod", created);
        let (namespace, pod) = match pod {
            Reviewed::Create { namespace, pod } => (namespace, pod),
            Reviewed::Update { old, new } => {
                let user = &review.request.user_info;
                let verdict = validate_update(&old, &new, &state.config, user);
                let namespace = review.request.namespace.as_deref().unwrap_or_default();
                let name = review.request.name.as_deref().unwrap_or_default();
                return judged(&state, &review, ("pod", namespace, name), Ok(verdict));
            }
            Reviewed::Other => return reply("allow", review.allow()),
        };
        let dry_run = review.request.dry_run.unwrap_or(false);
        let verdict = validate(&state.backend, &state.config, &namespace, &pod, dry_run).await;
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        judged(&state, &review, ("pod", &namespace, name), verdict)
    })
    .await
}

/// The answer to a validating review: allowed, denied (logged with the object), or our
/// own failure as a 5xx (the API server's failure policy decides).
fn judged(
    state: &AppState,
    review: &Review,
    (kind, namespace, name): (&str, &str, &str),
    verdict: Result<Verdict, crate::admission::validate::ValidateError>,
) -> (&'static str, Response) {
    if let Ok(verdict) = &verdict {
        count_exceeded(state, verdict);
    }
    match verdict {
        Ok(Verdict::Allow) => reply("allow", review.allow()),
        Ok(verdict @ Verdict::Warn(_)) => {
            let warnings = verdict.warnings();
            tracing::info!(kind, namespace, name, warnings = ?warnings, "admitted past a Warn quota");
            reply("warn", review.allow_with(&warnings))
        }
        Ok(Verdict::Deny(reason)) => {
            let message = reason.to_string();
            // Recorded before the log line, so that the line carries it too.
            trace::record_decision("deny");
            tracing::info!(kind, namespace, name, reason = reason.kind(), %message, "denied");
            reply("deny", review.deny(&message))
        }
        Err(error) => {
            trace::record_decision(error.kind());
            tracing::error!(kind, namespace, %error, "cannot judge");
            let status = match error.overloaded() {
                true => StatusCode::SERVICE_UNAVAILABLE,
                false => StatusCode::INTERNAL_SERVER_ERROR,
            };
            (error.kind(), (status, error.to_string()).into_response())
        }
    }
}

/// A mutation cannot be worked out without the namespace's quotas
/// (`Backend::ensure_quotas`): our own failure, a 500 the failure policy decides.
fn quotas_unread(namespace: &str, error: &ChargeError) -> (&'static str, Response) {
    tracing::error!(namespace, %error, "cannot read the namespace's GPUQuotas");
    let status = StatusCode::INTERNAL_SERVER_ERROR;
    (error.kind(), (status, error.to_string()).into_response())
}

/// Count the quotas a verdict found without room (`gpu_admission_quota_exceeded_total`).
fn count_exceeded(state: &AppState, verdict: &Verdict) {
    for (namespace, model, action) in verdict.exceeded() {
        let labels = ExceededLabels {
            namespace: namespace.to_string(),
            model: model.to_string(),
            action,
        };
        state.metrics.quota_exceeded.get_or_create(&labels).inc();
    }
}

pub(super) async fn mutate_route(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    answer(&state, &MUTATE, &headers, body, async |(review, pod)| {
        let created = pod
            .as_ref()
            .and_then(|(_, pod)| pod.metadata.name.as_deref());
        record_review(&review, "pod", created);
        let Some((namespace, pod)) =
            pod.filter(|(_, pod)| asks_for_gpu(pod, &state.config.resources))
        else {
            return reply("allow", review.allow());
        };
        if let Err(error) = state.backend.ensure_quotas(&namespace).await {
            return quotas_unread(&namespace, &error);
        }
        let (limits, nodes) = state.cache().read(|s| {
            let nodes = GpuNodes {
                mig_labels: s.mig_labels().map(str::to_string).collect(),
                dra_unlabelled: s.classes().values().any(|c| c.extended_resource.is_some()),
            };
            (s.namespace_limits(&namespace).clone(), nodes)
        });
        match mutation(&pod, &state.config, &limits, &nodes) {
            Ok(patch) => {
                let decision = if patch.0.is_empty() { "allow" } else { "patch" };
                reply(decision, review.patch(&patch))
            }
            Err(conflict) => reply("deny", review.deny(&conflict.to_string())),
        }
    })
    .await
}

/// A ResourceClaim review: the claim being created, with its namespace.
type ClaimReview = (Review, Option<(String, Box<ResourceClaim>)>);

fn created_claim(body: &[u8]) -> Result<ClaimReview, DecodeError> {
    let review = Review::from_json(body)?;
    review.expect(RESOURCE_CLAIMS)?;
    if review.request.operation != "CREATE" {
        return Ok((review, None));
    }
    let mut claim = review.claim()?;
    review.check_namespace("object", claim.metadata.namespace.as_deref())?;
    let namespace = review.request.namespace.clone().unwrap_or_default();
    if claim
        .metadata
        .name
        .as_deref()
        .unwrap_or_default()
        .is_empty()
    {
        let generated = claim.metadata.generate_name.clone().unwrap_or_default();
        let name = review.request.name.clone().filter(|n| !n.is_empty());
        claim.metadata.name = Some(name.unwrap_or(generated + &review.request.uid));
    }
    Ok((review, Some((namespace, Box::new(claim)))))
}

const VALIDATE_CLAIM: Route<ClaimReview> = Route {
    name: "validate_claim",
    limit: WEBHOOK_BODY_LIMIT,
    parse: created_claim,
};

const MUTATE_CLAIM: Route<ClaimReview> = Route {
    name: "mutate_claim",
    limit: WEBHOOK_BODY_LIMIT,
    parse: created_claim,
};

pub(super) async fn validate_claim_route(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    answer(
        &state,
        &VALIDATE_CLAIM,
        &headers,
        body,
        async |(review, claim)| {
            let created = claim.as_ref().and_then(|(_, c)| c.metadata.name.as_deref());
            record_review(&review, "claim", created);
            let Some((namespace, claim)) = claim else {
                return reply("allow", review.allow());
            };
            let dry_run = review.request.dry_run.unwrap_or(false);
            let asker = (namespace.as_str(), &review.request.user_info);
            let verdict =
                validate_claim(&state.backend, &state.config, asker, &claim, dry_run).await;
            let name = claim.metadata.name.as_deref().unwrap_or_default();
            judged(&state, &review, ("claim", &namespace, name), verdict)
        },
    )
    .await
}

pub(super) async fn mutate_claim_route(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    answer(
        &state,
        &MUTATE_CLAIM,
        &headers,
        body,
        async |(review, claim)| {
            let created = claim.as_ref().and_then(|(_, c)| c.metadata.name.as_deref());
            record_review(&review, "claim", created);
            let Some((namespace, claim)) = claim else {
                return reply("allow", review.allow());
            };
            if let Err(error) = state.backend.ensure_quotas(&namespace).await {
                return quotas_unread(&namespace, &error);
            }
            let asker = (namespace.as_str(), &review.request.user_info);
            match mutate_claim(state.cache(), &state.config, asker, claim).await {
                Ok(pinned) if pinned.patch.0.is_empty() => {
                    reply("allow", review.allow_with(&pinned.warnings))
                }
                Ok(pinned) => reply("patch", review.patch_with(&pinned.patch, &pinned.warnings)),
                Err(error) => {
                    // Our own failure, never a denial: the failure policy decides.
                    tracing::error!(namespace, %error, "cannot pin the claim");
                    let busy = matches!(error, crate::cache::pool::PoolError::Busy(_));
                    let (decision, status) = match busy {
                        true => ("busy", StatusCode::SERVICE_UNAVAILABLE),
                        false => ("evaluation_failed", StatusCode::INTERNAL_SERVER_ERROR),
                    };
                    (decision, (status, error.to_string()).into_response())
                }
            }
        },
    )
    .await
}
