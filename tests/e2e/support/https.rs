//! A minimal HTTPS client (tokio-rustls + hyper HTTP/1.1, the approach of
//! tests/tls_support) for the scenarios that call gpu-admission's doors directly, as a
//! forger would: trusting gpu-admission's serving CA, with or without a client
//! certificate. Every request uses a fresh connection and no session resumption, so each
//! one goes through a full handshake.
use std::error::Error;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;

pub type BoxError = Box<dyn Error + Send + Sync>;

/// Bound on one request, so a server that never answers fails the test instead of
/// hanging it.
const PATIENCE: Duration = Duration::from_secs(15);

/// A TLS client config that trusts only the CA in `ca_pem` and presents `identity`
/// (certificate chain PEM, key PEM) when given.
pub fn client_config(ca_pem: &Path, identity: Option<(&Path, &Path)>) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca_pem).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match identity {
        Some((cert, key)) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
                .unwrap()
                .map(Result::unwrap)
                .collect();
            let key = PrivateKeyDer::from_pem_file(key).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config.resumption = rustls::client::Resumption::disabled();
    Arc::new(config)
}

/// `https://host:port` → the socket address (the e2e URLs are all `127.0.0.1:<port>`).
fn socket_addr(url: &str) -> SocketAddr {
    let hostport = url
        .strip_prefix("https://")
        .unwrap_or_else(|| panic!("not an https URL: {url}"));
    hostport
        .trim_end_matches('/')
        .parse()
        .unwrap_or_else(|e| panic!("{url}: not https://<ip>:<port>: {e}"))
}

/// POSTs `body` (JSON) to `url` + `path` on a fresh connection. `Ok` is any HTTP answer
/// (status and body); `Err` a failure below HTTP: TCP, the TLS handshake, or the
/// connection failing before a response arrived (a TLS 1.3 server rejects a client
/// certificate, or its absence, after the client's half of the handshake, so the refusal
/// shows as an alert on the first read).
pub async fn post(
    url: &str,
    path: &str,
    body: String,
    config: Arc<rustls::ClientConfig>,
) -> Result<(StatusCode, String), BoxError> {
    tokio::time::timeout(PATIENCE, post_inner(socket_addr(url), path, body, config)).await?
}

async fn post_inner(
    addr: SocketAddr,
    path: &str,
    body: String,
    config: Arc<rustls::ClientConfig>,
) -> Result<(StatusCode, String), BoxError> {
    let tcp = TcpStream::connect(addr).await?;
    // gpu-admission's serving certificate names localhost and 127.0.0.1.
    let name = ServerName::try_from("localhost")?;
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake::<_, Body>(TokioIo::new(tls)).await?;
    let conn = tokio::spawn(conn);
    let request = Request::post(path)
        .header(header::HOST, "localhost")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body))?;
    let sent = sender.send_request(request).await;
    let response = match sent {
        Ok(response) => response,
        Err(error) => {
            // The connection task usually holds the cause (the TLS alert).
            conn.abort();
            return Err(error.into());
        }
    };
    let status = response.status();
    let bytes = axum::body::to_bytes(Body::new(response.into_body()), 16 << 20).await?;
    Ok((status, String::from_utf8(bytes.to_vec())?))
}

/// The error and all its sources, `: `-separated (hyper hides the TLS alert a level down).
pub fn chain(error: &(dyn Error + 'static)) -> String {
    std::iter::successors(Some(error), |e| (*e).source())
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ")
}
