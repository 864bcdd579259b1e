//! rustls serving with certificate hot-reload.
//!
//! The serving pair lives in a [`CertResolver`] (an `ArcSwap`, so the handshake
//! path is a lock-free load). [`reload_loop`] polls the files and swaps in a new
//! pair when the contents change and the new pair is valid; a bad pair is
//! logged once and the old one keeps serving. Polling, not inotify, because a
//! Kubernetes Secret update is an atomic swap of a `..data` symlink that
//! per-file watches miss.
//!
//! [`serve_tls`] and [`serve_plain`] are the accept loops: hyper-util's auto
//! builder (HTTP/1.1 and h2) over an axum router, with graceful shutdown, a cap on
//! open connections shared fairly between peers ([`super::slots`]), handshake, idle and
//! request timeouts, and h2 limits ([`ConnectionLimits`]).

use std::fmt;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::slots::{Activity, Slot, Slots};
pub use crate::cli::ConnectionLimits;

/// How long a connection whose slot a newcomer took may finish what it was sending
/// (an h2 GOAWAY, a response being written) before it is dropped.
const EVICTED_GRACE: Duration = Duration::from_secs(1);
/// Pause after an accept error that is not about one connection (e.g. EMFILE),
/// so the loop does not spin.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(250);

/// Why a certificate/key pair could not be loaded.
#[derive(thiserror::Error, Debug)]
pub enum TlsError {
    #[error("{} does not exist", path.display())]
    Missing { path: PathBuf },
    #[error("cannot read {}", path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("{}: no PEM certificate found", path.display())]
    NoCertificate { path: PathBuf },
    #[error("{}: invalid PEM: {reason}", path.display())]
    Pem { path: PathBuf, reason: String },
    #[error("{}: no PEM private key found", path.display())]
    NoPrivateKey { path: PathBuf },
    #[error("{}: unusable private key: {reason}", path.display())]
    BadKey { path: PathBuf, reason: String },
    #[error("{}: invalid certificate: {reason}", path.display())]
    BadCertificate { path: PathBuf, reason: String },
    #[error("key {} does not match certificate {}", key.display(), cert.display())]
    KeyMismatch { cert: PathBuf, key: PathBuf },
    /// `notBefore` is in the future (unix seconds).
    #[error("{}: certificate is not valid before {not_before} (unix time)", path.display())]
    NotYetValid { path: PathBuf, not_before: i64 },
    /// `notAfter` is in the past (unix seconds).
    #[error("{}: certificate expired at {not_after} (unix time)", path.display())]
    Expired { path: PathBuf, not_after: i64 },
}

impl TlsError {
    /// A short stable label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            TlsError::Missing { .. } => "missing",
            TlsError::Read { .. } => "read",
            TlsError::NoCertificate { .. } => "no_certificate",
            TlsError::Pem { .. } => "pem",
            TlsError::NoPrivateKey { .. } => "no_private_key",
            TlsError::BadKey { .. } => "bad_key",
            TlsError::BadCertificate { .. } => "bad_certificate",
            TlsError::KeyMismatch { .. } => "key_mismatch",
            TlsError::NotYetValid { .. } => "not_yet_valid",
            TlsError::Expired { .. } => "expired",
        }
    }
}

/// Result of one [`CertResolver::reload_if_changed`] call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReloadResult {
    /// Same contents as the pair in use, or the same bad contents (or the
    /// same read error) already reported.
    Unchanged,
    /// A new valid pair is now served.
    Reloaded,
    /// New contents that are not a valid pair; the old pair is still served.
    Failed,
}

/// What the last reload attempt concluded, so a bad pair is reported once.
#[derive(Default)]
struct ReloadState {
    /// Digest of the files of the pair being served.
    current: [u8; 32],
    /// Digest (or error text) of the last rejected contents.
    rejected: Option<Rejected>,
}

#[derive(PartialEq, Eq)]
enum Rejected {
    /// `retry`: the contents may become valid as time passes (a certificate
    /// whose `notBefore` is slightly ahead of our clock), so parse them again
    /// on each tick, but log only once.
    Contents {
        hash: [u8; 32],
        retry: bool,
    },
    Unreadable(String),
}

/// The serving certificate, swappable at runtime.
pub struct CertResolver {
    cert_path: PathBuf,
    key_path: PathBuf,
    current: ArcSwap<CertifiedKey>,
    state: Mutex<ReloadState>,
}

impl fmt::Debug for CertResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertResolver")
            .field("cert_path", &self.cert_path)
            .field("key_path", &self.key_path)
            .field("not_after", &self.not_after())
            .finish_non_exhaustive()
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

impl CertResolver {
    /// Loads and validates the pair; errors name the offending file.
    pub fn load(cert: &Path, key: &Path) -> Result<Arc<CertResolver>, TlsError> {
        let (cert_pem, key_pem) = read_pair(cert, key)?;
        let certified = parse_pair(cert, key, &cert_pem, &key_pem)?;
        Ok(Arc::new(CertResolver {
            cert_path: cert.to_path_buf(),
            key_path: key.to_path_buf(),
            current: ArcSwap::from_pointee(certified),
            state: Mutex::new(ReloadState {
                current: digest(&cert_pem, &key_pem),
                rejected: None,
            }),
        }))
    }

    /// The pair being served right now.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current.load_full()
    }

    /// `notAfter` of the leaf being served, in unix seconds.
    pub fn not_after(&self) -> Option<i64> {
        let key = self.current.load();
        let leaf = key.cert.first()?;
        validity(leaf).ok().map(|(_, not_after)| not_after)
    }

    /// Re-reads the files and swaps in the new pair if it changed and is
    /// valid. A rejected pair is logged with `warn!` once; the same contents
    /// (or the same read error) are not retried or logged again.
    pub fn reload_if_changed(&self) -> ReloadResult {
        let mut state = self.state.lock();
        let (cert_pem, key_pem) = match read_pair(&self.cert_path, &self.key_path) {
            Ok(pair) => pair,
            Err(err) => {
                return self.reject(&mut state, Rejected::Unreadable(error_chain(&err)), &err);
            }
        };
        let hash = digest(&cert_pem, &key_pem);
        if hash == state.current {
            state.rejected = None;
            return ReloadResult::Unchanged;
        }
        let known_bad = Rejected::Contents { hash, retry: false };
        if state.rejected.as_ref() == Some(&known_bad) {
            return ReloadResult::Unchanged;
        }
        match parse_pair(&self.cert_path, &self.key_path, &cert_pem, &key_pem) {
            Ok(certified) => {
                self.current.store(Arc::new(certified));
                *state = ReloadState {
                    current: hash,
                    rejected: None,
                };
                tracing::info!(
                    cert = %self.cert_path.display(),
                    not_after = ?self.not_after(),
                    "reloaded TLS certificate"
                );
                ReloadResult::Reloaded
            }
            Err(err) => {
                let retry = matches!(err, TlsError::NotYetValid { .. });
                self.reject(&mut state, Rejected::Contents { hash, retry }, &err)
            }
        }
    }

    fn reject(&self, state: &mut ReloadState, what: Rejected, err: &TlsError) -> ReloadResult {
        if state.rejected.as_ref() == Some(&what) {
            return ReloadResult::Unchanged;
        }
        state.rejected = Some(what);
        tracing::warn!(
            cert = %self.cert_path.display(),
            key = %self.key_path.display(),
            kind = err.kind(),
            error = %error_chain(err),
            "TLS reload failed; still serving the previous certificate"
        );
        ReloadResult::Failed
    }
}

/// `err` and its sources, joined with ": ", for a one-line log field.
fn error_chain(err: &TlsError) -> String {
    let mut out = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}

/// Length-prefixed so that moving bytes between the two files changes it.
fn digest(cert_pem: &[u8], key_pem: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update((cert_pem.len() as u64).to_be_bytes());
    h.update(cert_pem);
    h.update(key_pem);
    h.finalize().into()
}

fn read_file(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| match source.kind() {
        io::ErrorKind::NotFound => TlsError::Missing {
            path: path.to_path_buf(),
        },
        _ => TlsError::Read {
            path: path.to_path_buf(),
            source,
        },
    })
}

fn read_pair(cert: &Path, key: &Path) -> Result<(Vec<u8>, Vec<u8>), TlsError> {
    Ok((read_file(cert)?, read_file(key)?))
}

/// Parses a PEM chain and key and checks they belong together and that the
/// leaf is valid now.
fn parse_pair(
    cert: &Path,
    key: &Path,
    cert_pem: &[u8],
    key_pem: &[u8],
) -> Result<CertifiedKey, TlsError> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            path: cert.to_path_buf(),
            reason: e.to_string(),
        })?;
    let Some(leaf) = chain.first() else {
        return Err(TlsError::NoCertificate {
            path: cert.to_path_buf(),
        });
    };
    check_valid_now(cert, leaf)?;
    let private = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::NoPrivateKey {
            path: key.to_path_buf(),
        },
        other => TlsError::Pem {
            path: key.to_path_buf(),
            reason: other.to_string(),
        },
    })?;
    let signing = rustls::crypto::ring::default_provider()
        .key_provider
        .load_private_key(private)
        .map_err(|e| TlsError::BadKey {
            path: key.to_path_buf(),
            reason: e.to_string(),
        })?;
    let certified = CertifiedKey::new(chain, signing);
    certified.keys_match().map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => TlsError::KeyMismatch {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
        },
        other => TlsError::BadCertificate {
            path: cert.to_path_buf(),
            reason: other.to_string(),
        },
    })?;
    Ok(certified)
}

/// `(not_before, not_after)` in unix seconds.
fn validity(der: &CertificateDer<'_>) -> Result<(i64, i64), String> {
    let (_, x509) = x509_parser::parse_x509_certificate(der).map_err(|e| e.to_string())?;
    let v = x509.validity();
    Ok((v.not_before.timestamp(), v.not_after.timestamp()))
}

fn check_valid_now(path: &Path, leaf: &CertificateDer<'_>) -> Result<(), TlsError> {
    let (not_before, not_after) = validity(leaf).map_err(|reason| TlsError::BadCertificate {
        path: path.to_path_buf(),
        reason,
    })?;
    let now = i64::try_from(UnixTime::now().as_secs()).unwrap_or(i64::MAX);
    if now < not_before {
        return Err(TlsError::NotYetValid {
            path: path.to_path_buf(),
            not_before,
        });
    }
    if now > not_after {
        return Err(TlsError::Expired {
            path: path.to_path_buf(),
            not_after,
        });
    }
    Ok(())
}

/// A server config over `resolver`: ring provider (so no process-wide
/// default is needed), TLS 1.2 and 1.3, ALPN h2 then http/1.1, no client auth.
pub fn server_config(resolver: Arc<CertResolver>) -> Arc<rustls::ServerConfig> {
    let config = builder().with_no_client_auth().with_cert_resolver(resolver);
    with_alpn(config)
}

/// Like [`server_config`], but every client must present a certificate signed by a CA
/// in `client_ca` (PEM): the webhook door, when only the API server may call it.
pub fn mutual_server_config(
    resolver: Arc<CertResolver>,
    client_ca: &Path,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let pem = read_file(client_ca)?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| TlsError::Pem {
            path: client_ca.to_path_buf(),
            reason: e.to_string(),
        })?;
        roots.add(cert).map_err(|e| TlsError::BadCertificate {
            path: client_ca.to_path_buf(),
            reason: e.to_string(),
        })?;
    }
    if roots.is_empty() {
        return Err(TlsError::NoCertificate {
            path: client_ca.to_path_buf(),
        });
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build()
    .map_err(|e| TlsError::BadCertificate {
        path: client_ca.to_path_buf(),
        reason: e.to_string(),
    })?;
    let config = builder()
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(resolver);
    Ok(with_alpn(config))
}

fn builder() -> rustls::ConfigBuilder<rustls::ServerConfig, rustls::WantsVerifier> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    // Startup invariant: ring's default provider supports the default
    // protocol versions; this only fails for a misassembled custom provider.
    rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring provider supports the default TLS versions")
}

fn with_alpn(mut config: rustls::ServerConfig) -> Arc<rustls::ServerConfig> {
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Arc::new(config)
}

/// Calls [`CertResolver::reload_if_changed`] every `every` (off the async
/// threads, since it reads files) until `shutdown` is cancelled, passing each
/// result to `on_result` (e.g. to count failures and set the expiry gauge).
pub async fn reload_loop(
    resolver: Arc<CertResolver>,
    every: Duration,
    on_result: impl Fn(ReloadResult) + Send + 'static,
    shutdown: CancellationToken,
) {
    // `interval` panics on zero.
    let mut ticks = tokio::time::interval(every.max(Duration::from_millis(1)));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await; // the first tick is immediate; the pair was just loaded
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let r = Arc::clone(&resolver);
        let result = tokio::task::spawn_blocking(move || r.reload_if_changed())
            .await
            .unwrap_or_else(|err| {
                tracing::error!(error = %err, "TLS reload task panicked");
                ReloadResult::Failed
            });
        on_result(result);
    }
}

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
    accept_loop(listener, shutdown, grace, limits, move |stream, conn| {
        let acceptor = acceptor.clone();
        let app = app.clone();
        async move {
            let activity = conn.slot.activity().clone();
            let handshake = tokio::time::timeout_at(conn.opening_deadline, acceptor.accept(stream));
            let result = tokio::select! {
                r = handshake => r,
                () = activity.evicted() => {
                    tracing::debug!(peer = %conn.peer, "TLS handshake cut: a newcomer took its slot");
                    return;
                }
                () = conn.hard_stop.cancelled() => return,
            };
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
/// same shutdown behaviour and limits as [`serve_tls`]. For the admin and the
/// insecure extender ports.
pub async fn serve_plain(
    listener: TcpListener,
    app: axum::Router,
    shutdown: CancellationToken,
    grace: Duration,
    limits: ConnectionLimits,
) -> io::Result<()> {
    accept_loop(listener, shutdown, grace, limits, move |stream, conn| {
        serve_connection(stream, app.clone(), conn)
    })
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
    handle: F,
) -> io::Result<()>
where
    F: Fn(TcpStream, Conn) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let connections = tokio_util::task::TaskTracker::new();
    let slots = Slots::new(limits.max_connections);
    let hard_stop = CancellationToken::new();
    loop {
        let Some((stream, peer)) = accept(&listener, &shutdown).await else {
            break;
        };
        let opening_deadline = tokio::time::Instant::now() + limits.handshake_timeout;
        // At the cap a connection doing nothing gives way at once; while every one has
        // a request in flight, stop accepting: further clients wait in the kernel's
        // backlog until a request ends.
        let slot = tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            slot = slots.admit(peer.ip().to_canonical()) => slot,
        };
        if let Err(err) = stream.set_nodelay(true) {
            tracing::debug!(%peer, error = %err, "cannot set TCP_NODELAY");
        }
        let conn = Conn {
            peer,
            limits,
            opening_deadline,
            draining: shutdown.clone(),
            hard_stop: hard_stop.clone(),
            slot,
        };
        connections.spawn(handle(stream, conn));
    }
    drop(listener);
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
    Ok(())
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
/// gives its slot to a newcomer, shutdown drains it, or the grace period ends. Every
/// request is bounded by twice `request_timeout` (reading its body has its own
/// `request_timeout`, answered 408).
async fn serve_connection<I>(io: I, app: axum::Router, conn: Conn)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    use hyper_util::rt::TokioIo;
    let activity = conn.slot.activity().clone();
    let service = tracked(app, activity.clone(), conn.limits.request_timeout * 2);
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
            () = tokio::time::sleep_until(conn.opening_deadline), if !activity.has_requested() => {
                if !activity.has_requested() {
                    tracing::debug!(peer = %conn.peer, "no request in time; closing");
                    return;
                }
            }
            () = activity.evicted(), if evicted_until.is_none() => {
                connection.as_mut().graceful_shutdown();
                closing = true;
                evicted_until = Some(tokio::time::Instant::now() + EVICTED_GRACE);
            }
            () = sleep_until_some(evicted_until) => return,
            () = conn.hard_stop.cancelled() => return,
        }
    }
}

/// Sleeps until `deadline`, or forever without one.
async fn sleep_until_some(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// `app`, counting requests in flight and answering 503 to any that takes longer
/// than `deadline` (a backstop: handlers bound their own waits).
fn tracked(
    app: axum::Router,
    activity: Arc<Activity>,
    deadline: Duration,
) -> impl tower::Service<
    axum::http::Request<hyper::body::Incoming>,
    Response = axum::response::Response,
    Error = std::convert::Infallible,
    Future = impl Future<Output = Result<axum::response::Response, std::convert::Infallible>> + Send,
> + Clone {
    use axum::response::IntoResponse;
    use tower::ServiceExt;
    tower::service_fn(move |request: axum::http::Request<hyper::body::Incoming>| {
        let app = app.clone();
        let in_flight = activity.begin();
        async move {
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
