//! `/explain` checks its caller before it reads a body (docs/security.md, "The admin
//! port"): against a fake API server that knows one token, a POST whose body never
//! arrives gets its 401 without the body being touched, and without a token nothing is
//! asked of the API server at all.
#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::Poll;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use serde_json::json;
use tower::ServiceExt;

use crate::backend::Backend;
use crate::cache::{CacheWriter, Projection};
use crate::config::Config;
use crate::server::AppState;
use crate::server::admin::admin_router;

/// What the fake API server was asked.
#[derive(Default)]
struct Asked {
    token_reviews: AtomicUsize,
    access_reviews: AtomicUsize,
}

impl Asked {
    fn counts(&self) -> (usize, usize) {
        let tokens = self.token_reviews.load(Ordering::SeqCst);
        (tokens, self.access_reviews.load(Ordering::SeqCst))
    }
}

/// A client of an API server that knows one token, `good`, of user alice, who may read
/// and create pods in namespace team-a only.
fn api_server(asked: Arc<Asked>) -> kube::Client {
    let service = tower::service_fn(move |request: Request<kube::client::Body>| {
        let asked = asked.clone();
        async move {
            let path = request.uri().path().to_string();
            let body = request.into_body().collect_bytes().await.unwrap();
            let review: serde_json::Value = serde_json::from_slice(&body).unwrap();
            let answer = if path.ends_with("/tokenreviews") {
                asked.token_reviews.fetch_add(1, Ordering::SeqCst);
                let good = review["spec"]["token"] == "good";
                json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                       "spec": {}, "status": {"authenticated": good, "user": {"username": "alice"}}})
            } else {
                assert!(path.ends_with("/subjectaccessreviews"), "{path}");
                asked.access_reviews.fetch_add(1, Ordering::SeqCst);
                let namespace = &review["spec"]["resourceAttributes"]["namespace"];
                json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                       "spec": {}, "status": {"allowed": namespace == "team-a"}})
            };
            let answer = Full::new(Bytes::from(answer.to_string()));
            Ok::<_, Infallible>(Response::new(answer))
        }
    });
    kube::Client::new(service, "default")
}

/// The admin router in API mode over an empty, ready cache; a body may take an hour.
fn admin(asked: Arc<Asked>) -> axum::Router {
    let config = Config::default();
    let cache = CacheWriter::in_memory(Projection::from_config(&config));
    let backend = Backend::api_for_tests(cache, api_server(asked));
    let state = AppState::with_body_timeout(backend, config, Duration::from_secs(3600));
    admin_router(state)
}

/// A body announced as 1,000 bytes that never comes; `polled` says whether the server
/// began to read it.
fn never_arriving(polled: Arc<AtomicBool>) -> Body {
    let stream = futures::stream::poll_fn(move |_| {
        polled.store(true, Ordering::SeqCst);
        Poll::<Option<Result<Bytes, Infallible>>>::Pending
    });
    Body::from_stream(stream)
}

fn post(token: Option<&str>, body: Body, length: usize) -> Request<Body> {
    let request = Request::post("/explain").header(header::CONTENT_LENGTH, length);
    let request = match token {
        Some(token) => request.header(header::AUTHORIZATION, format!("Bearer {token}")),
        None => request,
    };
    request.body(body).unwrap()
}

/// The answer's status and text. The guard only turns a server that waits for the body
/// (an hour) into a failure instead of a hang.
async fn answer(router: axum::Router, request: Request<Body>) -> (StatusCode, String) {
    let answered = tokio::time::timeout(Duration::from_secs(120), router.oneshot(request));
    let response = answered
        .await
        .expect("no answer: the server waited for the body");
    let status = response.unwrap().into_parts();
    let text = status.1.collect().await.unwrap().to_bytes();
    (status.0.status, String::from_utf8_lossy(&text).into_owned())
}

#[tokio::test]
async fn a_post_without_a_token_is_refused_unread_and_the_api_server_never_asked() {
    let asked = Arc::new(Asked::default());
    let polled = Arc::new(AtomicBool::new(false));
    let request = post(None, never_arriving(polled.clone()), 1000);
    let (status, text) = answer(admin(asked.clone()), request).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{text}");
    assert!(text.contains("no bearer token"), "{text}");
    assert!(!polled.load(Ordering::SeqCst), "the body was read");
    assert_eq!(asked.counts(), (0, 0));
}

#[tokio::test]
async fn a_post_with_a_bad_token_is_refused_unread_after_one_token_review() {
    let asked = Arc::new(Asked::default());
    let polled = Arc::new(AtomicBool::new(false));
    let request = post(Some("forged"), never_arriving(polled.clone()), 1000);
    let (status, text) = answer(admin(asked.clone()), request).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{text}");
    assert!(text.contains("not valid"), "{text}");
    assert!(!polled.load(Ordering::SeqCst), "the body was read");
    assert_eq!(asked.counts(), (1, 0), "(token reviews, access reviews)");
}

/// A caller the API server knows has its manifest read, then its namespace checked.
#[tokio::test]
async fn a_known_caller_has_its_manifest_read_then_its_namespace_checked() {
    let manifest = |namespace: &str| {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "new", "namespace": namespace},
               "spec": {"containers": [{"name": "c",
                   "resources": {"limits": {"tencent.com/vcuda-core": "100"}}}]}})
        .to_string()
    };
    let asked = Arc::new(Asked::default());
    let theirs = manifest("team-b");
    let request = post(Some("good"), Body::from(theirs.clone()), theirs.len());
    let (status, text) = answer(admin(asked.clone()), request).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{text}");
    assert_eq!(text, "alice may not create pods in namespace team-b");
    assert_eq!(asked.counts(), (1, 1));

    let own = manifest("team-a");
    let request = post(Some("good"), Body::from(own.clone()), own.len());
    let (status, text) = answer(admin(asked.clone()), request).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let verdict: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(verdict["pod"], "team-a/new", "{verdict}");
    assert_eq!(asked.counts(), (2, 2));
}

#[tokio::test]
async fn a_get_without_a_token_asks_the_api_server_nothing() {
    let asked = Arc::new(Asked::default());
    let request = Request::get("/explain?pod=team-a/x").body(Body::empty());
    let (status, text) = answer(admin(asked.clone()), request.unwrap()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{text}");
    assert_eq!(asked.counts(), (0, 0));
}
