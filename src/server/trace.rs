//! The `request` span: every routed request runs inside one, so the log lines written
//! while it is handled say which route, namespace, object and decision they belong to.
//!
//! The span is opened by a route layer ([`trace_requests`]) with `route` set and the
//! other fields empty; handlers record them once known: the object as soon as the body
//! is decoded ([`record_object`], [`record_pod`]), the decision when the request is
//! answered ([`record_decision`], called by [`super::answer`]). Fields never recorded
//! (a body that did not decode names no pod) stay empty and are not printed.

use axum::Router;
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use k8s_openapi::api::core::v1::Pod;
use tracing::Instrument;
use tracing::field::Empty;

/// Name of the span every routed request runs in.
const SPAN: &str = "request";

/// `router`, with each routed request inside a [`SPAN`] span. A route layer, so only
/// requests that matched a route get one (a 404 has no route to name).
pub(super) fn trace_requests<S>(router: Router<S>) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    router.route_layer(axum::middleware::from_fn(traced))
}

async fn traced(request: Request, next: Next) -> Response {
    // Routes have no path parameters, so a matched path is the route itself.
    let span = tracing::info_span!(
        SPAN,
        route = request.uri().path(),
        namespace = Empty,
        pod = Empty,
        claim = Empty,
        decision = Empty,
    );
    next.run(request).instrument(span).await
}

/// What a request is about, on its span: `kind` is the field that takes the object's
/// name (`pod` or `claim`). Empty parts are left unrecorded. Both in one record: the
/// subscriber finds the span and formats its fields once, not once a field.
pub(super) fn record_object(kind: &'static str, namespace: &str, name: &str) {
    let span = tracing::Span::current();
    let Some(fields) = span.metadata().map(|m| m.fields()) else {
        return; // no subscriber, or outside a request span
    };
    let (Some(namespace_field), Some(name_field)) = (fields.field("namespace"), fields.field(kind))
    else {
        return;
    };
    span.record_all(&fields.value_set(&[
        (&namespace_field, given(&namespace)),
        (&name_field, given(&name)),
    ]));
}

/// A text field's value to record: none when it is empty.
fn given<'a>(value: &'a &str) -> Option<&'a dyn tracing::Value> {
    (!value.is_empty()).then_some(value as &dyn tracing::Value)
}

/// [`record_object`] for a pod, from its metadata.
pub(super) fn record_pod(pod: &Pod) {
    let meta = &pod.metadata;
    record_object(
        "pod",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default(),
    );
}

/// How the request was answered (the same label as the request metrics' `decision`).
pub(super) fn record_decision(decision: &str) {
    tracing::Span::current().record("decision", decision);
}

#[cfg(test)]
#[path = "trace_tests.rs"]
mod tests;
