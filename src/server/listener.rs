//! The listeners: accept loops serving an axum router over TLS ([`serve_tls`], with a
//! config from [`super::tls`]) or plain HTTP ([`serve_plain`]).
//!
//! hyper-util's auto builder (HTTP/1.1 and h2) with graceful shutdown, a cap on open
//! connections and on requests in flight shared fairly between peers ([`super::slots`]),
//! a rate floor for request bodies ([`super::pace`]), handshake, idle and request
//! timeouts, and h2 limits ([`ConnectionLimits`]). A connection whose slot a newcomer
//! took, or whose body was too slow, gets a short grace to finish what it was sending.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::flag_values;
use super::metered::MeteredBody;
use super::pace::{Pace, Progress};
pub use super::slots::Callers;
use super::slots::{Activity, Entry, Slot, Slots};

/// What one listener grants a client: every limit has a default an operator rarely needs
/// to touch; they exist so that no client can hold the server's memory or sockets.
#[derive(Debug, Clone, Copy, Args)]
pub struct ConnectionLimits {
    /// Open connections per listener, shared fairly between peers (IP addresses): the
    /// last eighth only for peers below their fair share, and at the cap a newcomer takes
    /// the slot of a worthless connection (silent, or sending its body too slowly) or of a
    /// peer over its share; requests whose bodies arrive are never cut. Requests in flight
    /// beyond this many: an h2 stream past its peer's share is refused.
    #[arg(long, env = "GPU_ADMISSION_MAX_CONNECTIONS", default_value_t = 256, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=flag_values::MOST_CONNECTIONS as u64))]
    pub max_connections: usize,
    /// A connection with no request in flight and no bytes moving is closed after this.
    #[arg(long, env = "GPU_ADMISSION_IDLE_TIMEOUT", default_value = "60s", value_parser = flag_values::timeout)]
    pub idle_timeout: Duration,
    /// Time to receive a request's headers, and separately its body; and to answer it.
    #[arg(long, env = "GPU_ADMISSION_REQUEST_TIMEOUT", default_value = "15s", value_parser = flag_values::timeout)]
    pub request_timeout: Duration,
    /// Time a new connection has to finish its TLS handshake and begin its first
    /// request; a connection that has not is closed.
    #[arg(long, env = "GPU_ADMISSION_HANDSHAKE_TIMEOUT", default_value = "3s", value_parser = flag_values::timeout)]
    pub handshake_timeout: Duration,
    /// Concurrent HTTP/2 streams per connection.
    #[arg(long, env = "GPU_ADMISSION_MAX_STREAMS", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_streams: u32,
    /// Slowest a request body may arrive, in bytes per second, judged over a sliding
    /// window of --body-rate-grace: each byte buys 1/this of a second, never more than
    /// the window ahead (0: no rule). A body a second short of a full window may give its
    /// connection's slot to a newcomer; one whose time runs out, or that is not whole
    /// --request-timeout after its head, is answered 408 and its connection closed.
    #[arg(long, env = "GPU_ADMISSION_MIN_BODY_RATE", default_value_t = 240)]
    pub min_body_rate: u32,
    /// The window of --min-body-rate: the most time a body's bytes may buy ahead, and
    /// the time a body that sends nothing has from its head (a burst then silence buys
    /// no more).
    #[arg(long, env = "GPU_ADMISSION_BODY_RATE_GRACE", default_value = "2s", value_parser = flag_values::timeout)]
    pub body_rate_grace: Duration,
}

impl Default for ConnectionLimits {
    /// The flags' defaults (one place for them: the `#[arg]` attributes above).
    fn default() -> Self {
        use clap::FromArgMatches;
        let command = ConnectionLimits::augment_args(clap::Command::new("limits"));
        let parsed = command
            .no_binary_name(true)
            .try_get_matches_from(std::iter::empty::<String>())
            .and_then(|matches| ConnectionLimits::from_arg_matches(&matches));
        // Startup invariant: the defaults above parse (`cli_is_well_formed` checks it).
        parsed.expect("the default connection limits parse")
    }
}

/// How long a connection whose slot a newcomer took may finish what it was sending
/// (an h2 GOAWAY, a response being written) before it is dropped.
const EVICTED_GRACE: Duration = Duration::from_secs(1);
/// Pause after an accept error that is not about one connection (e.g. EMFILE),
/// so the loop does not spin.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(250);

/// Serves `app` over TLS on `listener` until `shutdown` is cancelled, then
/// stops accepting and gives open connections `grace` to finish.
///
/// The handshake runs inside each connection's task (bounded by
/// `limits.handshake_timeout`), so a slow or failing client never holds up the accept
/// loop. Accept errors are logged and retried, so this returns `Ok` once shut down;
/// the `io::Result` leaves room for setup errors.
pub async fn serve_tls(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: axum::Router,
    shutdown: CancellationToken,
    grace: Duration,
    limits: ConnectionLimits,
) -> io::Result<()> {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let callers = Callers::KeepAlive;
    accept_loop(listener, shutdown, grace, limits, callers, move |stream, conn| {
        let acceptor = acceptor.clone();
        let app = app.clone();
        async move {
            let activity = conn.slot.activity().clone();
            activity.set_handshaking(true);
            let handshake = tokio::time::timeout_at(conn.opening_deadline, acceptor.accept(stream));
            let result = tokio::select! {
                r = handshake => r,
                () = activity.evicted() => {
                    tracing::debug!(peer = %conn.peer, "TLS handshake cut: a newcomer took its slot");
                    return;
                }
                () = conn.hard_stop.cancelled() => return,
            };
            activity.set_handshaking(false);
            match result {
                Ok(Ok(tls_stream)) => serve_connection(tls_stream, app, conn).await,
                Ok(Err(err)) => {
                    tracing::debug!(peer = %conn.peer, error = %err, "TLS handshake failed");
                }
                Err(_) => tracing::debug!(peer = %conn.peer, "TLS handshake timed out"),
            }
        }
    })
    .await
}

/// Serves `app` over plain HTTP/1.1 and h2c (prior knowledge) on `listener`;
/// same shutdown behaviour and limits as [`serve_tls`]. For the admin port (`callers`:
/// probes and scrapes, [`Callers::Redialing`]) and the insecure extender port.
pub async fn serve_plain(
    listener: TcpListener,
    app: axum::Router,
    shutdown: CancellationToken,
    grace: Duration,
    limits: ConnectionLimits,
    callers: Callers,
) -> io::Result<()> {
    accept_loop(
        listener,
        shutdown,
        grace,
        limits,
        callers,
        move |stream, conn| serve_connection(stream, app.clone(), conn),
    )
    .await
}

/// What a connection task gets besides its socket.
struct Conn {
    peer: std::net::SocketAddr,
    limits: ConnectionLimits,
    /// By then the TLS handshake must be over and the first request begun.
    opening_deadline: tokio::time::Instant,
    /// Cancelled when shutdown begins: finish what is in flight, then close.
    draining: CancellationToken,
    /// Cancelled when the grace period is over: drop the connection.
    hard_stop: CancellationToken,
    /// Held for the connection's lifetime (unless a newcomer takes it): the
    /// listener's connection cap, and what the connection is doing.
    slot: Slot,
}

async fn accept_loop<F, Fut>(
    listener: TcpListener,
    shutdown: CancellationToken,
    grace: Duration,
    limits: ConnectionLimits,
    callers: Callers,
    handle: F,
) -> io::Result<()>
where
    F: Fn(TcpStream, Conn) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let connections = tokio_util::task::TaskTracker::new();
    let slots = Slots::new(limits.max_connections, pace(&limits), callers);
    let room = slots.clone().keep_the_room(shutdown.clone());
    connections.spawn(room.instrument(tracing::debug_span!("waiting_room")));
    let hard_stop = CancellationToken::new();
    let handle = Arc::new(handle);
    loop {
        let Some((stream, peer)) = accept(&listener, &shutdown).await else {
            break;
        };
        let opening_deadline = tokio::time::Instant::now() + limits.handshake_timeout;
        let conn = move |slot, draining: &CancellationToken, hard_stop: &CancellationToken| Conn {
            peer,
            limits,
            opening_deadline,
            draining: draining.clone(),
            hard_stop: hard_stop.clone(),
            slot,
        };
        // Debug level: disabled by default, so a connection costs no span of its own.
        let span = tracing::debug_span!("connection", %peer);
        match slots.enter(peer.ip().to_canonical()) {
            Entry::Admitted(slot) => {
                let served = start(&*handle, stream, conn(slot, &shutdown, &hard_stop));
                connections.spawn(served.instrument(span));
            }
            Entry::Waiting(ticket) => {
                let (handle, hard_stop) = (handle.clone(), hard_stop.clone());
                let draining = shutdown.clone();
                let waited = async move {
                    if let Some(slot) = let_in(ticket, opening_deadline, &draining, peer).await {
                        start(&*handle, stream, conn(slot, &draining, &hard_stop)).await;
                    }
                };
                connections.spawn(waited.instrument(span));
            }
            Entry::Refused => {
                tracing::debug!(%peer, "connection cap reached and the waiting room full of peers ranked first; closing");
            }
        }
    }
    drop(listener);
    drain(connections, grace, hard_stop).await;
    Ok(())
}

/// The slot a waiting newcomer is let in to, or `None` (and it is closed) when its
/// opening deadline passes first, its seat went to a peer ranked first, or shutdown
/// began.
async fn let_in(
    ticket: tokio::sync::oneshot::Receiver<Slot>,
    opening_deadline: tokio::time::Instant,
    draining: &CancellationToken,
    peer: std::net::SocketAddr,
) -> Option<Slot> {
    let slot = tokio::select! {
        r = tokio::time::timeout_at(opening_deadline, ticket) => r,
        () = draining.cancelled() => return None,
    };
    let Ok(Ok(slot)) = slot else {
        tracing::debug!(%peer, "no slot before the opening deadline, or the seat went to a peer ranked first; closing");
        return None;
    };
    Some(slot)
}

/// Once accepting stopped: gives open connections `grace` to finish, then drops them.
async fn drain(
    connections: tokio_util::task::TaskTracker,
    grace: Duration,
    hard_stop: CancellationToken,
) {
    connections.close();
    let open = connections.len();
    if tokio::time::timeout(grace, connections.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            open,
            ?grace,
            "grace period over; closing remaining connections"
        );
        hard_stop.cancel();
        connections.wait().await;
    }
}

/// The body rate rule `limits` set.
fn pace(limits: &ConnectionLimits) -> Pace {
    Pace {
        floor: limits.min_body_rate,
        window: limits.body_rate_grace,
        whole: limits.request_timeout,
    }
}

/// The connection's task, once it holds a slot.
fn start<F, Fut>(handle: &F, stream: TcpStream, conn: Conn) -> Fut
where
    F: Fn(TcpStream, Conn) -> Fut,
{
    if let Err(err) = stream.set_nodelay(true) {
        tracing::debug!(peer = %conn.peer, error = %err, "cannot set TCP_NODELAY");
    }
    handle(stream, conn)
}

/// The next connection, or `None` once `shutdown` is cancelled. Errors about
/// a single connection are skipped; others (fd exhaustion) back off briefly.
async fn accept(
    listener: &TcpListener,
    shutdown: &CancellationToken,
) -> Option<(TcpStream, std::net::SocketAddr)> {
    loop {
        let result = tokio::select! {
            biased;
            () = shutdown.cancelled() => return None,
            r = listener.accept() => r,
        };
        match result {
            Ok(conn) => return Some(conn),
            Err(err) if is_connection_error(&err) => continue,
            Err(err) => {
                tracing::warn!(error = %err, "accept failed; backing off");
                tokio::select! {
                    () = shutdown.cancelled() => return None,
                    () = tokio::time::sleep(ACCEPT_ERROR_BACKOFF) => {}
                }
            }
        }
    }
}

fn is_connection_error(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// HTTP/1.1 and h2 settings that bound what one client can make the server hold:
/// header size and read time, concurrent streams, flow-control windows (unread body
/// bytes buffered per stream and per connection), and dead-peer pings.
fn http_builder(
    limits: &ConnectionLimits,
) -> hyper_util::server::conn::auto::Builder<hyper_util::rt::TokioExecutor> {
    use hyper_util::rt::{TokioExecutor, TokioTimer};
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.request_timeout)
        .max_buf_size(MAX_HEADER_BYTES);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_streams)
        .initial_stream_window_size(H2_STREAM_WINDOW)
        .initial_connection_window_size(H2_CONNECTION_WINDOW)
        .adaptive_window(false)
        .max_header_list_size(MAX_HEADER_BYTES as u32)
        .max_send_buf_size(H2_STREAM_WINDOW as usize)
        .max_pending_accept_reset_streams(limits.max_streams as usize)
        .keep_alive_interval(H2_PING_EVERY)
        .keep_alive_timeout(H2_PING_TIMEOUT);
    builder
}

/// Most header bytes (HTTP/1.1 head, h2 header list) a request may carry.
const MAX_HEADER_BYTES: usize = 64 << 10;
/// h2 flow-control windows: unread request body a client may push ahead.
const H2_STREAM_WINDOW: u32 = 256 << 10;
const H2_CONNECTION_WINDOW: u32 = 512 << 10;
const H2_PING_EVERY: Duration = Duration::from_secs(30);
const H2_PING_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves one connection (HTTP/1.1 or h2, detected from the preface) until it
/// closes, sits idle for `idle_timeout`, makes no request before its opening deadline,
/// gives its slot to a newcomer or sends a body too slowly, shutdown drains it, or the
/// grace period ends. Every
/// request is bounded by twice `request_timeout` (reading its body has its own
/// `request_timeout`, answered 408).
async fn serve_connection<I>(io: I, app: axum::Router, conn: Conn)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    use hyper_util::rt::TokioIo;
    let activity = conn.slot.activity().clone();
    let service = tracked(
        app,
        conn.slot.slots().clone(),
        activity.clone(),
        conn.limits.request_timeout.saturating_mul(2),
    );
    let builder = http_builder(&conn.limits);
    let connection = builder.serve_connection(
        TokioIo::new(io),
        hyper_util::service::TowerToHyperService::new(service),
    );
    tokio::pin!(connection);
    let mut closing = false;
    // Once a newcomer took the slot: the moment the connection is dropped regardless.
    let mut evicted_until: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            r = connection.as_mut() => {
                if let Err(err) = r {
                    tracing::debug!(peer = %conn.peer, error = %err, "connection error");
                }
                return;
            }
            () = conn.draining.cancelled(), if !closing => {
                connection.as_mut().graceful_shutdown();
                closing = true;
            }
            () = activity.idle_for(conn.limits.idle_timeout), if !closing => {
                tracing::debug!(peer = %conn.peer, "closing idle connection");
                connection.as_mut().graceful_shutdown();
                closing = true;
            }
            // Closed gracefully (h2: GOAWAY), not dropped: an h2 client may have pooled the
            // connection unused and hand it a request just as the deadline passes (the API
            // server's Go client does, in bursts); after a GOAWAY it sends that request on
            // another connection, while a dropped connection fails it. The guard was read
            // when this `select!` began: a request may have come since.
            () = tokio::time::sleep_until(conn.opening_deadline),
                if !activity.has_requested() && evicted_until.is_none() =>
            {
                if !activity.has_requested() {
                    tracing::debug!(peer = %conn.peer, "no request in time; closing");
                    connection.as_mut().graceful_shutdown();
                    closing = true;
                    evicted_until = Some(tokio::time::Instant::now() + EVICTED_GRACE);
                }
            }
            () = gives_up_its_slot(&activity), if evicted_until.is_none() => {
                connection.as_mut().graceful_shutdown();
                closing = true;
                evicted_until = Some(tokio::time::Instant::now() + EVICTED_GRACE);
            }
            () = sleep_until_some(evicted_until) => return,
            () = conn.hard_stop.cancelled() => return,
        }
    }
}

/// Resolves when a newcomer took the connection's slot or a body on it was too slow.
async fn gives_up_its_slot(activity: &Activity) {
    tokio::select! {
        () = activity.evicted() => {}
        () = activity.too_slow() => {}
    }
}

/// Sleeps until `deadline`, or forever without one.
async fn sleep_until_some(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// `app`, counting requests in flight and following their bodies (the rate floor), and
/// answering 503 to any that takes longer than `deadline` (a backstop: handlers bound
/// their own waits). An h2 stream beyond its peer's share of the listener's requests in
/// flight is refused (`REFUSED_STREAM`: nothing was done, the client may retry it).
fn tracked(
    app: axum::Router,
    slots: Arc<Slots>,
    activity: Arc<Activity>,
    deadline: Duration,
) -> impl tower::Service<
    axum::http::Request<hyper::body::Incoming>,
    Response = axum::response::Response,
    Error = BoxError,
    Future = impl Future<Output = Result<axum::response::Response, BoxError>> + Send,
> + Clone {
    use axum::response::IntoResponse;
    use hyper::body::Body;
    use tower::ServiceExt;
    tower::service_fn(move |request: axum::http::Request<hyper::body::Incoming>| {
        let app = app.clone();
        let refused = request.version() == axum::http::Version::HTTP_2
            && !slots.admits_stream(activity.peer());
        let begun = (!refused).then(|| {
            let pace = slots.pace();
            let progress = Progress::new(pace, request.body().is_end_stream());
            let in_flight = activity.begin(progress.clone());
            let activity = activity.clone();
            let request = request.map(|body| MeteredBody::new(body, progress, pace, activity));
            (in_flight, request)
        });
        async move {
            let Some((in_flight, request)) = begun else {
                return Err(h2::Error::from(h2::Reason::REFUSED_STREAM).into());
            };
            let response = match tokio::time::timeout(deadline, app.oneshot(request)).await {
                Ok(Ok(response)) => response,
                Ok(Err(never)) => match never {},
                Err(_) => (
                    axum::http::StatusCode::SERVICE_UNAVAILABLE,
                    "request not answered in time",
                )
                    .into_response(),
            };
            drop(in_flight);
            Ok(response)
        }
    })
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;
