//! `POST /validate` and `POST /mutate`: AdmissionReview in, AdmissionReview out.
//! Undecodable reviews get 400; our own failures 5xx (never a denial).

use std::time::Instant;

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::core::v1::Pod;

use crate::admission::mutate::{desired_pod, patch_for};
use crate::admission::review::Review;
use crate::admission::validate::{Verdict, validate};
use crate::placement::request::asks_for_gpu;
use crate::quota::NamespaceLimits;

use super::{AppState, Rejection, WEBHOOK_BODY_LIMIT, accept, observed};

/// A CREATE review's pod, with its namespace and a name even under generateName.
fn created_pod(review: &Review) -> Result<Option<(String, Pod)>, Rejection> {
    let request = &review.request;
    if request.operation != "CREATE" {
        return Ok(None);
    }
    let object = request
        .object
        .as_ref()
        .ok_or_else(|| Rejection::BadRequest("CREATE review has no request.object".into()))?;
    let mut pod: Pod =
        crate::extender::api::decode("request.object", object).map_err(Rejection::BadRequest)?;
    let namespace = request
        .namespace
        .clone()
        .or_else(|| pod.metadata.namespace.clone())
        .unwrap_or_else(|| "default".into());
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
    Ok(Some((namespace, pod)))
}

pub async fn validate_route(State(state): State<AppState>, body: Body) -> Response {
    const ROUTE: &str = "validate";
    let started = Instant::now();
    let (review, pod) = match accept(&state, body, WEBHOOK_BODY_LIMIT, Review::from_json)
        .await
        .and_then(|r| {
            let pod = created_pod(&r)?;
            Ok((r, pod))
        }) {
        Ok(parts) => parts,
        Err(rejection) => {
            return observed(
                &state,
                ROUTE,
                rejection.label(),
                started,
                rejection.into_response(),
            );
        }
    };
    let Some((namespace, pod)) = pod else {
        return observed(
            &state,
            ROUTE,
            "allow",
            started,
            Json(review.allow()).into_response(),
        );
    };
    let dry_run = review.request.dry_run.unwrap_or(false);
    match validate(&state.cache, &state.config, &namespace, &pod, dry_run).await {
        Ok(Verdict::Allow) => observed(
            &state,
            ROUTE,
            "allow",
            started,
            Json(review.allow()).into_response(),
        ),
        Ok(Verdict::Deny(message)) => {
            tracing::info!(namespace, pod = pod.metadata.name.as_deref().unwrap_or_default(), %message, "denied");
            observed(
                &state,
                ROUTE,
                "deny",
                started,
                Json(review.deny(&message)).into_response(),
            )
        }
        Err(error) => {
            tracing::error!(namespace, %error, "cannot judge pod");
            let response = (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response();
            observed(&state, ROUTE, error.kind(), started, response)
        }
    }
}

pub async fn mutate_route(State(state): State<AppState>, body: Body) -> Response {
    const ROUTE: &str = "mutate";
    let started = Instant::now();
    let (review, pod) = match accept(&state, body, WEBHOOK_BODY_LIMIT, Review::from_json)
        .await
        .and_then(|r| {
            let pod = created_pod(&r)?;
            Ok((r, pod))
        }) {
        Ok(parts) => parts,
        Err(rejection) => {
            return observed(
                &state,
                ROUTE,
                rejection.label(),
                started,
                rejection.into_response(),
            );
        }
    };
    let Some((namespace, pod)) = pod.filter(|(_, pod)| asks_for_gpu(pod, &state.config.resources))
    else {
        return observed(
            &state,
            ROUTE,
            "allow",
            started,
            Json(review.allow()).into_response(),
        );
    };
    let limits = state
        .cache
        .with_state(|s| NamespaceLimits::of(s.quotas(), &namespace));
    match desired_pod(&pod, &state.config, &limits) {
        Ok(desired) => {
            let patch = patch_for(&pod, &desired);
            let decision = if patch.0.is_empty() { "allow" } else { "patch" };
            observed(
                &state,
                ROUTE,
                decision,
                started,
                Json(review.patch(&patch)).into_response(),
            )
        }
        Err(message) => observed(
            &state,
            ROUTE,
            "deny",
            started,
            Json(review.deny(&message)).into_response(),
        ),
    }
}
