//! Serving certificates: loading, validation and hot reload, and the rustls server
//! configs built over them.
//!
//! The serving pair lives in a [`CertResolver`] (an `ArcSwap`, so the handshake
//! path is a lock-free load). [`reload_loop`] polls the files and swaps in a new
//! pair when the contents change and the new pair is valid; a bad pair is
//! logged once and the old one keeps serving. Polling, not inotify, because a
//! Kubernetes Secret update is an atomic swap of a `..data` symlink that
//! per-file watches miss.
//!
//! The accept loops that use these configs are in [`super::listener`].

use std::fmt;
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
use tokio_util::sync::CancellationToken;
use x509_parser::error::X509Error;

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
    fn kind(&self) -> &'static str {
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
fn validity(der: &CertificateDer<'_>) -> Result<(i64, i64), X509Error> {
    let (_, x509) = x509_parser::parse_x509_certificate(der).map_err(|e| match e {
        x509_parser::nom::Err::Error(e) | x509_parser::nom::Err::Failure(e) => e,
        x509_parser::nom::Err::Incomplete(_) => X509Error::InvalidCertificate,
    })?;
    let v = x509.validity();
    Ok((v.not_before.timestamp(), v.not_after.timestamp()))
}

fn check_valid_now(path: &Path, leaf: &CertificateDer<'_>) -> Result<(), TlsError> {
    let (not_before, not_after) = validity(leaf).map_err(|error| TlsError::BadCertificate {
        path: path.to_path_buf(),
        reason: error.to_string(),
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
        let span = tracing::Span::current();
        let result = tokio::task::spawn_blocking(move || span.in_scope(|| r.reload_if_changed()))
            .await
            .unwrap_or_else(|err| {
                tracing::error!(error = %err, "TLS reload task panicked");
                ReloadResult::Failed
            });
        on_result(result);
    }
}
