//! A quota the watch has not delivered yet is still enforced (docs/design.md, "A quota
//! the watch has not delivered"): against an API server that holds a GPUQuota this
//! replica's cache has never seen, a pod over it is refused, read from the API server;
//! a namespace whose quota the cache holds is judged without asking it.
#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::body::Bytes;
use axum::http::{Request, Response, StatusCode};
use http_body_util::Full;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::json;

use super::validate;
use crate::admission::verdict::{Reason, Verdict};
use crate::backend::Backend;
use crate::cache::{CacheWriter, Projection};
use crate::config::Config;
use crate::placement::testing::pod_with;
use crate::quota::{Denial, GPUQuota, GpuQuotaSpec, GpuQuotaStatus};

const QUOTAS: &str = "/apis/gpu-admission.io/v1alpha1/namespaces/team/gpuquotas";

/// Namespace team's quota: one T4, `used` of it in use.
fn quota(used: &str) -> GPUQuota {
    let mut quota = GPUQuota::new(
        "q",
        GpuQuotaSpec {
            hard: [("T4".to_string(), Quantity("1".into()))].into(),
            default_type: Some("T4".into()),
            ..Default::default()
        },
    );
    quota.metadata.namespace = Some("team".into());
    quota.metadata.resource_version = Some("7".into());
    quota.status = Some(GpuQuotaStatus {
        used: [("T4".to_string(), Quantity(used.into()))].into(),
        ..GpuQuotaStatus::default()
    });
    quota
}

/// A client of an API server whose only GPUQuotas are `quotas` (in namespace team), and
/// that counts how often they were listed; anything else it is asked fails.
fn api_server(quotas: Vec<GPUQuota>, listed: Arc<AtomicUsize>) -> kube::Client {
    let service = tower::service_fn(move |request: Request<kube::client::Body>| {
        let (quotas, listed) = (quotas.clone(), listed.clone());
        async move {
            let path = request.uri().path().to_string();
            let mut response = if request.method() == "GET" && path == QUOTAS {
                listed.fetch_add(1, Ordering::SeqCst);
                let list = json!({
                    "apiVersion": "gpu-admission.io/v1alpha1", "kind": "GPUQuotaList",
                    "metadata": {"resourceVersion": "9"}, "items": quotas,
                });
                Response::new(Full::new(Bytes::from(list.to_string())))
            } else {
                let mut refused = Response::new(Full::new(Bytes::from("not here")));
                *refused.status_mut() = StatusCode::NOT_IMPLEMENTED;
                refused
            };
            response.headers_mut().insert(
                axum::http::header::CONTENT_TYPE,
                "application/json".parse().unwrap(),
            );
            Ok::<_, Infallible>(response)
        }
    });
    kube::Client::new(service, "default")
}

fn gpu_pod(name: &str) -> k8s_openapi::api::core::v1::Pod {
    let mut pod = pod_with(&[&[("nvidia.com/gpu", "1")]]);
    pod.metadata.name = Some(name.into());
    pod.metadata.namespace = Some("team".into());
    pod
}

/// API mode over a ready cache holding `cached`, against an API server holding `stored`.
fn backend(cached: Option<GPUQuota>, stored: Vec<GPUQuota>) -> (Backend, Arc<AtomicUsize>) {
    let cache = CacheWriter::in_memory(Projection::from_config(&Config::default()));
    if let Some(quota) = cached {
        cache.write(|state| state.apply_quota(quota));
    }
    let listed = Arc::new(AtomicUsize::new(0));
    let backend = Backend::api_for_tests(cache, api_server(stored, listed.clone()));
    (backend, listed)
}

#[tokio::test]
async fn a_pod_over_a_quota_the_watch_has_not_delivered_is_refused() {
    let config = Config::default();
    let (backend, listed) = backend(None, vec![quota("1")]);
    let verdict = validate(&backend, &config, "team", &gpu_pod("over"), false).await;
    let Verdict::Deny(reason) = verdict.unwrap() else {
        panic!("the quota's one T4 is in use: the pod is over it");
    };
    assert!(
        matches!(&reason, Reason::Quota(Denial::Exceeded(e)) if e.model == "T4"),
        "{reason:?}"
    );
    assert!(listed.load(Ordering::SeqCst) >= 1);
    let cached = backend.cache().read(|s| s.namespace_quotas("team").count());
    assert_eq!(cached, 1, "the quota read is kept in the cache");
}

/// A tenant who knows the watch lags: a model the undelivered quotas do not list, and a
/// GPU asked only by an init container, are judged by those quotas all the same.
#[tokio::test]
async fn a_tenant_cannot_step_around_an_undelivered_quota_by_model_or_container_kind() {
    let config = Config::default();
    let mut a100 = quota("0");
    a100.metadata.name = Some("q2".into());
    a100.spec.hard = [("A100".to_string(), Quantity("2".into()))].into();
    a100.spec.default_type = None;
    let (backend, _) = backend(None, vec![quota("1"), a100]);
    let mut unlisted = gpu_pod("unlisted");
    let annotations = [(config.type_annotation.clone(), "A10".to_string())];
    unlisted.metadata.annotations = Some(annotations.into());
    let verdict = validate(&backend, &config, "team", &unlisted, false).await;
    let Verdict::Deny(reason) = verdict.unwrap() else {
        panic!("A10 is listed by no quota of the namespace");
    };
    assert!(
        matches!(&reason, Reason::Quota(Denial::ModelNotAllowed { model, .. }) if model == "A10"),
        "{reason:?}"
    );
    let mut init = gpu_pod("init");
    let spec = init.spec.as_mut().unwrap();
    spec.init_containers = Some(std::mem::take(&mut spec.containers));
    spec.containers = pod_with(&[&[]]).spec.unwrap().containers;
    let verdict = validate(&backend, &config, "team", &init, false).await;
    let Verdict::Deny(reason) = verdict.unwrap() else {
        panic!("the init container's T4 (the default type) is over the quota");
    };
    assert!(
        matches!(&reason, Reason::Quota(Denial::Exceeded(e)) if e.model == "T4"),
        "{reason:?}"
    );
}

#[tokio::test]
async fn a_namespace_without_a_quota_is_confirmed_by_the_api_server_each_time() {
    let config = Config::default();
    let (backend, listed) = backend(None, vec![]);
    for name in ["a", "b"] {
        let verdict = validate(&backend, &config, "team", &gpu_pod(name), false).await;
        assert_eq!(verdict.unwrap(), Verdict::Allow);
    }
    assert_eq!(listed.load(Ordering::SeqCst), 2, "one read per create");
}

#[tokio::test]
async fn a_quota_the_cache_holds_is_not_read_again() {
    // A dry run decides on the cache alone: the API server is never asked.
    let config = Config::default();
    let (backend, listed) = backend(Some(quota("0")), vec![]);
    let verdict = validate(&backend, &config, "team", &gpu_pod("dry"), true).await;
    assert_eq!(verdict.unwrap(), Verdict::Allow);
    assert_eq!(listed.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn an_api_server_that_cannot_be_read_is_our_failure_not_a_denial() {
    let config = Config::default();
    let cache = CacheWriter::in_memory(Projection::from_config(&config));
    let service = tower::service_fn(|_: Request<kube::client::Body>| async {
        let mut down = Response::new(Full::new(Bytes::from("down")));
        *down.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        Ok::<_, Infallible>(down)
    });
    let backend = Backend::api_for_tests(cache, kube::Client::new(service, "default"));
    let verdict = validate(&backend, &config, "team", &gpu_pod("a"), false).await;
    let error = verdict.unwrap_err();
    assert_eq!(error.kind(), "api", "{error}");
}

#[tokio::test]
async fn the_mutating_webhook_steers_by_a_quota_the_watch_has_not_delivered() {
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let config = Config::default();
    let (backend, listed) = backend(None, vec![quota("0")]);
    let state = crate::server::AppState::with_body_timeout(
        backend,
        config.clone(),
        std::time::Duration::from_secs(10),
    );
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "u1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": "a", "namespace": "team", "operation": "CREATE",
            "userInfo": {"username": "alice"}, "object": gpu_pod("a"),
        }
    });
    let request = Request::post("/mutate")
        .header(axum::http::header::CONTENT_TYPE, "application/json")
        .body(axum::body::Body::from(review.to_string()))
        .unwrap();
    let response = crate::server::webhook_router(state)
        .oneshot(request)
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let answer: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let patch = answer["response"]["patch"].as_str().unwrap_or_default();
    use base64::Engine as _;
    let patch = base64::engine::general_purpose::STANDARD
        .decode(patch)
        .unwrap();
    let patch = String::from_utf8(patch).unwrap();
    assert!(
        patch.contains(&format!("{:?}:\"T4\"", config.type_annotation)),
        "the quota's defaultType is set: {patch}"
    );
    assert_eq!(listed.load(Ordering::SeqCst), 1);
}
