//! HTTP serving: one router per door — the webhooks (what the API server calls), the
//! extender (what the scheduler next to us calls), the optional plain extender port,
//! and the admin port. Handlers only decode (`wire`), call the verbs with the backend, encode
//! and count; each routed request runs in a `request` tracing span (`trace.rs`).

pub mod admin;
mod explain;
pub(crate) mod flag_values;
pub mod listener;
mod metered;
mod pace;
pub mod slots;
pub mod tls;
mod trace;
mod webhooks;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::backend::Backend;
use crate::cache::ClusterCache;
use crate::config::Config;
use crate::extender::volcano::predicate;
use crate::extender::{bind, filter};
use crate::metrics::Metrics;
use crate::placement::learn::LearningPlacer;
use crate::wire::DecodeError;
use crate::wire::binding::ExtenderBindingArgs;
use crate::wire::extender::ExtenderArgs;
use crate::wire::volcano::PredicateArgs;

/// Largest AdmissionReview accepted. The API server refuses objects over 3 MiB, and
/// the only reviews sent with two objects (an UPDATE's object and oldObject) are of
/// pods, which etcd keeps under 1.5 MiB each.
const WEBHOOK_BODY_LIMIT: usize = 4 << 20;
/// Largest extender request accepted. With `nodeCacheCapable` (what deploy/ sets) a
/// request is the pod and up to 15,000 node names; the `Nodes` form carries whole Node
/// objects, a few KiB each.
const EXTENDER_BODY_LIMIT: usize = 32 << 20;
/// Bodies at least this large are decoded on the blocking pool, so the async workers
/// keep answering probes and small requests meanwhile.
const DECODE_INLINE_MAX: usize = 64 << 10;

/// What every handler shares: one reference-counted [`Shared`], so that handing it to
/// a request is one counter, not one per part.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

/// The parts of [`AppState`].
pub struct Shared {
    /// The run mode's seam: every charge, record and bind goes through it.
    pub(crate) backend: Backend,
    pub(crate) config: Arc<Config>,
    pub metrics: Arc<Metrics>,
    /// Set when shutdown begins, so `/readyz` turns away new traffic first.
    pub(crate) shutting_down: Arc<AtomicBool>,
    /// The placement policy, learning the request mix from the pods it places.
    pub placer: Arc<LearningPlacer>,
    /// How long a request body may take to arrive (then 408).
    body_timeout: std::time::Duration,
}

impl std::ops::Deref for AppState {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl AppState {
    pub fn new(backend: Backend, config: Config) -> Self {
        Self::with_body_timeout(
            backend,
            config,
            listener::ConnectionLimits::default().request_timeout,
        )
    }

    /// [`AppState::new`] with request bodies given `body_timeout` to arrive.
    pub fn with_body_timeout(
        backend: Backend,
        config: Config,
        body_timeout: std::time::Duration,
    ) -> Self {
        let placement = &config.placement;
        AppState(Arc::new(Shared {
            placer: Arc::new(LearningPlacer::new(
                placement.policy,
                placement.gpu_manager_compat,
            )),
            backend,
            config: Arc::new(config),
            metrics: Arc::new(Metrics::default()),
            shutting_down: Arc::new(AtomicBool::new(false)),
            body_timeout,
        }))
    }
}

impl AppState {
    /// The backend's cluster cache, for reads.
    pub fn cache(&self) -> &ClusterCache {
        self.backend.cache()
    }
}

/// The webhook door (`--address`): what the API server calls, and nothing else.
pub fn webhook_router(state: AppState) -> Router {
    let routes = Router::new()
        .route("/version", get(version))
        .route("/validate", post(webhooks::validate_route))
        .route("/mutate", post(webhooks::mutate_route))
        .route(
            "/validate/resourceclaims",
            post(webhooks::validate_claim_route),
        )
        .route("/mutate/resourceclaims", post(webhooks::mutate_claim_route));
    trace::trace_requests(routes).with_state(state)
}

/// The extender door (`--extender-address`, loopback by default): what the scheduler
/// next to this process calls, and nothing else.
pub fn extender_router(state: AppState) -> Router {
    let routes = extender_routes().route("/version", get(version));
    trace::trace_requests(routes).with_state(state)
}

/// Routes of the optional plain-HTTP extender port: the extender and the probes.
pub(crate) fn insecure_extender_router(state: AppState) -> Router {
    let routes = extender_routes()
        .route("/livez", get(admin::livez))
        .route("/readyz", get(admin::readyz));
    trace::trace_requests(routes).with_state(state)
}

fn extender_routes() -> Router<AppState> {
    Router::new()
        .route("/scheduler/predicates", post(predicates))
        .route("/scheduler/filter", post(predicates))
        .route("/scheduler/vpredicates", post(vpredicates))
        .route("/scheduler/bind", post(bind_route))
}

async fn version() -> impl IntoResponse {
    axum::Json(serde_json::json!({
        "name": env!("CARGO_PKG_NAME"),
        "version": env!("CARGO_PKG_VERSION"),
    }))
}

/// Why a request was not judged: a body that does not decode (400, the text names the
/// problem, counted by its kind) or cannot be read (400), a body over the route's
/// limit (413), a body too slow to arrive (408), or our own state not ready (503, so
/// the caller's failure policy decides).
#[derive(Debug)]
enum Rejection {
    Undecodable(DecodeError),
    Unreadable(String),
    TooLarge { limit: usize },
    TooSlow,
    NotReady,
}

impl Rejection {
    fn label(&self) -> &'static str {
        match self {
            Rejection::Undecodable(error) => error.kind(),
            Rejection::Unreadable(_) => "bad_request",
            Rejection::TooLarge { .. } => "too_large",
            Rejection::TooSlow => "too_slow",
            Rejection::NotReady => "not_ready",
        }
    }
}

impl IntoResponse for Rejection {
    fn into_response(self) -> Response {
        match self {
            Rejection::Undecodable(error) => {
                (StatusCode::BAD_REQUEST, error.to_string()).into_response()
            }
            Rejection::Unreadable(message) => (StatusCode::BAD_REQUEST, message).into_response(),
            Rejection::TooLarge { limit } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "request body is larger than this route's limit of {}",
                    byte_size(limit)
                ),
            )
                .into_response(),
            Rejection::TooSlow => (
                StatusCode::REQUEST_TIMEOUT,
                "request body did not arrive in time",
            )
                .into_response(),
            Rejection::NotReady => (
                StatusCode::SERVICE_UNAVAILABLE,
                "gpu-admission's cluster cache is not ready yet",
            )
                .into_response(),
        }
    }
}

/// A byte count as people write it: the largest unit that divides it exactly (so a
/// limit reads as it was set: "64 KiB", "4 MiB", "1000 bytes").
fn byte_size(bytes: usize) -> String {
    let units = [(30, "GiB"), (20, "MiB"), (10, "KiB")];
    for (shift, unit) in units {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{} {unit}", bytes >> shift);
        }
    }
    format!("{bytes} bytes")
}

/// How a route reads its body: its size limit and its decoder.
struct Route<T> {
    name: &'static str,
    limit: usize,
    parse: fn(&[u8]) -> Result<T, DecodeError>,
}

/// A route whose decoder takes the body itself, shared, not copied: the filter answers
/// with Node objects cut from its request (tens of MB in the `Nodes` form).
struct BodyRoute<T> {
    name: &'static str,
    limit: usize,
    parse: fn(Bytes) -> Result<T, DecodeError>,
}

/// What [`accept`] and [`answer`] need of a route.
trait Decoder<T> {
    fn name(&self) -> &'static str;
    fn limit(&self) -> usize;
    fn decoder(&self) -> impl FnOnce(Bytes) -> Result<T, DecodeError> + Send + 'static;
}

impl<T: 'static> Decoder<T> for Route<T> {
    fn name(&self) -> &'static str {
        self.name
    }
    fn limit(&self) -> usize {
        self.limit
    }
    fn decoder(&self) -> impl FnOnce(Bytes) -> Result<T, DecodeError> + Send + 'static {
        let parse = self.parse;
        move |bytes: Bytes| parse(&bytes)
    }
}

impl<T: 'static> Decoder<T> for BodyRoute<T> {
    fn name(&self) -> &'static str {
        self.name
    }
    fn limit(&self) -> usize {
        self.limit
    }
    fn decoder(&self) -> impl FnOnce(Bytes) -> Result<T, DecodeError> + Send + 'static {
        self.parse
    }
}

/// Read a body of at most `route.limit` bytes (413 beyond), decode it (off the async
/// workers when large), and check readiness.
async fn accept<T: Send + 'static>(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
    route: &impl Decoder<T>,
) -> Result<T, Rejection> {
    let limit = route.limit();
    let announced = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let expects_continue = headers
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    // An announced oversize body is refused unread when the client waits for our go
    // (Expect: 100-continue) or when it is too large to be worth draining.
    if announced.is_some_and(|n| n > limit as u64 && (expects_continue || n > DRAIN_MAX)) {
        return Err(Rejection::TooLarge { limit });
    }
    let expected = announced.map_or(0, |n| n.min(limit as u64) as usize);
    let read = read_body(body, limit, expected);
    let bytes = tokio::time::timeout(state.body_timeout, read)
        .await
        .map_err(|_| Rejection::TooSlow)??;
    let parse = route.decoder();
    let parsed = if bytes.len() < DECODE_INLINE_MAX {
        parse(bytes)
    } else {
        // Off the async workers, in the request's span.
        let span = tracing::Span::current();
        tokio::task::spawn_blocking(move || span.in_scope(|| parse(bytes)))
            .await
            .unwrap_or_else(|error| Err(DecodeError::Aborted(error.to_string())))
    };
    let parsed = parsed.map_err(Rejection::Undecodable)?;
    if !state.cache().is_ready() {
        return Err(Rejection::NotReady);
    }
    Ok(parsed)
}

/// Past a route's limit, up to this much more is read and thrown away before the 413
/// goes out: a client that is still sending (HTTP/1.1 without `Expect`, h2) would
/// otherwise see its connection or stream reset instead of the answer.
const DRAIN_MAX: u64 = 128 << 20;

/// The body's bytes, up to `limit`; `expected` (the announced length) sizes the buffer
/// once instead of growing it.
async fn read_body(mut body: Body, limit: usize, expected: usize) -> Result<Bytes, Rejection> {
    use http_body_util::BodyExt;
    let mut kept = Vec::with_capacity(expected);
    let mut seen = 0u64;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(unreadable)?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        seen += data.len() as u64;
        if seen > DRAIN_MAX {
            break;
        }
        if seen <= limit as u64 {
            kept.extend_from_slice(&data);
        }
    }
    if seen > limit as u64 {
        return Err(Rejection::TooLarge { limit });
    }
    Ok(kept.into())
}

/// Why a body could not be read: too slow for the rate floor (`pace`), or broken.
fn unreadable(error: axum::Error) -> Rejection {
    let error = error.into_inner();
    if error.is::<pace::BodyTooSlow>() {
        return Rejection::TooSlow;
    }
    Rejection::Unreadable(format!("cannot read request body: {error}"))
}

/// The shape of every POST handler: read and decode the body (400 on bad input, 413
/// over the limit, 503 while not ready), judge it, count the request by route and
/// decision, and record the decision on the request span.
async fn answer<T, Judged>(
    state: &AppState,
    route: &impl Decoder<T>,
    headers: &HeaderMap,
    body: Body,
    judge: impl FnOnce(T) -> Judged,
) -> Response
where
    T: Send + 'static,
    Judged: Future<Output = (&'static str, Response)>,
{
    let started = Instant::now();
    let (decision, response) = match accept(state, headers, body, route).await {
        Ok(parsed) => judge(parsed).await,
        Err(rejection) => (rejection.label(), rejection.into_response()),
    };
    trace::record_decision(decision);
    state
        .metrics
        .observe(route.name(), decision, started.elapsed().as_secs_f64());
    response
}

const PREDICATES: BodyRoute<ExtenderArgs> = BodyRoute {
    name: "predicates",
    limit: EXTENDER_BODY_LIMIT,
    parse: ExtenderArgs::from_body,
};

const VPREDICATES: Route<PredicateArgs> = Route {
    name: "vpredicates",
    limit: EXTENDER_BODY_LIMIT,
    parse: PredicateArgs::from_json,
};

async fn predicates(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    answer(&state, &PREDICATES, &headers, body, async |args| {
        trace::record_pod(&args.pod);
        let (result, outcome) = filter(&state.backend, &state.config, &state.placer, &args).await;
        (outcome.label(), result.into_response())
    })
    .await
}

/// A binding names a pod and a node: a few hundred bytes.
const BIND: Route<ExtenderBindingArgs> = Route {
    name: "bind",
    limit: 64 * 1024,
    parse: ExtenderBindingArgs::from_json,
};

async fn bind_route(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    answer(&state, &BIND, &headers, body, async |args| {
        trace::record_object("pod", &args.pod_namespace, &args.pod_name);
        let (result, outcome) = bind(&state.backend, &state.config, &state.placer, &args).await;
        (outcome.label(), axum::Json(result).into_response())
    })
    .await
}

async fn vpredicates(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    answer(&state, &VPREDICATES, &headers, body, async |args| {
        trace::record_pod(&args.pod);
        let response = predicate(&state.backend, &state.config, args);
        let decision = if response.code == 0 { "fits" } else { "unfit" };
        (decision, axum::Json(response).into_response())
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::{Bytes, Rejection, byte_size, read_body};
    use axum::body::Body;

    /// A body that arrives in `frames`.
    fn framed(frames: &[&'static str]) -> Body {
        let frames: Vec<Result<Bytes, std::io::Error>> = frames
            .iter()
            .map(|f| Ok(Bytes::from_static(f.as_bytes())))
            .collect();
        Body::from_stream(futures::stream::iter(frames))
    }

    #[tokio::test]
    async fn a_body_is_read_whole_in_one_frame_or_many() {
        for frames in [
            &["{\"a\": 1}"][..],
            &["{\"a\"", ": 1", "}"],
            &["", "{\"a\": 1}"],
            &["{\"a\": 1}", "", ""],
            &["", "", "{", "", "\"a\": 1}"],
        ] {
            let read = read_body(framed(frames), 64, 9)
                .await
                .expect("within the limit");
            assert_eq!(&read[..], b"{\"a\": 1}", "{frames:?}");
        }
        let over = read_body(framed(&["0123", "45678"]), 8, 9).await;
        assert!(matches!(over, Err(Rejection::TooLarge { limit: 8 })));
    }

    #[test]
    fn limits_read_in_the_unit_they_were_set_in() {
        assert_eq!(byte_size(64 * 1024), "64 KiB");
        assert_eq!(byte_size(4 << 20), "4 MiB");
        assert_eq!(byte_size(32 << 20), "32 MiB");
        assert_eq!(byte_size(1 << 30), "1 GiB");
        assert_eq!(byte_size(1536 << 10), "1536 KiB");
        assert_eq!(byte_size(1000), "1000 bytes");
    }
}
