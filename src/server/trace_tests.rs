//! The request span as a subscriber sees it: which fields a request's span and the log
//! lines inside it carry.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tower::ServiceExt;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

use super::SPAN;
use crate::backend::Backend;
use crate::cache::Projection;
use crate::config::Config;
use crate::server::{AppState, admin::admin_router, extender_router, webhook_router};

type Fields = BTreeMap<String, String>;

/// What a subscriber saw: each closed [`SPAN`] span's fields, and each event written
/// inside one (its own fields, and the span's at that moment).
#[derive(Clone, Default)]
struct Captured {
    spans: Arc<Mutex<Vec<Fields>>>,
    events: Arc<Mutex<Vec<(Fields, Fields)>>>,
}

struct Visitor<'a>(&'a mut Fields);

impl Visit for Visitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().to_string(), format!("{value:?}"));
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Captured {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::new();
        attrs.record(&mut Visitor(&mut fields));
        ctx.span(id).unwrap().extensions_mut().insert(fields);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let span = ctx.span(id).unwrap();
        let mut extensions = span.extensions_mut();
        values.record(&mut Visitor(extensions.get_mut::<Fields>().unwrap()));
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.event_span(event).filter(|s| s.name() == SPAN) else {
            return;
        };
        let mut own = Fields::new();
        event.record(&mut Visitor(&mut own));
        let fields = span.extensions().get::<Fields>().cloned().unwrap();
        self.events.lock().push((own, fields));
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let span = ctx.span(&id).unwrap();
        if span.name() == SPAN {
            let fields = span.extensions_mut().remove::<Fields>().unwrap();
            self.spans.lock().push(fields);
        }
    }
}

fn fields(pairs: &[(&str, &str)]) -> Fields {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// An offline cluster whose only GPUQuota allows team-a one Tesla-T4.
fn state() -> AppState {
    let quota = "---\napiVersion: gpu-admission.io/v1alpha1\nkind: GPUQuota\n\
                 metadata: {name: default, namespace: team-a}\n\
                 spec:\n  hard: {Tesla-T4: \"1\"}\n  defaultType: Tesla-T4\n";
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cluster.yaml");
    std::fs::write(&path, quota).unwrap();
    let config = Config::default();
    let backend = Backend::from_file(&path, Projection::from_config(&config)).unwrap();
    AppState::new(backend, config)
}

fn gpu_pod(namespace: &str, name: &str, gpus: u32) -> Value {
    let limits = json!({
        "tencent.com/vcuda-core": (gpus * 100).to_string(),
        "tencent.com/vcuda-memory": (gpus * 4).to_string(),
    });
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{name}")},
        "spec": {"containers": [{"name": "c", "image": "busybox", "resources": {"limits": limits}}]}
    })
}

fn review(pod: &Value) -> String {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "review-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": pod["metadata"]["name"], "namespace": pod["metadata"]["namespace"],
            "operation": "CREATE", "userInfo": {"username": "alice"},
            "object": pod, "oldObject": null, "dryRun": false
        }
    })
    .to_string()
}

async fn send(router: axum::Router, method: &str, path: &str, body: String) -> StatusCode {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap();
    router.oneshot(request).await.unwrap().status()
}

/// Runs `requests` with a capturing subscriber as this thread's default (the test
/// runtime polls on this thread), and returns what it saw.
async fn captured<F: Future<Output = ()>>(requests: F) -> Captured {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::registry().with(captured.clone());
    let _default = tracing::subscriber::set_default(subscriber);
    requests.await;
    captured
}

#[tokio::test]
async fn a_denial_runs_in_a_span_naming_namespace_pod_and_decision() {
    let router = webhook_router(state());
    let seen = captured(async {
        let body = review(&gpu_pod("team-a", "big", 2));
        assert_eq!(
            send(router, "POST", "/validate", body).await,
            StatusCode::OK
        );
    })
    .await;
    let want = fields(&[
        ("route", "/validate"),
        ("namespace", "team-a"),
        ("pod", "big"),
        ("decision", "deny"),
    ]);
    assert_eq!(*seen.spans.lock(), vec![want.clone()]);
    // The existing "denied" log line (kind, namespace, name, message) carries the
    // span's fields, the decision included.
    let events = seen.events.lock();
    let denied = events
        .iter()
        .find(|(own, _)| own.get("name").is_some_and(|n| n == "big"));
    assert_eq!(denied.map(|(_, span)| span), Some(&want), "{events:?}");
}

#[tokio::test]
async fn every_door_traces_its_routes_with_what_is_known() {
    let state = state();
    let seen = captured(async {
        let created = review(&gpu_pod("team-b", "small", 1));
        let mutate = send(webhook_router(state.clone()), "POST", "/mutate", created).await;
        assert_eq!(mutate, StatusCode::OK);
        let garbage = send(
            webhook_router(state.clone()),
            "POST",
            "/validate",
            "{".into(),
        )
        .await;
        assert_eq!(garbage, StatusCode::BAD_REQUEST);
        let bind = json!({"PodName": "p", "PodNamespace": "team-c", "PodUID": "u", "Node": "n"});
        let bind = send(
            extender_router(state.clone()),
            "POST",
            "/scheduler/bind",
            bind.to_string(),
        );
        assert_eq!(bind.await, StatusCode::OK);
        let livez = send(admin_router(state.clone()), "GET", "/livez", String::new()).await;
        assert_eq!(livez, StatusCode::OK);
        let unrouted = send(
            admin_router(state.clone()),
            "GET",
            "/nowhere",
            String::new(),
        )
        .await;
        assert_eq!(unrouted, StatusCode::NOT_FOUND);
    })
    .await;
    let spans = seen.spans.lock();
    let routes: Vec<_> = spans.iter().map(|s| s["route"].as_str()).collect();
    assert_eq!(
        routes,
        ["/mutate", "/validate", "/scheduler/bind", "/livez"]
    );
    let mutate = fields(&[("namespace", "team-b"), ("pod", "small")]);
    assert!(
        mutate.iter().all(|(k, v)| spans[0][k] == *v),
        "{:?}",
        spans[0]
    );
    assert!(spans[0].contains_key("decision"), "{:?}", spans[0]);
    assert_eq!(
        spans[1],
        fields(&[("route", "/validate"), ("decision", "malformed_json")])
    );
    assert_eq!(spans[2]["namespace"], "team-c");
    assert_eq!(spans[2]["pod"], "p");
    assert!(spans[2].contains_key("decision"), "{:?}", spans[2]);
    assert_eq!(spans[3], fields(&[("route", "/livez")]));
}
