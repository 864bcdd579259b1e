//! A minimal TLS + HTTP/1.1 client for tests/tls.rs (tokio-rustls + hyper).
#![allow(clippy::unwrap_used, dead_code)]

use std::error::Error;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;

pub type BoxError = Box<dyn Error + Send + Sync>;

/// What one request saw.
pub struct Reply {
    pub status: axum::http::StatusCode,
    pub body: String,
    /// The leaf certificate the server presented.
    pub peer: CertificateDer<'static>,
}

/// A client config that trusts only the CA in `ca_pem` (ring provider, no
/// process-wide default needed).
pub fn client_config(ca_pem: &Path) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca_pem).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    // A resumed session presents no certificate (the client reports the one
    // from the original handshake), so a rotation would go unnoticed.
    config.resumption = rustls::client::Resumption::disabled();
    Arc::new(config)
}

/// Opens a new TLS connection to `addr` as `server_name`.
pub async fn connect(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    server_name: &str,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, BoxError> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from(server_name.to_owned())?;
    let connector = tokio_rustls::TlsConnector::from(config);
    Ok(connector.connect(name, tcp).await?)
}

/// One GET on a fresh connection, bounded by a generous timeout so a broken
/// server fails the test instead of hanging it.
pub async fn get(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    path: &str,
) -> Result<Reply, BoxError> {
    tokio::time::timeout(Duration::from_secs(10), get_inner(addr, config, path)).await?
}

async fn get_inner(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    path: &str,
) -> Result<Reply, BoxError> {
    let tls = connect(addr, config, "localhost").await?;
    let peer = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .ok_or("no peer certificate")?
        .clone()
        .into_owned();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake::<_, Body>(TokioIo::new(tls)).await?;
    tokio::spawn(conn);
    let request = axum::http::Request::get(path)
        .header(axum::http::header::HOST, "localhost")
        .body(Body::empty())?;
    let response = sender.send_request(request).await?;
    let status = response.status();
    let bytes = axum::body::to_bytes(Body::new(response.into_body()), 1 << 20).await?;
    Ok(Reply {
        status,
        body: String::from_utf8(bytes.to_vec())?,
        peer,
    })
}

/// One GET over h2 (ALPN `h2`) on a fresh connection; returns the status and
/// body after checking the server negotiated h2.
pub async fn get_h2(
    addr: SocketAddr,
    ca_pem: &Path,
    path: &str,
) -> Result<(axum::http::StatusCode, String), BoxError> {
    let mut config = (*client_config(ca_pem)).clone();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tls = connect(addr, Arc::new(config), "localhost").await?;
    if tls.get_ref().1.alpn_protocol() != Some(b"h2".as_slice()) {
        return Err("server did not negotiate h2".into());
    }
    let executor = hyper_util::rt::TokioExecutor::new();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake::<_, _, Body>(executor, TokioIo::new(tls)).await?;
    tokio::spawn(conn);
    let request =
        axum::http::Request::get(format!("https://localhost{path}")).body(Body::empty())?;
    let response = sender.send_request(request).await?;
    let status = response.status();
    let bytes = axum::body::to_bytes(Body::new(response.into_body()), 1 << 20).await?;
    Ok((status, String::from_utf8(bytes.to_vec())?))
}

/// DER of the first certificate in a PEM file.
pub fn der_of(path: &Path) -> CertificateDer<'static> {
    CertificateDer::from_pem_file(path).unwrap()
}

/// DNS names in a certificate's SAN extension.
pub fn dns_sans(der: &CertificateDer<'_>) -> Vec<String> {
    let (_, x509) = x509_parser::parse_x509_certificate(der).unwrap();
    let Some(ext) = x509.subject_alternative_name().unwrap() else {
        return Vec::new();
    };
    ext.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_string()),
            _ => None,
        })
        .collect()
}
