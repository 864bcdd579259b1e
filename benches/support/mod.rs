//! What the HTTP benchmarks share: a client connection to a server of ours.

use std::sync::Arc;

use axum::body::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};

/// The server's allocator, as the binary declares it (`src/main.rs`): what a benchmark
/// measures in process is what the server runs.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// One HTTP/1.1 connection over TLS to `addr` (certificate for `localhost` under the CA
/// in `ca`), no Nagle delay, its driver spawned.
pub async fn connect<B>(addr: std::net::SocketAddr, ca: &std::path::Path) -> SendRequest<B>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(ca).unwrap())
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender
}

/// A client connection for [`send`].
#[allow(dead_code)] // benches/filter.rs includes this module and posts its own way
pub type Sender = SendRequest<Full<Bytes>>;

/// One request on `sender`: `GET path` without a body, `POST path` (JSON) with one.
/// Returns the status and the whole response body.
#[allow(dead_code)] // benches/filter.rs includes this module and posts its own way
pub async fn send(sender: &mut Sender, path: &str, body: Option<Bytes>) -> (u16, Bytes) {
    let builder = axum::http::Request::builder().header("host", "localhost");
    let request = match body {
        None => builder.method("GET").uri(path).body(Full::default()),
        Some(body) => builder
            .method("POST")
            .uri(path)
            .header("content-type", "application/json")
            .body(Full::new(body)),
    }
    .unwrap();
    sender.ready().await.unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, body)
}

/// A webhook door (TLS, served as `serve` serves it) over an app state, with a
/// development certificate in a directory of its own.
#[allow(dead_code)] // benches/filter.rs serves both doors its own way
pub struct WebhookDoor {
    pub addr: std::net::SocketAddr,
    /// The CA to trust (`connect`).
    pub ca: std::path::PathBuf,
    pub shutdown: tokio_util::sync::CancellationToken,
    _certs: tempfile::TempDir,
}

#[allow(dead_code)] // benches/filter.rs serves both doors its own way
pub async fn serve_webhooks(state: gpu_admission::server::AppState) -> WebhookDoor {
    serve_router(gpu_admission::server::webhook_router(state)).await
}

/// [`serve_webhooks`] for any router (a bench may add routes of its own beside the
/// webhooks').
#[allow(dead_code)] // benches/filter.rs serves both doors its own way
pub async fn serve_router(router: axum::Router) -> WebhookDoor {
    use gpu_admission::certs::{self, CertFiles};
    use gpu_admission::server::listener::{ConnectionLimits, serve_tls};
    use gpu_admission::server::tls::{CertResolver, server_config};
    let dir = tempfile::tempdir().unwrap();
    let files = CertFiles::in_dir(dir.path());
    let validity = std::time::Duration::from_secs(86400);
    let now = time::OffsetDateTime::now_utc();
    certs::ensure(&files, &certs::dev_request(), validity, now).unwrap();
    let resolver = CertResolver::load(&files.cert, &files.key).unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve_tls(
        listener,
        server_config(resolver),
        router,
        shutdown.clone(),
        std::time::Duration::from_secs(1),
        ConnectionLimits::default(),
    ));
    WebhookDoor {
        addr,
        ca: files.ca_cert,
        shutdown,
        _certs: dir,
    }
}
